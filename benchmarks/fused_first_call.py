"""Does the fused path's speed depend on the size of the call that compiled it?

    python benchmarks/fused_first_call.py               # float32, 8M elements, torch's threads
    python benchmarks/fused_first_call.py --no-size-hint   # the same without the size hint

torch.compile with dynamic shapes compiles a kernel once, for every size, and inductor tunes
it for the size of the call that compiled it (on a CPU: whether to use threads). Users'
first call is often a small one (a unit test, a warm-up batch). Two copies of the generated
perf module are timed side by side in this process, fwd+bwd, with the fused path on:

  small-first  compiled by a first call on 1000 elements (forward and backward)
  at-size      compiled by its first call at the measured size
  builtin      the torch op, where there is one

``small / at-size`` near 1 means the first call's size does not matter. The generated
module marks a call that compiles with a size hint (``_SIZE_HINT``); ``--no-size-hint`` sets
it to 1 in both copies, which turns the hint off, to show what it is for. Run with torch's
default threads (more than one: the difference is whether a kernel uses them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_torch import CASES, Device, make_problem
from common import generate_module, import_file, median, print_table


def fwd_bwd(fn, problem) -> float:
    start = time.perf_counter()
    torch.autograd.grad(fn(*problem.inputs), problem.diff, problem.gy)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8_000_000)
    parser.add_argument("--first-size", type=int, default=1000)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--no-size-hint", action="store_true")
    parser.add_argument("--functions", nargs="+")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    # Every compile fresh: inductor's cache keys a kernel without the size it was tuned for,
    # so one copy's kernel would be handed to the other.
    torch._inductor.config.fx_graph_cache = False
    dtype, dev = getattr(torch, args.dtype), Device("cpu")
    names = [n for n in CASES if args.functions is None or n in args.functions]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
        f"{args.dtype}, n = {args.size:,}, first call of small-first on {args.first_size:,}; "
        f"size hint {'off' if args.no_size_hint else 'on'}; medians of {args.repeats}"
    )
    with tempfile.TemporaryDirectory(prefix="symgrad-first-call-") as tmp:
        gen = generate_module("torch", Path(tmp), names)
        copies = {
            "small-first": import_file(gen.path, f"{gen.path.stem}_small_first"),
            "at-size": import_file(gen.path, f"{gen.path.stem}_at_size"),
        }
        for module in copies.values():
            module.use_fused(True)
            if args.no_size_hint:
                module._SIZE_HINT = 1
        rows, ratios = [], []
        for name in names:
            case = CASES[name]
            small = make_problem(case, args.first_size, dtype, dev, hvp=False)
            problem = make_problem(case, args.size, dtype, dev, hvp=False)
            fns = {k: getattr(m, name) for k, m in copies.items()}
            fwd_bwd(fns["small-first"], small)  # compiles forward and backward
            if case.builtin is not None:
                fns["builtin"] = case.builtin
            for fn in fns.values():  # compiles at-size; warms up
                fwd_bwd(fn, problem)
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(args.repeats):  # interleaved, so load hits all alike
                for k, fn in fns.items():
                    times[k].append(fwd_bwd(fn, problem))
            ms = {k: median(v) * 1e3 for k, v in times.items()}
            ratio = ms["small-first"] / ms["at-size"]
            ratios.append(ratio)
            rows.append(
                [
                    name,
                    f"{ms['small-first']:.2f}",
                    f"{ms['at-size']:.2f}",
                    f"{ms['builtin']:.2f}" if "builtin" in ms else "n/a",
                    f"{ratio:.2f}",
                    f"{ms['small-first'] / ms['builtin']:.2f}" if "builtin" in ms else "n/a",
                ]
            )
    print_table(
        [
            "function",
            "small-first ms",
            "at-size ms",
            "builtin ms",
            "small/at-size",
            "small/builtin",
        ],
        rows,
        "fused fwd+bwd, median times",
    )
    print(f"\nsmall-first / at-size: median over the suite {median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

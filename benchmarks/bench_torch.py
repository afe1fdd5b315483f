"""Benchmark symgrad's generated PyTorch code against naive autograd, torch.compile and builtins.

    python benchmarks/bench_torch.py            # default run (CPU: 4-6 minutes on 2 cores)
    python benchmarks/bench_torch.py --quick    # smoke run, < 1 minute

The perf spec (benchmarks/specs/perf.yaml) is generated into a temporary directory at
start-up with symgrad's Python API and imported from there. For every function, dtype and
size, five variants are timed side by side in this process, interleaved repeat by repeat:

  generated  the generated wrapper (autograd.Function with the derived backward)
  fused      the same with the generated module's use_fused() on (its torch.compile path),
             where the generated module has one
  naive      autograd of the naive formula, written below in plain torch ops as the spec has it
  compiled   torch.compile(naive, dynamic=False), timed after compilation
  builtin    the torch op where one exists (F.softplus, F.silu, ...)

See benchmarks/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (
    fmt_ratio,
    fmt_samples,
    generate_module,
    geomean,
    import_file,
    median,
    print_codegen_times,
    print_table,
    quiet_stderr,
    ratio,
    short_reason,
    suite_median,
)
from torch.profiler import ProfilerActivity, profile

VARIANTS = ("generated", "fused", "naive", "compiled", "builtin")
SHORT = {
    "generated": "gen",
    "fused": "fused",
    "naive": "naive",
    "compiled": "comp",
    "builtin": "builtin",
}


# --------------------------------------------------------------------------- naive formulas
# Each is the spec's `output:` transcribed literally into torch ops: no common
# subexpressions shared, no stabilisation (what a user would get from autograd).


def naive_softplus(x):
    return torch.log(1 + torch.exp(x))


def naive_silu(x):
    return x / (1 + torch.exp(-x))


def naive_mish(x):
    return x * torch.tanh(torch.log(1 + torch.exp(x)))


def naive_gelu_erf(x):
    return x * (1 + torch.erf(x / math.sqrt(2))) / 2


def naive_gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def naive_elu(x):
    return torch.where(x > 0, x, torch.exp(x) - 1)


def naive_log_sigmoid(x):
    return torch.log(1 / (1 + torch.exp(-x)))


def naive_gated_mix(x, y, z):
    return x * torch.sigmoid(y) + z * torch.tanh(x)


def naive_focal_loss(z, target, gamma=2.0):
    return -(
        target * (1 - torch.sigmoid(z)) ** gamma * torch.log(torch.sigmoid(z))
        + (1 - target) * torch.sigmoid(z) ** gamma * torch.log(1 - torch.sigmoid(z))
    )


def naive_bce_with_logits(z, target):
    return -(
        target * torch.log(1 / (1 + torch.exp(-z)))
        + (1 - target) * torch.log(1 - 1 / (1 + torch.exp(-z)))
    )


def naive_huber(pred, target):
    return torch.where(
        torch.abs(pred - target) <= 1, (pred - target) ** 2 / 2, torch.abs(pred - target) - 1 / 2
    )


def naive_student_t_logpdf(x, nu=3.0):
    return (
        math.lgamma((nu + 1) / 2)
        - math.lgamma(nu / 2)
        - math.log(math.sqrt(nu * math.pi))
        - (nu + 1) / 2 * torch.log(1 + x**2 / nu)
    )


# --------------------------------------------------------------------------- builtins


def builtin_student_t_logpdf(x, nu=3.0):
    dist = torch.distributions.StudentT(x.new_tensor(nu), validate_args=False)
    return dist.log_prob(x)


@dataclass(frozen=True)
class Case:
    """One function of the suite: its inputs, naive formula and builtin (if any).

    ``inputs`` are (name, kind): "randn" is a standard normal tensor that gets a gradient,
    "unit" a uniform [0, 1) tensor that does not (targets). Scalars keep their defaults.
    """

    inputs: tuple[tuple[str, str], ...]
    naive: Callable
    builtin: Callable | None = None
    builtin_name: str = "-"


X = (("x", "randn"),)
CASES: dict[str, Case] = {
    "softplus": Case(X, naive_softplus, F.softplus, "F.softplus"),
    "silu": Case(X, naive_silu, F.silu, "F.silu"),
    "mish": Case(X, naive_mish, F.mish, "F.mish"),
    "gelu_erf": Case(X, naive_gelu_erf, F.gelu, "F.gelu"),
    "gelu_tanh": Case(
        X, naive_gelu_tanh, lambda x: F.gelu(x, approximate="tanh"), "F.gelu(approximate='tanh')"
    ),
    "elu": Case(X, naive_elu, F.elu, "F.elu"),
    "log_sigmoid": Case(X, naive_log_sigmoid, F.logsigmoid, "F.logsigmoid"),
    "gated_mix": Case((("x", "randn"), ("y", "randn"), ("z", "randn")), naive_gated_mix),
    "focal_loss": Case((("z", "randn"), ("target", "unit")), naive_focal_loss),
    "bce_with_logits": Case(
        (("z", "randn"), ("target", "unit")),
        naive_bce_with_logits,
        lambda z, t: F.binary_cross_entropy_with_logits(z, t, reduction="none"),
        "F.binary_cross_entropy_with_logits",
    ),
    "huber": Case(
        (("pred", "randn"), ("target", "randn")),
        naive_huber,
        lambda p, t: F.huber_loss(p, t, reduction="none", delta=1.0),
        "F.huber_loss",
    ),
    "student_t_logpdf": Case(
        X,
        naive_student_t_logpdf,
        builtin_student_t_logpdf,
        "distributions.StudentT.log_prob (composite)",
    ),
}


# --------------------------------------------------------------------------- measurement


class Device:
    def __init__(self, name: str):
        self.name = name
        self.cuda = name.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class Problem:
    """The tensors of one measurement: inputs, upstream gradient and (HVP) the vectors v."""

    inputs: list[torch.Tensor]
    gy: torch.Tensor
    vs: list[torch.Tensor] | None = None  # set: a Hessian-vector product instead

    @property
    def diff(self) -> list[torch.Tensor]:
        return [t for t in self.inputs if t.requires_grad]

    @property
    def given(self) -> list[torch.Tensor]:
        """What the caller holds anyway: not counted as extra saved memory."""
        return [*self.inputs, self.gy, *(self.vs or [])]


def make_problem(case: Case, n: int, dtype: torch.dtype, dev: Device, hvp: bool) -> Problem:
    g = torch.Generator().manual_seed(0)
    inputs = []
    for _, kind in case.inputs:
        if kind == "randn":
            t = torch.randn(n, generator=g, dtype=dtype).to(dev.name).requires_grad_(True)
        else:
            t = torch.rand(n, generator=g, dtype=dtype).to(dev.name)
        inputs.append(t)
    gy = torch.randn(n, generator=g, dtype=dtype).to(dev.name)
    vs = None
    if hvp:
        vs = [
            torch.randn(n, generator=g, dtype=dtype).to(dev.name) for t in inputs if t.requires_grad
        ]
    return Problem(inputs, gy, vs)


def step(fn, p: Problem, dev: Device) -> tuple[list[torch.Tensor], list[float]]:
    """One forward + backward, or forward + grad(create_graph=True) + grad for an HVP.

    Returns the results (output, gradients, HVPs) and the seconds of each phase.
    """
    diff = p.diff
    dev.sync()
    t0 = time.perf_counter()
    out = fn(*p.inputs)
    dev.sync()
    t1 = time.perf_counter()
    grads = torch.autograd.grad(out, diff, p.gy, create_graph=p.vs is not None)
    dev.sync()
    t2 = time.perf_counter()
    if p.vs is None:
        return [out.detach(), *grads], [t1 - t0, t2 - t1]
    hvps = torch.autograd.grad(grads, diff, p.vs)
    dev.sync()
    t3 = time.perf_counter()
    return [out.detach(), *(g.detach() for g in grads), *hvps], [t1 - t0, t2 - t1, t3 - t2]


def saved_bytes(fn, p: Problem, dev: Device) -> tuple[int, int]:
    """(all, extra) bytes of the unique storages saved for backward during ``step``.

    ``extra`` leaves out storages of tensors the caller holds anyway (inputs, upstream
    gradient, v). For an HVP this includes what grad(create_graph=True) saves.
    """
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(fn, p, dev)
    storages = {}
    for t in packed:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    given = {t.untyped_storage().data_ptr() for t in p.given}
    return sum(storages.values()), sum(b for ptr, b in storages.items() if ptr not in given)


def peak_bytes(body: Callable[[], object], dev: Device) -> int:
    """Peak bytes allocated above the starting level while ``body`` runs.

    CUDA: torch.cuda.max_memory_allocated. CPU: the allocation/free events of the
    PyTorch profiler (profile_memory=True), summed in time order.
    """
    if dev.cuda:
        dev.sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        body()
        dev.sync()
        return torch.cuda.max_memory_allocated() - base
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        body()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    level = peak = 0
    for e in events:
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def max_rel_err(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """Largest |got - ref| / max(|ref|, 1) over all the results."""
    return max(((a - b).abs() / b.abs().clamp_min(1.0)).max().item() for a, b in zip(got, ref))


@dataclass
class Result:
    """Per variant: timing samples (seconds per phase; None: n/a), memory, first call, notes."""

    samples: dict[str, list[list[float]] | None]
    saved: dict[str, tuple[int, int] | None]
    peak: dict[str, int | None]
    first_s: dict[str, float | None]
    notes: dict[str, str]

    def phase(self, v: str, i: int | None) -> list[float] | None:
        """Samples of phase ``i`` (None: the sum of all phases)."""
        if self.samples[v] is None:
            return None
        return [sum(s) if i is None else s[i] for s in self.samples[v]]


def variant_fns(name: str, gen_module, fused_module, case: Case, compiled_cache: dict) -> dict:
    if name not in compiled_cache:
        compiled_cache[name] = torch.compile(case.naive, dynamic=False)
    return {
        "generated": getattr(gen_module, name),
        "fused": None if fused_module is None else getattr(fused_module, name),
        "naive": case.naive,
        "compiled": compiled_cache[name],
        "builtin": case.builtin,
    }


def measure(fns: dict, p: Problem, dev: Device, repeats: int, dtype: torch.dtype) -> Result:
    """Three untimed calls per variant (first call + agreement check, saved bytes, peak),
    then ``repeats`` timed calls of every variant, interleaved."""
    res = Result({}, {}, {}, {}, {})
    fns = dict(fns)
    tol = 1e-3 if dtype == torch.float32 else 1e-6
    ref = None
    for v in VARIANTS:
        res.samples[v] = res.saved[v] = res.peak[v] = res.first_s[v] = None
        if fns[v] is None:
            continue
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t0 = time.perf_counter()
                results, _ = step(fns[v], p, dev)
                res.first_s[v] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported: the table shows n/a
            res.notes[v] = short_reason(exc)
            fns[v] = None
            continue
        fallback = [w for w in caught if "eager" in str(w.message)]
        if v == "fused" and fallback:  # use_fused() warns when it falls back to eager
            res.notes[v] = f"fell back to eager: {str(fallback[0].message)[:140]}"
            fns[v] = None
            continue
        if v == "generated":
            ref = results
        elif ref is not None:
            err = max_rel_err(results, ref)
            if not err <= tol:
                res.notes[v] = f"disagrees with generated: max rel err {err:.2g} > {tol:g}"
        del results
        res.saved[v] = saved_bytes(fns[v], p, dev)
        res.peak[v] = peak_bytes(lambda fn=fns[v]: step(fn, p, dev), dev)
    del ref

    active = [v for v in VARIANTS if fns[v] is not None]
    for v in active:
        res.samples[v] = []
    for r in range(repeats):
        # Rotate the order so background load and cache state hit every variant alike.
        for v in active[r % len(active) :] + active[: r % len(active)]:
            res.samples[v].append(step(fns[v], p, dev)[1])
    return res


# --------------------------------------------------------------------------- reporting


def per_elem(nbytes: int | None, n: int) -> str:
    return "n/a" if nbytes is None else f"{nbytes / n:.0f}"


def saved_cell(saved: tuple[int, int] | None, n: int) -> str:
    return "n/a" if saved is None else f"{saved[0] / n:.0f} ({saved[1] / n:.0f})"


def print_notes(results: dict[str, Result]) -> None:
    """Reasons for n/a cells and disagreements, one line per distinct reason."""
    by_reason: dict[str, list[str]] = {}
    for fn, r in results.items():
        for v, reason in r.notes.items():
            by_reason.setdefault(f"{v}: {reason}", []).append(fn)
    for reason, fns in by_reason.items():
        print(f"  note [{', '.join(fns)}] {reason}")


def heading(text: str) -> None:
    print(f"\n{text}\n{'=' * len(text)}")


def summary_line(summary: dict[str, float | None]) -> str:
    return "; ".join(f"{k} {fmt_ratio(v)}" for k, v in summary.items())


def report_first_order(results: dict[str, Result], dtype_name: str, n: int) -> dict:
    heading(f"== first order: fwd / bwd / fwd+bwd, {dtype_name}, n = {n:,}")
    rows = []
    for name, r in results.items():
        row = [name]
        for v in ("generated", "naive"):
            row += [fmt_samples(r.phase(v, i)) for i in (0, 1, None)]
        row += [fmt_samples(r.phase(v, None)) for v in ("fused", "compiled", "builtin")]
        rows.append(row)
    headers = ["function", "gen fwd", "gen bwd", "gen f+b", "naive fwd", "naive bwd"]
    headers += ["naive f+b", "fused f+b", "comp f+b", "builtin f+b"]
    print_table(headers, rows, "median times, ms (* = interquartile range > 25% of the median)")

    rows = []
    pairs = {  # column -> (numerator, denominator), all fwd+bwd
        "gen/naive f+b": ("generated", "naive"),
        "gen/builtin f+b": ("generated", "builtin"),
        "comp/builtin f+b": ("compiled", "builtin"),
        "gen/comp f+b": ("generated", "compiled"),
        "comp/naive f+b": ("compiled", "naive"),
        "fused/comp f+b": ("fused", "compiled"),
        "fused/builtin f+b": ("fused", "builtin"),
    }
    cols: dict[str, list] = {k: [] for k in pairs}
    for name, r in results.items():
        row = [name]
        row += [fmt_ratio(ratio(r.phase("generated", i), r.phase("naive", i))) for i in (0, 1)]
        for k, (a, b) in pairs.items():
            cols[k].append(ratio(r.phase(a, None), r.phase(b, None)))
            row.append(fmt_ratio(cols[k][-1]))
        rows.append(row)
    headers = ["function", "gen/naive fwd", "gen/naive bwd", *pairs]
    print_table(headers, rows, "time ratios of medians (< 1: the first is faster)")

    rows = []
    for name, r in results.items():
        row = [name] + [saved_cell(r.saved[v], n) for v in VARIANTS]
        row += [per_elem(r.peak[v], n) for v in VARIANTS]
        rows.append(row)
    headers = ["function"] + [f"saved {SHORT[v]}" for v in VARIANTS]
    headers += [f"peak {SHORT[v]}" for v in VARIANTS]
    print_table(
        headers,
        rows,
        "memory, bytes per element: saved for backward, all (not counting inputs/grad), "
        "and peak above start during fwd+bwd",
    )
    # Functions whose generated code saves more for backward than their builtin does.
    heavier = [
        name
        for name, r in results.items()
        if None not in (r.saved["generated"], r.saved["builtin"])
        and r.saved["generated"][0] > r.saved["builtin"][0]
    ]
    summary = {
        "gen/naive f+b median": suite_median(cols["gen/naive f+b"]),
        "geomean": geomean(cols["gen/naive f+b"]),
        "gen/builtin median": suite_median(cols["gen/builtin f+b"]),
        "comp/builtin median": suite_median(cols["comp/builtin f+b"]),
        "gen/comp median": suite_median(cols["gen/comp f+b"]),
        "fused/comp median": suite_median(cols["fused/comp f+b"]),
        "fused/builtin median": suite_median(cols["fused/builtin f+b"]),
    }
    print(f"\nsuite: {summary_line(summary)}")
    print(f"saved for backward, generated > builtin: {', '.join(heavier) or 'none'}")
    for v in ("compiled", "fused"):
        first = [r.first_s[v] for r in results.values() if r.first_s[v] is not None]
        if first:
            print(f"{v}: first call (compile + run), median over the suite {median(first):.2f} s")
    print_notes(results)
    return summary, cols, heavier


HVP_MEMORY = ("generated", "naive", "builtin")  # torch.compile has no double backward


def report_hvp(results: dict[str, Result], dtype_name: str, n: int) -> dict:
    heading(f"== second order: Hessian-vector product (double backward), {dtype_name}, n = {n:,}")
    rows = []
    g_n, g_b = [], []
    for name, r in results.items():
        total = {v: r.phase(v, None) for v in VARIANTS}
        g_n.append(ratio(total["generated"], total["naive"]))
        g_b.append(ratio(total["generated"], total["builtin"]))
        row = [name] + [fmt_samples(total[v]) for v in VARIANTS]
        row += [fmt_ratio(g_n[-1]), fmt_ratio(g_b[-1])]
        row += [saved_cell(r.saved[v], n) for v in HVP_MEMORY]
        row += [per_elem(r.peak[v], n) for v in HVP_MEMORY]
        rows.append(row)
    headers = ["function"] + [f"{SHORT[v]} ms" for v in VARIANTS]
    headers += ["gen/naive", "gen/builtin"] + [f"saved {SHORT[v]}" for v in HVP_MEMORY]
    headers += [f"peak {SHORT[v]}" for v in HVP_MEMORY]
    print_table(
        headers,
        rows,
        "fwd + grad(create_graph=True) + grad(v): median ms, ratios, bytes per element "
        "(saved: all (not counting inputs/grad/v); peak above start)",
    )
    summary = {
        "HVP gen/naive median": suite_median(g_n),
        "geomean": geomean(g_n),
        "gen/builtin median": suite_median(g_b),
    }
    print(f"\nsuite: {summary_line(summary)}")
    print_notes(results)
    return summary


# --------------------------------------------------------------------------- main

#: --quick's subset: one-input (with and without builtin), three-input, non-differentiable
#: target, two differentiable inputs with Piecewise.
QUICK = ("softplus", "mish", "gated_mix", "bce_with_logits", "huber")


#: glibc malloc settings for --keep-freed-memory: no trimming of the heap top, and every
#: allocation up to glibc's ceiling for the mmap threshold (32 MiB) from the heap.
KEEP_FREED = {"MALLOC_TRIM_THRESHOLD_": "1099511627776", "MALLOC_MMAP_THRESHOLD_": "33554432"}


def keep_freed_memory(argv: list[str]) -> None:
    """Re-execute this script with :data:`KEEP_FREED` in the environment (glibc reads it
    at start-up only), unless it is there already."""
    if all(os.environ.get(k) == v for k, v in KEEP_FREED.items()):
        return
    env = {**os.environ, **KEEP_FREED}
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 8_000_000])
    p.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    p.add_argument("--repeats", type=int, default=7, help="timed calls per variant (median)")
    p.add_argument("--functions", nargs="+", default=None, help="subset of the suite")
    p.add_argument(
        "--hvp-sizes",
        type=int,
        nargs="*",
        default=None,
        help="sizes of the second-order section (default: the smallest of --sizes; none: skip)",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1; 0: torch's default, one per core). See README:\n"
        "with any other load on the machine, multi-threaded timings measure scheduler stalls",
    )
    p.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="rerun under glibc settings that keep freed memory in the process\n"
        f"({' '.join(f'{k}={v}' for k, v in KEEP_FREED.items())}): allocations up to\n"
        "32 MiB reuse pages instead of faulting in fresh ones, as a caching allocator\n"
        "(jemalloc, tcmalloc, CUDA's) would. Larger ones (float64 8M) still fault",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: n = 100,000, float32, 3 repeats, functions {' '.join(QUICK)}\n"
        "(unless --functions is given)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.functions = args.functions or list(QUICK)
        args.sizes, args.dtypes, args.repeats = [100_000], ["float32"], 3
    if args.hvp_sizes is None:
        args.hvp_sizes = [min(args.sizes)]
    unknown = set(args.functions or []) - set(CASES)
    if unknown:
        p.error(f"unknown function(s) {sorted(unknown)}; choose from {list(CASES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.keep_freed_memory:
        keep_freed_memory(sys.argv[1:] if argv is None else list(argv))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dev = Device(args.device)
    start = time.perf_counter()
    print(
        f"torch {torch.__version__}, device {dev.name}, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"
    )
    print(
        f"sizes {args.sizes}, dtypes {args.dtypes}, HVP sizes {args.hvp_sizes}; "
        f"medians of {args.repeats} timed calls per variant, interleaved, after 3 untimed"
    )
    kept = {k: os.environ[k] for k in KEEP_FREED if k in os.environ}
    print(f"allocator: glibc {'with ' + str(kept) if kept else 'defaults'}")
    with tempfile.TemporaryDirectory(prefix="symgrad-bench-") as tmp:
        gen = generate_module("torch", Path(tmp), args.functions)
        print_codegen_times(gen)
        names = [n for n in CASES if args.functions is None or n in args.functions]
        missing = [n for n in names if not hasattr(gen.module, n)]
        if missing:
            print(f"error: the generated module lacks {missing}", file=sys.stderr)
            return 1
        print_table(
            ["function", "inputs", "builtin"],
            [[n, ", ".join(i for i, _ in CASES[n].inputs), CASES[n].builtin_name] for n in names],
            "suite",
        )
        fused_module = None
        if hasattr(gen.module, "use_fused"):
            fused_module = import_file(gen.path, f"{gen.path.stem}_fused")
            fused_module.use_fused(True)
        else:
            print("fused: n/a everywhere: the generated module has no use_fused()")
        compiled_cache: dict = {}
        summaries = []
        pooled: dict[str, list] = {}  # first-order ratios of every function, dtype and size
        heavier_anywhere: set[str] = set()

        def run_suite(dtype_name: str, n: int, hvp: bool) -> dict[str, Result]:
            dtype = getattr(torch, dtype_name)
            results = {}
            for name in names:
                if sys.stderr.isatty():
                    print(f"  ... {dtype_name} n={n:,} {name}", file=sys.stderr, flush=True)
                fns = variant_fns(name, gen.module, fused_module, CASES[name], compiled_cache)
                problem = make_problem(CASES[name], n, dtype, dev, hvp)
                results[name] = measure(fns, problem, dev, args.repeats, dtype)
            return results

        for dtype_name in args.dtypes:
            for n in args.sizes:
                results = run_suite(dtype_name, n, hvp=False)
                summary, cols, heavier = report_first_order(results, dtype_name, n)
                summaries.append((f"{dtype_name} n={n:,}", summary))
                for k, values in cols.items():
                    pooled.setdefault(k, []).extend(values)
                heavier_anywhere.update(heavier)
            for n in args.hvp_sizes:
                results = run_suite(dtype_name, n, hvp=True)
                summaries.append((f"{dtype_name} n={n:,}", report_hvp(results, dtype_name, n)))
    heading("== summary: ratios of median times, median (and geomean) over the suite")
    for label, summary in summaries:
        print(f"{label}: {summary_line(summary)}")
    if pooled:
        # The targets read "median over the suite": here every function at every
        # dtype and size of this run is one sample (the lines above are one cell each).
        cells = len(pooled["gen/naive f+b"]) // max(1, len(names))
        targets = ("gen/naive f+b", "fused/comp f+b", "fused/builtin f+b")
        whole = {f"{k} median": suite_median(pooled[k]) for k in targets}
        counts = ", ".join(f"{k} over {sum(v is not None for v in pooled[k])}" for k in targets)
        print(f"\nwhole suite, first order ({len(names)} functions x {cells} dtype/size cells):")
        print(f"  {summary_line(whole)} ({counts} ratios)")
        print(
            "  saved for backward, generated > builtin in any cell: "
            f"{', '.join(sorted(heavier_anywhere)) or 'none'}"
        )
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark symgrad's generated TensorFlow code against the naive formula and tf builtins.

    python benchmarks/bench_tf.py             # default run (CPU: 4-6 minutes on 2 cores)
    python benchmarks/bench_tf.py --quick     # smoke run, < 1 minute

The perf spec (benchmarks/specs/perf.yaml) is generated into a temporary directory at
start-up with symgrad's Python API and imported from there. For every function, dtype and
size, a forward + backward step (GradientTape, upstream gradient given) is timed for

  generated  the generated function (nested tf.custom_gradient)
  naive      the naive formula in plain tf ops, as the spec writes it (TF derives the gradient)
  builtin    the tf.math / tf.nn op where one exists

each run three ways: eagerly, inside tf.function, and inside tf.function(jit_compile=True)
(XLA). All nine are interleaved repeat by repeat; medians are reported, then ratios.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no oneDNN / CPU-feature banners

import numpy as np
import tensorflow as tf
from common import (
    fmt_ratio,
    fmt_samples,
    generate_module,
    geomean,
    median,
    print_codegen_times,
    print_table,
    ratio,
    short_reason,
    suite_median,
)

VARIANTS = ("generated", "naive", "builtin")
MODES = ("eager", "function", "xla")
SHORT = {"generated": "gen", "naive": "naive", "builtin": "builtin"}


# --------------------------------------------------------------------------- naive formulas
# Each is the spec's `output:` transcribed literally into tf ops (no shared
# subexpressions, no stabilisation).


def naive_softplus(x):
    return tf.math.log(1 + tf.math.exp(x))


def naive_silu(x):
    return x / (1 + tf.math.exp(-x))


def naive_mish(x):
    return x * tf.math.tanh(tf.math.log(1 + tf.math.exp(x)))


def naive_gelu_erf(x):
    return x * (1 + tf.math.erf(x / math.sqrt(2))) / 2


def naive_gelu_tanh(x):
    return 0.5 * x * (1 + tf.math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def naive_elu(x):
    return tf.where(x > 0, x, tf.math.exp(x) - 1)


def naive_log_sigmoid(x):
    return tf.math.log(1 / (1 + tf.math.exp(-x)))


def naive_gated_mix(x, y, z):
    return x * tf.math.sigmoid(y) + z * tf.math.tanh(x)


def naive_focal_loss(z, target, gamma=2.0):
    return -(
        target * (1 - tf.math.sigmoid(z)) ** gamma * tf.math.log(tf.math.sigmoid(z))
        + (1 - target) * tf.math.sigmoid(z) ** gamma * tf.math.log(1 - tf.math.sigmoid(z))
    )


def naive_bce_with_logits(z, target):
    return -(
        target * tf.math.log(1 / (1 + tf.math.exp(-z)))
        + (1 - target) * tf.math.log(1 - 1 / (1 + tf.math.exp(-z)))
    )


def naive_huber(pred, target):
    return tf.where(
        tf.math.abs(pred - target) <= 1,
        (pred - target) ** 2 / 2,
        tf.math.abs(pred - target) - 1 / 2,
    )


def naive_student_t_logpdf(x, nu=3.0):
    return (
        math.lgamma((nu + 1) / 2)
        - math.lgamma(nu / 2)
        - math.log(math.sqrt(nu * math.pi))
        - (nu + 1) / 2 * tf.math.log(1 + x**2 / nu)
    )


@dataclass(frozen=True)
class Case:
    """Inputs as (name, kind): "randn" gets a gradient, "unit" (uniform [0, 1)) does not."""

    inputs: tuple[tuple[str, str], ...]
    naive: Callable
    builtin: Callable | None = None
    builtin_name: str = "-"


X = (("x", "randn"),)
CASES: dict[str, Case] = {
    "softplus": Case(X, naive_softplus, tf.math.softplus, "tf.math.softplus"),
    "silu": Case(X, naive_silu, tf.nn.silu, "tf.nn.silu"),
    "mish": Case(X, naive_mish, None, "- (none in core TF)"),
    "gelu_erf": Case(X, naive_gelu_erf, lambda x: tf.nn.gelu(x, approximate=False), "tf.nn.gelu"),
    "gelu_tanh": Case(
        X, naive_gelu_tanh, lambda x: tf.nn.gelu(x, approximate=True), "tf.nn.gelu(approximate)"
    ),
    "elu": Case(X, naive_elu, tf.nn.elu, "tf.nn.elu"),
    "log_sigmoid": Case(X, naive_log_sigmoid, tf.math.log_sigmoid, "tf.math.log_sigmoid"),
    "gated_mix": Case((("x", "randn"), ("y", "randn"), ("z", "randn")), naive_gated_mix),
    "focal_loss": Case((("z", "randn"), ("target", "unit")), naive_focal_loss),
    "bce_with_logits": Case(
        (("z", "randn"), ("target", "unit")),
        naive_bce_with_logits,
        lambda z, t: tf.nn.sigmoid_cross_entropy_with_logits(labels=t, logits=z),
        "tf.nn.sigmoid_cross_entropy_with_logits",
    ),
    "huber": Case(
        (("pred", "randn"), ("target", "randn")),
        naive_huber,
        None,
        "- (keras' huber reduces over the last axis)",
    ),
    "student_t_logpdf": Case(X, naive_student_t_logpdf, None, "- (needs tensorflow_probability)"),
}


# --------------------------------------------------------------------------- measurement


def make_step(fn: Callable, mask: tuple[bool, ...], mode: str, dtype: tf.DType) -> Callable:
    """forward + GradientTape backward of ``fn``, called as step(*inputs, gy)."""

    def step(*args):
        *inputs, gy = args
        diff = [t for t, d in zip(inputs, mask) if d]
        with tf.GradientTape() as tape:
            tape.watch(diff)
            out = fn(*inputs)
        return [out, *tape.gradient(out, diff, output_gradients=gy)]

    if mode == "eager":
        return step
    # One trace per dtype serves every size; XLA still compiles once per shape.
    signature = [tf.TensorSpec([None], dtype)] * (len(mask) + 1)
    return tf.function(step, input_signature=signature, jit_compile=mode == "xla")


@dataclass
class Result:
    samples: dict[tuple[str, str], list[float] | None]  # (variant, mode) -> seconds
    first_s: dict[tuple[str, str], float | None]
    notes: dict[tuple[str, str], str]


def make_inputs(case: Case, n: int, dtype: tf.DType) -> list[tf.Tensor]:
    rng = np.random.default_rng(0)
    np_dtype = dtype.as_numpy_dtype
    tensors = []
    for _, kind in case.inputs:
        data = rng.standard_normal(n) if kind == "randn" else rng.random(n)
        tensors.append(tf.constant(data.astype(np_dtype)))
    tensors.append(tf.constant(rng.standard_normal(n).astype(np_dtype)))  # upstream gradient
    return tensors


def max_rel_err(got: list[tf.Tensor], ref: list[tf.Tensor]) -> float:
    errs = []
    for a, b in zip(got, ref):
        a, b = a.numpy(), b.numpy()
        errs.append(float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1.0))))
    return max(errs)


def measure(steps: dict, args_: list[tf.Tensor], repeats: int, dtype: tf.DType) -> Result:
    """Two untimed calls per (variant, mode): the first (tracing / XLA compile) with an
    agreement check against generated eager, then one warm-up; then ``repeats`` timed
    calls of all of them, interleaved."""
    every = [(v, m) for v in VARIANTS for m in MODES]
    res = Result(dict.fromkeys(every), dict.fromkeys(every), {})
    tol = 1e-3 if dtype == tf.float32 else 1e-6
    steps = dict(steps)
    ref = None
    for key, step in steps.items():
        if step is None:
            continue
        try:
            t0 = time.perf_counter()
            got = step(*args_)
            res.first_s[key] = time.perf_counter() - t0
            step(*args_)
        except Exception as exc:  # noqa: BLE001 - reported: the table shows n/a
            res.notes[key] = short_reason(exc)
            steps[key] = None
            continue
        if key == ("generated", "eager"):
            ref = got
        elif ref is not None:
            err = max_rel_err(got, ref)
            if not err <= tol:
                res.notes[key] = f"disagrees with generated: max rel err {err:.2g} > {tol:g}"
        del got
    del ref
    active = [k for k, s in steps.items() if s is not None]
    for k in active:
        res.samples[k] = []
    for r in range(repeats):
        for key in active[r % len(active) :] + active[: r % len(active)]:
            t0 = time.perf_counter()
            steps[key](*args_)
            res.samples[key].append(time.perf_counter() - t0)
    return res


# --------------------------------------------------------------------------- reporting


def heading(text: str) -> None:
    print(f"\n{text}\n{'=' * len(text)}")


def summary_line(summary: dict[str, float | None]) -> str:
    return "; ".join(f"{k} {fmt_ratio(v)}" for k, v in summary.items())


def report(results: dict[str, Result], dtype_name: str, n: int) -> dict:
    heading(f"== fwd+bwd (GradientTape), {dtype_name}, n = {n:,}")
    keys = [(v, m) for m in MODES for v in VARIANTS]
    rows = [[name] + [fmt_samples(r.samples[k]) for k in keys] for name, r in results.items()]
    headers = ["function"] + [f"{SHORT[v]} {m}" for v, m in keys]
    print_table(headers, rows, "median times, ms (* = interquartile range > 25% of the median)")

    cols: dict[str, list] = {}
    for m in MODES:
        cols[f"gen/naive {m}"] = []
        cols[f"gen/builtin {m}"] = []
    cols["gen xla/gen eager"] = []
    cols["naive xla/gen eager"] = []
    rows = []
    for name, r in results.items():
        s = r.samples
        for m in MODES:
            cols[f"gen/naive {m}"].append(ratio(s["generated", m], s["naive", m]))
            cols[f"gen/builtin {m}"].append(ratio(s["generated", m], s["builtin", m]))
        cols["gen xla/gen eager"].append(ratio(s["generated", "xla"], s["generated", "eager"]))
        cols["naive xla/gen eager"].append(ratio(s["naive", "xla"], s["generated", "eager"]))
        rows.append([name] + [fmt_ratio(c[-1]) for c in cols.values()])
    print_table(["function", *cols], rows, "time ratios of medians (< 1: the first is faster)")
    summary = {f"{k} median": suite_median(c) for k, c in cols.items() if k.startswith("gen/")}
    summary["gen/naive eager geomean"] = geomean(cols["gen/naive eager"])
    print(f"\nsuite: {summary_line(summary)}")
    for m in ("function", "xla"):
        first = [r.first_s["generated", m] for r in results.values()]
        first = [f for f in first if f is not None]
        if first:
            print(f"generated, {m}: first call (trace/compile + run), median {median(first):.2f} s")
    by_reason: dict[str, list[str]] = {}
    for fn, r in results.items():
        for (v, m), reason in r.notes.items():
            by_reason.setdefault(f"{v} {m}: {reason}", []).append(fn)
    for reason, fns in by_reason.items():
        print(f"  note [{', '.join(fns)}] {reason}")
    return summary


# --------------------------------------------------------------------------- main

#: --quick's subset: one-input (with and without builtin), three-input, non-differentiable
#: target, two differentiable inputs with Piecewise.
QUICK = ("softplus", "mish", "gated_mix", "bce_with_logits", "huber")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 8_000_000])
    p.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    p.add_argument("--repeats", type=int, default=5, help="timed calls per variant (median)")
    p.add_argument("--functions", nargs="+", default=None, help="subset of the suite")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="TF intra- and inter-op threads (default 1; 0: TF's default). See README",
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
    unknown = set(args.functions or []) - set(CASES)
    if unknown:
        p.error(f"unknown function(s) {sorted(unknown)}; choose from {list(CASES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # every step is its own tf.function: retracing warnings
    if args.threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    start = time.perf_counter()
    print(
        f"tensorflow {tf.__version__}, CPU only, intra-op threads "
        f"{tf.config.threading.get_intra_op_parallelism_threads() or 'default'}, "
        f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"
    )
    print(
        f"sizes {args.sizes}, dtypes {args.dtypes}, modes {args.modes}; medians of "
        f"{args.repeats} timed calls per (variant, mode), interleaved, after 2 untimed"
    )
    with tempfile.TemporaryDirectory(prefix="symgrad-bench-") as tmp:
        gen = generate_module("tensorflow", Path(tmp), args.functions)
        print_codegen_times(gen)
        names = [n for n in CASES if args.functions is None or n in args.functions]
        print_table(
            ["function", "inputs", "builtin"],
            [[n, ", ".join(i for i, _ in CASES[n].inputs), CASES[n].builtin_name] for n in names],
            "suite",
        )
        summaries = []
        for dtype_name in args.dtypes:
            dtype = getattr(tf, dtype_name)
            steps = {}
            for name in names:
                case = CASES[name]
                mask = tuple(kind == "randn" for _, kind in case.inputs)
                fns = {"generated": getattr(gen.module, name), "naive": case.naive}
                fns["builtin"] = case.builtin
                steps[name] = {
                    (v, m): None if fn is None else make_step(fn, mask, m, dtype)
                    for v, fn in fns.items()
                    for m in MODES
                    if m in args.modes
                }
            for n in args.sizes:
                results = {}
                for name in names:
                    if sys.stderr.isatty():
                        print(f"  ... {dtype_name} n={n:,} {name}", file=sys.stderr, flush=True)
                    inputs = make_inputs(CASES[name], n, dtype)
                    results[name] = measure(steps[name], inputs, args.repeats, dtype)
                summaries.append((f"{dtype_name} n={n:,}", report(results, dtype_name, n)))
    heading("== summary: ratios of median times, median over the suite")
    for label, summary in summaries:
        print(f"{label}: {summary_line(summary)}")
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

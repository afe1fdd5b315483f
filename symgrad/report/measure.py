"""Accuracy measurement: symgrad's generated code vs plain autograd, point by point.

See :mod:`symgrad.report` for what is measured and how.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import mpmath
import sympy

from symgrad.cases import Quantity, quantities
from symgrad.derive import Derived, derive_function
from symgrad.errors import SpecError
from symgrad.load import imported
from symgrad.numerics.floats import (
    _check_dtype,
    bits_of_error,
    round_to,
    ulp_distance,
)
from symgrad.numerics.mp import Undefined, evaluate, exact, to_float
from symgrad.numerics.points import (
    RANGE_ENDS,
    dtype_extremes,
    float_domain,
    sample_values,
    scalar_value,
    tame_value,
)
from symgrad.spec import Function, Spec

#: Supported dtypes: name -> (struct float format, struct int format, bits).
#: Precisions (bits) at which a disputed naive reference is evaluated again.
RETRY_PRECISIONS = (16384, 65536)
#: Above this input magnitude a retry cannot help (exp(-x) needs ~1.44 x bits) and is slow.
RETRY_MAX_INPUT = 40000.0
#: Two exact values within this many float64 ulps agree (symgrad's Taylor branches are
#: float64-accurate approximations, not identities).
AGREE_ULPS = 2**24
#: A symgrad mean this many bits above naive's counts as a regression.
WORSE_MARGIN_BITS = 0.5


# --------------------------------------------------------------------------- sample points
def sample_points(
    fn: Function,
    n: int,
    rng: random.Random,
    dtype: str = "float64",
    range_ends: bool = True,
) -> list[dict[str, float]]:
    """Points for ``fn``: extreme points first, then ``n`` Herbie-style random points.

    Extreme points put one differentiable input (or the only tensor input) at each of its
    extreme values and the other tensors at a tame value; random points draw every tensor
    input independently. Scalars take their defaults. ``range_ends`` (the default): the
    extreme values include the ends of the dtype's range inside the domain
    (``RANGE_ENDS``, where the accuracy choice measures too: ``x + sqrt(x*x - 1)``
    overflows past 9e307), which points drawn over the bit patterns almost never reach.
    """
    tensors = [i for i in fn.inputs if i.is_tensor]
    scalars = {i.name: scalar_value(i) for i in fn.inputs if not i.is_tensor}
    tame = {i.name: round_to(tame_value(i), dtype) for i in tensors}
    points: list[dict[str, float]] = []
    for inp in tensors:
        if not inp.gets_gradient and len(tensors) > 1:
            continue
        values = dtype_extremes(inp, dtype)
        if range_ends:
            lo, hi = float_domain(inp, dtype)
            ends = {round_to(v, dtype) for v in RANGE_ENDS}
            values += sorted(v for v in ends - set(values) if math.isfinite(v) and lo <= v <= hi)
        for v in values:
            points.append({**tame, inp.name: v, **scalars})
    columns = {i.name: sample_values(i, n, rng, dtype) for i in tensors}
    for k in range(n):
        points.append({**{name: col[k] for name, col in columns.items()}, **scalars})
    return points


# --------------------------------------------------------------------------- quantities
# --------------------------------------------------------------------------- exact values
#: The reference at a point was left out: naive and stable exact values disagree.
DISPUTED = "disputed"
Exact = float | None | str  # a float64 value, None (undefined) or DISPUTED


def _agree(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return False
    return ulp_distance(a, b) <= AGREE_ULPS


def _evaluate_at(expr: sympy.Expr, env: Mapping[sympy.Symbol, float], prec: int) -> float | None:
    with mpmath.workprec(prec):
        values = {s: mpmath.mpf(v) for s, v in env.items()}
        try:
            return to_float(evaluate(expr, values))
        except (Undefined, ArithmeticError, ValueError):
            return None


def reference_value(
    reference: sympy.Expr, stable: sympy.Expr | None, env: Mapping[sympy.Symbol, float]
) -> Exact:
    """The exact value (float64) of ``reference`` at ``env``, cross-checked when suspicious.

    A naive reference that is undefined, infinite or zero may be an artefact of finite
    precision (``1 - 1/(1 + exp(-x))`` is 0 at any precision for huge x); then the exact
    value of the stable formula decides, after retrying the naive one at higher precision.
    Returns None where the value is undefined and :data:`DISPUTED` where the two disagree
    or mpmath fails (it raises OverflowError for ``erfc`` of a huge argument).
    """
    try:
        value = exact(reference, env)
    except (ArithmeticError, ValueError):  # mpmath fails on some huge arguments
        return DISPUTED
    suspicious = value is None or value == 0 or math.isinf(value)
    if not suspicious or stable is None:
        return value
    try:
        check = exact(stable, env)
    except (ArithmeticError, ValueError):
        return DISPUTED
    if _agree(value, check):
        return value
    if all(abs(v) <= RETRY_MAX_INPUT for v in env.values()):
        for prec in RETRY_PRECISIONS:
            retried = _evaluate_at(reference, env, prec)
            if _agree(retried, check):
                return retried
    return DISPUTED


def _exact_chunk(
    exprs: Sequence[tuple[sympy.Expr, sympy.Expr | None]],
    envs: Sequence[Mapping[sympy.Symbol, float]],
) -> list[list[Exact]]:
    """Reference values of every quantity at every point of a chunk (runs in workers too)."""
    return [[reference_value(r, s, env) for r, s in exprs] for env in envs]


def _exact_values(
    exprs: Sequence[tuple[sympy.Expr, sympy.Expr | None]],
    envs: Sequence[Mapping[sympy.Symbol, float]],
    budget: float | None,
    pool: ProcessPoolExecutor | None,
    chunk: int = 4,
) -> list[list[Exact] | None]:
    """Reference values per point (None for a point not reached within ``budget`` seconds)."""
    deadline = None if budget is None else time.monotonic() + budget
    results: list[list[Exact] | None] = [None] * len(envs)
    if pool is None:
        for k, env in enumerate(envs):
            if deadline is not None and time.monotonic() > deadline:
                break
            results[k] = _exact_chunk(exprs, [env])[0]
        return results
    futures: dict[Future, int] = {}
    for start in range(0, len(envs), chunk):
        futures[pool.submit(_exact_chunk, list(exprs), list(envs[start : start + chunk]))] = start
    pending = set(futures)
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in done:
            if not fut.cancelled():
                start = futures[fut]
                for offset, values in enumerate(fut.result()):
                    results[start + offset] = values
        if deadline is not None and time.monotonic() > deadline:
            for fut in pending:
                fut.cancel()
            for fut in wait(pending).done:  # running chunks finish; cancelled ones are skipped
                if not fut.cancelled():
                    start = futures[fut]
                    for offset, values in enumerate(fut.result()):
                        results[start + offset] = values
            break
    return results


# --------------------------------------------------------------------------- torch values
def generated_module(spec: Spec, derived: Sequence[Derived]) -> ModuleType:
    """symgrad's torch module for ``derived`` (generated into a temporary dir and imported)."""
    from symgrad.generate import generate

    functions = tuple(d.function for d in derived)
    sub = dataclasses.replace(spec, functions=functions, targets=("torch",), tensor_functions=())
    (file,) = generate(sub, targets=("torch",), tests=False, derived=tuple(derived))
    with imported(file.name, file.text) as (module, _):
        return module


Outputs = Callable[[Mapping[str, Any]], Sequence[Any]]


def symgrad_outputs(module: ModuleType, fn: Function) -> Outputs:
    """Call the generated wrapper of ``fn``: tensors positionally, scalars by keyword."""

    def call(values: Mapping[str, Any]) -> Sequence[Any]:
        wrapper = getattr(module, fn.name)
        args = [values[i.name] for i in fn.inputs if i.is_tensor]
        kwargs = {i.name: values[i.name] for i in fn.inputs if not i.is_tensor}
        result = wrapper(*args, **kwargs)
        return tuple(result) if isinstance(result, (tuple, list)) else (result,)

    return call


def naive_source(derived: Derived) -> list[str]:
    """The naive output formulas as torch source, exactly as written (not stabilised)."""
    from symgrad.printers import TorchPrinter

    printer = TorchPrinter(scalars=derived.scalars, as_written=True)
    return [printer.doprint(expr) for _, expr in derived.naive_outputs]


def naive_outputs(derived: Derived) -> Outputs:
    """Evaluate the naive formulas with torch ops, for plain autograd to differentiate.

    The source is printed by symgrad from the parsed SymPy formula (never spec text), and
    evaluated with only ``torch``, ``math``, ``abs``/``max``/``min`` and the inputs in scope.
    """
    import torch

    codes = [
        compile(src, f"<naive {derived.function.name}>", "eval") for src in naive_source(derived)
    ]

    scope = {"__builtins__": {"abs": abs, "max": max, "min": min}, "torch": torch, "math": math}

    def call(values: Mapping[str, Any]) -> Sequence[Any]:
        ref = next(v for v in values.values() if isinstance(v, torch.Tensor))
        outs = []
        for code in codes:
            out = eval(code, scope, dict(values))  # our own printed source
            out = torch.as_tensor(out, dtype=ref.dtype, device=ref.device)
            if out.shape != ref.shape:
                out = out.expand(ref.shape)
            outs.append(out)
        return outs

    return call


def device_problem(device: str) -> str | None:
    """Why torch cannot run on ``device`` here (None: it can), e.g. "cuda" without a GPU."""
    import torch

    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{first} (use cpu, or a device this machine has)"
    return None


def _grad(y: Any, x: Any, create_graph: bool) -> Any:
    """d sum(y) / d x (zeros where y does not depend on x); elementwise, so per point."""
    import torch

    if not y.requires_grad:
        return torch.zeros_like(x)
    (g,) = torch.autograd.grad(
        y, x, torch.ones_like(y), create_graph=create_graph, retain_graph=True, allow_unused=True
    )
    return torch.zeros_like(x) if g is None else g


def torch_values(
    call: Outputs,
    fn: Function,
    qs: Sequence[Quantity],
    points: Sequence[Mapping[str, float]],
    dtype: str,
    device: str = "cpu",
) -> dict[str, list[float] | str]:
    """Every quantity of ``qs`` computed with torch at ``points`` (one batched call each).

    Gradients of output ``o`` take upstream gradient 1 for ``o`` and none for the other
    outputs; second derivatives differentiate that gradient again (``order: 2`` only).
    A quantity whose computation raises gets the error message instead of values (and so
    does everything after a failing forward). The tensors live on ``device``.
    """
    import torch

    tdtype = getattr(torch, dtype)
    values: dict[str, Any] = {}
    for inp in fn.inputs:
        column = [p[inp.name] for p in points]
        if inp.is_tensor:
            values[inp.name] = torch.tensor(
                column, dtype=tdtype, device=device, requires_grad=inp.gets_gradient
            )
        else:
            values[inp.name] = column[0]
    second_order = fn.order >= 2
    result: dict[str, list[float] | str] = {}
    firsts: dict[tuple[int, str], Any] = {}
    with torch.enable_grad():
        try:
            outs = call(values)
        except Exception as exc:  # noqa: BLE001 - reported in the rows
            return {q.label: f"{type(exc).__name__}: {exc}" for q in qs}
        for q in qs:
            try:
                if q.kind == "forward":
                    t = outs[q.output]
                else:
                    assert q.input is not None
                    key = (q.output, q.input)
                    if key not in firsts:
                        firsts[key] = _grad(outs[q.output], values[q.input], second_order)
                    t = firsts[key]
                    if q.kind == "second":
                        t = _grad(t, values[q.partner or q.input], False)
                # clone: autograd may give an unmaterialised zero tensor (abs's second
                # derivative), which has no storage to read.
                t = t.detach().to("cpu", torch.float64).clone()
                result[q.label] = t.reshape(-1).tolist()
            except Exception as exc:  # noqa: BLE001 - reported in the row
                result[q.label] = f"{type(exc).__name__}: {exc}"
    return result


# --------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class Sample:
    """One evaluated point of a row (for plots): inputs, exact and computed values."""

    inputs: tuple[float, ...]
    exact: float
    symgrad: float
    naive: float | None


@dataclass(frozen=True)
class Row:
    """Accuracy of one quantity of one function in one dtype.

    ``naive_*`` are None where plain autograd has no comparable value (the user overrides
    that gradient) or could not run. ``points`` counts the points with a defined, agreed
    exact value; ``undefined`` and ``disputed`` the points left out. ``error`` says why a
    row has no numbers (derivation, generation or evaluation failure).
    """

    function: str
    quantity: str
    dtype: str
    points: int
    symgrad_mean_bits: float
    symgrad_max_bits: float
    symgrad_nonfinite: int
    naive_mean_bits: float | None
    naive_max_bits: float | None
    naive_nonfinite: int | None
    undefined: int = 0
    disputed: int = 0
    error: str | None = None
    samples: tuple[Sample, ...] = field(default=(), repr=False, compare=False)
    input_names: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """The row has numbers: no error and at least one point."""
        return self.error is None and self.points > 0

    @property
    def worse_than_naive(self) -> bool:
        """symgrad's mean bits exceed naive autograd's (by :data:`WORSE_MARGIN_BITS`), or
        symgrad has more non-finite results."""
        if not self.ok or self.naive_mean_bits is None:
            return False
        return (
            self.symgrad_mean_bits > self.naive_mean_bits + WORSE_MARGIN_BITS
            or self.symgrad_nonfinite > (self.naive_nonfinite or 0)
        )

    @property
    def note(self) -> str:
        """What the table's last column says: the error, or flags worth a look."""
        if self.error is not None:
            return self.error
        flags = []
        if self.worse_than_naive:
            flags.append("WORSE")
        if self.symgrad_nonfinite:
            flags.append("NONFINITE")
        return " ".join(flags)


def _failed(fn: Function, label: str, dtype: str, error: str, **counts: int) -> Row:
    """A row without numbers, saying why."""
    nan = math.nan
    return Row(fn.name, label, dtype, 0, nan, nan, 0, None, None, None, error=error, **counts)


def _stats(
    values: Sequence[float], exacts: Sequence[float], dtype: str
) -> tuple[float, float, int]:
    """Mean bits, max bits and non-finite count of ``values`` against ``exacts``."""
    bits = [bits_of_error(v, e, dtype) for v, e in zip(values, exacts)]
    nonfinite = sum(1 for v, e in zip(values, exacts) if math.isfinite(e) and not math.isfinite(v))
    if not bits:
        return math.nan, math.nan, 0
    return sum(bits) / len(bits), max(bits), nonfinite


def _rows_for(
    fn: Function,
    qs: Sequence[Quantity],
    points: Sequence[Mapping[str, float]],
    refs: Sequence[Sequence[Exact]],
    mine: Mapping[str, list[float] | str],
    naive: Mapping[str, list[float] | str],
    dtype: str,
) -> list[Row]:
    """One row per quantity from the torch values (or error messages) of both sides."""
    names = tuple(i.name for i in fn.inputs if i.is_tensor)
    rows = []
    for j, q in enumerate(qs):
        column = [r[j] for r in refs]
        keep = [k for k, v in enumerate(column) if isinstance(v, float)]
        counts = {
            "undefined": sum(1 for v in column if v is None),
            "disputed": sum(1 for v in column if v == DISPUTED),
        }
        m_all = mine[q.label]
        if isinstance(m_all, str):
            rows.append(_failed(fn, q.label, dtype, f"symgrad: {m_all}", **counts))
            continue
        exacts = [round_to(float(column[k]), dtype) for k in keep]  # type: ignore[arg-type]
        m_values = [m_all[k] for k in keep]
        m_stats = _stats(m_values, exacts, dtype)
        n_all = naive[q.label] if q.naive_available else None
        n_values = None if n_all is None or isinstance(n_all, str) else [n_all[k] for k in keep]
        n_stats = (None, None, None) if n_values is None else _stats(n_values, exacts, dtype)
        samples = tuple(
            Sample(
                inputs=tuple(points[k][name] for name in names),
                exact=e,
                symgrad=m_values[idx],
                naive=None if n_values is None else n_values[idx],
            )
            for idx, (k, e) in enumerate(zip(keep, exacts))
        )
        error = f"naive: {n_all}" if isinstance(n_all, str) else None
        rows.append(
            Row(
                fn.name,
                q.label,
                dtype,
                len(keep),
                *m_stats,
                *n_stats,
                **counts,
                error=error,
                samples=samples,
                input_names=names,
            )
        )
    return rows


@contextlib.contextmanager
def _pool(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """Worker processes for the exact values, or None (serial) for one worker.

    Workers are forked, and started at once, before torch or the generated module runs:
    "spawn" would re-run a calling script that lacks an ``if __name__ == "__main__"``
    guard. Where fork is unavailable the evaluation is serial.
    """
    import multiprocessing

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        for started in [pool.submit(int) for _ in range(workers)]:
            started.result()
        yield pool


def measure_function(
    derived: Derived,
    module: ModuleType,
    dtype: str = "float64",
    points: int = 256,
    seed: int = 0,
    budget: float | None = 30.0,
    pool: ProcessPoolExecutor | None = None,
    device: str = "cpu",
    range_ends: bool = True,
) -> list[Row]:
    """Rows for one derived function, with symgrad's code taken from ``module``, run on
    ``device`` (both sides: symgrad's code and autograd of the naive formula);
    ``range_ends``: see :func:`sample_points`."""
    fn = derived.function
    qs = quantities(derived, mixed=True)
    rng = random.Random(f"symgrad-accuracy:{seed}:{fn.name}:{dtype}")
    candidates = sample_points(fn, points, rng, dtype, range_ends)
    envs = [{derived.symbols[name]: v for name, v in p.items()} for p in candidates]
    exprs = [(q.reference, q.stable) for q in qs]
    try:
        refs_or_none = _exact_values(exprs, envs, budget, pool)
    except Exception as exc:  # noqa: BLE001 - e.g. a node mpmath cannot evaluate
        return [_failed(fn, q.label, dtype, f"exact: {type(exc).__name__}: {exc}") for q in qs]
    reached = [(p, r) for p, r in zip(candidates, refs_or_none) if r is not None]
    pts = [p for p, _ in reached]
    refs = [r for _, r in reached]
    if not pts:
        return [
            _failed(fn, q.label, dtype, "no point evaluated within the time budget") for q in qs
        ]
    mine = torch_values(symgrad_outputs(module, fn), fn, qs, pts, dtype, device)
    try:
        naive_call = naive_outputs(derived)
    except Exception as exc:  # noqa: BLE001 - e.g. a formula the printer cannot print
        naive: dict[str, list[float] | str] = {q.label: f"{type(exc).__name__}: {exc}" for q in qs}
    else:
        naive = torch_values(naive_call, fn, qs, pts, dtype, device)
    return _rows_for(fn, qs, pts, refs, mine, naive, dtype)


def measure_spec(
    spec: Spec,
    dtype: str = "float64",
    points: int = 256,
    seed: int = 0,
    budget: float | None = 30.0,
    workers: int = 1,
    functions: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    fused: bool = False,
    device: str = "cpu",
    range_ends: bool = True,
) -> list[Row]:
    """Accuracy rows for every function of ``spec`` (or only those named in ``functions``).

    ``points`` random points per function (plus its extreme points); the exact values of a
    function get at most ``budget`` seconds (None: no limit), after which the points not
    yet evaluated are dropped (``Row.points`` says how many were used). ``workers`` > 1
    evaluates exact values in that many processes. A function that fails to derive,
    generate or run gets a row with ``error`` set instead of stopping the report.
    ``progress`` is called with a line after each function (for a CLI's stderr).
    ``fused`` measures the generated module with ``use_fused()`` on: its math compiled by
    torch.compile (the compiler's own forms of an op included), first and second order.
    ``device`` is where the torch code runs ("cuda": the GPU's kernels, and Triton's when
    ``fused``); the exact values are always computed on the host. ``range_ends`` adds the
    ends of the dtype's range to each input's extreme points (:func:`sample_points`). Second
    derivatives include the mixed ones (:func:`symgrad.cases.quantities` with ``mixed``).
    """
    _check_dtype(dtype)
    chosen = [f for f in spec.functions if functions is None or f.name in functions]
    rows: list[Row] = []
    with _pool(workers) as pool:  # first: workers fork before torch starts threads
        derived: list[Derived] = []
        for fn in chosen:
            try:
                derived.append(derive_function(fn))
            except SpecError as exc:
                rows.append(_failed(fn, "derive", dtype, f"{type(exc).__name__}: {exc}"))
        modules: dict[str, ModuleType] = {}
        try:
            if derived:
                whole = generated_module(spec, derived)
                modules = {d.function.name: whole for d in derived}
                whole.use_fused(fused)
        except Exception:  # noqa: BLE001 - retried per function below, which reports it
            for d in derived:  # find which function breaks generation; keep the others
                try:
                    modules[d.function.name] = generated_module(spec, [d])
                    modules[d.function.name].use_fused(fused)
                except Exception as exc:  # noqa: BLE001
                    error = f"{type(exc).__name__}: {exc}"
                    rows.append(_failed(d.function, "generate", dtype, error))
        for d in derived:
            if d.function.name in modules:
                start = time.monotonic()
                new = measure_function(
                    d,
                    modules[d.function.name],
                    dtype,
                    points,
                    seed,
                    budget,
                    pool,
                    device,
                    range_ends,
                )
                rows += new
                if progress is not None:
                    used = max((r.points + r.undefined + r.disputed for r in new), default=0)
                    progress(f"{d.function.name}: {used} points in {time.monotonic() - start:.1f}s")
    order = {f.name: k for k, f in enumerate(chosen)}
    return sorted(rows, key=lambda r: order[r.function])  # stable: keeps quantity order

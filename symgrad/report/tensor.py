"""Accuracy of tensor functions: the generated torch code and autograd of the naive formula
against exact values, on small tensors whose rows sit at the hard places.

Each function is evaluated on a few small tensors (each named axis of size 3 to 5, batch
axes ``...`` one axis of 2) of several kinds: ordinary values, large ones (+-1e4: logits
whose naive softmax overflows), a large offset with a spread of 1 (mean 1e4: where a
one-pass variance cancels), constant rows and large logits (100 ... 1000). The quantities
are the forward, each input's gradient (upstream: fixed random values) and each input's
second order (the gradient of <gradients, fixed random values>, the double backward).

Exact values come from the function's tape evaluated with mpmath at 256 bits, checked at
384 (an element on which the two disagree after rounding to float64 is left out as
disputed). The naive baseline is autograd of the formula as written, printed by the same
code generator before any stable rewrite (``logsumexp`` written by the user stays one).
"""

from __future__ import annotations

import itertools
import math
from types import ModuleType

import numpy as np

from symgrad.numerics.floats import round_to
from symgrad.report.measure import Row, _failed, _stats
from symgrad.spec import Function
from symgrad.tensor.exact import KINDS, exact_values, sample_inputs

PRECISIONS = (256, 384)


# --------------------------------------------------------------------------- the naive baseline
def _naive_function(fn: Function):
    """Autograd of the formula as written: the forward printed from the tape of the
    formula before any stable rewrite."""
    from symgrad.runtime import copy_in
    from symgrad.tensor.emit import Code, Result
    from symgrad.tensor.lang import parse_tensor_function
    from symgrad.tensor.tape import Output, Tape

    formula = parse_tensor_function(fn, raw=True)
    tape = Tape(formula)
    node = tape.node_of(tape.lower(formula.expr))
    inputs = [i.name for i in fn.inputs]
    lines = Code(tape, "torch", {n: n for n in inputs}).body(
        [Result("out", Output("out", ((node.name, formula.shape),), "out"), None)]
    )
    body = "\n".join(f"    {line}" for line in lines)
    code = f"def naive({', '.join(inputs)}):\n{body}\n    return out\n"
    helpers = copy_in("torch", code)
    source = "\n".join(["import math", "import torch", *helpers.imports, helpers.source, code])
    namespace: dict = {}
    exec(
        compile(source, f"<naive {fn.name}>", "exec"), namespace
    )  # the generator's own code, not the spec's
    return namespace["naive"]


# --------------------------------------------------------------------------- measuring
def _torch_quantities(call, args, leaves, upstream, gg, order):
    import torch

    out = call(*args)
    grads = torch.autograd.grad(out, leaves, upstream, create_graph=order >= 2, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]
    second = []
    if order >= 2:
        total = sum((g * v).sum() for g, v in zip(grads, gg) if g.requires_grad)
        if isinstance(total, torch.Tensor) and total.requires_grad:
            second = torch.autograd.grad(total, leaves, allow_unused=True)
            second = [torch.zeros_like(x) if s is None else s for x, s in zip(leaves, second)]
        else:
            second = [torch.zeros_like(x) for x in leaves]
    return out.detach(), [g.detach() for g in grads], [s.detach() for s in second]


def measure_tensor_function(fn: Function, module: ModuleType, dtype: str) -> list[Row]:
    """Rows (forward, gradient and second order of each input) for one tensor function."""
    import torch

    from symgrad.tensor.plan import derive_tensor

    torch_dtype = getattr(torch, dtype)
    try:
        d = derive_tensor(fn)
        naive = _naive_function(fn)
    except Exception as exc:  # noqa: BLE001 - a row saying why, not a crash of the report
        return [_failed(fn, "derive", dtype, f"{type(exc).__name__}: {exc}")]
    diff = [i for i in fn.inputs if i.gets_gradient]
    labels = ["out"] + [f"grad_{i.name}" for i in diff]
    if fn.order >= 2:
        labels += [f"second_{i.name}" for i in diff]
    collected = {
        lab: {"exact": [], "symgrad": [], "naive": [], "undefined": 0, "disputed": 0}
        for lab in labels
    }
    for kind, seed in itertools.product(KINDS, (0, 1)):
        raw = sample_inputs(fn, kind, seed)
        # the inputs as the dtype holds them: the exact values are of these
        held = {
            k: (
                np.asarray(v, dtype=np.float32 if dtype == "float32" else np.float64)
                if isinstance(v, np.ndarray) and v.dtype.kind == "f"
                else v
            )
            for k, v in raw.items()
        }
        rng = np.random.default_rng(100 + seed)
        args = []
        for inp in fn.inputs:
            v = held[inp.name]
            if not inp.is_tensor:
                args.append(v)
            elif v.dtype.kind == "i":
                args.append(torch.as_tensor(v, dtype=torch.long))
            else:
                args.append(
                    torch.as_tensor(v, dtype=torch_dtype).requires_grad_(inp.differentiable)
                )
        leaves = [a for a, i in zip(args, fn.inputs) if i.gets_gradient]
        with torch.no_grad():
            shape = tuple(module.__dict__[fn.name](*args).shape)
        upstream_np = rng.standard_normal(shape).astype(
            held_dtype := (np.float32 if dtype == "float32" else np.float64)
        )
        gg_np = [rng.standard_normal(tuple(x.shape)).astype(held_dtype) for x in leaves]
        upstream = torch.as_tensor(upstream_np)
        gg = [torch.as_tensor(v) for v in gg_np]
        results = {}
        for name, call in (("symgrad", module.__dict__[fn.name]), ("naive", naive)):
            try:
                results[name] = _torch_quantities(call, args, leaves, upstream, gg, fn.order)
            except Exception:  # noqa: BLE001 - a failing naive baseline has no numbers
                results[name] = None
        exact = {prec: exact_values(fn, d, held, upstream_np, gg_np, prec) for prec in PRECISIONS}
        for label in labels:
            bucket = collected[label]
            ref = exact[PRECISIONS[0]]
            check = exact[PRECISIONS[1]]
            mine = _pick(results["symgrad"], label, diff)
            theirs = _pick(results["naive"], label, diff)
            if ref is None or mine is None:
                bucket["undefined"] += 1
                continue
            for index in np.ndindex(ref[label].shape):
                e, e2 = ref[label][index], check[label][index] if check else None
                if e is None or (isinstance(e, float) and math.isnan(e)):
                    bucket["undefined"] += 1
                    continue
                if e2 is None or round_to(e, "float64") != round_to(e2, "float64"):
                    bucket["disputed"] += 1
                    continue
                bucket["exact"].append(round_to(e, dtype))
                bucket["symgrad"].append(float(mine[index]))
                bucket["naive"].append(float(theirs[index]) if theirs is not None else math.nan)
    rows = []
    for label in labels:
        b = collected[label]
        if not b["exact"]:
            rows.append(
                _failed(
                    fn,
                    label,
                    dtype,
                    "no exact values",
                    undefined=b["undefined"],
                    disputed=b["disputed"],
                )
            )
            continue
        mine = _stats(b["symgrad"], b["exact"], dtype)
        theirs = _stats(b["naive"], b["exact"], dtype)
        rows.append(
            Row(
                fn.name,
                label,
                dtype,
                len(b["exact"]),
                *mine,
                *theirs,
                undefined=b["undefined"],
                disputed=b["disputed"],
            )
        )
    return rows


def _pick(result, label: str, diff) -> np.ndarray | None:
    if result is None:
        return None
    out, grads, second = result
    if label == "out":
        return out.double().numpy()
    names = [i.name for i in diff]
    if label.startswith("grad_"):
        return grads[names.index(label[5:])].double().numpy()
    if not second:
        return None
    return second[names.index(label[7:])].double().numpy()


def tensor_rows(spec, dtype: str, functions=None, progress=None) -> list[Row]:
    """Rows of every tensor function of ``spec`` (or those named)."""
    import dataclasses

    from symgrad.generate import generate
    from symgrad.load import imported

    chosen = [f for f in spec.tensor_functions if functions is None or f.name in functions]
    if not chosen:
        return []
    sub = dataclasses.replace(
        spec, functions=(), tensor_functions=tuple(chosen), targets=("torch",)
    )
    (file,) = generate(sub, targets=("torch",), tests=False)
    with imported(file.name, file.text) as (module, _):
        pass
    rows: list[Row] = []
    for fn in chosen:
        new = measure_tensor_function(fn, module, dtype)
        rows += new
        if progress is not None:
            progress(f"{fn.name}: {max((r.points for r in new), default=0)} elements")
    return rows


__all__ = ["measure_tensor_function", "tensor_rows"]

"""Exact values of a tensor function's forward, gradients and second order (mpmath).

The function's tape (the derived formulas, reductions as whole operations) is evaluated
element by element in mpmath at a given precision on small tensors of several kinds:
ordinary values, large ones (+-1e4), a large offset with a spread of 1 (mean 1e4), constant
rows and large logits. Used by ``symgrad accuracy`` and by the generated tests' reference
values.
"""

from __future__ import annotations

from collections.abc import Sequence

import mpmath
import numpy as np

from symgrad.numerics.mp import evaluate, to_float
from symgrad.spec import Function

KINDS = ("random", "large", "offset", "constant", "logits")


def sample_inputs(
    fn: Function, kind: str, seed: int, small: bool = False
) -> dict[str, np.ndarray | float]:
    """The inputs of ``fn`` of one ``kind`` (see :data:`KINDS`), float64 or integer arrays
    (each named axis of size 3 to 5, or 2 to 3 where ``small``; batch axes '...' one axis
    of 2) and the scalars' defaults."""
    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}
    values: dict[str, np.ndarray | float] = {}
    for inp in fn.inputs:
        if not inp.is_tensor:
            values[inp.name] = float(inp.default) if inp.has_default else 1.0
            continue
        shape = []
        for axis in inp.shape:
            if axis == "...":
                shape.append(2)
            else:
                size = 2 + len(sizes) % 2 if small else 3 + len(sizes) % 3
                shape.append(sizes.setdefault(axis, size))
        shape = tuple(shape)
        if dict(inp.assumptions).get("integer"):
            values[inp.name] = rng.integers(0, 3, shape)
            continue
        lo, hi = inp.domain
        x = (
            rng.uniform(max(lo, -3.0), min(hi, 3.0), shape)
            if lo < 3 and hi > -3
            else (rng.uniform(lo, hi, shape))
        )
        if inp.differentiable:
            x = {
                "random": x,
                "large": 1e4 * rng.standard_normal(shape),
                "offset": 1e4 + rng.standard_normal(shape),
                "constant": np.full(shape, 3.0),
                "logits": rng.choice([-1000.0, -100.0, 0.0, 100.0, 1000.0], shape)
                + rng.standard_normal(shape),
            }[kind]
        values[inp.name] = np.clip(x, lo, hi)
    return values


def _align(arr: np.ndarray, have: Sequence[str], want: Sequence[str]) -> np.ndarray:
    """``arr`` (axes ``have``) transposed and reshaped to broadcast against ``want``."""
    order = [a for a in want if a in have]
    arr = np.transpose(arr, [list(have).index(a) for a in order])
    shape = [arr.shape[order.index(a)] if a in order else 1 for a in want]
    return arr.reshape(shape)


def _mp(x) -> object:
    return mpmath.mpf(float(x))


def _exact_tape(tape, roots: set[str], env: dict[str, np.ndarray], scalars, sizes) -> dict:
    """Every node ``roots`` need, as object arrays of mpf (``env``: the leaves)."""
    values: dict[str, np.ndarray] = {}
    for name in tape.needed(sorted(roots)):
        node = tape.nodes[name]
        if node.op == "leaf":
            values[name] = env[node.input]
        elif node.op == "onehot":
            labels = env[node.input]
            (axis,) = node.over
            size = sizes[tape.formula.size([axis])]
            hot = np.zeros((*labels.shape, size), dtype=object)
            hot[...] = mpmath.mpf(0)
            for index in np.ndindex(labels.shape):
                hot[(*index, int(labels[index]))] = mpmath.mpf(1)
            values[name] = hot
        elif node.op == "elem":
            args = [tape.nodes[a] for a in node.args]
            arrays = [_align(values[a.name], a.axes, node.axes) for a in args]
            shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
            arrays = [np.broadcast_to(a, shape) for a in arrays]
            out = np.empty(shape, dtype=object)
            symbols = [tape.symbol(a.name) for a in args]
            base = {**scalars, **sizes}
            for index in np.ndindex(shape):
                point = {**base, **{s: arr[index] for s, arr in zip(symbols, arrays)}}
                out[index] = evaluate(node.expr, point)
            values[name] = out
        elif node.op == "sum":
            union = [a for a in tape.order if any(a in tape.nodes[n].axes for n in node.args)]
            want = [*node.axes, *(a for a in union if a not in node.axes)]
            product = None
            for arg in node.args:
                term = _align(values[arg], tape.nodes[arg].axes, want)
                product = term if product is None else product * term
            product = np.broadcast_to(product, np.broadcast_shapes(product.shape))
            axes = tuple(range(len(node.axes), len(want)))
            values[name] = product.sum(axis=axes) if axes else product
        else:
            (arg,) = node.args
            b = values[arg]
            b_axes = tape.nodes[arg].axes
            kept = [a for a in b_axes if a not in node.over]
            moved = _align(b, b_axes, [*kept, *node.over])
            rows = moved.reshape((*moved.shape[: len(kept)], -1))
            if node.op in ("max", "min"):
                pick = max if node.op == "max" else min
                values[name] = np.apply_along_axis(pick, -1, rows)
                continue
            lse = np.apply_along_axis(
                lambda r: (lambda m: m + mpmath.log(mpmath.fsum(mpmath.exp(v - m) for v in r)))(
                    max(r)
                ),
                -1,
                rows,
            )
            if node.op == "lse":
                values[name] = lse
            else:
                full = _align(lse, kept, [*kept, *node.over])
                shifted = moved - full
                result = (
                    shifted
                    if node.op == "logsoftmax"
                    else np.vectorize(mpmath.exp, otypes=[object])(shifted)
                )
                values[name] = np.transpose(result, [[*kept, *node.over].index(a) for a in b_axes])
    return values


def _output_value(tape, out, values, shape) -> np.ndarray:
    total = None
    for node, layout in out.parts:
        part = np.broadcast_to(_align(values[node], tape.nodes[node].axes, layout), shape)
        total = part if total is None else total + part
    if total is None:
        total = np.full(shape, mpmath.mpf(0), dtype=object)
    return total


def _size_of(fn: Function, dim: str, held) -> int:
    for inp in fn.inputs:
        if inp.shape and dim in inp.shape:
            return int(np.shape(held[inp.name])[list(inp.shape).index(dim)])
    raise KeyError(dim)


def exact_values(
    fn: Function, d, held: dict, upstream: np.ndarray, gg: Sequence[np.ndarray], prec: int
) -> dict[str, np.ndarray] | None:
    """Exact ``out``, ``grad_<x>`` and (order 2) ``second_<x>`` of derivation ``d`` at the
    inputs ``held`` (upstream gradient ``upstream``; ``gg``: the weights of the second
    order, one per differentiable input), rounded to float64 (object arrays; None where
    undefined). None where the evaluation fails (a pole, an overflow of mpmath)."""
    tape = d.tape
    diff = [i for i in fn.inputs if i.gets_gradient]
    with mpmath.workprec(prec):
        env = {}
        for inp in fn.inputs:
            v = held[inp.name]
            if inp.is_tensor:
                env[inp.name] = v if v.dtype.kind == "i" else np.vectorize(_mp, otypes=[object])(v)
        env["grad"] = np.vectorize(_mp, otypes=[object])(upstream)
        for i, v in zip(diff, gg):
            env[f"gg_{i.name}"] = np.vectorize(_mp, otypes=[object])(v)
        scalars = {s: mpmath.mpf(held[n]) for n, s in tape.formula.scalars.items()}
        for axis in list(tape.formula.dims):  # a size symbol for every axis
            tape.formula.size([axis])
        sizes = {sym: _size_of(fn, tape.formula.sizes[sym], held) for sym in tape.formula.sizes}
        outs = [("out", d.out, upstream.shape)] + [
            (f"grad_{i.name}", g, held[i.name].shape) for i, g in zip(diff, d.grads)
        ]
        if d.second is not None:
            for k, i in enumerate(diff):
                parts = tuple(p for row in d.second for p in row[k].parts)
                outs.append(
                    (
                        f"second_{i.name}",
                        type(d.out)(f"s_{i.name}", parts, i.name),
                        held[i.name].shape,
                    )
                )
        roots = {n for _, o, _ in outs for n, _ in o.parts}
        try:
            values = _exact_tape(tape, roots, env, scalars, sizes)
            return {
                label: np.vectorize(to_float, otypes=[object])(_output_value(tape, o, values, s))
                for label, o, s in outs
            }
        except (ArithmeticError, ValueError):
            return None

"""Helpers of the generated PyTorch modules: the fused path, the in-place helpers of
code that records no graph, and forms of ops for compiled code.

Plain Python on torch alone, tested directly (tests/test_runtime.py). A generated module
holds a copy of the helpers it uses, with the ones they use (symgrad.runtime.copy_in), so
that it depends on torch alone; the private torch APIs are in :mod:`torch_private`.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import warnings
from collections.abc import Callable

import torch

from .shared_helpers import _root_newton, _root_powers
from .torch_private import (
    _mark_dynamic_hinted,
    _recompile_limit_hit,
    _transforms_active,
)

# The fused path: the math of every forward and backward through torch.compile, one fused
# kernel each (a backward without create_graph is one call for all its gradients). The
# autograd structure around it stays eager, so double backward, forward mode and vmap are
# unchanged. Off by default; `use_fused()` turns it on.
_fused_enabled = False
# (math function, kinds of its arguments) -> its compiled version (the math function
# itself after a compiler failure).
_compiled: dict[tuple, Callable] = {}
_fresh_copies: dict[tuple, int] = {}
# The tensor size the fused path's kernels are tuned for. Compiled for dynamic shapes, a
# kernel keeps what inductor chose for the size of the call that compiled it (on a CPU,
# whether to use threads), and inductor's cache keeps it for later processes: compiled on
# 1000 elements, the fused softplus forward took 7.0 ms on 8M float32, not 3.6 (2 threads).
_SIZE_HINT = 1 << 24
# Math functions with a form of their own for the fused path: as accurate, but chosen for
# fewest operations (compiled, an operation is no pass over memory of its own).
_FUSED_FORMS: dict[Callable, Callable] = {}


def use_fused(enabled: bool = True) -> None:
    """Compile this module's forward and backward math with ``torch.compile``.

    Dynamic shapes (no recompiles for new sizes); where compilation fails the eager code
    runs instead, with a warning.
    """
    global _fused_enabled
    _fused_enabled = enabled


class _Function(torch.autograd.Function):
    """The base of the generated autograd Functions: vmap from their own formulas
    (``generate_vmap_rule``), and ``forward``'s signature computed once: ``apply`` binds
    its arguments to it on every call, and ``inspect.signature`` costs ~4 us of a ~14 us
    call (inspect returns a function's ``__signature__``)."""

    generate_vmap_rule = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.forward.__signature__ = inspect.signature(cls.forward)


def _without_jvp(function: type) -> type:
    """The Function ``function`` without its jvp, what torch.compile traces: dynamo cannot
    trace a custom jvp (so compiled code has no forward mode)."""
    return type(
        f"_{function.__name__}", (function,), {"jvp": torch.autograd.Function.jvp}
    )


def _apply(function: type, traced: type, *args):
    """``function.apply(*args)``; ``traced`` (``function`` without its jvp) under
    torch.compile."""
    return (traced if torch.compiler.is_compiling() else function).apply(*args)


def _grad(needed: bool, function: type, traced: type, *args):
    """The gradient that the Function ``function`` computes from ``args``, if ``needed``:
    where autograd records (create_graph=True), a call of the Function, whose backward is
    the second order; otherwise its forward alone, with no graph."""
    if not needed:
        return None
    if torch.is_grad_enabled():
        return _apply(function, traced, *args)
    return function.forward(*args)


def _sum_to(grad: torch.Tensor | None, shape: torch.Size) -> torch.Tensor | None:
    """``grad`` summed to ``shape``: the gradient of an input that was broadcast."""
    return None if grad is None else grad.sum_to_size(shape)


def _run(math_fn: Callable, *args):
    """``math_fn(*args)``, through its compiled version when the fused path is on (and its
    fused form, if it has one, wherever it is compiled: a user's torch.compile too)."""
    if torch.compiler.is_compiling():
        # Fresh tensors, not ones an in-place op of math_fn wrote: torch 2.11's dynamo
        # routes the gradient of such an output of an autograd.Function to the wrong slot
        # (pytorch/pytorch#180642, fixed in 2.12). Inductor fuses the copies away.
        result = _FUSED_FORMS.get(math_fn, math_fn)(*args)
        if isinstance(result, tuple):
            return tuple(None if t is None else t.clone() for t in result)
        return result.clone()
    if not _fused_enabled or _transforms_active():
        return math_fn(*args)  # (dynamo does not trace vmap's batched tensors)
    key = (math_fn, _kinds(args))
    compiled = _compiled.get(key)
    if compiled is math_fn:
        return math_fn(*args)
    compiling = compiled is None
    if (
        compiling
    ):  # a new kind of call: a compiled copy of its own, tuned for large tensors
        fused = _FUSED_FORMS.get(math_fn, math_fn)
        compiled = _compiled[key] = torch.compile(
            _own_code(fused), dynamic=True, fullgraph=True
        )
    try:
        return compiled(*(_size_hinted(args) if compiling else args))
    except Exception as error:  # noqa: BLE001 - any compiler failure: keep the eager code
        if (
            _recompile_limit_hit(error)
            and not compiling
            and _fresh_copies.get(key, 0) < 2
        ):
            # This kind of call alone has had 8 versions (layouts: transposed, sliced,
            # sizes 0 and 1): a fresh copy, twice at most.
            _fresh_copies[key] = _fresh_copies.get(key, 0) + 1
            _compiled.pop(key, None)
            return _run(math_fn, *args)
        try:
            result = math_fn(*args)
        except Exception:
            if compiling:  # the caller's own error: the next call compiles afresh
                _compiled.pop(key, None)
            raise
        warnings.warn(
            f"torch.compile unavailable ({error}); using eager code", stacklevel=3
        )
        _compiled[key] = math_fn
        return result


def _own_code(fn: Callable) -> Callable:
    """``fn`` with a code object of its own. Dynamo keeps a function's compiled versions
    on its code object, at most 8 (``recompile_limit``), and under fullgraph=True a ninth
    is an error; a copy per kind of call keeps each to the layouts of one kind (and a call
    checks the guards of that kind only). torch.compile's own ``isolate_recompiles`` does
    this in recent torch (2.13); a copy does it in every version."""
    copy = types.FunctionType(
        fn.__code__.replace(),
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        fn.__closure__,
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def _kinds(args: tuple) -> tuple:
    """What of ``args`` compiled code is specialised on (besides sizes and layout): the
    type, dtype, device, rank and requires_grad of tensors, the value of flags."""
    return tuple(
        [
            (type(a), a.dtype, a.device, a.ndim, a.requires_grad)
            if isinstance(a, torch.Tensor)
            else a
            if isinstance(a, bool)
            else None
            for a in args
        ]
    )


def _size_hinted(args: tuple) -> tuple:
    """``args`` with the tensors replaced by aliases whose largest dimension tells
    torch.compile to tune its kernels for ``_SIZE_HINT`` elements (the sizes stay dynamic:
    the hint changes how fast a kernel is, not what it computes)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if any(type(a) is not torch.Tensor for a in tensors):
        # Dynamo keeps a Parameter's sizes static (and a size shared with one); subclasses
        # go as they are.
        return args
    try:
        shape = torch.broadcast_shapes(*(a.shape for a in tensors))  # the work's shape
    except RuntimeError:  # shapes that do not broadcast: the call will say so
        return args
    size = max(shape, default=1)
    if not 0 < shape.numel() < _SIZE_HINT or size < 2:
        return args
    # Every dimension of that size gets the same hint, so dynamo's symbol for it is shared.
    hint = size * math.ceil((_SIZE_HINT / shape.numel()) ** (1 / shape.count(size)))
    hinted = []
    for a in args:
        if isinstance(a, torch.Tensor) and size in a.shape:
            a = a.detach().requires_grad_(a.requires_grad)  # (dynamo guards on it)
            for dim, n in enumerate(a.shape):
                if n == size and not _mark_dynamic_hinted(a, dim, hint):
                    return args  # (torch 2.8 and older: no hints)
        hinted.append(a)
    return tuple(hinted)


def _broadcast_result(value, *inputs: torch.Tensor) -> torch.Tensor:
    """``value`` (a tensor or a number) at the shape, dtype and device of ``inputs``
    broadcast together: the result of a formula that no longer reads every input
    (``sin(x)**2 + cos(x)**2 + cosh(y)`` simplified to ``cosh(y)``, or to a number) has the
    shape and dtype that the formula as written would have."""
    shape = torch.broadcast_shapes(*(t.shape for t in inputs))
    # torch's type promotion, 0-dim rule included, on empty stand-ins of the inputs
    stand_ins = [torch.empty((0,) * min(t.dim(), 1), dtype=t.dtype) for t in inputs]
    if isinstance(value, torch.Tensor):
        stand_ins.append(torch.empty((0,) * min(value.dim(), 1), dtype=value.dtype))
    dtype = sum(stand_ins[1:], stand_ins[0]).dtype
    if not isinstance(value, torch.Tensor):
        return torch.full(shape, value, dtype=dtype, device=inputs[0].device)
    if value.shape == shape and value.dtype == dtype:
        return value
    # a tensor of its own, not a view: the caller may write into it
    return value.to(dtype).expand(shape).contiguous()


def _check_broadcast(name: str, **tensors) -> None:
    """Raise an error naming the function and the shapes where the inputs of an
    elementwise function do not broadcast (torch's own says only which sizes differ)."""
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in tensors.items()}
    try:
        torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        got = ", ".join(f"{k} {s}" for k, s in shapes.items())
        raise RuntimeError(  # torch's own type for it
            f"{name}(): the inputs do not broadcast: {got}. {name} is elementwise (its inputs "
            "broadcast against each other as in x * y; no matrix products or reductions)"
        ) from None


def _check_axis(name: str, axis: str, *uses: tuple[torch.Tensor, int]) -> None:
    """Raise an error naming the function, the axis and the shapes where inputs that share
    a named axis disagree on its size (a tensor expression's sizes come from its inputs)."""
    sizes = {tensor.shape[dim] for tensor, dim in uses if tensor is not None}
    if len(sizes) > 1:
        got = ", ".join(
            f"{tuple(tensor.shape)} (axis {dim})"
            for tensor, dim in uses
            if tensor is not None
        )
        raise ValueError(
            f"{name}(): the inputs disagree on the size of axis '{axis}': shapes {got}"
        )


def _mul_into(buffer: torch.Tensor, other) -> torch.Tensor:
    """``buffer * other``, written into ``buffer`` (a temporary the caller owns and no
    longer needs) where the product has its shape and dtype.

    Code generation cannot know that: the upstream gradient has the output's shape, but
    ``autograd.grad(is_grads_batched=True)`` and torch.func batch it where the inputs are
    not. On this check a fresh product (an allocation and its page faults, the largest
    cost of a pass over a large tensor) is saved in the common case.
    """
    if (
        torch.compiler.is_compiling()
        or torch.is_grad_enabled()
        or _transforms_active()
        or not isinstance(other, torch.Tensor)
        or torch.result_type(buffer, other) != buffer.dtype
        or (other.shape != buffer.shape and other.dim() > 0)  # (a 0-dim one broadcasts)
    ):
        return buffer * other
    try:
        return buffer.mul_(other)
    except (
        RuntimeError
    ):  # other batched by autograd.grad(is_grads_batched=True): refused
        return buffer * other  # before anything was written


#: Integer dtypes as wide as the floating ones, for the select below.
_BITS = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def _where(cond: torch.Tensor, a, b, overwrite: str | None = None) -> torch.Tensor:
    """``torch.where(cond, a, b)`` for code that records no autograd graph.

    On CPU torch.where branches on every element, and where the condition is unpredictable
    (the sign of random data) that costs ~3.5 ns per element, 10-25x a multiply. Here the
    result is blended from the bits of the branches instead: the chosen value passes bit
    for bit, so inf or NaN in the other branch never reaches the result. ``overwrite``
    ("a" or "b") names a branch whose buffer the caller owns and no longer needs: the
    result is written into it. Anywhere else (other devices, autograd recording, vmap,
    torch.compile, mixed dtypes, a condition of another shape) this is torch.where.
    """
    ref = a if isinstance(a, torch.Tensor) else b
    bits = _BITS.get(ref.dtype)
    if (
        bits is None
        or ref.device.type != "cpu"
        or cond.dtype != torch.bool
        or torch.compiler.is_compiling()
        or torch.is_grad_enabled()
        or _transforms_active()
    ):
        return torch.where(cond, a, b)
    # (+0.0 has no bits to add; a number is checked here, a tensor's value would be read)
    plus_zero = [
        not isinstance(t, torch.Tensor) and t == 0 and math.copysign(1, t) > 0
        for t in (a, b)
    ]
    a, b = (t if isinstance(t, torch.Tensor) else ref.new_full((), t) for t in (a, b))
    if a.dtype != b.dtype or any(t.dim() and t.shape != cond.shape for t in (a, b)):
        return torch.where(cond, a, b)
    try:  # the batched gradients of autograd.grad(is_grads_batched=True) have no such view
        a_bits, b_bits = a.view(bits), b.view(bits)
    except RuntimeError:
        return torch.where(cond, a, b)
    keep, other = (b_bits, a_bits) if overwrite == "b" else (a_bits, b_bits)
    # all ones where `keep` is chosen, zeros elsewhere
    mask = cond.to(bits).sub_(1) if overwrite == "b" else cond.to(bits).neg_()
    out = (
        keep.bitwise_and_(mask)
        if overwrite and keep.shape == cond.shape
        else keep & mask
    )
    if not plus_zero[0 if overwrite == "b" else 1]:
        out.bitwise_or_(mask.bitwise_not_().bitwise_and_(other))
    return out.view(ref.dtype)


def _kahan_log1p(u: torch.Tensor) -> torch.Tensor:
    """log1p(u) for finite u as Kahan's ``log(w) * u / (w - 1)``, ``w = 1 + u`` rounded.

    The quotient corrects log(w) for the rounding: within 2 ulp of log1p (Goldberg, "What
    every computer scientist should know about floating-point arithmetic", theorem 4), at
    half the cost of inductor's log1p. Where w == 1, u is below half an ulp of 1 and is
    its own log1p.
    """
    w = 1 + u
    return torch.where(w == 1, u, torch.log(w) * (u / (w - 1)))


def _log1p(u: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """``torch.log1p(u)``; compiled (the fused path), :func:`_kahan_log1p`.

    ``overwrite``: the caller owns ``u`` and no longer needs it.
    """
    if torch.compiler.is_compiling():
        return torch.where(u == torch.inf, u, _kahan_log1p(u))
    return u.log1p_() if overwrite else torch.log1p(u)


def _horner(x: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    """sum(c_k * x**k) by Horner's rule (unrolled when compiled)."""
    p = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        p = p * x + c
    return p


def _in_float64(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 (``x`` itself where it is float64 already): a formula whose
    float32 arithmetic loses bits that its float64 arithmetic keeps is computed in float64
    and rounded back (:func:`_rounded_like`), as torch's CPU kernels accumulate float32
    sums in double. As it is on a device without float64 (MPS)."""
    return x if x.device.type == "mps" else x.to(torch.float64)


def _rounded_like(value: torch.Tensor, *like: torch.Tensor) -> torch.Tensor:
    """``value`` in the dtype that a formula of the tensors ``like`` has (their promoted
    floating dtype): the end of a formula computed in float64 (:func:`_in_float64`)."""
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in like))
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return value.to(dtype)


def _compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if floating point; else (integers, bools) in the default dtype, which
    is the dtype torch's unary float ops give them."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


#: 1 / k!, k = 1 ... 14: expm1's Taylor polynomial for |x| < 0.5
#: (symgrad.series.expm1_taylor); float32 takes the first 8.
_EXPM1_TAYLOR = (
    1.0,
    0.5,
    0.16666666666666666,
    0.041666666666666664,
    0.008333333333333333,
    0.001388888888888889,
    0.0001984126984126984,
    2.48015873015873e-05,
    2.7557319223985893e-06,
    2.755731922398589e-07,
    2.505210838544172e-08,
    2.08767569878681e-09,
    1.6059043836821613e-10,
    1.1470745597729725e-11,
)


def _expm1(x: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """``torch.expm1(x)``; compiled (the fused path), its Taylor polynomial below
    |x| = 0.5 and ``exp(x) - 1`` elsewhere.

    Inductor's vectorised CPU expm1 is ``exp(x) - 1``, which loses every digit near 0
    (expm1(-1e-10) comes out 0). Past |x| = 0.5 the subtraction costs at most an ulp
    of the result (it is exact down to x = -log(2)); below, the polynomial's remainder is
    under half an ulp. Within 2 ulp of the correctly rounded value, as Kahan's
    ``(u - 1) * x / log(u)`` was, without its log and division. ``overwrite``: the caller
    owns ``x`` and no longer needs it (compiled, the result is a new tensor anyway).
    """
    if torch.compiler.is_compiling():
        x = _compute_dtype(x)
        double = x.dtype == torch.float64
        taylor = _EXPM1_TAYLOR if double else _EXPM1_TAYLOR[:8]
        near = _horner(x, taylor) * x
        return torch.where(torch.abs(x) < 0.5, near, torch.exp(x) - 1)
    return x.expm1_() if overwrite else torch.expm1(x)


def _erf(x: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """``torch.erf(x)``; compiled (the fused path) below float64, evaluated in float64 and
    rounded: inductor's vectorised CPU float32 erf is a polynomial within 1.5e-7 absolute,
    so near 0 it loses every digit (erf(1e-7) comes out 1.6e-7, not 1.1e-7). Its float64
    erf is accurate. ``overwrite``: the caller owns ``x`` and no longer needs it.
    """
    if torch.compiler.is_compiling() and x.dtype != torch.float64:
        # (an integer x: erf's result has the default dtype, as eagerly)
        dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        return torch.erf(x.double()).to(dtype)
    return x.erf_() if overwrite else torch.erf(x)


#: Chebyshev coefficients of (1 + 2a) * exp(a**2) * erfc(a) for a >= 0, in
#: t = (a - 3) / (a + 3) (symgrad.series.erfc_chebyshev); float32 takes the first 12.
_ERFC_SERIES = (
    1.17756257419656,
    0.005353904539615676,
    -0.09377550342284209,
    0.05436652555744322,
    -0.018976596707845208,
    0.004453426061462712,
    -0.0006335531710553147,
    1.7661719523171593e-05,
    1.2841532864056671e-05,
    -2.0072285659059913e-06,
    -1.807522790414837e-07,
    7.549828343825093e-08,
    1.885668523838603e-09,
    -2.699519049798364e-09,
    -1.460079119939105e-11,
    1.0361607445969489e-10,
    1.475715976623473e-12,
    -4.277340064396911e-12,
    -2.07922492859799e-13,
    1.8134502003176963e-13,
    1.973425574544739e-14,
    -7.287943737592673e-15,
    -1.5169878690228116e-15,
    2.3514112258781403e-16,
    1.0006111691821667e-16,
)
#: Taylor coefficients of erf(a) / a in a**2, for a < 0.5
#: (symgrad.series.erf_taylor); float32 takes the first 6.
_ERF_TAYLOR = (
    1.1283791670955126,
    -0.37612638903183754,
    0.11283791670955126,
    -0.026866170645131252,
    0.005223977625442188,
    -0.0008548327023450853,
    0.00012055332981789664,
    -1.492565035840625e-05,
    1.6462114365889248e-06,
    -1.6365844691234924e-07,
    1.4807192815879218e-08,
    -1.2290555301717928e-09,
)


def _erfc(x: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """``torch.erfc(x)``; compiled for a CPU (the fused path), from series: inductor's CPU
    erfc is a scalar loop, 6x its (vectorised) erf.

    For a = |x| >= 0.5, erfc(a) = exp(-a**2) * s / (1 + 2a), with s the Chebyshev
    series summed by Clenshaw's recurrence, and exp(-a**2) = exp(-m**2) * exp((m - a) *
    (m + a)) for m = a rounded to 1/128: m**2 and m - a are exact, so the rounding of a**2
    costs no digits where erfc is tiny. Below 0, erfc(x) = 2 - erfc(a); nearer 0,
    1 -+ erf(a) from erf's Taylor series. Within 4 ulp of the correctly rounded value in
    float64, 5 in float32 (0.6-0.7 mean past |x| = 0.5). On a GPU the compiled erfc
    is accurate and fast, and is used. ``overwrite``: the caller owns ``x`` and no longer
    needs it (compiled, the result is a new tensor anyway).
    """
    if torch.compiler.is_compiling() and x.device.type == "cpu":
        x = _compute_dtype(x)
        double = x.dtype == torch.float64
        chebyshev = _ERFC_SERIES if double else _ERFC_SERIES[:12]
        taylor = _ERF_TAYLOR if double else _ERF_TAYLOR[:6]
        # erfc(30) is below the smallest float64: the clamp keeps t and the exps finite
        a = torch.abs(x).to(torch.float64 if double else torch.float32).clamp(max=30.0)
        t = (a - 3) / (a + 3)
        t2 = 2 * t
        b1, b2 = chebyshev[-1], 0.0
        for c in reversed(chebyshev[1:-1]):
            b1, b2 = t2 * b1 - b2 + c, b1
        s = t * b1 - b2 + chebyshev[0]
        m = torch.round(a * 128) / 128
        tail = torch.exp(-m * m) * (torch.exp((m - a) * (m + a)) * s / (1 + 2 * a))
        near = 1 - torch.copysign(a * _horner(a * a, taylor), x)
        far = torch.where(x < 0, 2 - tail, tail)
        return torch.where(a < 0.5, near, far).to(x.dtype)
    return x.erfc_() if overwrite else torch.erfc(x)


def _atanh(x: torch.Tensor, overwrite: bool = False) -> torch.Tensor:
    """``torch.atanh(x)``; compiled (the fused path), ``log1p(2a / (1 - a)) / 2`` with
    ``a = |x|`` and the sign of x: inductor's vectorised CPU atanh is
    ``log((1 + x) / (1 - x)) / 2``, which loses every digit near 0.

    ``overwrite``: the caller owns ``x`` and no longer needs it.
    """
    if torch.compiler.is_compiling():
        a = torch.abs(x)
        u = 2 * a / (1 - a)
        return torch.copysign(torch.where(u == torch.inf, u, _kahan_log1p(u)) / 2, x)
    return x.atanh_() if overwrite else torch.atanh(x)


def _softplus(
    x: torch.Tensor, threshold: float = 40.0, negative_of: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.softplus(x, threshold=threshold)``; compiled, ``relu(x) + log1p(t)``,
    ``t = exp(-|x|)``, as accurate (and exact past the threshold too).

    log1p(t) is ``log(w) + (t - (w - 1)) / w`` with ``w = 1 + t`` rounded: ``t - (w - 1)``
    is exactly what rounding w lost, and log(w + c) = log(w) + c / w to first order.
    For t in [0, 1] that is within 2 ulp of log1p without a select.

    ``negative_of``: a tensor equal to ``-x``, whose ``exp(-|.|)`` the caller's compiled
    code computes anyway; t is taken from it, so inductor computes one exp for both.
    """
    if torch.compiler.is_compiling():
        t = torch.exp(-torch.abs(x if negative_of is None else negative_of))
        w = 1 + t
        return torch.relu(x) + (torch.log(w) + (t - (w - 1)) / w)
    return torch.nn.functional.softplus(x, threshold=threshold)


def _tan_half_atan(q: torch.Tensor) -> torch.Tensor:
    """``q / (1 + hypot(q, 1))`` = tan(atan(q) / 2), in [-1, 1] for every q (+-inf: +-1).

    Compiled in float32 and float64, ``c / (1 + sqrt(1 + c**2))`` with c = q clamped to
    +-1e19 instead (c**2 stays finite; past 1e19 the value is +-1 to the last bit):
    inductor's hypot costs ~7 multiplies more per element. Otherwise hypot, with q clamped
    to the largest float (inf / inf would be NaN).
    """
    if torch.compiler.is_compiling() and q.dtype in (torch.float32, torch.float64):
        c = torch.clamp(q, -1e19, 1e19)
        return c / (1 + torch.sqrt(1 + c * c))
    largest = torch.finfo(q.dtype).max
    c = torch.clamp(q, -largest, largest)
    # (c.new_tensor(1) would be a copy from the host: on a GPU, a sync)
    return c / (1 + torch.hypot(c, c.new_ones(())))


def _root_power(x: torch.Tensor, p: int, q: int) -> torch.Tensor:
    """``x**(p/q)`` for an exponent that no float holds (1/3, -2/3, 0.1), within ~1 ulp.

    ``torch.pow(x, p / q)`` raises x to the rounded exponent: a relative error of
    |log(x)| * 2**-54, 114 ulps for x**(1/3) at x = 1e296 in float64. Here the q-th root
    is pow's corrected by one Newton step, then x**(p/q) is its powers and x's
    (:func:`_root_powers`). Negative x gives NaN, as pow does; 0 and inf, pow's own values.
    """
    root = torch.pow(x, 1.0 / q)
    newton = _root_newton(root, x, q)
    root = torch.where(newton.isnan(), root, newton)  # 0 and inf: pow's
    return _root_powers(root, x, p, q)


def _sigmoid(
    x: torch.Tensor, overwrite: bool = False, negative_of: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch.sigmoid(x)``; compiled, from ``t = exp(-|x|)``: 1 / (1 + t) for x >= 0,
    t / (1 + t) below. As accurate, and inductor computes exp(-|x|) once for this and
    the dsigmoid or softplus beside it (a sigmoid of its own would be a second exp).

    ``overwrite``: the caller owns ``x`` and no longer needs it. ``negative_of``: a tensor
    equal to ``-x``, whose ``exp(-|.|)`` the caller's compiled code computes anyway.
    """
    if torch.compiler.is_compiling():
        t = torch.exp(-torch.abs(x if negative_of is None else negative_of))
        r = 1 / (1 + t)
        return torch.where(x >= 0, r, t * r)
    return x.sigmoid_() if overwrite else torch.sigmoid(x)

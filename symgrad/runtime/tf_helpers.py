"""Helpers of the generated TensorFlow modules.

Plain Python on TensorFlow alone, tested directly (tests/test_runtime.py). A generated
module holds a copy of the helpers it uses (symgrad.runtime.copy_in), so that it depends on
TensorFlow alone.
"""

from __future__ import annotations

import tensorflow as tf

from .shared_helpers import _root_newton, _root_powers


def _reduce_to(grad: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Sum a broadcast gradient back to the shape of the input it belongs to."""
    shape = tf.shape(like)
    axes, _ = tf.raw_ops.BroadcastGradientArgs(s0=shape, s1=tf.shape(grad))
    return tf.reshape(tf.reduce_sum(grad, axis=axes), shape)


def _broadcast_result(value, *inputs: tf.Tensor) -> tf.Tensor:
    """``value`` (a tensor or a number) at the shape of ``inputs`` broadcast together, in
    their floating dtype: the result of a formula that no longer reads every input
    (``sin(x)**2 + cos(x)**2 + cosh(y)`` simplified to ``cosh(y)``, or to a number) has the
    shape that the formula as written would have."""
    shape = tf.shape(inputs[0])
    for t in inputs[1:]:
        shape = tf.broadcast_dynamic_shape(shape, tf.shape(t))
    floats = [t.dtype for t in inputs if t.dtype.is_floating]
    value = tf.cast(value, floats[0] if floats else inputs[0].dtype)
    return tf.broadcast_to(value, shape)


def _check_axis(name: str, axis: str, *uses) -> None:
    """Raise an error naming the function, the axis and the shapes where inputs that share
    a named axis disagree on its size (static shapes; unknown sizes are not checked)."""
    shapes = [(tf.TensorShape(t.shape), dim) for t, dim in uses if t is not None]
    sizes = {s[dim] for s, dim in shapes if s.rank is not None and s[dim] is not None}
    if len(sizes) > 1:
        got = ", ".join(f"{tuple(s.as_list())} (axis {dim})" for s, dim in shapes)
        raise ValueError(
            f"{name}(): the inputs disagree on the size of axis '{axis}': shapes {got}"
        )


def _check_broadcast(name: str, **tensors) -> None:
    """Raise an error naming the function and the shapes where the inputs of an
    elementwise function do not broadcast (TF's own names neither)."""
    shapes = {k: tf.TensorShape(getattr(v, "shape", ())) for k, v in tensors.items()}
    try:
        result = tf.TensorShape(())
        for shape in shapes.values():
            result = tf.broadcast_static_shape(result, shape)
    except ValueError:
        got = ", ".join(f"{k} {tuple(s.as_list())}" for k, s in shapes.items())
        raise ValueError(
            f"{name}(): the inputs do not broadcast: {got}. {name} is elementwise (its inputs "
            "broadcast against each other as in x * y; no matrix products or reductions)"
        ) from None


def _root_power(x: tf.Tensor, p: int, q: int) -> tf.Tensor:
    """``x**(p/q)`` for an exponent that no float holds (1/3, -2/3, 0.1), within ~1 ulp:
    pow's q-th root corrected by one Newton step, then its powers and x's (see the torch
    module's ``_root_power``; ``tf.math.pow(x, p / q)`` is off by |log(x)| * 2**-54
    relative, 114 ulps for x**(1/3) at x = 1e296)."""
    root = tf.math.pow(x, 1.0 / q)
    newton = _root_newton(root, x, q)
    root = tf.where(tf.math.is_nan(newton), root, newton)  # 0 and inf: pow's
    return _root_powers(root, x, p, q)

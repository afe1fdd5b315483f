"""Run what ``gen`` made before it says "ok": each function once, in each framework.

Every function of a generated module is called at a few points inside its inputs' domains,
in float32 and float64: forward, backward, double backward (order 2) and forward mode
(torch). A step that raises is a :class:`SmokeFailure` naming the function, so a crash in
generated code is an error of ``gen``, not a file a user commits. Values are not judged
here: the generated tests and ``symgrad accuracy`` do that.

A framework that is not installed is skipped (with a note): symgrad itself needs neither.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from symgrad.load import imported
from symgrad.numerics.points import domain_interior, scalar_value
from symgrad.spec import Function, Input, Spec

#: Points per tensor input, as fractions of its benign interval (domain_interior).
_FRACTIONS = (0.2, 0.55, 0.9)
_MODULES = {"torch": "_torch.py", "tensorflow": "_tf.py"}


@dataclass(frozen=True)
class SmokeFailure:
    """One step of one generated function that raised."""

    function: Function
    target: str
    step: str  # import, forward, backward, double backward, jvp
    dtype: str
    error: str  # "TypeError: ..." and the generated line it came from

    def __str__(self) -> str:
        dtype = f" ({self.dtype})" if self.dtype else ""
        return f"the generated {self.target} {self.step}{dtype} raised {self.error}"


def _points(inp: Input) -> list[float]:
    lo, hi = domain_interior(inp)
    values = [lo + f * (hi - lo) for f in _FRACTIONS]
    if dict(inp.assumptions).get("integer"):
        values = [float(round(v)) for v in values]
    return values


def _error(exc: BaseException, module_file: Path, function: str = "") -> str:
    """The exception, with the generated lines it came from (the user's file to read)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(module_file)]
    own = [f for f in frames if function and function in f.name]
    shown = own[-1:] + [f for f in frames[-1:] if not own or f.lineno != own[-1].lineno]
    for frame in shown:
        text += f"\n    at {module_file.name}:{frame.lineno} in {frame.name}: {frame.line}"
    return text


def _is_index(inp: Input) -> bool:
    """A class index of a tensor expression: integers, no gradient."""
    return inp.shape is not None and dict(inp.assumptions).get("integer") is True


def _data(fn: Function, inp: Input) -> tuple[list[float], tuple[int, ...]]:
    """An input's values and shape: its points, tiled over a small shape for a tensor
    expression (each named axis of size 2 or 3, batch axes '...' one axis of 2)."""
    points = [0, 1] if _is_index(inp) else _points(inp)  # (every axis has 2 or 3 entries)
    if inp.shape is None:
        return points, (len(points),)
    named = sorted({a for i in fn.inputs for a in (i.shape or ()) if a != "..."})
    shape = tuple(2 if a == "..." else 2 + named.index(a) % 2 for a in inp.shape)
    count = 1
    for n in shape:
        count *= n
    return [points[k % len(points)] for k in range(count)], shape


def _steps_torch(fn: Function, wrapper: Callable, dtype) -> Iterator[tuple[str, Callable]]:
    import torch
    import torch.autograd.forward_ad as fwad

    tensors = [i for i in fn.inputs if i.is_tensor]
    scalars = {i.name: scalar_value(i) for i in fn.inputs if not i.is_tensor}

    def make(requires_grad: bool = True) -> list:
        made = []
        for i in tensors:
            values, shape = _data(fn, i)
            t = torch.tensor(values, dtype=torch.long if _is_index(i) else dtype).reshape(shape)
            made.append(t.requires_grad_(requires_grad and i.gets_gradient))
        return made

    def outputs(args: list) -> tuple:
        result = wrapper(*args, **scalars)
        return result if isinstance(result, tuple) else (result,)

    state: dict[str, object] = {}

    def forward() -> None:
        state["args"] = args = make()
        state["outs"] = outputs(args)

    def backward() -> None:
        args, outs = state["args"], state["outs"]
        diff = [a for a in args if a.requires_grad]
        live = [o for o in outs if o.requires_grad]
        if not diff or not live:
            state["grads"] = []
            return
        total = sum(o.sum() for o in live)
        grads = torch.autograd.grad(total, diff, create_graph=fn.order >= 2, allow_unused=True)
        state["grads"] = [g for g in grads if g is not None and g.requires_grad]

    def double_backward() -> None:
        args, grads = state["args"], state["grads"]
        if grads:
            diff = [a for a in args if a.requires_grad]
            torch.autograd.grad(sum(g.sum() for g in grads), diff, allow_unused=True)

    def jvp() -> None:
        with fwad.dual_level():
            duals = [
                fwad.make_dual(a, torch.ones_like(a)) if i.gets_gradient else a
                for i, a in zip(tensors, make(requires_grad=False))
            ]
            for out in outputs(duals):
                fwad.unpack_dual(out)

    yield "forward", forward
    yield "backward", backward
    if fn.order >= 2:
        yield "double backward", double_backward
    if any(i.gets_gradient for i in tensors):
        yield "jvp", jvp


def _steps_tensorflow(fn: Function, wrapper: Callable, dtype) -> Iterator[tuple[str, Callable]]:
    import tensorflow as tf

    tensors = [i for i in fn.inputs if i.is_tensor]
    scalars = {i.name: scalar_value(i) for i in fn.inputs if not i.is_tensor}
    args = [
        tf.reshape(
            tf.constant(_data(fn, i)[0], dtype=tf.int64 if _is_index(i) else dtype), _data(fn, i)[1]
        )
        for i in tensors
    ]
    diff = [a for i, a in zip(tensors, args) if i.gets_gradient]
    state: dict[str, object] = {}

    def run() -> None:
        with tf.GradientTape() as outer:
            outer.watch(diff)
            with tf.GradientTape() as inner:
                inner.watch(diff)
                result = wrapper(*args, **scalars)
                outs = result if isinstance(result, tuple) else (result,)
                total = tf.add_n([tf.reduce_sum(o) for o in outs])
            state["step"] = "backward"
            grads = [g for g in inner.gradient(total, diff) if g is not None] if diff else []
            gsum = tf.add_n([tf.reduce_sum(g) for g in grads]) if grads else None
        if fn.order >= 2 and gsum is not None:
            state["step"] = "double backward"
            outer.gradient(gsum, diff)

    state["step"] = "forward"
    yield "forward, backward and double backward", lambda: _tracked(run, state)


def _tracked(run: Callable[[], None], state: dict) -> None:
    """``run()``, its exception tagged with the step it stopped in."""
    try:
        run()
    except Exception as exc:
        exc.add_note(f"step: {state['step']}")
        raise


def _framework(target: str):
    """The framework module, or None where it is not installed."""
    if importlib.util.find_spec(target) is None:
        return None
    if target == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no C++ start-up chatter
    return importlib.import_module(target)


def smoke_run(
    spec: Spec, files: Iterable[tuple[str, str]], targets: Iterable[str]
) -> tuple[list[SmokeFailure], list[str]]:
    """Run the generated modules among ``files`` (name, text) for ``targets``.

    Returns the failures and the targets skipped because their framework is missing.
    """
    texts = dict(files)
    failures: list[SmokeFailure] = []
    skipped: list[str] = []
    for target in targets:
        name = f"{spec.module}{_MODULES[target]}"
        if name not in texts:
            continue
        framework = _framework(target)
        if framework is None:
            skipped.append(target)
            continue
        failures += _run_module(spec, target, name, texts[name], framework)
    return failures, skipped


def _run_module(spec: Spec, target: str, name: str, text: str, framework) -> list[SmokeFailure]:
    failures = []
    with contextlib.ExitStack() as stack:
        try:
            module, path = stack.enter_context(imported(name, text))
        except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
            error = _error(exc, Path(name))
            first = (*spec.functions, *spec.tensor_functions)[0]
            return [SmokeFailure(first, target, "import", "", error)]
        steps = _steps_torch if target == "torch" else _steps_tensorflow
        dtypes = (framework.float32, framework.float64)
        functions = (*spec.functions, *spec.tensor_functions)
        for fn, dtype in itertools.product(functions, dtypes):
            wrapper = getattr(module, fn.name)
            for step, run in steps(fn, wrapper, dtype):
                try:
                    run()
                except Exception as exc:  # noqa: BLE001 - a crash of generated code is reported
                    notes = [n for n in getattr(exc, "__notes__", []) if n.startswith("step: ")]
                    step = notes[-1].removeprefix("step: ") if notes else step
                    dtype_name = getattr(dtype, "name", None) or str(dtype).removeprefix("torch.")
                    error = _error(exc, path, fn.name)
                    failures.append(SmokeFailure(fn, target, step, dtype_name, error))
                    break  # the later steps of this dtype need this one
    return failures

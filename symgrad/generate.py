"""Spec -> file contents for every requested target: the pipeline in one place."""

from __future__ import annotations

from dataclasses import dataclass

from symgrad.derive import Derived, derive_spec, each_function
from symgrad.plan import FunctionPlan, plan_tensorflow, plan_torch
from symgrad.render import render, ruff_format
from symgrad.runtime import copy_in
from symgrad.spec import Spec


@dataclass(frozen=True)
class GeneratedFile:
    name: str
    text: str


def _module(
    spec: Spec,
    plans: list[FunctionPlan],
    template: str,
    name: str,
    spec_path: str,
    framework: str,
) -> GeneratedFile:
    """Render a module: its functions, then the runtime helpers they use copied in."""
    from symgrad.tensor.plan import plan_tensor

    tensor_plans = each_function(
        spec.tensor_functions, "generating code for", lambda fn: plan_tensor(fn, framework)
    )
    context = {
        "spec": spec,
        "spec_path": spec_path,
        "functions": plans,
        "tensor_functions": tensor_plans,
    }
    draft = render(template, imports=(), runtime="", **context)
    helpers = copy_in(framework, draft)
    text = render(template, imports=helpers.imports, runtime=helpers.source, **context)
    return GeneratedFile(name, ruff_format(text, name))


def _plans(planner, derived: tuple[Derived, ...]) -> list[FunctionPlan]:
    """Every function planned; each failure names its function."""
    return each_function(derived, "generating code for", planner, lambda d: d.function)


def generate(
    spec: Spec,
    targets: tuple[str, ...] | None = None,
    tests: bool = True,
    spec_path: str | None = None,
    derived: tuple[Derived, ...] | None = None,
) -> list[GeneratedFile]:
    """Every file for ``spec``: modules, and their tests unless ``tests`` is False."""
    from symgrad.testgen import test_files

    derived = derived if derived is not None else derive_spec(spec)
    targets = tuple(t for t in spec.targets if targets is None or t in targets)
    spec_path = spec_path or spec.path.as_posix()
    files = []
    if "torch" in targets:
        plans = _plans(plan_torch, derived)
        files.append(
            _module(
                spec, plans, "torch_module.py.jinja", f"{spec.module}_torch.py", spec_path, "torch"
            )
        )
    if "tensorflow" in targets:
        plans = _plans(plan_tensorflow, derived)
        files.append(
            _module(
                spec, plans, "tf_module.py.jinja", f"{spec.module}_tf.py", spec_path, "tensorflow"
            )
        )
    if tests:
        files += [
            GeneratedFile(n, ruff_format(t, n))
            for n, t in test_files(spec, derived, targets, spec_path)
        ]
    return files

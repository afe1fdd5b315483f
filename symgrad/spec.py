"""Load and validate a spec file into frozen dataclasses; the only place YAML is read."""

from __future__ import annotations

import difflib
import hashlib
import itertools
import keyword
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from symgrad.errors import Location, SpecError

TARGETS = ("torch", "tensorflow")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SNAKE = re.compile(r"^[a-z_][a-z0-9_]*$")
_ASSUMPTIONS = ("positive", "nonnegative", "integer")
#: Names an input or output may not take: they collide with generated code or the language.
_FUNCTION_KEYS = ("doc", "inputs", "let", "output", "outputs", "gradient", "order")
_SPEC_KEYS = ("module", "doc", "targets", "order", "functions")
RESERVED = frozenset({"grad", "ctx", "torch", "tf", "math", "out", "inputs", "output", "self"})


# --------------------------------------------------------------------------- YAML with lines
class _LineDict(dict):
    """A YAML mapping that remembers its own line and the line of each key."""

    line: int
    key_lines: dict[str, int]


class _Loader(yaml.SafeLoader):
    """Safe YAML (no object construction) that rejects duplicate keys and keeps lines."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _LineDict:
    loader.flatten_mapping(node)
    result = _LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            key = str(key)
        if key in result:
            raise SpecError(
                Location(loader.name, line),
                f"duplicate key '{key}' (first given on line {result.key_lines[key]})",
                "give each key once",
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str, path: Path) -> Any:
    loader = _Loader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except SpecError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        column = f", column {mark.column + 1}" if mark is not None else ""
        said, hint = _yaml_problem(problem)
        raise SpecError(Location(path, line), f"invalid YAML{column}: {said}", hint) from None
    finally:
        loader.dispose()


#: PyYAML's words for common mistakes -> (what the user did, how to fix it).
_YAML_PROBLEMS = (
    (
        "expected <block end>",
        "this line is indented differently from the keys above it",
        "YAML nests by indentation: the keys of one mapping start in the same column "
        "(use spaces, and as many as the line above)",
    ),
    (
        "mapping values are not allowed here",
        "a ':' where a value was expected (an indentation slip, or a ':' inside an unquoted value)",
        'indent the key under its parent, or quote the value: output: "..."',
    ),
    (
        "found character '\\t'",
        "a tab character",
        "indent with spaces: YAML does not allow tabs",
    ),
    (
        "could not find expected ':'",
        "a key without ':' (or an unclosed quote or bracket above)",
        "write key: value, and close every quote and bracket",
    ),
    (
        "expected ',' or '}'",
        "an unclosed { ... } mapping",
        "close the braces, e.g. inputs: {x: {}}",
    ),
    (
        "expected ',' or ']'",
        "an unclosed [ ... ] list",
        "close the brackets, e.g. domain: [0, inf]",
    ),
)


def _yaml_problem(problem: str) -> tuple[str, str | None]:
    """PyYAML's problem in a user's words, and the fix."""
    for words, said, hint in _YAML_PROBLEMS:
        if words in problem:
            return said, hint
    return problem, "check the indentation and the quotes around this line"


# --------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Input:
    """One declared input of a function."""

    name: str
    kind: str  # "tensor" or "scalar"
    differentiable: bool
    domain: tuple[float, float]
    assumptions: tuple[tuple[str, bool], ...]
    default: float | None
    has_default: bool
    shape: tuple[str, ...] | None  # named axes (tensor expressions); None = elementwise
    line: int
    optional: bool = False  # tensor expressions: the argument defaults to None

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensor"

    @property
    def gets_gradient(self) -> bool:
        return self.kind == "tensor" and self.differentiable


@dataclass(frozen=True)
class Formula:
    """A named expression as written in the spec (an output or a gradient override)."""

    name: str
    text: str
    line: int
    shape: tuple[str, ...] | None = None  # tensor expressions: the output's free axes


@dataclass(frozen=True)
class Function:
    """One function of a spec: inputs, the naive forward formula(s), optional VJP overrides."""

    name: str
    doc: str | None
    inputs: tuple[Input, ...]
    outputs: tuple[Formula, ...]
    single_output: bool  # written as `output:` (one unnamed output) rather than `outputs:`
    gradients: tuple[Formula, ...]  # user-defined VJPs, by input name
    order: int
    line: int
    location: Location
    lets: tuple[Formula, ...] = ()  # tensor expressions: named intermediates, in order

    @property
    def class_name(self) -> str:
        return "".join(part[:1].upper() + part[1:] for part in self.name.split("_") if part)

    def input(self, name: str) -> Input:
        return next(i for i in self.inputs if i.name == name)

    @property
    def is_tensor(self) -> bool:
        """A tensor expression (named axes, reductions) rather than an elementwise function."""
        return self.outputs[0].shape is not None


@dataclass(frozen=True)
class Spec:
    """A whole spec file."""

    module: str
    doc: str | None
    targets: tuple[str, ...]
    order: int
    functions: tuple[Function, ...]  # elementwise functions
    path: Path
    sha256: str
    tensor_functions: tuple[Function, ...] = ()  # tensor expressions (symgrad.tensor)


# --------------------------------------------------------------------------- validation
class _Fields:
    """Pops known keys from a YAML mapping and rejects what is left, torchgen-style."""

    def __init__(self, data: Any, where: Location, what: str):
        if not isinstance(data, dict):
            raise SpecError(where, f"{what} must be a mapping, got {_describe(data)}")
        self.data = dict(data)
        self.lines: dict[str, int] = getattr(data, "key_lines", {})
        self.where = where

    def line(self, key: str) -> int | None:
        return self.lines.get(key, self.where.line)

    def at(self, key: str) -> Location:
        return self.where.at(line=self.line(key))

    def pop(self, key: str, default: Any = None) -> Any:
        return self.data.pop(key, default)

    def finish_keys(self, allowed: tuple[str, ...], what: str, lines: dict[str, int]) -> None:
        """Reject unknown keys up front (so a typo is not reported as a missing key)."""
        self.lines = lines
        for key in list(self.data):
            if key in allowed:
                self.data.pop(key)
        self.finish(allowed, what)

    def finish(self, allowed: tuple[str, ...], what: str) -> None:
        for key in self.data:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"allowed keys: {', '.join(allowed)}"
            raise SpecError(self.at(key), f"unknown key '{key}' in {what}", hint)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if value is not None else "nothing"


def _number(value: Any, where: Location, what: str) -> float:
    """A YAML number; also accepts 'inf', '-inf', '1e-5' (YAML 1.1 reads those as strings)."""
    if isinstance(value, bool):
        raise SpecError(where, f"{what} must be a number, got {_describe(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower().replace(".inf", "inf")
        try:
            return float(text)
        except ValueError:
            pass
    raise SpecError(where, f"{what} must be a number, got {_describe(value)}")


def _bool(value: Any, where: Location, what: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(where, f"{what} must be true or false, got {_describe(value)}")
    return value


def _identifier(name: Any, where: Location, what: str, *, snake: bool = False) -> str:
    if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
        raise SpecError(
            where, f"{what} {name!r} is not a valid Python identifier", "use letters, digits and _"
        )
    if snake and not _SNAKE.match(name):
        raise SpecError(where, f"{what} '{name}' must be snake_case", f"use '{name.lower()}'")
    return name


def _order(value: Any, where: Location) -> int:
    if value not in (1, 2) or isinstance(value, bool):
        raise SpecError(where, f"order must be 1 or 2, got {_describe(value)}")
    return int(value)


def _formula(name: str, value: Any, where: Location, what: str) -> Formula:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SpecError(where, f"{what} must be a formula string, got {_describe(value)}")
    text = str(value).strip()
    if not text:
        raise SpecError(where, f"{what} is empty")
    return Formula(name, text, where.line or 0)


def _parse_input(name: str, data: Any, where: Location) -> Input:
    _identifier(name, where, "input name")
    if name in RESERVED:
        raise SpecError(where, f"input name '{name}' is reserved", "rename the input")
    f = _Fields({} if data is None else data, where, f"input '{name}'")
    kind = f.pop("kind", "tensor")
    if kind not in ("tensor", "scalar"):
        raise SpecError(
            f.at("kind"), f"input '{name}': kind must be tensor or scalar, got {kind!r}"
        )
    differentiable = _bool(f.pop("differentiable", True), f.at("differentiable"), "differentiable")
    if kind == "scalar" and "differentiable" in f.lines:
        if differentiable:
            raise SpecError(
                f.at("differentiable"),
                f"scalar input '{name}' cannot be differentiable",
                "make it a tensor (kind: tensor) to get a gradient",
            )
    domain = (-math.inf, math.inf)
    raw_domain = f.pop("domain", None)
    if raw_domain is not None:
        if not isinstance(raw_domain, list) or len(raw_domain) != 2:
            raise SpecError(f.at("domain"), f"input '{name}': domain must be [lo, hi]")
        lo = _number(raw_domain[0], f.at("domain"), "domain lower bound")
        hi = _number(raw_domain[1], f.at("domain"), "domain upper bound")
        if not lo < hi:
            raise SpecError(
                f.at("domain"),
                f"input '{name}': domain lower bound {lo:g} must be below the upper bound {hi:g}",
            )
        domain = (lo, hi)
    assumptions = []
    for key in _ASSUMPTIONS:
        if key in f.data:
            assumptions.append((key, _bool(f.pop(key), f.at(key), key)))
    has_default = "default" in f.data
    default = None
    if has_default:
        if kind != "scalar":
            raise SpecError(
                f.at("default"), f"tensor input '{name}' cannot have a default", "remove default"
            )
        default = _number(f.pop("default"), f.at("default"), "default")
    shape = f.pop("shape", None)
    if shape is not None:
        if kind == "scalar":
            raise SpecError(
                f.at("shape"), f"scalar input '{name}' cannot have a shape", "remove shape"
            )
        shape = _shape(shape, f.at("shape"), f"input '{name}'")
    optional = _bool(f.pop("optional", False), f.at("optional"), "optional")
    if optional and (kind != "tensor" or shape is None):
        raise SpecError(
            f.at("optional"),
            f"input '{name}': only tensor inputs with a shape can be optional",
            "give it a shape, e.g. shape: [m], or remove optional",
        )
    f.finish(
        ("kind", "differentiable", "domain", "default", "shape", "optional", *_ASSUMPTIONS),
        "an input",
    )
    return Input(
        name=name,
        kind=kind,
        differentiable=differentiable and kind == "tensor",
        domain=domain,
        assumptions=tuple(assumptions),
        default=default,
        has_default=has_default,
        shape=shape,
        line=where.line or 0,
        optional=optional,
    )


def _shape(value: Any, where: Location, what: str) -> tuple[str, ...]:
    """Named axes, ``[n, k]``, with an optional leading ``...`` (any batch axes)."""
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise SpecError(
            where,
            f"{what}: shape must be a list of axis names, got {_describe(value)}",
            "e.g. shape: [n, k] or shape: [..., d]",
        )
    for i, axis in enumerate(value):
        if axis == "...":
            if i != 0:
                raise SpecError(where, f"{what}: '...' may only come first in a shape")
            continue
        _identifier(axis, where, f"{what}: axis")
    if len(set(value)) != len(value):
        raise SpecError(where, f"{what}: an axis name appears twice in {value}")
    return tuple(value)


def _parse_function(name: str, data: Any, where: Location, default_order: int) -> Function:
    where = where.at(function=name)
    _identifier(name, where, "function name", snake=True)
    f = _Fields(data, where, f"function '{name}'")
    _Fields(dict(f.data), where, "").finish_keys(_FUNCTION_KEYS, "a function", f.lines)
    doc = f.pop("doc")
    if doc is not None and not isinstance(doc, str):
        raise SpecError(f.at("doc"), "doc must be a string")
    order = _order(f.pop("order"), f.at("order")) if "order" in f.data else default_order

    raw_inputs = f.pop("inputs")
    if raw_inputs is None:
        raise SpecError(where, "missing 'inputs'", "declare the inputs, e.g. inputs: {x: {}}")
    fi = _Fields(raw_inputs, f.at("inputs"), "inputs")
    if not fi.data:
        raise SpecError(f.at("inputs"), "'inputs' is empty", "declare at least one input")
    inputs = tuple(_parse_input(str(key), value, fi.at(str(key))) for key, value in fi.data.items())
    input_names = {i.name for i in inputs}
    for inp in inputs:
        if inp.kind == "scalar" and inp.domain != (-math.inf, math.inf) and inp.has_default:
            lo, hi = inp.domain
            if not lo <= inp.default <= hi:
                raise SpecError(
                    fi.at(inp.name),
                    f"default {inp.default:g} of '{inp.name}' lies outside its domain [{lo:g}, {hi:g}]",
                )
    # A scalar without a default must come before any with one (Python signature rules).
    seen_default = False
    for inp in inputs:
        if inp.kind == "scalar":
            seen_default = seen_default or inp.has_default
        elif seen_default:
            raise SpecError(
                fi.at(inp.name),
                f"tensor input '{inp.name}' follows a scalar with a default",
                "declare tensors before scalars that have defaults",
            )
    if not any(i.is_tensor for i in inputs):
        raise SpecError(f.at("inputs"), "a function needs at least one tensor input")

    has_output, has_outputs = "output" in f.data, "outputs" in f.data
    if has_output and has_outputs:
        raise SpecError(f.at("outputs"), "give either 'output' or 'outputs', not both")
    if not (has_output or has_outputs):
        raise SpecError(
            where, "missing 'output'", "add output: <formula> (or outputs: {name: ...})"
        )
    if has_output:
        raw = f.pop("output")
        if isinstance(raw, dict):
            fs = _Fields(raw, f.at("output"), "output")
            if "expr" not in fs.data or "shape" not in fs.data:
                raise SpecError(
                    f.at("output"),
                    "a tensor output needs both shape and expr",
                    'e.g. output: {shape: [n, m], expr: "sum(x[n, k] * w[m, k], k)"}',
                )
            shape = _shape(fs.pop("shape"), fs.at("shape"), "output")
            text = _formula("out", fs.pop("expr"), fs.at("expr"), "output expr")
            fs.finish(("shape", "expr"), "a tensor output")
            outputs = (Formula("out", text.text, text.line, shape),)
        else:
            outputs = (_formula("out", raw, f.at("output"), "output"),)
    else:
        fo = _Fields(f.pop("outputs"), f.at("outputs"), "outputs")
        if not fo.data:
            raise SpecError(f.at("outputs"), "'outputs' is empty")
        outputs = []
        for key, value in fo.data.items():
            key = str(key)
            _identifier(key, fo.at(key), "output name")
            if key in input_names:
                raise SpecError(fo.at(key), f"output '{key}' has the name of an input")
            if key in RESERVED or key.startswith("grad_"):
                raise SpecError(fo.at(key), f"output name '{key}' is reserved", "rename the output")
            outputs.append(_formula(key, value, fo.at(key), f"output '{key}'"))
        outputs = tuple(outputs)

    lets = _parse_lets(f.pop("let"), f.at("let"), input_names)
    gradients: tuple[Formula, ...] = ()
    raw_grad = f.pop("gradient")
    if raw_grad is not None:
        fg = _Fields(raw_grad, f.at("gradient"), "gradient")
        grads = []
        for key, value in fg.data.items():
            key = str(key)
            if key not in input_names:
                close = difflib.get_close_matches(key, sorted(input_names), n=1)
                raise SpecError(
                    fg.at(key),
                    f"gradient given for unknown input '{key}'",
                    f"did you mean '{close[0]}'?"
                    if close
                    else f"inputs are: {', '.join(input_names)}",
                )
            inp = next(i for i in inputs if i.name == key)
            if not inp.gets_gradient:
                raise SpecError(
                    fg.at(key), f"gradient given for '{key}', which is not differentiable"
                )
            grads.append(_formula(key, value, fg.at(key), f"gradient of '{key}'"))
        gradients = tuple(grads)
    f.finish(_FUNCTION_KEYS, "a function")
    _check_tensor_function(outputs, inputs, gradients, f, fi)
    if lets and outputs[0].shape is None:
        raise SpecError(
            f.at("let"),
            "let: is for tensor expressions",
            'write the output as a tensor expression: output: {shape: [...], expr: "..."}',
        )
    return Function(
        name=name,
        doc=doc.strip() if doc else None,
        inputs=inputs,
        outputs=outputs,
        single_output=has_output,
        gradients=gradients,
        order=order,
        line=where.line or 0,
        location=where,
        lets=lets,
    )


def _parse_lets(raw: Any, where: Location, input_names: set[str]) -> tuple[Formula, ...]:
    """``let:``: named intermediates, each ``{shape, expr}``, in order."""
    if raw is None:
        return ()
    fl = _Fields(raw, where, "let")
    lets = []
    for key, value in fl.data.items():
        key = str(key)
        _identifier(key, fl.at(key), "let name")
        if key in input_names or key in RESERVED:
            raise SpecError(fl.at(key), f"let name '{key}' is taken", "rename it")
        if not isinstance(value, dict):
            raise SpecError(
                fl.at(key),
                f"let '{key}' must be {{shape: [...], expr: ...}}",
                'e.g. z: {shape: [n, o], expr: "sum(x[n, c] * w[o, c], c)"}',
            )
        fs = _Fields(value, fl.at(key), f"let '{key}'")
        if "expr" not in fs.data or "shape" not in fs.data:
            raise SpecError(fl.at(key), f"let '{key}' needs both shape and expr")
        shape = _shape(fs.pop("shape"), fs.at("shape"), f"let '{key}'")
        text = _formula(key, fs.pop("expr"), fs.at("expr"), f"let '{key}'")
        fs.finish(("shape", "expr"), "a let entry")
        lets.append(Formula(key, text.text, text.line, shape))
    return tuple(lets)


def _check_tensor_function(outputs, inputs, gradients, f: _Fields, fi: _Fields) -> None:
    """Shapes belong to tensor expressions: every tensor input of one has a shape."""
    tensor = outputs[0].shape is not None
    for inp in inputs:
        if inp.shape is not None and not tensor:
            raise SpecError(
                fi.at(inp.name),
                f"input '{inp.name}' has a shape, but the output is an elementwise formula",
                'write the output as a tensor expression: output: {shape: [...], expr: "..."}',
            )
        if tensor and inp.is_tensor and inp.shape is None:
            raise SpecError(
                fi.at(inp.name),
                f"tensor input '{inp.name}' of a tensor expression needs a shape",
                "name its axes, e.g. shape: [n, k] (shape: [] for a 0-d tensor)",
            )
    for before, after in itertools.pairwise(inputs):
        if before.optional and after.is_tensor and not after.optional:
            raise SpecError(
                fi.at(after.name),
                f"tensor input '{after.name}' follows the optional input '{before.name}'",
                "declare optional inputs after the required tensors",
            )
    if tensor and gradients:
        raise SpecError(
            f.at("gradient"),
            "user-defined gradients are not supported for tensor expressions yet",
            "remove gradient: (symgrad derives the gradient of tensor expressions)",
        )


def load_spec(path: str | Path) -> Spec:
    """Read, parse and validate a spec file (YAML only; formulas are parsed later)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(Location(path), f"cannot read spec: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(Location(path), "spec is not UTF-8 text") from None
    data = _load_yaml(text, path)
    where = Location(path, 1)
    f = _Fields(data if data is not None else {}, where, "the spec")
    _Fields(dict(f.data), where, "").finish_keys(_SPEC_KEYS, "the spec", f.lines)
    module = f.pop("module")
    if module is None:
        raise SpecError(where, "missing 'module'", "add module: <python_identifier>")
    module = _identifier(module, f.at("module"), "module")
    doc = f.pop("doc")
    if doc is not None and not isinstance(doc, str):
        raise SpecError(f.at("doc"), "doc must be a string")
    targets = f.pop("targets", list(TARGETS))
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets:
        raise SpecError(f.at("targets"), "targets must be a list, e.g. [torch, tensorflow]")
    for t in targets:
        if t not in TARGETS:
            raise SpecError(f.at("targets"), f"unknown target {t!r}", f"use {' or '.join(TARGETS)}")
    order = _order(f.pop("order", 2), f.at("order"))
    raw_functions = f.pop("functions")
    if raw_functions is None:
        raise SpecError(where, "missing 'functions'", "add functions: {name: {inputs, output}}")
    ff = _Fields(raw_functions, f.at("functions"), "functions")
    if not ff.data:
        raise SpecError(f.at("functions"), "'functions' is empty")
    functions = tuple(
        _parse_function(str(name), value, ff.at(str(name)), order)
        for name, value in ff.data.items()
    )
    class_names: dict[str, str] = {}  # class -> what gives it
    for fn in functions:
        # its Function, and those of its gradients (order 2) as the torch planner names them
        diff = [i.name for i in fn.inputs if i.gets_gradient] if fn.order >= 2 else []
        given = {fn.class_name: f"function '{fn.name}'"}
        for i in diff:
            suffix = "" if len(diff) == 1 else "".join(p[:1].upper() + p[1:] for p in i.split("_"))
            given[f"{fn.class_name}Grad{suffix}"] = f"the gradient of '{fn.name}'"
        for name, giver in given.items():
            if name in class_names:
                raise SpecError(
                    fn.location,
                    f"{giver} and {class_names[name]} both give class {name}",
                    "rename one of the functions",
                )
            class_names[name] = giver
    f.finish(_SPEC_KEYS, "the spec")
    return Spec(
        module=module,
        doc=doc.strip() if doc else None,
        targets=tuple(t for t in TARGETS if t in targets),
        order=order,
        functions=tuple(fn for fn in functions if not fn.is_tensor),
        path=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        tensor_functions=tuple(fn for fn in functions if fn.is_tensor),
    )

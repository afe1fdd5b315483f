"""A tensor function -> what the module templates print: math functions and their Functions.

Forward, backward (the VJP of the differentiable inputs, each guarded by its
``needs_input_grad`` flag as torchgen guards saves), forward mode (JVP) and, with
``order: 2``, the VJP of the backward (the double backward) are derived from one tape, so the
backward reuses the forward's nodes and the second order the backward's.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from symgrad.spec import Function
from symgrad.tensor.emit import Code, Result, check_no_broadcast_product
from symgrad.tensor.lang import ELLIPSIS, TensorFormula, parse_tensor_function, spec_text
from symgrad.tensor.tape import Output, Tape


@dataclass(frozen=True)
class Math:
    """One generated math function: ``def name(args): lines; return result``."""

    name: str
    args: tuple[str, ...]
    lines: tuple[str, ...]
    result: str

    @property
    def body(self) -> list[str]:
        return [*self.lines, f"return {self.result}"]


@dataclass(frozen=True)
class Methods:
    """The bodies of a torch Function's methods and of the wrapper, as lines."""

    setup: list[str]
    backward: list[str]
    tangents: list[str]
    jvp: list[str]
    grad_setup: list[str]
    cotangents: list[str]
    grad_backward: list[str]
    signature: str
    wrapper: list[str]


@dataclass
class TensorPlan:
    name: str
    class_name: str
    grad_class: str | None
    summary: str
    doc_lines: list[str]
    inputs: tuple[str, ...]  # every input, in order (the wrapper's and forward's arguments)
    tensors: tuple[str, ...]
    scalars: tuple[tuple[str, str | None], ...]  # (name, default)
    differentiable: tuple[str, ...]
    positions: dict[str, int]  # input -> position in forward's arguments
    forward: Math
    backward: Math
    jvp: Math
    second: Math | None
    saves: tuple[tuple[str, str | None], ...]  # (tensor, guard: flags one of which needs it)
    axis_checks: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # dim -> (input, dim)
    methods: Methods | None = None
    optional: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()  # saved reductions: the forward returns them after its output
    formula: TensorFormula | None = None  # the parsed, stable formula


@dataclass(frozen=True)
class Derivation:
    """The tape of a tensor function and its outputs (framework-free)."""

    formula: TensorFormula
    tape: Tape
    out: Output
    grads: list[Output]
    jvp: Output
    second: list[list[Output]] | None  # per gradient: its VJP for inputs then grad
    stats: tuple[str, ...] = ()  # small reductions the forward computes and saves


def derive_tensor(fn: Function, missing: frozenset[str] = frozenset()) -> Derivation:
    """Derive ``fn``; the optional inputs in ``missing`` are absent (their terms dropped)."""
    formula = parse_tensor_function(fn, missing)
    tape = Tape(formula)
    out_node = tape.node_of(tape.lower_shared(formula.expr))
    out = Output("out", ((out_node.name, formula.shape),), "out")
    wrt = [(i.name, i.shape) for i in fn.inputs if i.gets_gradient and i.name not in missing]
    grads = tape.vjp([out], ["grad"], wrt)
    tangent = tape.jvp(out_node.name, {name: f"{name}_t" for name, _ in wrt})
    jvp_node = tape.node_of(tangent) if tangent != 0 else None
    jvp = Output("out_t", ((jvp_node.name, formula.shape),) if jvp_node else (), "out")
    second = None
    if fn.order >= 2:
        second = [
            tape.vjp([g], [f"gg_{name}"], [*wrt, ("grad", formula.shape)])
            for g, (name, _) in zip(grads, wrt)
        ]
    check_no_broadcast_product(tape)
    stats = () if any(i.optional for i in fn.inputs) else _stats(tape, out_node.name, grads)
    return Derivation(formula, tape, out, grads, jvp, second, stats)


def _stats(tape: Tape, out: str, grads: list[Output]) -> tuple[str, ...]:
    """Reductions of the forward that the backward reads and that are smaller than every
    full input (a layer norm's row sums: one number per row): saved, not recomputed. A
    full-size contraction (the conv output of conv + BN) is recomputed instead."""
    widest = max(
        len([a for a in n.axes if a != ELLIPSIS]) for n in tape.nodes.values() if n.op == "leaf"
    )
    forward = set(tape.needed([out]))
    backward = set(tape.needed([n for g in grads for n, _ in g.parts]))
    return tuple(
        name
        for name in tape.nodes
        if name in forward & backward
        and name != out
        and tape.nodes[name].op in ("sum", "lse", "max", "min")
        and len([a for a in tape.nodes[name].axes if a != ELLIPSIS]) < widest
    )


def _variants(fn: Function) -> list[frozenset[str]]:
    """The sets of absent optional inputs, the most absent first, all present last."""
    optional = [i.name for i in fn.inputs if i.optional]
    sets = [frozenset(c) for r in range(len(optional), -1, -1) for c in combinations(optional, r)]
    return sets


def _when(missing: frozenset[str]) -> str:
    return " and ".join(f"{x} is None" for x in sorted(missing))


def _merge(variants: list[tuple[frozenset[str], Math]]) -> Math:
    """One math function from a variant per set of absent optional inputs."""
    *absent, (_, full) = variants
    lines: list[str] = []
    for missing, math in absent:
        lines.append(f"if {_when(missing)}:")
        lines += [f"    {line}" for line in math.body]
    return Math(full.name, full.args, (*lines, *full.lines), full.result)


def _maths(fn: Function, d: Derivation, framework: str, missing: frozenset[str]):
    """forward, backward, jvp and second-order math functions of one variant."""
    tape = d.tape
    inputs = tuple(i.name for i in fn.inputs)
    every = tuple(i.name for i in fn.inputs if i.gets_gradient)
    differentiable = tuple(x for x in every if x not in missing)
    flags = tuple(f"need_{x}" for x in every)
    absent = [f"grad_{x}" for x in every if x in missing]

    code = Code(tape, framework, {n: n for n in inputs} | {"out": "out"})
    stats = [Result(s, Output(s, ((s, tape.nodes[s].axes),), s), None) for s in d.stats]
    fwd_lines = code.body([Result("out", d.out, None), *stats])
    if d.stats:  # (each stat's own line is `t1 = t1`: dropped)
        fwd_lines = [line for line in fwd_lines if line not in {f"{s} = {s}" for s in d.stats}]
        result = ", ".join([_rhs(fwd_lines[-1]), *d.stats])
    else:
        result = _rhs(fwd_lines[-1])
    forward = Math(f"_{fn.name}_forward", inputs, tuple(fwd_lines[:-1]), result)
    code = Code(tape, framework, {n: n for n in inputs} | {"out": "out"}, frozenset(d.stats))
    inputs = (*inputs, *d.stats)  # what backward and the second order are given

    results = [Result(f"grad_{x}", g, f"need_{x}") for x, g in zip(differentiable, d.grads)]
    lines = code.body(results)
    if absent:
        lines = [" = ".join([*absent, "None"]), *lines]
    backward = Math(
        f"_{fn.name}_backward",
        (*inputs, "grad", *flags),
        tuple(lines),
        ", ".join(f"grad_{x}" for x in every) + ("," if len(every) == 1 else ""),
    )

    jvp_lines = Code(tape, framework, {n: n for n in inputs}).body([Result("out_t", d.jvp, None)])
    jvp = Math(
        f"_{fn.name}_jvp",
        (*inputs[: len(inputs) - len(d.stats)], *(f"{x}_t" for x in every)),
        tuple(jvp_lines[:-1]),
        _rhs(jvp_lines[-1]),
    )

    second = None
    if d.second is not None:
        wrt = (*differentiable, "grad")
        results = []
        for x, outs in zip(differentiable, d.second):
            for y, out in zip(wrt, outs):
                if out.parts:
                    results.append(Result(f"{y}_bar", out, f"gg_{x} is not None and need_{y}_bar"))
        lines = code.body(results)
        assigned = {r.target for r in results}
        unset = [f"{y}_bar" for y in (*every, "grad") if f"{y}_bar" not in assigned]
        if unset:
            if lines and lines[0].endswith(" = None"):
                lines = [" = ".join([*unset, lines[0]]), *lines[1:]]
            else:
                lines = [" = ".join([*unset, "None"]), *lines]
        second = Math(
            f"_{fn.name}_backward_backward",
            (
                *inputs,
                "grad",
                *(f"gg_{x}" for x in every),
                *(f"need_{y}_bar" for y in (*every, "grad")),
            ),
            tuple(lines),
            ", ".join(f"{y}_bar" for y in (*every, "grad")),
        )
    return forward, backward, jvp, second


def plan_tensor(fn: Function, framework: str) -> TensorPlan:
    variants = _variants(fn)
    derived = {m: derive_tensor(fn, m) for m in variants}
    maths = {m: _maths(fn, derived[m], framework, m) for m in variants}
    forward, backward, jvp, second = (
        _merge([(m, maths[m][k]) for m in variants]) if maths[variants[-1]][k] else None
        for k in range(4)
    )
    d = derived[frozenset()]
    tape = d.tape
    inputs = tuple(i.name for i in fn.inputs)
    tensors = tuple(i.name for i in fn.inputs if i.is_tensor)
    differentiable = tuple(i.name for i in fn.inputs if i.gets_gradient)
    flags = tuple(f"need_{x}" for x in differentiable)
    optional = {i.name for i in fn.inputs if i.optional}

    # what backward reads, per gradient: a tensor is saved when a gradient that reads it is
    # needed (second order reads what its gradient's first order did, plus grad)
    saves = []
    for t in tensors:
        readers = [
            f
            for x, g, f in zip(differentiable, d.grads, flags)
            if t in tape.inputs_of([n for n, _ in g.parts])
            or (d.second is not None and _second_reads(tape, d, x, t))
        ]
        if t in optional:
            # saved as given: whether it was given picks the backward's formulas
            saves.append((t, None))
        elif readers:
            saves.append((t, None if len(readers) == len(flags) else " or ".join(readers)))
    checks = []
    for dim in sorted(set(d.formula.dims.values())):
        uses = []
        for i in fn.inputs:
            if i.shape and dim in i.shape:
                named = [a for a in i.shape if a != "..."]
                uses.append((i.name, named.index(dim) - len(named)))
        if len(uses) > 1:
            checks.append((dim, tuple(uses)))
    plan = TensorPlan(
        name=fn.name,
        class_name=fn.class_name,
        grad_class=f"{fn.class_name}Grad" if d.second is not None else None,
        summary=(fn.doc or f"{fn.name}: {fn.outputs[0].text}").splitlines()[0],
        doc_lines=_doc(fn, d),
        inputs=inputs,
        tensors=tensors,
        scalars=tuple(
            (i.name, None if not i.has_default else repr(float(i.default)))
            for i in fn.inputs
            if not i.is_tensor
        ),
        differentiable=differentiable,
        positions={n: k for k, n in enumerate(inputs)},
        forward=forward,
        backward=backward,
        jvp=jvp,
        second=second,
        saves=tuple(saves),
        axis_checks=tuple(checks),
        optional=tuple(i.name for i in fn.inputs if i.optional),
        stats=d.stats,
        formula=d.formula,
    )
    plan.methods = _torch_methods(plan) if framework == "torch" else _tf_methods(plan)
    return plan


def _tuple(names) -> str:
    names = list(names)
    return ", ".join(names) + ("," if len(names) == 1 else "")


def _torch_methods(p: TensorPlan) -> Methods:
    flags = [f"ctx.needs_input_grad[{p.positions[x]}]" for x in p.differentiable]
    scalars = [s for s, _ in p.scalars]
    stats = list(p.stats)
    setup = [f"{_tuple(p.inputs)} = inputs"]
    if stats:  # the forward's small reductions, returned beside its output: no gradient
        setup.append(f"_, {', '.join(stats)} = output")
        setup.append(f"ctx.mark_non_differentiable({', '.join(stats)})")
    guards = " ".join(g for _, g in p.saves if g)
    setup += [f"need_{x} = {f}" for x, f in zip(p.differentiable, flags) if f"need_{x}" in guards]
    if scalars:
        setup.append(f"ctx.scalars = ({_tuple(scalars)})")
    saved = [t if g is None else f"{t} if {g} else None" for t, g in p.saves]
    setup.append(f"ctx.save_for_backward({', '.join([*saved, *stats])})")
    setup.append(f"ctx.save_for_forward({', '.join(p.tensors)})")

    unpack = []
    if p.saves or stats:
        unpack.append(f"{_tuple([*(t for t, _ in p.saves), *stats])} = ctx.saved_tensors")
    unpack += [
        f"{t} = None  # (no gradient asked for reads it)"
        for t in p.tensors
        if t not in {s for s, _ in p.saves}
    ]
    scalar_unpack = [f"{_tuple(scalars)} = ctx.scalars"] if scalars else []
    grads = _tuple(f"grad_{x}" for x in p.differentiable)
    args = ", ".join([*p.inputs, *stats, "grad", *flags])
    if p.grad_class:
        call = f"{grads} = _grad(True, {p.grad_class}, _{p.grad_class}, {args})"
    else:
        call = f"{grads} = _run({p.backward.name}, {args})"
    returns = ", ".join(f"grad_{x}" if x in p.differentiable else "None" for x in p.inputs)
    backward = [*unpack, *scalar_unpack, call, f"return {returns}"]

    tangents = [f"{x}_t" for x in p.inputs]
    jvp = [f"{_tuple(p.tensors)} = ctx.saved_tensors", *scalar_unpack]
    for x in p.differentiable:
        absent = f" and {x} is not None" if x in p.optional else ""
        jvp.append(f"if {x}_t is None{absent}:")
        jvp.append(f"    {x}_t = torch.zeros_like({x})")
    nones = "".join(", None" for _ in stats)
    jvp.append(f"return _run({p.jvp.name}, {', '.join(p.jvp.args)}){nones}")

    grad_setup = [f"{', '.join([*p.inputs, *stats])}, grad, *_ = inputs"]
    if scalars:
        grad_setup.append(f"ctx.scalars = ({_tuple(scalars)})")
    grad_setup.append(f"ctx.save_for_backward({', '.join([*p.tensors, *stats])}, grad)")
    cotangents = [f"gg_{x}" for x in p.differentiable]
    n = len(p.inputs) + len(stats)
    needs = [f"need[{p.positions[x]}]" for x in p.differentiable] + [f"need[{n}]"]
    bars = [f"{x}_bar" for x in p.differentiable] + ["grad_bar"]
    grad_backward = [
        f"{', '.join([*p.tensors, *stats])}, grad = ctx.saved_tensors",
        *scalar_unpack,
        "need = ctx.needs_input_grad",
        f"{', '.join(bars)} = _run(",
        f"    {p.second.name if p.second else ''},",
        f"    {', '.join([*p.inputs, *stats, 'grad', *cotangents, *needs])},",
        ")",
        "return "
        + ", ".join(
            [f"{x}_bar" if x in p.differentiable else "None" for x in p.inputs]
            + ["None"] * len(stats)
            + ["grad_bar"]
            + ["None"] * len(p.differentiable)
        ),
    ]
    wrapper = [
        f'_check_axis("{p.name}", "{dim}", {", ".join(f"({t}, {k})" for t, k in uses)})'
        for dim, uses in p.axis_checks
    ]
    first = "[0]" if stats else ""
    wrapper.append(f"return _apply({p.class_name}, _{p.class_name}, {', '.join(p.inputs)}){first}")
    return Methods(
        setup,
        backward,
        tangents,
        jvp,
        grad_setup,
        cotangents,
        grad_backward,
        _signature(p, "torch.Tensor"),
        wrapper,
    )


def _second_reads(tape: Tape, d: Derivation, x: str, t: str) -> bool:
    k = [g.name for g in d.grads].index(f"grad_{x}")
    return any(t in tape.inputs_of([n for n, _ in o.parts]) for o in d.second[k])


def _rhs(line: str) -> str:
    return line.split(" = ", 1)[1]


def _doc(fn: Function, d: Derivation) -> list[str]:
    lines = [
        "Tensor expression, as written in the spec::",
        "",
        f"    out[{', '.join(d.formula.shape)}] = {fn.outputs[0].text}",
        "",
        "Stable form symgrad derived::",
        "",
        f"    out[{', '.join(d.formula.shape)}] = {spec_text(d.formula.expr)}",
    ]
    if fn.doc and len(fn.doc.splitlines()) > 1:
        lines = [*fn.doc.splitlines()[1:], "", *lines]
    return lines


def _tf_methods(p: TensorPlan) -> Methods:
    """The TensorFlow wrapper: ``tf.custom_gradient`` over the tensors given (scalars and
    absent optional inputs are closed over), its gradient another custom_gradient whose
    gradient is the second order. One block per set of absent optional inputs."""
    optional = list(p.optional)
    variants = [
        frozenset(c) for r in range(len(optional), -1, -1) for c in combinations(optional, r)
    ]
    wrapper = [
        f'_check_axis("{p.name}", "{dim}", {", ".join(f"({t}, {k})" for t, k in uses)})'
        for dim, uses in p.axis_checks
    ]
    grad_fn: list[str] = []
    for missing in variants:
        tensors = [t for t in p.tensors if t not in missing]
        diff = [x for x in p.differentiable if x not in missing]
        grads = [f"grad_{x}" for x in diff]
        every = [f"grad_{x}" for x in p.differentiable]
        given = [*p.inputs, *p.stats]
        backward_call = (
            f"{p.backward.name}({', '.join([*given, 'grad', *(['True'] * len(every))])})"
        )
        returns = ", ".join(f"grad_{x}" if x in diff else "None" for x in tensors)
        if p.second is None:
            inner = [f"{_tuple(every)} = {backward_call}", f"return {returns}"]
        else:
            lhs = grads[0] if len(grads) == 1 else ", ".join(grads)
            inner = [f"{lhs} = _{p.name}_grad({', '.join([*given, 'grad'])})"]
            inner.append(f"return {returns}")
        block = [
            "@tf.custom_gradient",
            f"def forward({', '.join(tensors)}):",
            f"    {', '.join(['out', *p.stats])} = {p.forward.name}({', '.join(p.inputs)})",
            "",
            "    def backward(grad):",
            *(f"        {line}" for line in inner),
            "",
            "    return out, backward",
            "",
            f"return forward({', '.join(f'tf.convert_to_tensor({t})' for t in tensors)})",
        ]
        wrapper += _guarded(missing, block)
        if p.second is not None:
            bars = [f"{x}_bar" if x in diff else "_" for x in p.differentiable] + ["grad_bar"]
            bar_returns = ", ".join(
                [f"{x}_bar" if x in diff else "None" for x in tensors] + ["grad_bar"]
            )
            gg = [f"gg_{x}" if x in diff else "None" for x in p.differentiable]
            block = [
                "@tf.custom_gradient",
                f"def forward({', '.join([*tensors, 'grad'])}):",
                f"    {_tuple(g if g in grads else '_' for g in every)} = {backward_call}",
                "",
                f"    def backward({', '.join(f'gg_{x}' for x in diff)}):",
                f"        {', '.join(bars)} = {p.second.name}(",
                f"            {', '.join([*given, 'grad', *gg])},",
                f"            {', '.join(['True'] * (len(p.differentiable) + 1))},",
                "        )",
                f"        return {bar_returns}",
                "",
                f"    return {grads[0] if len(grads) == 1 else '(' + ', '.join(grads) + ')'}, backward",
                "",
                f"return forward({', '.join([*tensors, 'grad'])})",
            ]
            grad_fn += _guarded(missing, block)
    return Methods([], [], [], [], [], [], grad_fn, _signature(p, "tf.Tensor"), wrapper)


def _guarded(missing: frozenset[str], block: list[str]) -> list[str]:
    if not missing:
        return block
    return [f"if {_when(missing)}:", *(f"    {line}" if line else "" for line in block), ""]


def _signature(p: TensorPlan, tensor: str) -> str:
    defaults = dict(p.scalars)
    params = []
    for x in p.inputs:
        if x in p.optional:
            params.append(f"{x}: {tensor} | None = None")
        elif x in p.tensors:
            params.append(f"{x}: {tensor}")
        elif defaults.get(x) is not None:
            params.append(f"{x}: float = {defaults[x]}")
        else:
            params.append(f"{x}: float")
    return ", ".join(params)

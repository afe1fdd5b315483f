"""Plan the generated code: what each method computes, what is saved, shared temporaries.

Input: a :class:`~symgrad.derive.Derived`. Output: per framework, plain data (names and
lines of code already printed) that the templates lay out. No maths happens after this.
"""

from __future__ import annotations

import ast
import copy
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from symgrad.cse import common_subexpressions, fresh_symbols
from symgrad.derived import Derived
from symgrad.docstrings import formula_doc, one_line
from symgrad.functions import (
    ROOT_POWER_HELPER,
    StableFunction,
    grouped,
    hypot,
    hypot_ratio,
    tan_half_atan,
)
from symgrad.ir import Node, Role, Tape, Value, parse_expr
from symgrad.ops import OPS, ROUNDED_HELPER, TORCH_ARITHMETIC, WIDE_HELPER, spelled
from symgrad.printers import PRINTERS, FrameworkPrinter
from symgrad.rewrite.rules import hypot_power_ratio, stabilize


def emit(
    assignments: Sequence[tuple[str, sympy.Expr]],
    printer: FrameworkPrinter,
    temp_prefix: str = "t",
    copy_inputs: bool = False,
    values: Mapping[str, Value] | None = None,
    in_place: bool = False,
    group_scalars: bool = False,
    upstream: frozenset[sympy.Symbol] = frozenset(),
) -> Tape:
    """The tape of ``name = expr`` for each assignment, sharing common subexpressions.

    ``values``: what the code starts from (inputs, saved tensors, upstream gradients; see
    :mod:`symgrad.ir`). With ``in_place`` temporaries are updated in place: only for code
    that runs without autograd recording. ``group_scalars``: the Python-number terms and
    factors of a sum or product with tensors become one number first (one pass over the
    tensor instead of one per term). ``upstream``: upstream-gradient symbols, multiplied
    after a select rather than into each of its branches (:func:`_select_then_scale`).
    """
    exprs = [
        _factors_into_branches(
            _expand_regimes(_paired_hypot_powers(_select_then_scale(sympy.sympify(e), upstream)))
        )
        for _, e in assignments
    ]
    temps = fresh_symbols(exprs, temp_prefix)
    replacements = []
    if group_scalars:
        groups, exprs = _group_scalars(exprs, printer.scalars)
        names = {d: next(temps) for d, _ in groups}
        replacements = [(names[d], value.xreplace(names)) for d, value in groups]
        exprs = [e.xreplace(names) for e in exprs]
    # each compound argument of a primitive the printer writes out once more: CSE names it
    arguments = _written_out_arguments(exprs)
    cse_replacements, reduced = _without_aliases(*common_subexpressions(exprs + arguments, temps))
    reduced = reduced[: len(exprs)]
    replacements += cse_replacements
    tape = Tape(dict(values or {}))
    tape.values |= {s.name: Value(s.name, Role.NUMBER, "other") for s in printer.scalars}
    for temp, value in replacements:
        scalar = printer.is_scalar(value)
        role = Role.NUMBER if scalar else Role.TEMPORARY
        tape.define(temp.name, parse_expr(printer.doprint(value)), role)
        printer.temporaries.record(temp, value)
        if scalar:
            printer.scalars = printer.scalars | {temp}
        if isinstance(value, sympy.logic.boolalg.Boolean):
            printer.booleans.add(temp)
    for (name, _), value in zip(assignments, reduced):
        code = printer.doprint(value)
        if isinstance(value, sympy.Symbol) and copy_inputs and not printer.is_scalar(value):
            # autograd.Function outputs must not be inputs returned as they are.
            code = f"{code}.clone()"
        tape.define(name, parse_expr(code), Role.RESULT)
    if in_place:
        tape = update_in_place(tape)
    return tape


def _expand_regimes(expr: sympy.Expr) -> sympy.Expr:
    """Primitives without a framework op (dsigmoid, erfcx_inv, ...) in their elementary
    form, before CSE: their pieces (|x|, exp(-|x|)) are computed once and shared with the
    rest. A form whose order of operations SymPy would undo is left for the printer
    (exprel's exp(x/2) * (exp(x/2) * P) must not become exp(x/2)**2 * P: CSE rebuilds
    every node). hypot_ratio stays too: its b/hypot(x, y) would merge with the powers
    around it (hypot_ratio(y, x, y)**2 / hypot(x, y) -> y**2 / hypot(x, y)**3), and
    hypot(x, y)**3 overflows where the ratios the printer writes do not; tan_half_atan
    likewise (q * tan_half_atan(q) would become q**2 / (1 + hypot(q, 1)), whose q**2
    overflows)."""

    def expanded(node: StableFunction) -> sympy.Expr:
        form = _regime_form(node)
        # a product stays one factor of the product around it (functions.grouped)
        return grouped.of(node, form) if isinstance(form, (sympy.Mul, sympy.Pow)) else form

    return expr.replace(
        lambda e: (
            isinstance(e, StableFunction)
            and not isinstance(e, (hypot_ratio, tan_half_atan))
            and _regime_form(e) is not None
        ),
        expanded,
    )


def _without_aliases(replacements, reduced):
    """Each temporary that is another in parentheses (:class:`~symgrad.functions.grouped`
    around a form that CSE named: ``t11 = (t9)``) replaced by that name: an alias is one
    line more, and neither of its names may be updated in place. A grouped factor bounded
    by 1 stays: the printers order the factors of a product by it."""
    aliases: dict[sympy.Symbol, sympy.Symbol] = {}
    kept = []
    for temp, value in replacements:
        value = value.xreplace(aliases)
        if isinstance(value, grouped) and value.args[0].is_Symbol and value.args[1] == 0:
            aliases[temp] = value.args[0]
        else:
            kept.append((temp, value))
    return kept, [e.xreplace(aliases) for e in reduced]


def _written_out_arguments(exprs: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """The compound arguments of the primitives that the printer writes out itself (their
    regimes: what :func:`_expand_regimes` left), which read their argument once per use:
    exprel(i*t2)'s Taylor branch is a Horner scheme in its argument, and printed as it is,
    ``i * t2`` was computed 25 times (one temporary each, in place). Given to CSE beside
    the formulas, each is named once; the same values, one pass each."""
    nodes = {n for e in exprs for n in e.atoms(StableFunction) if n.regimes() is not None}
    arguments = {a for n in nodes for a in n.args if a.free_symbols and not a.is_Atom}
    return sorted(arguments, key=sympy.default_sort_key)


def _factors_into_branches(expr: sympy.Expr) -> sympy.Expr:
    """c * Piecewise((b1, k1), ...) as Piecewise((c*b1, k1), ...) where c cancels a factor
    of a branch: a primitive written out (:func:`_expand_regimes`) meets the factors around
    it only here, after every rewrite.

    log1prel_d(1, u) is v*(v/(1 + v) - v*log1p(v) + v*log(v)) above u = 1, v = 1/u: 0 where
    u overflows, and the chain rule multiplies it by u (compound interest's d/di, u = i/n
    at i = 3e144, n = 1e-191): inf * 0, NaN, where u * v cancels and the branch is finite.
    A factor that cancels nothing stays outside, one multiply after the select."""

    def cancels(powers: dict, branch: sympy.Expr) -> bool:
        return any(
            (powers[b] * e).is_negative
            for b, e in (f.as_base_exp() for f in sympy.Mul.make_args(branch))
            if b in powers
        )

    def fold(node: sympy.Mul) -> sympy.Expr:
        pieces = [f for f in node.args if isinstance(f, sympy.Piecewise)]
        if len(pieces) != 1:
            return node
        outside = sympy.Mul(*(f for f in node.args if f is not pieces[0]))
        powers = dict(f.as_base_exp() for f in sympy.Mul.make_args(outside) if not f.is_number)
        if not any(cancels(powers, b) for b, _ in pieces[0].args):
            return node
        return sympy.Piecewise(*((outside * b, c) for b, c in pieces[0].args))

    return expr.replace(lambda e: isinstance(e, sympy.Mul) and e.has(sympy.Piecewise), fold)


def _select_then_scale(expr: sympy.Expr, upstream: frozenset[sympy.Symbol]) -> sympy.Expr:
    """Piecewise((grad*a, c), (grad*b, True)) as grad * Piecewise((a, c), (b, True)).

    Folding puts the upstream gradient into every branch (piecewise_fold, needed for
    factors like exp(x) that may be inf where a branch is 0); for the upstream gradient one
    multiply after the select is the same value and one pass less. Branches that are 0 keep
    it folded: PyTorch's own backwards give 0 there even for an inf upstream gradient.
    """
    if not upstream or not expr.has(sympy.Piecewise):
        return expr

    def scaled(node: sympy.Piecewise) -> sympy.Expr:
        common = None
        for value, _ in node.args:
            factors = {f for f in sympy.Mul.make_args(value) if f in upstream}
            common = factors if common is None else common & factors
        if not common:
            return node
        scale = sympy.Mul(*sorted(common, key=sympy.default_sort_key))
        return scale * sympy.Piecewise(*((value / scale, cond) for value, cond in node.args))

    return expr.replace(lambda e: isinstance(e, sympy.Piecewise), scaled)


def _paired_hypot_powers(expr: sympy.Expr) -> sympy.Expr:
    """x*y / hypot(x, y)**3 as hypot_ratio(x, x, y) * hypot_ratio(y, x, y) / hypot(x, y).

    The printers pair the powers themselves, but only where they see hypot: once CSE has
    named hypot(x, y) t0, x*y / t0**3 overflows for |x| > 1e102. So the pairing rule of
    :mod:`symgrad.rewrite.rules` is applied before CSE, whatever form the choice took.
    """
    return stabilize(expr, (hypot_power_ratio,)) if expr.has(hypot) else expr


@functools.cache
def _regime_form(node: StableFunction) -> sympy.Expr | None:
    """``node.regimes()`` where rebuilding every node keeps it as it is, else None."""
    regimes = node.regimes()
    return regimes if regimes is not None and _rebuilt(regimes) == regimes else None


def _rebuilt(expr: sympy.Basic) -> sympy.Basic:
    """``expr`` with every node rebuilt (evaluated), as sympy.cse rebuilds them."""
    if expr.is_Atom or not expr.args:
        return expr
    return expr.func(*(_rebuilt(a) for a in expr.args))


def _group_scalars(
    exprs: list[sympy.Expr], scalars: frozenset[sympy.Symbol]
) -> tuple[list[tuple[sympy.Dummy, sympy.Expr]], list[sympy.Expr]]:
    """Scalar terms of sums and factors of products (two or more, not all numbers) as
    one symbol each: ``x**2*(nu + 1)/2`` -> ``x**2*s`` with ``s = (nu + 1)/2``."""
    groups: list[tuple[sympy.Dummy, sympy.Expr]] = []
    known: dict[sympy.Expr, sympy.Dummy] = {}

    def visit(e: sympy.Basic) -> sympy.Basic:
        if not e.args or e.free_symbols <= scalars:
            return e
        args = [visit(a) for a in e.args]
        if isinstance(e, (sympy.Add, sympy.Mul)):
            numbers = [a for a in args if a.free_symbols <= scalars]
            if len(numbers) >= 2 and any(a.free_symbols for a in numbers):
                value = e.func(*numbers)
                if value not in known:
                    known[value] = sympy.Dummy(real=True)
                    groups.append((known[value], value))
                return e.func(known[value], *(a for a in args if not a.free_symbols <= scalars))
        return e.func(*args) if tuple(args) != e.args else e

    exprs = [visit(e) for e in exprs]
    return groups, exprs


# ----------------------------------------------------------------------------- buffers
# Eager torch allocates every intermediate anew, and fresh memory (page faults) costs more
# than the arithmetic on it. Code that runs without autograd recording (Function.forward,
# the first-order backward) therefore updates the temporaries it owns in place:
# `t = a * b; u = t + c` becomes `t.mul_(b).add_(c)`-style updates of the dead buffer.

#: torch functions of one tensor (the first argument) with an in-place method.
_TORCH_INPLACE = {
    **{op.torch: op.torch_inplace for op in OPS if op.torch_inplace},
    **{func: method for func, method in TORCH_ARITHMETIC.items() if method},
}
#: torch functions that return a new tensor (never a view of an argument).
_TORCH_FRESH = {
    *(op.torch for op in OPS if spelled(op.torch)),
    *TORCH_ARITHMETIC,
}

#: The generated module's helpers that the printers call, elementwise functions of their
#: tensor arguments that return a new tensor (symgrad/runtime/torch_helpers.py).
_ELEMENTWISE_HELPERS = frozenset({"_tan_half_atan", ROOT_POWER_HELPER})


#: The dtype name of the values computed from :data:`WIDE_HELPER`'s (not an identifier).
_FLOAT64 = "<float64>"


@dataclass(frozen=True)
class _Value:
    """What the buffer pass knows of a tensor value.

    ``shape``/``dtype``: the names whose shapes (dtypes) determine its shape (dtype);
    ``kind``: "float" when surely floating point, "bool", or "other" (e.g. an integer
    target); ``owned``: a buffer this body allocated that nothing reads afterwards.
    """

    shape: frozenset[str]
    dtype: frozenset[str]
    kind: str
    owned: bool = False


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _method(owner: ast.expr, name: str, *args: ast.expr, **kwargs: ast.expr) -> ast.Call:
    return ast.Call(
        func=ast.Attribute(value=owner, attr=name, ctx=ast.Load()),
        args=list(args),
        keywords=[ast.keyword(arg=k, value=v) for k, v in kwargs.items()],
    )


#: The select helper of the generated torch module (symgrad/runtime/torch_helpers.py): code
#: that records no autograd graph calls it instead of torch.where.
WHERE_HELPER = "_where"
#: The module helper that multiplies into an owned buffer where a check at run time shows
#: the product fits it (the upstream gradient's shape is only known then).
MUL_HELPER = "_mul_into"
#: Calls that inductor compiles slowly or inaccurately, routed in graph-free code through
#: module helpers that run the op itself eagerly and an accurate form when compiled (the
#: fused path): inductor's log1p costs twice its log; its vectorised CPU expm1 and atanh
#: are exp(x) - 1 and log((1 + x) / (1 - x)) / 2, which lose every digit near 0, and its
#: float32 erf a polynomial within 1.5e-7 absolute (erf(1e-7) comes out 100% off), its
#: erfc a scalar loop (6x its erf: a Chebyshev series instead, symgrad.series); its
#: sigmoid computes an exp(-x) of its own where the code (a dsigmoid, a softplus) already
#: has exp(-|x|): sigmoid is routed only there (on its own, inductor's is the cheaper).
COMPILED_FORMS = {op.torch: op.torch_compiled for op in OPS if op.torch_compiled}


class _Buffers:
    """Rewrites straight-line ``name = expr`` torch code to update owned buffers in place.

    A buffer is updated in place only where that cannot change a result: it is a value
    this code allocated (never an input, a saved tensor or a result), nothing reads it
    afterwards, it is floating point, and the update's result has its shape and dtype,
    which holds when the other operands' shapes and dtypes come from names its own come
    from (so broadcasting and type promotion cannot widen it, and under vmap it is batched
    wherever they are). Python numbers never widen a floating tensor.
    """

    def __init__(self, tape: Tape, keep_results: bool = True):
        self.passes = 0  # tensor operations, each a pass over memory
        tensors = {n: v for n, v in tape.values.items() if v.role is not Role.NUMBER}
        self.values = {
            n: _Value(frozenset({n}), frozenset({n}), v.kind) for n, v in tensors.items()
        }
        self.keep = tape.names(Role.RESULT) if keep_results else set()
        self.numbers = tape.names(Role.NUMBER) | {"math", "torch"}
        self.floats = {n for n, v in tensors.items() if v.kind == "float"} | {_FLOAT64}
        self.routed: set[int] = set()  # id() of the sigmoid calls sent to _sigmoid
        self.tape = tape

    def rewrite(self) -> Tape:
        # the passes rebuild and annotate operation trees: never those of the tape given
        fresh = [Node(n.target, copy.deepcopy(n.expr)) for n in self.tape.nodes]
        nodes = _single_reads(fresh, self.keep | self.numbers)
        self.routed = _share_exp_neg_abs(nodes)
        last_use: dict[str, int] = {}
        for k, node in enumerate(nodes):
            for name in node.reads():
                last_use[name] = k
        result = Tape(dict(self.tape.values))
        for k, node in enumerate(nodes):
            reads = node.reads()
            self.dead = {
                n for n in reads if last_use[n] == k and reads.count(n) == 1 and n not in self.keep
            }
            value, info = self.visit(node.expr)
            if info is not None:
                if isinstance(node.expr, ast.Name):  # an alias: neither name may be updated
                    self.keep.add(node.expr.id)
                    info = _Value(info.shape, info.dtype, info.kind, False)
                self.values[node.target.name] = info
            result.nodes.append(Node(node.target, value))
        return result

    # ------------------------------------------------------------------ expressions
    def visit(self, node: ast.expr) -> tuple[ast.expr, _Value | None]:
        """The rewritten expression and what it is (None: not a tensor)."""
        if isinstance(node, ast.Name):
            if node.id in self.numbers:
                return node, None
            # a name nobody described is a tensor of its own that nothing may update
            unknown = _Value(frozenset({node.id}), frozenset({node.id}), "other")
            info = self.values.get(node.id, unknown)
            owned = info.owned and node.id in self.dead
            return node, _Value(info.shape, info.dtype, info.kind, owned)
        new, info = self.operation(node)
        if info is not None:
            self.passes += 1
        return new, info

    def operation(self, node: ast.expr) -> tuple[ast.expr, _Value | None]:
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.UnaryOp):
            operand, info = self.visit(node.operand)
            if info is None:
                return node, None
            if isinstance(node.op, ast.USub) and self.can_update(info, info):
                return _method(operand, "neg_"), info
            kind = "bool" if isinstance(node.op, (ast.Invert, ast.Not)) else info.kind
            return ast.UnaryOp(node.op, operand), _Value(info.shape, info.dtype, kind, True)
        if isinstance(node, ast.Compare):
            parts = [self.visit(e) for e in (node.left, *node.comparators)]
            infos = [i for _, i in parts if i is not None]
            if not infos:
                return node, None
            new = ast.Compare(parts[0][0], node.ops, [e for e, _ in parts[1:]])
            return new, _Value(self.union(infos, "shape"), frozenset(), "bool", True)
        if isinstance(node, ast.Call):
            return self.call(node)
        # numbers, attributes (math.pi, x.dtype), scalar conditionals: left as they are
        return node, None

    def union(self, infos, field_name: str) -> frozenset[str]:
        return frozenset().union(*(getattr(i, field_name) for i in infos))

    def combine(self, infos, kind: str | None = None) -> _Value:
        """A fresh value computed elementwise from ``infos``."""
        dtype = self.union(infos, "dtype")
        if kind is None:
            kind = "float" if dtype & self.floats else "other"
        return _Value(self.union(infos, "shape"), dtype, kind, True)

    def may_update(self, owner: _Value | None, result: _Value) -> bool:
        """``owner`` is a floating buffer this code owns and ``result`` floating: updating
        it is right wherever the result fits (known here, or checked at run time)."""
        return (
            owner is not None and owner.owned and owner.kind == "float" and result.kind == "float"
        )

    def can_update(self, owner: _Value | None, result: _Value) -> bool:
        return (
            self.may_update(owner, result)
            and result.shape <= owner.shape
            and result.dtype <= owner.dtype
        )

    def binop(self, node: ast.BinOp) -> tuple[ast.expr, _Value | None]:
        (left, li), (right, ri) = self.visit(node.left), self.visit(node.right)
        infos = [i for i in (li, ri) if i is not None]
        if not infos:
            return node, None
        op = node.op
        bitwise = isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor))
        result = self.combine(infos, "bool" if bitwise else None)
        left_ok, right_ok = self.can_update(li, result), self.can_update(ri, result)
        method = {ast.Add: "add_", ast.Sub: "sub_", ast.Mult: "mul_", ast.Div: "div_"}
        method[ast.Pow] = "pow_"
        name = method.get(type(op))
        if name and left_ok and not bitwise:
            return _method(left, name, right), result
        if right_ok and isinstance(op, (ast.Add, ast.Mult)):
            return _method(right, name, left), result
        if right_ok and isinstance(op, ast.Sub):  # a - t = (-t) + a, exactly
            return _method(_method(right, "neg_"), "add_", left), result
        if right_ok and isinstance(op, ast.Div) and _is_one(left):
            return _method(right, "reciprocal_"), result
        if isinstance(op, ast.Mult):
            for owner, info, other in ((left, li, right), (right, ri, left)):
                if self.may_update(info, result):
                    return ast.Call(ast.Name(MUL_HELPER, ast.Load()), [owner, other], []), result
        return ast.BinOp(left, op, right), result

    def call(self, node: ast.Call) -> tuple[ast.expr, _Value | None]:
        func = _dotted(node.func)
        if func in (WIDE_HELPER, ROUNDED_HELPER):
            return self.cast(node, func)
        if func in _ELEMENTWISE_HELPERS:
            args = [self.visit(a) for a in node.args]
            infos = [i for _, i in args if i is not None]
            new = ast.Call(node.func, [a for a, _ in args], node.keywords)
            return new, (self.combine(infos) if infos else None)
        if func is None or not func.startswith("torch."):
            if isinstance(node.func, ast.Attribute):
                return self.method_call(node)  # t.to(...), math.exp(...)
            return node, None  # max(), abs(), ...: Python numbers
        args = [self.visit(a) for a in node.args]
        keywords = [(k, self.visit(k.value)) for k in node.keywords]
        infos = [i for _, i in args if i is not None]
        infos += [i for _, (_, i) in keywords if i is not None]
        new = ast.Call(
            node.func,
            [a for a, _ in args],
            [ast.keyword(arg=k.arg, value=v) for k, (v, _) in keywords],
        )
        if not infos:
            return new, None
        result = self.combine(infos)
        if func == "torch.where":  # the condition lends its shape, not its dtype
            branches = [i for _, i in args[1:] if i is not None]
            dtype = self.union(branches, "dtype")
            kind = "float" if dtype & self.floats else "other"
            result = _Value(result.shape, dtype, kind, True)
            return self.where(new, args, result), result
        if func not in _TORCH_FRESH:
            return new, _Value(result.shape, result.dtype, "other", False)
        first, first_info = args[0] if args else (None, None)
        if func in COMPILED_FORMS and (func != "torch.sigmoid" or id(node) in self.routed):
            new.func = ast.Name(COMPILED_FORMS[func], ast.Load())
            if func in _TORCH_INPLACE and self.can_update(first_info, result):
                new.keywords.append(ast.keyword("overwrite", ast.Constant(True)))
            return new, result
        if func in _TORCH_INPLACE and self.can_update(first_info, result):
            rest = [a for a, _ in args[1:]]
            kw = {k.arg: v for k, (v, _) in keywords}
            return _method(first, _TORCH_INPLACE[func], *rest, **kw), result
        return new, result

    def cast(self, node: ast.Call, func: str) -> tuple[ast.expr, _Value | None]:
        """``_in_float64(x)``, ``_rounded_like(value, *like)``: ``x`` (``value``) itself
        where it has that dtype already, so never a buffer to update; float64 is a dtype
        name of its own (:data:`_FLOAT64`), ``like``'s dtype theirs."""
        args = [self.visit(a) for a in node.args]
        new = ast.Call(node.func, [a for a, _ in args], [])
        (_, first), rest = args[0], [i for _, i in args[1:] if i is not None]
        if first is None:
            return new, None
        if func == WIDE_HELPER:
            return new, _Value(first.shape, frozenset({_FLOAT64}), "float", False)
        return new, _Value(first.shape, self.union(rest, "dtype"), first.kind, False)

    def where(self, new: ast.Call, args, result: _Value) -> ast.Call:
        """``torch.where`` -> the generated module's ``_where`` (a branch-free select on
        CPU), told which branch buffer it may write the result into."""
        new.func = ast.Name(WHERE_HELPER, ast.Load())
        if len(args) == 3:
            for label, (_, info) in zip("ab", args[1:]):
                if self.can_update(info, result):
                    new.keywords = [ast.keyword("overwrite", ast.Constant(label))]
                    break
        return new

    def method_call(self, node: ast.Call) -> tuple[ast.expr, _Value | None]:
        """``t.to(x.dtype)``, ``t.clone()``: the only methods the printers emit on tensors."""
        receiver, info = self.visit(node.func.value)
        if info is None:
            return node, None  # math.exp(...) and the like
        new = ast.Call(
            ast.Attribute(receiver, node.func.attr, ast.Load()), node.args, node.keywords
        )
        if node.func.attr == "clone":
            return new, _Value(info.shape, info.dtype, info.kind, True)
        if node.func.attr == "to":
            names = frozenset(
                n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)
            ) & set(self.values)
            kind = "float" if names & self.floats else "other"
            return new, _Value(info.shape, names or info.dtype, kind, info.owned)
        return new, _Value(info.shape, info.dtype, "other", False)


_OPERATIONS = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call)


#: The calls whose compiled forms compute ``t = exp(-|a|)`` of their argument a.
_EXP_NEG_ABS_USERS = ("torch.sigmoid", "torch.nn.functional.softplus")


def _share_exp_neg_abs(nodes: list[Node]) -> set[int]:
    """Lets the compiled forms of sigmoid and softplus share one ``exp(-|a|)``.

    Compiled, ``_sigmoid`` and ``_softplus`` compute ``t = exp(-|a|)`` of their argument,
    and inductor computes each distinct expression once per kernel. Where the code also
    needs ``t`` of the same a elsewhere (a dsigmoid's ``exp(-|a|)``, softplus(a) next to
    sigmoid(a)), sigmoid goes through ``_sigmoid`` too (on its own, inductor's sigmoid is
    the cheaper): returned, the ``id()`` of those calls. A call on ``-a`` (or on a name
    bound to ``-a``) of an input name a with such company gets ``negative_of=a``, so its
    compiled form takes ``t`` from ``|a|`` as well: ``bce(z)`` then costs one exp and one
    log, not two of each. Eagerly the hint is ignored.
    """
    negations = {
        node.target.name: node.expr.operand
        for node in nodes
        if isinstance(node.expr, ast.UnaryOp)
        and isinstance(node.expr.op, ast.USub)
        and isinstance(node.expr.operand, ast.Name)
    }
    users: dict[str, list[tuple[ast.Call | None, ast.Name | None]]] = {}
    for statement in nodes:
        for node in ast.walk(statement.expr):
            if not isinstance(node, ast.Call) or len(node.args) != 1:
                continue
            func, (arg,) = _dotted(node.func), node.args
            if func == "torch.exp":
                if not (isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub)):
                    continue
                inner = arg.operand
                if isinstance(inner, ast.Call) and _dotted(inner.func) == "torch.abs":
                    users.setdefault(ast.dump(inner.args[0]), []).append((None, None))
            elif func in _EXP_NEG_ABS_USERS:
                base = None
                if isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.USub):
                    base = arg.operand
                elif isinstance(arg, ast.Name):
                    base = negations.get(arg.id)
                key = ast.dump(arg if base is None else base)
                users.setdefault(key, []).append((node, base))
    routed = set()
    for group in users.values():
        kinds = {
            (None if call is None else _dotted(call.func), base is not None) for call, base in group
        }
        if len(kinds) < 2:
            continue
        positive = any(base is None for _, base in group)
        for call, base in group:
            if call is None:
                continue
            if _dotted(call.func) == "torch.sigmoid":
                routed.add(id(call))
            if positive and isinstance(base, ast.Name):
                hint = ast.Name(base.id, ast.Load())
                call.keywords.append(ast.keyword("negative_of", hint))
    return routed


def _in_order(node: ast.AST, parent: ast.AST | None = None):
    """(node, parent) pairs in Python's evaluation order."""
    for child in ast.iter_child_nodes(node):
        yield from _in_order(child, node)
    yield node, parent


def _single_reads(nodes: list[Node], keep: set[str]) -> list[Node]:
    """Where a temporary's last statement reads it more than once, the operations of the
    earlier reads become statements of their own before it, so that the last read may
    update the temporary in place (``where(t <= 1, a, t - 0.5)``: ``t.sub_(0.5)``).
    Names in ``keep`` (results, Python numbers) are left alone."""
    defined = {node.target.name for node in nodes}
    taken = defined | {name for node in nodes for name in node.reads()}
    fresh = (f"t{k}" for k in range(10**6) if f"t{k}" not in taken)
    result: list[Node] = []
    for k, node in enumerate(nodes):
        later = {name for n in nodes[k + 1 :] for name in n.reads()}
        expr = node.expr
        for name in sorted(defined - later - keep):
            reads = [
                (child, parent)
                for child, parent in _in_order(expr)
                if isinstance(child, ast.Name) and child.id == name
            ]
            if len(reads) < 2:
                continue
            last = reads[-1][0]
            earlier = list({id(p): p for _, p in reads[:-1]}.values())
            # an operation inside another one that becomes a statement goes with it
            earlier = [
                p for p in earlier if not any(q is not p and p in set(ast.walk(q)) for q in earlier)
            ]
            if not all(
                isinstance(p, _OPERATIONS) and last not in set(ast.walk(p)) for p in earlier
            ):
                continue
            for operation in earlier:
                temp = next(fresh)
                result.append(Node(Value(temp, Role.TEMPORARY), operation))
                expr = _replace(expr, operation, ast.Name(temp, ast.Load()))
        result.append(Node(node.target, expr))
    return result


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> ast.AST:
    class Replace(ast.NodeTransformer):
        def visit(self, node):
            return new if node is old else self.generic_visit(node)

    return Replace().visit(tree)


def _is_one(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == 1


def count_passes(tape: Tape) -> int:
    """Tensor operations of ``tape`` (in-place ones included): passes over memory."""
    buffers = _Buffers(tape, keep_results=False)
    buffers.rewrite()
    return buffers.passes


def update_in_place(tape: Tape) -> Tape:
    """``tape`` with the temporaries it owns updated in place where that cannot change a
    result (see :class:`_Buffers`). Values not on the tape are taken for tensors that
    nothing may update."""
    return _Buffers(tape).rewrite()


_UNPACK_SOURCES = ("inputs", "output", "ctx.saved_tensors")


def unpack_line(names: Sequence[str], source: str) -> str:
    """``a, b = source`` (``a, = source`` for one name)."""
    return f"{', '.join(names)}{',' if len(names) == 1 else ''} = {source}"


def mark_unused(lines: list[str]) -> list[str]:
    """Prefix names unpacked from inputs/output/saved tensors but never used with ``_``;
    drop the unpacking when none is used."""
    result = []
    for k, line in enumerate(lines):
        target, _, source = line.partition(" = ")
        if source not in _UNPACK_SOURCES or line.startswith(" "):
            result.append(line)
            continue
        names = [n.strip() for n in target.strip("()").split(",") if n.strip()]
        rest = "\n".join(lines[k + 1 :])
        used = [n if re.search(rf"\b{n}\b", rest) else f"_{n}" for n in names]
        if all(n.startswith("_") for n in used):
            continue
        if len(used) == 1 and "," not in target:
            result.append(f"{used[0]} = {source}")
        else:
            result.append(unpack_line(used, source))
    return result


def guarded(tape: Tape, results: dict[str, str]) -> list[str]:
    """The lines of ``tape``, which computes several ``results`` (name -> flag), each only
    when its flag is true: a statement runs when a result that needs it does."""
    flags: dict[str, set[str]] = {r: {f} for r, f in results.items()}
    for node in reversed(tape.nodes):
        for name in node.reads():
            flags.setdefault(name, set()).update(flags.get(node.target.name, set()))
    every = set(results.values())
    out = [f"{' = '.join(results)} = None"]
    current = None
    for node in tape:
        line = node.line()
        need = flags.get(node.target.name, every)
        if need == every:
            current = None
            out.append(line)
            continue
        if need != current:
            ordered = [f for f in results.values() if f in need]
            out.append(f"if {' or '.join(ordered)}:")
            current = need
        out.append(f"    {line}")
    return out


def _needs(indices: list[int], n_inputs: int) -> list[str]:
    """The flags ``ctx.needs_input_grad[k]`` for ``k`` in ``indices`` (of a Function of
    ``n_inputs`` inputs), as call arguments: the whole tuple, or a slice, where they are."""
    if indices == list(range(n_inputs)):
        return ["*ctx.needs_input_grad"]
    if indices == list(range(len(indices))):
        return [f"*ctx.needs_input_grad[:{len(indices)}]"]
    return [f"ctx.needs_input_grad[{k}]" for k in indices]


def _save_lines(saved: list[str], inputs: list[str]) -> list[str]:
    """Save ``saved`` for backward and forward mode (``*inputs`` where that is all)."""
    names = "*inputs" if saved == inputs else ", ".join(saved)
    return [f"ctx.save_for_backward({names})", f"ctx.save_for_forward({names})"]


def is_zero(expr: sympy.Expr) -> bool:
    return sympy.sympify(expr) == 0


# ----------------------------------------------------------------------------- shared data
@dataclass
class Param:
    """One parameter of the user-facing wrapper."""

    name: str
    annotation: str
    default: str | None


@dataclass
class Method:
    """One method or function body: its argument names and lines."""

    args: list[str]
    lines: list[str]


@dataclass
class MathFn:
    """A module-level function of straight-line tensor code (torch)."""

    name: str
    args: list[str]
    lines: list[str]
    doc: str = ""


@dataclass
class Kernel:
    """One generated autograd Function (torch) or custom_gradient function (TF)."""

    name: str  # class name (torch) or function name (tf)
    doc: list[str]
    inputs: list[str]  # every argument, tensors first then scalars
    forward: Method
    setup: Method | None = None
    backward: Method | None = None
    jvp: Method | None = None
    math_name: str = ""  # torch: the module-level function holding the forward's math
    extra_math: list[MathFn] = field(default_factory=list)  # torch: e.g. the joint backward
    # torch: (eager math function, its fused-path version) where the forms differ
    fused_math: list[tuple[str, MathFn]] = field(default_factory=list)


@dataclass
class FunctionPlan:
    """Everything the templates need for one spec function."""

    name: str
    class_name: str
    summary: str
    doc_lines: list[str]
    params: list[Param]
    returns: str
    call_args: list[str]
    kernels: list[Kernel] = field(default_factory=list)


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p)


def _params(derived: Derived, framework: str) -> list[Param]:
    tensor = "torch.Tensor" if framework == "torch" else "tf.Tensor"
    params = []
    for inp in derived.function.inputs:
        if inp.is_tensor:
            params.append(Param(inp.name, tensor, None))
        else:
            default = repr(inp.default) if inp.has_default else None
            params.append(Param(inp.name, "float", default))
    return params


def _summary(derived: Derived) -> str:
    fn = derived.function
    if fn.doc:
        return fn.doc.strip().splitlines()[0]
    formulas = ", ".join(one_line(e) for _, e in derived.naive_outputs)
    return f"{fn.name}: {formulas}."


def _returns(n_outputs: int, tensor: str) -> str:
    """The wrapper's return annotation: one tensor, or a tuple of them."""
    return tensor if n_outputs == 1 else f"tuple[{', '.join([tensor] * n_outputs)}]"


def _spread_outputs(derived: Derived) -> list[str]:
    """The outputs whose formula does not read every tensor input (``cosh(y)`` for
    ``sin(x)**2 + cos(x)**2 + cosh(y)``, a number for ``x - x``): the forward broadcasts
    them to the inputs' shape and dtype, which the formula as written has."""
    tensors = {derived.symbols[i.name] for i in derived.function.inputs if i.is_tensor}
    return [
        name for name, expr in derived.outputs if not tensors <= sympy.sympify(expr).free_symbols
    ]


def _spread_lines(derived: Derived, spread: list[str]) -> list[str]:
    """``out = _broadcast_result(out, x, y)`` for each output of :func:`_spread_outputs`."""
    tensors = ", ".join(i.name for i in derived.function.inputs if i.is_tensor)
    return [f"{o} = _broadcast_result({o}, {tensors})" for o in spread]


def _broadcasts(derived: Derived) -> bool:
    return sum(1 for i in derived.function.inputs if i.is_tensor) > 1


# ----------------------------------------------------------------------------- torch
class _TorchPlanner:
    def __init__(self, derived: Derived):
        self.d = derived
        self.fn = derived.function
        self.sym = derived.symbols
        self.scalars = derived.scalars
        # upstream gradients: of the outputs, and of each VJP (the double backward's)
        self.upstream = frozenset(derived.grads) | frozenset(
            sympy.Symbol(f"grad_grad_{i}", real=True) for i in derived.diff_inputs
        )
        self.reduce = _broadcasts(derived)
        self.out_syms = derived.output_symbols()
        self._second: dict[str, dict[str, sympy.Expr]] = {}
        self.non_diff = {i.name for i in self.fn.inputs if not i.gets_gradient}
        # Save-vs-recompute: an output whose formula reappears in a gradient is reused
        # (d exp(x)/dx = grad * out) when that is cheaper by the cost model: fewer tensors
        # saved for the backward first, then fewer passes over memory in it.
        self.reuse = {}
        for expr, out in derived.reusable_outputs():
            candidate = {**self.reuse, expr: out}
            if self.backward_cost(candidate) < self.backward_cost(self.reuse):
                self.reuse = candidate

    def backward_cost(self, reuse: dict[sympy.Expr, sympy.Symbol]) -> tuple[int, int]:
        """(tensors saved, passes over memory) of the first-order backward with ``reuse``."""
        vjps = [(f"grad_{i}", e.xreplace(reuse)) for i, e in self.d.vjps.items() if not is_zero(e)]
        saved = self.tensors_in(e for _, e in vjps) - set(self.d.grads)
        if not vjps:
            return len(saved), 0
        tape = emit(vjps, self.printer(), values=self.values(), group_scalars=True)
        return len(saved), count_passes(tape)

    def printer(self) -> FrameworkPrinter:
        return PRINTERS["torch"](scalars=self.scalars)

    def tape(self, assignments, copy_inputs: bool = False, in_place: bool = False) -> Tape:
        """The code of ``assignments``; ``in_place`` for code that runs without autograd
        recording."""
        return emit(
            assignments,
            self.printer(),
            copy_inputs=copy_inputs,
            values=self.values(),
            in_place=in_place,
            group_scalars=True,
            upstream=self.upstream,
        )

    def body(self, assignments, copy_inputs: bool = False, in_place: bool = False) -> list[str]:
        """:meth:`tape` as lines."""
        return self.tape(assignments, copy_inputs, in_place).lines()

    def values(self) -> dict[str, Value]:
        """The tensors generated code starts from: inputs, saved outputs, upstream gradients.

        Outputs and upstream gradients count as names of their own, although their shapes
        are those of the inputs: under vmap one of them can be batched where the inputs
        are not (torch.func.hessian, autograd.grad(is_grads_batched=True)).
        """
        result = {}
        for inp in self.fn.inputs:
            if inp.is_tensor:
                kind = "float" if inp.gets_gradient else "other"
                result[inp.name] = Value(inp.name, Role.INPUT, kind)
        for name in self.out_syms:
            result[name] = Value(name, Role.SAVED)
        grads_of_grads = [f"grad_grad_{i}" for i in self.d.diff_inputs]
        for name in [*(g.name for g in self.d.grads), *grads_of_grads]:
            result[name] = Value(name, Role.UPSTREAM)
        return result

    def subst(self, expr: sympy.Expr) -> sympy.Expr:
        return sympy.sympify(expr).xreplace(self.reuse) if self.reuse else expr

    def tensors_in(self, exprs) -> set[sympy.Symbol]:
        syms = set()
        for e in exprs:
            syms |= sympy.sympify(e).free_symbols
        return {s for s in syms if s not in self.scalars}

    def ordered(self, syms: set[sympy.Symbol]) -> list[str]:
        """Input tensors in spec order, then outputs, then upstream gradients."""
        order = [i.name for i in self.fn.inputs if i.is_tensor]
        order += list(self.out_syms) + [g.name for g in self.d.grads]
        names = {s.name for s in syms}
        return [n for n in order if n in names]

    def scalar_names(self, exprs) -> list[str]:
        used = set()
        for e in exprs:
            used |= {s.name for s in sympy.sympify(e).free_symbols}
        return [i.name for i in self.fn.inputs if not i.is_tensor and i.name in used]

    def graph_free(
        self, name: str, results: list[tuple[int, str, sympy.Expr, str | None]], n_inputs: int
    ) -> tuple[str | None, list[MathFn]]:
        """The call of a backward's math for ``create_graph=False``, and that function.

        ``results``: (index in ``ctx.needs_input_grad``, of ``n_inputs``; variable;
        formula; shape to sum it to). The function computes every result with shared
        subexpressions and owned temporaries updated in place; of several, each only when
        its ``need_<variable>`` flag is set.
        """
        if not results:
            return None, []
        exprs = [e for _, _, e, _ in results]
        tensors = self.tensors_in(exprs)
        args = self.ordered(tensors)
        args += sorted(s.name for s in tensors if s.name not in args)  # grad_grad_<input>
        scalars = self.scalar_names(exprs)
        flags = [f"need_{var}" for _, var, _, _ in results] if len(results) > 1 else []
        tape = self.tape([(var, e) for _, var, e, _ in results], in_place=True)
        lines = tape.lines()
        if flags:
            lines = guarded(tape, {var: f"need_{var}" for _, var, _, _ in results})
        lines.append(f"return {', '.join(var for _, var, _, _ in results)}")
        call_args = [*args, *(f"ctx.{s}" for s in scalars)]
        call_args += _needs([k for k, _, _, _ in results], n_inputs) if flags else []
        call = f"_run({name}, {', '.join(call_args)})"
        return call, [MathFn(name, [*args, *scalars, *flags], lines)]

    def reduced(self, var: str, shape: str | None) -> str:
        """``var``, summed to ``shape`` where the inputs broadcast (None stays None)."""
        return f"_sum_to({var}, {shape})" if self.reduce and shape is not None else var

    # -------------------------------------------------------------- the main Function
    def main(self) -> Kernel:
        d, fn = self.d, self.fn
        inputs = [i.name for i in fn.inputs]
        out_names = [name for name, _ in d.outputs]
        spread = _spread_outputs(d)
        forward = Method(
            inputs,
            [
                *self.body(d.outputs, copy_inputs=True, in_place=True),
                *_spread_lines(d, spread),
                f"return {', '.join(out_names)}",
            ],
        )

        order2 = fn.order >= 2
        vjps = {i: self.subst(e) for i, e in d.vjps.items()}
        jac = {o: {i: self.subst(e) for i, e in row.items()} for o, row in d.jacobian.items()}
        backward_needs = self.tensors_in(vjps.values()) - set(d.grads)
        if order2:
            # The backward Functions recompute from what they get; they also need the
            # tensors of their own second-order formulas.
            backward_needs = set()
            for i in d.diff_inputs:
                backward_needs |= set(self._grad_inputs(i)[0])
            backward_needs = {s for s in backward_needs if s not in set(d.grads)}
        jvp_needs = self.tensors_in(e for row in jac.values() for e in row.values())
        # torch.round's convention: where the derivative is 0 everywhere, the gradient is
        # zeros (not None, nor an output that does not require grad); zeros_like needs the
        # input (backward) and the output (its tangent)
        zero_grads = [i for i in d.diff_inputs if is_zero(d.vjps[i])]
        backward_needs |= {d.symbols[i] for i in zero_grads}
        non_diff = self.non_differentiable_outputs()
        zero_outs = [o for o in out_names if o not in d.differentiable_outputs()]
        jvp_needs |= {self.out_syms[o] for o in zero_outs if o not in non_diff}
        # a tangent of an output spread to the inputs' shape is spread to the output's
        spread_tangents = [o for o in spread if o not in zero_outs]
        jvp_needs |= {self.out_syms[o] for o in spread_tangents}
        saved = self.ordered(backward_needs | jvp_needs)

        setup = [unpack_line(inputs, "inputs")]
        if any(n in saved for n in out_names) or non_diff:
            # a single output is the tensor itself, not a 1-tuple
            setup.append(
                unpack_line(out_names, "output")
                if len(out_names) > 1
                else f"{out_names[0]} = output"
            )
        used = [*vjps.values(), *(e for r in jac.values() for e in r.values())]
        used += [e for r in d.second.values() for e in r.values()]
        setup += [f"ctx.{name} = {name}" for name in self.scalar_names(used)]
        if non_diff:
            setup.append(f"ctx.mark_non_differentiable({', '.join(non_diff)})")
        if saved:
            setup += _save_lines(saved, inputs)

        # Shapes of broadcast inputs that get a gradient but are not saved.
        shapes = {}
        for inp in fn.inputs:
            if self.reduce and inp.gets_gradient:
                shapes[inp.name] = f"{inp.name}.shape"
                if inp.name not in saved:
                    shapes[inp.name] = f"ctx.{inp.name}_shape"
                    setup.insert(
                        -2 if saved else len(setup), f"{shapes[inp.name]} = {inp.name}.shape"
                    )
        setup_method = Method(["ctx", "inputs", "output"], mark_unused(setup) or ["pass"])

        grad_names = [g.name for g in d.grads]
        diff = [
            (k, inp.name)
            for k, inp in enumerate(fn.inputs)
            if inp.gets_gradient and not is_zero(d.vjps[inp.name])
        ]
        results = [
            self.reduced(f"grad_{inp.name}", shapes.get(inp.name))
            if (k, inp.name) in diff
            else f"torch.zeros_like({inp.name})"
            if inp.name in zero_grads
            else "None"
            for k, inp in enumerate(fn.inputs)
        ]
        grads = [f"grad_{i}" for _, i in diff]
        back = self._unpack_saved(saved)
        # First order (create_graph=False, the common case): every gradient from one
        # function, sharing its work, with no graph and no Function per input.
        call, extra_math = (None, [])
        if not order2 or len(diff) > 1:
            wanted = [(k, f"grad_{i}", vjps[i], shapes.get(i)) for k, i in diff]
            call, extra_math = self.graph_free(f"_{fn.name}_backward", wanted, len(fn.inputs))
        if not order2:
            back = [
                "if torch.is_grad_enabled():",
                f'    raise RuntimeError("{fn.name} has no double backward (spec order: 1); '
                f'use order: 2 for second derivatives")',
                *back,
            ]
            if len(diff) == 1:
                ((k, _),) = diff
                back += [
                    f"{grads[0]} = None",
                    f"if ctx.needs_input_grad[{k}]:",
                    f"    {grads[0]} = {call}",
                ]
            elif diff:
                back.append(unpack_line(grads, call))
        else:
            # Differentiable: a gradient is a Function whose backward is the second order.
            applied = [
                f"grad_{i} = _grad(ctx.needs_input_grad[{k}], {cls}, _{cls}, {args})"
                for k, i in diff
                for cls, args in [(self.grad_class(i), ", ".join(self._grad_inputs(i)[1]))]
            ]
            if len(diff) > 1:
                back += [
                    "if not torch.is_grad_enabled():  # create_graph=False: one call for all",
                    f"    {unpack_line(grads, call)}",
                    "else:",
                    *("    " + line for line in applied),
                ]
            else:
                back += applied
        back.append(f"return {', '.join(results)}")
        backward = Method(["ctx", *grad_names], mark_unused(back))

        # Forward mode: out_t = sum_i d out / d x_i * x_i_t (user VJPs define the derivative).
        tangents = [f"{i.name}_t" if i.gets_gradient else f"_{i.name}_t" for i in fn.inputs]
        jvp_assign = []
        for o in out_names:
            terms = [jac[o][i] * sympy.Symbol(f"{i}_t", real=True) for i in d.diff_inputs]
            jvp_assign.append((f"{o}_t", sympy.Add(*terms)))
        jvp_lines = self._unpack_saved(saved) + self._unpack_scalars([e for _, e in jvp_assign])
        jvp_lines += self.body([(o, e) for o, e in jvp_assign if not is_zero(e)])
        jvp_lines += [f"{o}_t = _broadcast_result({o}_t, {o})" for o in spread_tangents]
        for o in zero_outs:
            # a marked output has no tangent
            jvp_lines.append(f"{o}_t = None" if o in non_diff else f"{o}_t = torch.zeros_like({o})")
        jvp_lines.append(f"return {', '.join(f'{o}_t' for o in out_names)}")
        jvp = Method(["ctx", *tangents], mark_unused(jvp_lines))
        return Kernel(
            name=fn.class_name,
            doc=[],
            inputs=inputs,
            math_name=f"_{fn.name}_forward",
            forward=forward,
            setup=setup_method,
            backward=backward,
            jvp=jvp,
            extra_math=extra_math,
        )

    def non_differentiable_outputs(self) -> list[str]:
        """Outputs of no differentiable input (marked so: they never require grad). An
        output of one with derivative 0 (round(x)) gets zero gradients, as in torch."""
        requiring = self.d.outputs_requiring_grad()
        return [name for name, _ in self.d.outputs if name not in requiring]

    def _unpack_saved(self, saved: list[str]) -> list[str]:
        return [unpack_line(saved, "ctx.saved_tensors")] if saved else []

    def _unpack_scalars(self, exprs) -> list[str]:
        return [f"{n} = ctx.{n}" for n in self.scalar_names(exprs)]

    # -------------------------------------------------------------- per-input backward Functions
    def grad_class(self, input_name: str) -> str:
        """The Function of the gradient w.r.t. ``input_name``: ``<Name>Grad`` (one
        differentiable input) or ``<Name>Grad<Input>``, not ``<Name>Backward``, the name
        autograd gives the backward node of ``<Name>``."""
        if len(self.d.diff_inputs) == 1:
            return f"{self.fn.class_name}Grad"
        return f"{self.fn.class_name}Grad{_camel(input_name)}"

    def second_terms(self, i: str) -> dict[str, sympy.Expr]:
        """d vjp_i / d w for each tensor w the backward Function of input ``i`` takes.

        Where the VJP reuses an output (d exp(x)/dx = grad * out), these are partial
        derivatives with the output as a variable of its own: autograd chains the output's
        gradient back through this function, as PyTorch's own exp backward does, and only
        the output needs saving. Otherwise they are the derived totals.
        """
        if i in self._second:
            return self._second[i]
        d = self.d
        vjp = self.subst(d.vjps[i])
        outs = set(self.out_syms.values())
        if vjp.free_symbols & outs:
            terms = {w: self.subst(e) for w, e in d.second_partials[vjp].items()}
        else:
            terms = {w: self.subst(e) for w, e in d.second[i].items()}
        self._second[i] = {w: e for w, e in terms.items() if not is_zero(e)}
        return self._second[i]

    def _grad_inputs(self, i: str) -> tuple[list[sympy.Symbol], list[str]]:
        """Tensor symbols the backward Function of input ``i`` takes, and its apply args."""
        vjp = self.subst(self.d.vjps[i])
        second = self.second_terms(i)
        syms = self.tensors_in([vjp, *second.values()])
        # Every variable with a second-order term must be an input, to get its gradient.
        every = [*self.sym.values(), *self.d.grads, *self.out_syms.values()]
        syms |= {s for s in every if s.name in second}
        names = self.ordered(syms)
        by_name = {s.name: s for s in syms}
        scalars = self.scalar_names([vjp, *second.values()])
        return [by_name[n] for n in names], names + [f"ctx.{s}" for s in scalars]

    def grad_kernel(self, i: str) -> Kernel:
        d = self.d
        vjp = self.subst(d.vjps[i])
        second = self.second_terms(i)
        tensor_syms, _ = self._grad_inputs(i)
        tensor_names = [s.name for s in tensor_syms]
        scalars = self.scalar_names([vjp, *second.values()])
        args = tensor_names + scalars
        var = f"grad_{i}"
        body = self.body([(var, vjp)], copy_inputs=True, in_place=True)
        forward = Method(args, [*body, f"return {var}"])

        saved = self.ordered(self.tensors_in(second.values()))
        setup = [unpack_line(args, "inputs")]
        for s in scalars:
            setup.append(f"ctx.{s} = {s}")
        if saved:
            setup += _save_lines(saved, args)
        # Gradients w.r.t. broadcast inputs are summed to their shape; an input that is not
        # saved still needs its shape (upstream gradients already have the output's shape).
        grad_names = {g.name for g in d.grads}
        reduce_to = {}
        for name in args:
            if self.reduce and name in second and name not in grad_names and name not in scalars:
                reduce_to[name] = f"{name}.shape" if name in saved else f"ctx.{name}_shape"
                if name not in saved:
                    setup.append(f"ctx.{name}_shape = {name}.shape")
        setup_method = Method(["ctx", "inputs", "output"], mark_unused(setup) or ["pass"])

        unpack = self._unpack_saved(saved) + self._unpack_scalars(second.values())
        gg = sympy.Symbol(f"grad_{var}", real=True)
        # create_graph=False (e.g. the last step of a Hessian-vector product): every term
        # from one function without a graph; otherwise the differentiable formulas below.
        terms = [
            (k, f"{name}_bar", gg * second[name], reduce_to.get(name))
            for k, name in enumerate(args)
            if name in second and not is_zero(second[name])
        ]
        call, extra_math = self.graph_free(f"_{self.fn.name}_grad_{i}_backward", terms, len(args))
        bars = [var for _, var, _, _ in terms]
        returned = [
            self.reduced(f"{a}_bar", reduce_to.get(a)) if f"{a}_bar" in bars else "None"
            for a in args
        ]
        back = self._unpack_saved(saved)
        if len(terms) == 1:
            ((k, _, _, _),) = terms
            back += [
                f"if not ctx.needs_input_grad[{k}]:",
                f"    return {', '.join(['None'] * len(args))}",
            ]
        if call:
            back.append("if not torch.is_grad_enabled():  # create_graph=False: no graph")
            if returned == bars:
                back.append(f"    return {call}")
            elif len(bars) == 1 and bars[0] in returned:  # (not summed to a shape)
                back.append(f"    return {', '.join(call if r in bars else r for r in returned)}")
            else:
                got = bars[0] if len(bars) == 1 else ", ".join(bars)
                back += [f"    {got} = {call}", f"    return {', '.join(returned)}"]
        back += self._unpack_scalars(second.values())
        if len(terms) > 1:
            back.append(f"{' = '.join(bars)} = None")
        for k, out, expr, _ in terms:
            inner = self.body([(out, expr)])
            if len(terms) > 1:
                back.append(f"if ctx.needs_input_grad[{k}]:")
                inner = ["    " + line for line in inner]
            back += inner
        back.append(f"return {', '.join(returned)}")
        backward = Method(["ctx", gg.name], mark_unused(back))

        tangent_args = [f"{a}_t" if a in second else f"_{a}_t" for a in args]
        jvp_expr = sympy.Add(
            *(second[a] * sympy.Symbol(f"{a}_t", real=True) for a in args if a in second)
        )
        jvp_lines = unpack + self.body([(f"{var}_t", jvp_expr)]) + [f"return {var}_t"]
        if is_zero(jvp_expr):
            jvp_lines = [f"return torch.zeros_like({tensor_names[0]})"]
        wrt = f" w.r.t. {i}" if len(d.diff_inputs) > 1 else ""
        return Kernel(
            name=self.grad_class(i),
            doc=[
                f"The gradient of {self.fn.name}{wrt}: forward is the VJP, backward the second order."
            ],
            inputs=args,
            math_name=f"_{self.fn.name}_grad_{i}",
            forward=forward,
            setup=setup_method,
            backward=backward,
            jvp=Method(["ctx", *tangent_args], mark_unused(jvp_lines)),
            extra_math=extra_math,
        )


def _torch_kernels(planner: _TorchPlanner) -> list[Kernel]:
    d = planner.d
    kernels = [planner.main()]
    if d.function.order >= 2:
        kernels += [planner.grad_kernel(i) for i in d.diff_inputs if not is_zero(d.vjps[i])]
    return kernels


def _fused_versions(kernels: list[Kernel], fused: list[Kernel]) -> None:
    """Attach to ``kernels`` the math functions of ``fused`` (the same plan from the fused
    path's forms) that differ, as ``<name>_fused``; only where the arguments agree (the
    Functions around them save and pass what the eager forms need)."""
    for kernel, other in zip(kernels, fused):
        pairs = [
            (
                MathFn(kernel.math_name, kernel.forward.args, kernel.forward.lines),
                MathFn(other.math_name, other.forward.args, other.forward.lines),
            ),
            *zip(kernel.extra_math, other.extra_math),
        ]
        for eager, compiled in pairs:
            if eager.name == compiled.name and eager.args == compiled.args:
                if eager.lines != compiled.lines:
                    kernel.fused_math.append(
                        (eager.name, MathFn(f"{eager.name}_fused", eager.args, compiled.lines))
                    )


def plan_torch(derived: Derived) -> FunctionPlan:
    """The PyTorch code of one function."""
    planner = _TorchPlanner(derived)
    fn = derived.function
    kernels = _torch_kernels(planner)
    if derived.fused:
        _fused_versions(kernels, _torch_kernels(_TorchPlanner(derived.for_fused())))
    outputs = [name for name, _ in derived.outputs]
    return FunctionPlan(
        name=fn.name,
        class_name=fn.class_name,
        summary=_summary(derived),
        doc_lines=formula_doc(derived, fused=any(k.fused_math for k in kernels)),
        params=_params(derived, "torch"),
        returns=_returns(len(outputs), "torch.Tensor"),
        call_args=[i.name for i in fn.inputs],
        kernels=kernels,
    )


# ----------------------------------------------------------------------------- tensorflow
def plan_tensorflow(derived: Derived) -> FunctionPlan:
    """The TensorFlow code of one function (nested tf.custom_gradient)."""
    fn = derived.function
    d = derived
    reduce = _broadcasts(derived)

    def body(assignments) -> list[str]:
        return emit(assignments, PRINTERS["tensorflow"](scalars=d.scalars)).lines()

    tensors = [i.name for i in fn.inputs if i.is_tensor]
    out_names = [name for name, _ in d.outputs]
    grad_names = [g.name for g in d.grads]
    order2 = fn.order >= 2

    # The outer custom_gradient: forward, and a grad_fn calling one function per input.
    lines = body(d.outputs) + _spread_lines(d, _spread_outputs(d))
    lines += ["", f"def backward({', '.join(grad_names)}):"]
    results = []
    for inp in fn.inputs:
        if not inp.is_tensor:
            continue
        if not inp.gets_gradient or is_zero(d.vjps[inp.name]):
            results.append("None")
            continue
        var = f"grad_{inp.name}"
        if order2:
            args = _tf_grad_args(d, inp.name)
            lines.append(f"    {var} = _{fn.name}_grad_{inp.name}({', '.join(args)})")
        else:
            lines += ["    " + line for line in body([(var, d.vjps[inp.name])])]
        if reduce:
            lines.append(f"    {var} = _reduce_to({var}, {inp.name})")
        results.append(var)
    ret = results[0] if len(results) == 1 else ", ".join(results)
    lines.append(f"    return {ret}")
    lines += [
        "",
        f"return ({', '.join(out_names)}{',' if len(out_names) == 1 else ''}), backward"
        if len(out_names) > 1
        else f"return {out_names[0]}, backward",
    ]
    main = Kernel(
        name="forward",
        doc=[],
        inputs=tensors,
        forward=Method(tensors, lines),
    )
    kernels = [main]

    if order2:
        for i in d.diff_inputs:
            if is_zero(d.vjps[i]):
                continue
            args = _tf_grad_args(d, i)
            tensor_args = [a for a in args if a not in {s.name for s in d.scalars}]
            var = f"grad_{i}"
            glines = body([(var, d.vjps[i])])
            glines += ["", f"def backward(grad_{var}):"]
            gg = sympy.Symbol(f"grad_{var}", real=True)
            bars = []
            for a in tensor_args:
                expr = d.second[i].get(a)
                if expr is None or is_zero(expr):
                    bars.append("None")
                    continue
                glines += ["    " + line for line in body([(f"{a}_bar", gg * expr)])]
                if reduce:
                    glines.append(f"    {a}_bar = _reduce_to({a}_bar, {a})")
                bars.append(f"{a}_bar")
            glines.append(f"    return {', '.join(bars)}")
            glines += ["", f"return {var}, backward"]
            kernels.append(
                Kernel(
                    name=f"_{fn.name}_grad_{i}",
                    doc=[
                        f"The gradient of {fn.name} w.r.t. {i}; its gradient is the derived second order."
                    ],
                    inputs=args,
                    forward=Method(tensor_args, glines),
                )
            )
    outputs = out_names
    return FunctionPlan(
        name=fn.name,
        class_name=fn.class_name,
        summary=_summary(derived),
        doc_lines=formula_doc(derived),
        params=_params(derived, "tensorflow"),
        returns=_returns(len(outputs), "tf.Tensor"),
        call_args=tensors,
        kernels=kernels,
    )


def _tf_grad_args(d: Derived, i: str) -> list[str]:
    """Arguments of the TF gradient function of input ``i``: tensors it uses, then scalars."""
    exprs = [d.vjps[i], *d.second[i].values()]
    used = set()
    for e in exprs:
        used |= {s.name for s in sympy.sympify(e).free_symbols}
    for w, e in d.second[i].items():
        if not is_zero(e):
            used.add(w)
    fn = d.function
    order = [x.name for x in fn.inputs if x.is_tensor] + [g.name for g in d.grads]
    scalars = [x.name for x in fn.inputs if not x.is_tensor]
    return [n for n in order if n in used] + [n for n in scalars if n in used]

"""Tensor expressions: a spec's ``{shape, expr}`` parsed into SymPy, with reductions kept opaque.

``x[n, k]`` becomes a real :class:`sympy.Symbol` (a :class:`Leaf`: the input and the axis names
of its positions), a reduction becomes ``RSum(body, (axes...))`` or ``RLSE``/``RMax``/``RMin``:
SymPy functions that SymPy's own algebra (powsimp, log(exp u) = u) passes through but never
differentiates. Bound axes are lexically scoped and renamed to the declared axis they index,
so ``mean(x[j], j)`` and ``mean(x[i], i)`` are one expression (and one node of the tape).

Stability rewrites here are on whole reductions (elementwise parts go through
:func:`symgrad.rewrite.rules.stabilize`): ``sum(exp b) -> exp(logsumexp b)``, which with
``log(exp u) = u`` gives logsumexp, log-softmax and softmax from the naive formulas, and the
one-pass variance ``mean(b**2) - mean(b)**2`` rewritten two-pass.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import sympy

from symgrad.errors import Location, SpecError
from symgrad.expr import _Builder, parse_formula_tree
from symgrad.rewrite.rules import stabilize
from symgrad.spec import Function, Input

ELLIPSIS = "..."
#: Reductions: spec word -> SymPy function class name (mean is a sum over a size).
REDUCTIONS = ("sum", "mean", "logsumexp", "max", "min")


class Reduction(sympy.Function):
    """``R(body, (axes...))``: opaque to SymPy's calculus, real-valued."""

    nargs = 2

    def _eval_is_extended_real(self):
        return True

    def _eval_is_finite(self):
        return True

    @property
    def body(self) -> sympy.Expr:
        return self.args[0]

    @property
    def over(self) -> tuple[str, ...]:
        return tuple(str(a) for a in self.args[1])


class RSum(Reduction):
    """Sum over the named axes."""


class RLSE(Reduction):
    """log(sum(exp(body))) over the named axes, computed shifted by the max."""


class RMax(Reduction):
    """Largest value over the named axes (ties split the gradient, as torch.amax)."""


class RMin(Reduction):
    """Smallest value over the named axes."""


class RLogSoftmax(Reduction):
    """body - logsumexp(body) over the named axes: keeps the axes."""


class RSoftmax(Reduction):
    """exp(body - logsumexp(body)) over the named axes: keeps the axes, positive."""

    def _eval_is_positive(self):
        return True


def axes_tuple(axes) -> sympy.Tuple:
    return sympy.Tuple(*(sympy.Symbol(a) for a in axes))


@dataclass(frozen=True)
class Leaf:
    """An access ``x[a, b]``: the input and the axis name at each of its positions."""

    input: str
    layout: tuple[str, ...]  # '...' first where the input has batch axes
    onehot: str | None = None  # a class index: 1 where this axis equals the input's value


@dataclass
class TensorFormula:
    """A parsed tensor function: the output expression and what its symbols stand for."""

    function: Function
    expr: sympy.Expr
    shape: tuple[str, ...]  # the output's axes
    leaves: dict[sympy.Symbol, Leaf]
    scalars: dict[str, sympy.Symbol]
    dims: dict[str, str]  # axis name -> the declared axis it indexes (its size)
    order: tuple[str, ...]  # every axis name, in the one order all layouts follow
    sizes: dict[sympy.Symbol, str] = field(default_factory=dict)  # size symbol -> dim

    def axes(self, expr: sympy.Basic) -> frozenset[str]:
        return free_axes(expr, self.leaves)

    def size(self, axes) -> sympy.Expr:
        """The number of elements along ``axes`` (a symbol per declared axis)."""
        result = sympy.Integer(1)
        for axis in axes:
            dim = self.dims[axis]
            symbol = sympy.Symbol(f"size_{dim}", positive=True, integer=True)
            self.sizes[symbol] = dim
            result *= symbol
        return result


def free_axes(expr: sympy.Basic, leaves: dict[sympy.Symbol, Leaf]) -> frozenset[str]:
    """The axes of ``expr``: its leaves' axes, less those its reductions bind."""
    if isinstance(expr, sympy.Symbol):
        leaf = leaves.get(expr)
        return frozenset(leaf.layout) if leaf else frozenset()
    if isinstance(expr, (RLogSoftmax, RSoftmax)):
        return free_axes(expr.body, leaves)
    if isinstance(expr, Reduction):
        return free_axes(expr.body, leaves) - set(expr.over)
    out: frozenset[str] = frozenset()
    for arg in expr.args:
        out |= free_axes(arg, leaves)
    return out


# --------------------------------------------------------------------------- parsing
def _index_names(node: ast.AST) -> list[ast.AST]:
    return list(node.elts) if isinstance(node, ast.Tuple) else [node]


@dataclass(frozen=True)
class Let:
    """A ``let:`` entry: its formula's tree, its axes and the declared axis of each."""

    name: str
    tree: ast.AST
    text: str
    shape: tuple[str, ...]
    dims: tuple[str, ...]  # per named axis of shape
    where: Location


class _TensorBuilder(_Builder):
    """The elementwise builder plus indexing, reductions, ``size`` and ``let`` names."""

    def __init__(self, text, symbols, where, shaped: dict[str, Input], formula: TensorFormula):
        super().__init__(text, symbols, where)
        self.shaped = shaped
        self.lets: dict[str, Let] = {}
        self.formula = formula
        self.env: dict[str, str] = {}  # bound axis (as written) -> its canonical name
        self.root: ast.AST = ast.Constant(0)

    # -- scanning the AST for axes, before building ---------------------------------
    def _binder(self, node: ast.AST) -> tuple[ast.AST, list[str]] | None:
        """(body, bound axes) of a reduction call, else None."""
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in REDUCTIONS
            and len(node.args) == 2
        ):
            axes = []
            for a in _index_names(node.args[1]):
                if not isinstance(a, ast.Name):
                    raise self.fail(a, "reduction axes must be axis names, e.g. sum(e, k)")
                axes.append(a.id)
            return node.args[0], axes
        return None

    def _accesses(self, node: ast.AST, bound: frozenset[str] = frozenset()):
        """Yield (axis as written, input, position) for the unbound axes of accesses."""
        binder = self._binder(node)
        if binder is not None:
            body, axes = binder
            yield from self._accesses(body, bound | set(axes))
            return
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            inp = self.shaped.get(node.value.id)
            let = self.lets.get(node.value.id)
            if let is not None:
                idx = [i for i in _index_names(node.slice) if not _is_ellipsis(i)]
                for position, index in enumerate(idx[: len(let.dims)]):
                    if isinstance(index, ast.Name) and index.id not in bound:
                        yield index.id, None, let.dims[position]
                return
            if inp is not None:
                named = [a for a in inp.shape if a != ELLIPSIS]
                idx = [i for i in _index_names(node.slice) if not _is_ellipsis(i)]
                for position, index in enumerate(idx):
                    if isinstance(index, ast.Name) and index.id not in bound:
                        if position < len(named):
                            yield index.id, inp, named[position]
                    elif not isinstance(index, ast.Name):
                        yield from self._accesses(index, bound)
                return
        for child in ast.iter_child_nodes(node):
            yield from self._accesses(child, bound)

    # -- building --------------------------------------------------------------------
    def _Name(self, node: ast.Name):
        let = self.lets.get(node.id)
        if let is not None:
            if let.dims:
                raise self.fail(node, f"'{node.id}' has axes {list(let.shape)}: index it")
            return self._let(let, [])
        if node.id in self.shaped:
            inp = self.shaped[node.id]
            named = [a for a in inp.shape if a != ELLIPSIS]
            if named:
                raise self.fail(
                    node,
                    f"input '{node.id}' has axes {list(inp.shape)}: index it",
                    f"write {node.id}[{', '.join(named)}]",
                )
            return self._leaf(inp, [])
        return super()._Name(node)

    def _let(self, let: Let, names: list[str]) -> sympy.Expr:
        """A let's formula with its axes named as at this use."""
        named = [a for a in let.shape if a != ELLIPSIS]
        saved, saved_text, saved_where = self.env, self.text, self.where
        self.env = dict(zip(named, names))
        self.text, self.where = let.text, let.where
        try:
            return self.build(let.tree)
        finally:
            self.env, self.text, self.where = saved, saved_text, saved_where

    def _Subscript(self, node: ast.Subscript):
        let = self.lets.get(getattr(node.value, "id", None))
        if let is not None:
            indices = [i for i in _index_names(node.slice) if not _is_ellipsis(i)]
            if len(indices) != len(let.dims):
                raise self.fail(
                    node,
                    f"'{let.name}' has {len(let.dims)} named axes, indexed with {len(indices)}",
                )
            names = []
            for index, dim in zip(indices, let.dims):
                if not isinstance(index, ast.Name):
                    raise self.fail(index, "an index of a let name must be an axis name")
                name = self.env.get(index.id, index.id)
                self.formula.dims.setdefault(name, dim)
                names.append(name)
            return self._let(let, names)
        if not isinstance(node.value, ast.Name) or node.value.id not in self.shaped:
            name = getattr(node.value, "id", None)
            if name is not None and name in self.symbols:
                raise self.fail(
                    node,
                    f"'{name}' is not a tensor with a shape, so it cannot be indexed",
                    f"give it a shape under inputs, e.g. {name}: {{shape: [n]}}",
                )
            raise self.fail(node, "only inputs with a shape can be indexed")
        inp = self.shaped[node.value.id]
        indices = _index_names(node.slice)
        if indices and _is_ellipsis(indices[0]):
            if ELLIPSIS not in inp.shape:
                raise self.fail(node, f"input '{inp.name}' has no batch axes '...'")
            indices = indices[1:]
        named = [a for a in inp.shape if a != ELLIPSIS]
        if len(indices) != len(named):
            raise self.fail(
                node,
                f"input '{inp.name}' has {len(named)} named axes {named}, "
                f"indexed with {len(indices)}",
                f"write {inp.name}[{', '.join(named)}]",
            )
        names: list[str] = []
        gathers: list[tuple[str, sympy.Symbol]] = []  # (axis, class index): logits[n, label[n]]
        for position, index in enumerate(indices):
            if isinstance(index, ast.Subscript):
                label = self._class_index(index)
                axis, k = named[position], 1
                while (
                    axis in names
                    or axis in [a for a, _ in gathers]
                    or axis in (self.formula.leaves[label].layout)
                ):
                    k += 1
                    axis = f"{named[position]}_{k}"
                self.formula.dims[axis] = named[position]
                names.append(axis)
                gathers.append((axis, label))
                continue
            if not isinstance(index, ast.Name):
                raise self.fail(
                    index, "an index must be an axis name", f"e.g. {inp.name}[{', '.join(named)}]"
                )
            names.append(self.env.get(index.id, index.id))
        for name, dim in zip(names, named):
            self.formula.dims.setdefault(name, dim)  # (its size: that of the first use)
        result = self._leaf(inp, names)
        for axis, label in gathers:
            leaf = self.formula.leaves[label]
            onehot = sympy.Symbol(f"onehot({label.name},{axis})", real=True, nonnegative=True)
            self.formula.leaves[onehot] = Leaf(leaf.input, (*leaf.layout, axis), onehot=axis)
            result = RSum(result * onehot, axes_tuple([axis]))
        return result

    def _class_index(self, node: ast.Subscript) -> sympy.Symbol:
        """``label[n]`` used as an index: an integer input with no gradient."""
        name = getattr(node.value, "id", None)
        inp = self.shaped.get(name)
        if inp is None or dict(inp.assumptions).get("integer") is not True or inp.differentiable:
            raise self.fail(
                node,
                "only an input with integer: true and differentiable: false can be a class index",
                f"declare it as {name}: {{shape: [...], integer: true, differentiable: false}}",
            )
        index = self._Subscript(node)
        if not isinstance(index, sympy.Symbol):
            raise self.fail(node, "a class index is a plain access such as label[n]")
        return index

    def _leaf(self, inp: Input, names: list[str]) -> sympy.Symbol:
        layout = ((ELLIPSIS,) if ELLIPSIS in inp.shape else ()) + tuple(names)
        text = inp.name + (f"[{','.join(names)}]" if names else "")
        symbol = sympy.Symbol(text, real=True)
        self.formula.leaves[symbol] = Leaf(inp.name, layout)
        return symbol

    def _dim_anywhere(self, name: str) -> str | None:
        """The declared axis that ``name`` indexes somewhere in the formula."""
        trees = [self.root, *(let.tree for let in self.lets.values())]
        for node in (n for tree in trees for n in ast.walk(tree)):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
                let = self.lets.get(node.value.id)
                if let is not None:
                    idx = [i for i in _index_names(node.slice) if not _is_ellipsis(i)]
                    for position, index in enumerate(idx[: len(let.dims)]):
                        if isinstance(index, ast.Name) and index.id == name:
                            return let.dims[position]
                    continue
                inp = self.shaped.get(node.value.id)
                if inp is None:
                    continue
                named = [a for a in inp.shape if a != ELLIPSIS]
                idx = [i for i in _index_names(node.slice) if not _is_ellipsis(i)]
                for position, index in enumerate(idx[: len(named)]):
                    if isinstance(index, ast.Name) and index.id == name:
                        return named[position]
        return None

    def _Call(self, node: ast.Call):
        name = getattr(node.func, "id", None)
        if name == "size":
            if len(node.args) != 1:
                raise self.fail(node, "size takes the axes: size(k) or size((i, j))")
            axes = []
            for a in _index_names(node.args[0]):
                if not isinstance(a, ast.Name):
                    raise self.fail(a, "size takes axis names")
                axis = self.env.get(a.id, a.id)
                if axis not in self.formula.dims:
                    axis = self._dim_anywhere(a.id)  # an axis bound elsewhere: its size
                if axis is None:
                    raise self.fail(a, f"unknown axis '{a.id}'", "name an axis of an input")
                axes.append(axis)
            return self.formula.size(axes)
        if name not in REDUCTIONS:
            return super()._Call(node)
        if len(node.args) != 2 or node.keywords:
            raise self.fail(node, f"{name} takes an expression and axes: {name}(e, k)")
        body, written = self._binder(node)
        if len(set(written)) != len(written):
            raise self.fail(node.args[1], "an axis is reduced twice")
        saved = dict(self.env)
        canonical = []
        outer_free = set()
        dims = {}
        for axis, _inp, dim in self._accesses(body):
            if axis in written:
                dims.setdefault(axis, dim)
            else:
                outer_free.add(self.env.get(axis, axis))
        for axis in written:
            if axis not in dims:
                raise self.fail(
                    node.args[1],
                    f"axis '{axis}' is reduced but no input in {name}(...) is indexed by it",
                )
            target = dims[axis]
            candidate, k = target, 1
            while candidate in outer_free or candidate in canonical:
                k += 1
                candidate = f"{target}_{k}"
            self.env[axis] = candidate
            self.formula.dims[candidate] = target
            canonical.append(candidate)
        try:
            inner = self.build(body)
        finally:
            self.env = saved
        if isinstance(inner, sympy.Tuple) or not isinstance(inner, sympy.Expr):
            raise self.fail(body, f"{name} takes a number-valued expression")
        axes = axes_tuple(canonical)
        if name == "sum":
            return RSum(inner, axes)
        if name == "mean":
            return RSum(inner, axes) / self.formula.size(canonical)
        if name == "logsumexp":
            return RLSE(inner, axes)
        return (RMax if name == "max" else RMin)(inner, axes)


def _check_let(let, fn: Function, outer: _TensorBuilder, scalars, shaped) -> Let:
    """Parse a let entry alone: its free axes are its shape, each indexes a declared axis."""
    where = fn.location.at(line=let.line)
    tree = parse_formula_tree(let.text, where)
    scratch = TensorFormula(fn, sympy.Integer(0), let.shape, {}, scalars, {}, ())
    for inp in shaped.values():
        for axis in inp.shape:
            if axis != ELLIPSIS:
                scratch.dims.setdefault(axis, axis)
    builder = _TensorBuilder(let.text.strip(), scalars, where, shaped, scratch)
    builder.lets = dict(outer.lets)
    builder.root = tree
    expr = builder.build(tree)
    if isinstance(expr, sympy.Tuple) or not isinstance(expr, sympy.Expr):
        raise SpecError(where, f"let '{let.name}' must be a number-valued expression")
    free = scratch.axes(expr)
    named = [a for a in let.shape if a != ELLIPSIS]
    if free - {ELLIPSIS} != set(named) or (ELLIPSIS in free) != (ELLIPSIS in let.shape):
        raise SpecError(
            where,
            f"let '{let.name}': the expression's free axes {sorted(free)} are not its shape "
            f"{list(let.shape)}",
            "list exactly the axes the expression leaves free",
        )
    return Let(
        let.name, tree, let.text.strip(), let.shape, tuple(scratch.dims[a] for a in named), where
    )


def _is_ellipsis(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


# --------------------------------------------------------------------------- rewrites
def _sum_exp_to_lse(expr: sympy.Expr, formula: TensorFormula) -> sympy.Expr:
    """``sum(c * exp(b), K) -> c * exp(logsumexp(b, K))`` for c free of K."""

    def rule(node):
        if not isinstance(node, RSum):
            return node
        over = set(node.over)
        inside, outside = [], []
        for factor in sympy.Mul.make_args(node.body):
            (inside if formula.axes(factor) & over else outside).append(factor)
        if len(inside) == 1 and isinstance(inside[0], sympy.exp):
            return sympy.Mul(*outside) * sympy.exp(RLSE(inside[0].args[0], node.args[1]))
        return node

    return expr.replace(lambda e: isinstance(e, RSum), rule)


def _softmax_forms(expr: sympy.Expr) -> sympy.Expr:
    """``b - logsumexp(b)`` -> log_softmax(b); ``exp(log_softmax(b))`` -> softmax(b)."""

    def add_rule(node):
        terms = list(node.args)
        for term in terms:
            if term.could_extract_minus_sign() and isinstance(-term, RLSE):
                lse = -term
                parts = list(sympy.Add.make_args(lse.body))
                rest = list(terms)
                rest.remove(term)
                if all(p in rest for p in parts):
                    for p in parts:
                        rest.remove(p)
                    return sympy.Add(RLogSoftmax(lse.body, lse.args[1]), *rest)
        return node

    expr = expr.replace(lambda e: isinstance(e, sympy.Add), add_rule)
    return expr.replace(
        lambda e: isinstance(e, sympy.exp) and isinstance(e.args[0], RLogSoftmax),
        lambda e: RSoftmax(*e.args[0].args),
    )


def _two_pass_variance(expr: sympy.Expr, formula: TensorFormula) -> sympy.Expr:
    """``c*sum(b**2, K) - c/|K| * sum(b, K)**2`` -> ``c*sum((b - sum(b, K)/|K|)**2, K)``."""

    def squares(term):
        for f in sympy.Mul.make_args(term):
            if isinstance(f, RSum) and f.body.is_Pow and f.body.exp == 2:
                yield f

    def squared_sums(term):
        for f in sympy.Mul.make_args(term):
            if f.is_Pow and f.exp == 2 and isinstance(f.base, RSum):
                yield f

    def add_rule(node):
        terms = list(node.args)
        for t1 in terms:
            for sq in squares(t1):
                body, over = sq.body.base, sq.args[1]
                n = formula.size(sq.over)
                c1 = t1 / sq
                for t2 in terms:
                    for ss in squared_sums(t2):
                        if ss.base != RSum(body, over):
                            continue
                        if sympy.simplify(t2 / ss + c1 / n) != 0:
                            continue
                        rest = [t for t in terms if t is not t1 and t is not t2]
                        centred = RSum((body - RSum(body, over) / n) ** 2, over)
                        return sympy.Add(c1 * centred, *rest)
        return node

    return expr.replace(lambda e: isinstance(e, sympy.Add), add_rule)


def _merged_sums(expr: sympy.Expr, formula: TensorFormula) -> sympy.Expr:
    """``sum(c * sum(b, J), K) -> sum(c * b, J + K)`` for c free of J: one reduction."""

    def rule(node):
        if not isinstance(node, RSum):
            return node
        factors = list(sympy.Mul.make_args(node.body))
        inner = [f for f in factors if isinstance(f, RSum)]
        if len(inner) != 1:
            return node
        (sub,) = inner
        rest = [f for f in factors if f is not sub]
        if any(formula.axes(f) & set(sub.over) for f in rest):
            return node
        return RSum(sympy.Mul(*rest) * sub.body, axes_tuple([*sub.over, *node.over]))

    return expr.replace(lambda e: isinstance(e, RSum), rule)


def stable(expr: sympy.Expr, formula: TensorFormula) -> sympy.Expr:
    """The stable form of a tensor formula (reductions first, then elementwise rules)."""
    expr = _merged_sums(expr, formula)
    expr = _two_pass_variance(expr, formula)
    expr = _sum_exp_to_lse(expr, formula)
    expr = sympy.powsimp(expr, deep=True, combine="exp")
    expr = _softmax_forms(expr)
    return stabilize(expr)


# --------------------------------------------------------------------------- printing
class _SpecPrinter(sympy.printing.str.StrPrinter):
    """A stable form in the spec's own words: sum(e, k), logsumexp, log_softmax, size(d)."""

    def _reduction(self, name, expr):
        axes = expr.over
        over = axes[0] if len(axes) == 1 else f"({', '.join(axes)})"
        return f"{name}({self._print(expr.body)}, {over})"

    def _print_RSum(self, expr):
        return self._reduction("sum", expr)

    def _print_RLSE(self, expr):
        return self._reduction("logsumexp", expr)

    def _print_RMax(self, expr):
        return self._reduction("max", expr)

    def _print_RMin(self, expr):
        return self._reduction("min", expr)

    def _print_RSoftmax(self, expr):
        return self._reduction("softmax", expr)

    def _print_RLogSoftmax(self, expr):
        return self._reduction("log_softmax", expr)

    def _print_Symbol(self, expr):
        if expr.name.startswith("size_"):
            return f"size({expr.name[5:]})"
        return expr.name.replace(",", ", ")


def spec_text(expr: sympy.Expr) -> str:
    """``expr`` written in the spec language (for ``symgrad show`` and docstrings)."""
    return _SpecPrinter().doprint(expr)


# --------------------------------------------------------------------------- entry point
def parse_tensor_function(
    fn: Function, missing: frozenset[str] = frozenset(), raw: bool = False
) -> TensorFormula:
    """Parse and check a tensor function's output; the result is in its stable form. The
    optional inputs in ``missing`` are absent: their accesses are 0 (their terms dropped)."""
    out = fn.outputs[0]
    where = fn.location.at(line=out.line)
    shaped = {i.name: i for i in fn.inputs if i.is_tensor}
    scalars = {
        i.name: sympy.Symbol(i.name, real=True, **dict(i.assumptions))
        for i in fn.inputs
        if not i.is_tensor
    }
    order: list[str] = []
    if any(ELLIPSIS in i.shape for i in shaped.values()):
        order.append(ELLIPSIS)
    for axis in out.shape:
        if axis not in order:
            order.append(axis)
    for inp in shaped.values():
        for axis in inp.shape:
            if axis not in order:
                order.append(axis)
    formula = TensorFormula(fn, sympy.Integer(0), out.shape, {}, scalars, {}, ())
    for inp in shaped.values():
        for axis in inp.shape:
            if axis != ELLIPSIS:
                formula.dims.setdefault(axis, axis)
    builder = _TensorBuilder(out.text.strip(), scalars, where, shaped, formula)
    for let in fn.lets:
        builder.lets[let.name] = _check_let(let, fn, builder, scalars, shaped)
    tree = parse_formula_tree(out.text, where)
    builder.root = tree
    expr = builder.build(tree)
    if isinstance(expr, sympy.Tuple) or not isinstance(expr, sympy.Expr):
        raise SpecError(where, "the output must be a number-valued expression")
    for axis in sorted(formula.dims, key=lambda a: (a not in order, a)):
        if axis not in order:
            order.append(axis)
    formula.order = tuple(order)
    free = formula.axes(expr)
    shape = [a for a in out.shape if a != ELLIPSIS]
    for axis in sorted(free - {ELLIPSIS}):
        if axis not in shape:
            raise SpecError(
                where,
                f"axis '{axis}' is free in the output expression but not in its shape {list(out.shape)}",
                f"add '{axis}' to the output shape, or reduce over it: sum(..., {axis})",
            )
    for axis in shape:
        if axis not in free:
            raise SpecError(
                where,
                f"axis '{axis}' of the output shape {list(out.shape)} is not in the expression",
                "every output axis must index an input in the expression",
            )
    if (ELLIPSIS in free) != (ELLIPSIS in out.shape):
        raise SpecError(
            where,
            "the batch axes '...' of the inputs must be the output's: start its shape with '...'"
            if ELLIPSIS in free
            else "the output shape has '...' but no input with batch axes is used",
        )
    if missing:
        absent = {s: 0 for s, leaf in formula.leaves.items() if leaf.input in missing}
        expr = expr.xreplace(absent)
        if formula.axes(expr) != free:
            raise SpecError(
                where,
                f"without the optional input(s) {', '.join(sorted(missing))} the output loses axes",
                "make the input required, or keep every output axis in the other terms",
            )
    formula.expr = expr if raw else stable(expr, formula)  # raw: the naive formula, as written
    return formula


__all__ = [
    "ELLIPSIS",
    "RLSE",
    "Leaf",
    "RLogSoftmax",
    "RMax",
    "RMin",
    "RSoftmax",
    "RSum",
    "Reduction",
    "TensorFormula",
    "free_axes",
    "parse_tensor_function",
]

"""The tensor tape: nodes with named axes, and the reverse (VJP) and forward (JVP) sweeps.

A node is an input access (``leaf``), an elementwise formula over earlier nodes (``elem``),
a contraction of several nodes (``sum``: an einsum, a plain sum when it has one operand),
or a reduction that needs its own kernel (``lse``, ``max``, ``min``, and ``softmax`` /
``logsoftmax`` which keep their axes). Nodes are hash-consed: the backward reuses what the
forward computed, and the second order what the backward did.

The sweeps follow Laue et al.'s rules in Einstein notation: the adjoint of an operand is the
node's adjoint times its partial derivative, summed over the axes the operand lacks (for an
einsum: the other operands and the adjoint, contracted to the operand's axes). Elementwise
partials are ``sympy.diff`` of a node's own formula, so ``d(t**2)/dt = 2*t`` for a centred
``t``, never ``2*x - 2*mean(x)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from symgrad.tensor.lang import (
    RLSE,
    Leaf,
    RLogSoftmax,
    RMax,
    RMin,
    RSoftmax,
    RSum,
    TensorFormula,
)


@dataclass(frozen=True)
class Node:
    name: str
    op: str  # leaf | elem | sum | lse | max | min | softmax | logsoftmax
    axes: tuple[str, ...]  # the stored layout
    args: tuple[str, ...] = ()
    expr: sympy.Expr | None = None  # elem: a formula over the args' symbols
    over: tuple[str, ...] = ()  # lse, max, min, softmax, logsoftmax: the reduced axes
    input: str | None = None  # leaf: the input (or cotangent, tangent) it reads


@dataclass(frozen=True)
class Output:
    """A result tensor: the sum of its parts, each a node viewed in a layout of the result's
    axes (one part per way the input was indexed: ``x[n, k]`` and ``x[m, k]``)."""

    name: str
    parts: tuple[tuple[str, tuple[str, ...]], ...]
    like: str  # the input (or output) whose shape it has


@dataclass
class Tape:
    formula: TensorFormula
    nodes: dict[str, Node] = field(default_factory=dict)
    _keys: dict[tuple, str] = field(default_factory=dict)
    _count: int = 0
    _nonnegative: set[str] = field(default_factory=set)

    # -------------------------------------------------------------- building
    @property
    def order(self) -> tuple[str, ...]:
        return self.formula.order

    def sorted_axes(self, axes) -> tuple[str, ...]:
        return tuple(sorted(set(axes), key=self.order.index))

    def symbol(self, name: str) -> sympy.Symbol:
        """A node's symbol: real, and nonnegative where the node is (a sum of squares, a
        softmax), so that SymPy writes sqrt(v)/v as 1/sqrt(v): v*sqrt(v)**2 overflows
        float32 where the variance is 1e19, 1/sqrt(v) does not."""
        if name in self._nonnegative:
            return sympy.Symbol(name, real=True, nonnegative=True)
        return sympy.Symbol(name, real=True)

    def _is_nonnegative(self, op, args, expr, input) -> bool:
        if op in ("softmax", "onehot"):
            return True
        if op == "leaf":
            inputs = {i.name: i for i in self.formula.function.inputs}
            flags = dict(inputs[input].assumptions) if input in inputs else {}
            return bool(flags.get("positive") or flags.get("nonnegative"))
        if op in ("sum", "max", "min"):
            return all(a in self._nonnegative for a in args)
        if op == "elem":
            return expr.is_nonnegative is True
        return False

    def axes(self, expr: sympy.Basic) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for s in expr.free_symbols:
            node = self.nodes.get(s.name)
            if node is not None:
                out |= set(node.axes)
        return out

    def _add(self, op, axes, args=(), expr=None, over=(), input=None) -> sympy.Symbol:
        key = (op, tuple(axes), tuple(args), expr, tuple(over), input)
        name = self._keys.get(key)
        if name is None:
            if op == "leaf":
                name = input if input not in self.nodes else f"{input}_{self._count}"
            else:
                name = f"t{self._count}"
            self._count += 1
            self.nodes[name] = Node(name, op, tuple(axes), tuple(args), expr, tuple(over), input)
            if self._is_nonnegative(op, args, expr, input):
                self._nonnegative.add(name)
            self._keys[key] = name
        return self.symbol(name)

    def _rank(self, name: str) -> tuple:
        """Operands in the order of the inputs' declaration, then of the tape."""
        node = self.nodes[name]
        inputs = [i.name for i in self.formula.function.inputs]
        if node.op == "leaf" and node.input in inputs:
            return (0, inputs.index(node.input), name)
        return (1, list(self.nodes).index(name), name)

    def leaf(self, input: str, layout: tuple[str, ...]) -> sympy.Symbol:
        return self._add("leaf", layout, input=input)

    def is_onehot(self, expr: sympy.Expr) -> bool:
        node = self.nodes.get(getattr(expr, "name", None))
        return node is not None and node.op == "onehot"

    def node_of(self, expr: sympy.Expr) -> sympy.Symbol:
        """A node holding ``expr`` (itself when it is one already)."""
        if isinstance(expr, sympy.Symbol) and expr.name in self.nodes:
            return expr
        axes = self.axes(expr)
        expr = self._hoist(expr, axes)
        if isinstance(expr, sympy.Symbol) and expr.name in self.nodes:
            return expr
        args = sorted(s.name for s in expr.free_symbols if s.name in self.nodes)
        return self._add("elem", self.sorted_axes(axes), args, expr)

    def _hoist(self, expr: sympy.Expr, full: frozenset[str]) -> sympy.Expr:
        """``expr`` with its parts over fewer axes than ``full`` computed first, as nodes of
        their own: ``2 * t * s[..., None]`` is ``t * u`` with ``u = 2 * s`` a row vector, one
        pass over the full tensor instead of two."""
        if expr.is_Atom or isinstance(expr, (sympy.Piecewise, sympy.logic.boolalg.Boolean)):
            return expr
        axes = self.axes(expr)
        if axes != full:
            return self.node_of(expr) if axes else expr
        if isinstance(expr, (sympy.Mul, sympy.Add)):
            small = [a for a in expr.args if self.axes(a) != full]
            big = [self._hoist(a, full) for a in expr.args if self.axes(a) == full]
            if not big:  # (an outer product: no part is smaller than the whole)
                return expr
            grouped = expr.func(*small)
            if self.axes(grouped) and (len(small) > 1 or not grouped.is_Atom):
                grouped = self.node_of(grouped)
            return expr.func(*big, grouped)
        return expr.func(*(self._hoist(a, full) for a in expr.args))

    def size(self, axes) -> sympy.Expr:
        return self.formula.size(sorted(axes, key=self.order.index))

    def reduce(self, expr: sympy.Expr, over) -> sympy.Expr:
        """``sum(expr, over)``: factors free of ``over`` pulled out, the rest one einsum whose
        operands are the factors grouped by their axes (no product of every index)."""
        over = set(over)
        if not over or expr == 0:
            return expr
        present = self.axes(expr) & over
        scale = self.size(over - present) if over - present else sympy.Integer(1)
        if not present:
            return scale * expr
        groups: dict[object, list[sympy.Expr]] = {}
        outside = []
        for factor in sympy.Mul.make_args(expr):
            axes = self.axes(factor)
            if not axes & present:
                outside.append(factor)
            elif self.is_onehot(factor):  # its own operand: a gather, not a product
                groups[factor] = [factor]
            else:
                groups.setdefault(axes, []).append(factor)
        args = [self.node_of(sympy.Mul(*g)).name for g in groups.values()]
        union = set().union(*(self.nodes[a].axes for a in args))
        total = self._add("sum", self.sorted_axes(union - present), sorted(args, key=self._rank))
        return scale * sympy.Mul(*outside) * total

    # -------------------------------------------------------------- lowering
    def lower_shared(self, expr: sympy.Expr) -> sympy.Expr:
        """``lower``, a subexpression used twice computed once (``x - mean(x)`` of a layer
        norm is one node, read by the variance and the output)."""
        replacements, (reduced,) = sympy.cse([expr], optimizations=None)
        env: dict[sympy.Symbol, sympy.Expr] = {}
        for symbol, sub in replacements:
            low = self.lower(sub.xreplace(env))
            # a shared product stays a product: a sum over it is an einsum of its factors
            env[symbol] = self.node_of(low) if self.axes(low) and not low.is_Mul else low
        return self.lower(reduced.xreplace(env))

    def lower(self, expr: sympy.Expr) -> sympy.Expr:
        """A formula (leaves, reductions) as an elementwise expression over nodes."""
        leaves = self.formula.leaves
        if isinstance(expr, sympy.Symbol):
            leaf: Leaf | None = leaves.get(expr)
            if leaf is not None and leaf.onehot is not None:
                return self._add("onehot", leaf.layout, input=leaf.input, over=(leaf.onehot,))
            return self.leaf(leaf.input, leaf.layout) if leaf else expr
        if isinstance(expr, RSum):
            return self.reduce(self.lower(expr.body), expr.over)
        if isinstance(expr, (RLSE, RMax, RMin, RSoftmax, RLogSoftmax)):
            body = self.node_of(self.lower(expr.body))
            op = {RLSE: "lse", RMax: "max", RMin: "min", RSoftmax: "softmax"}.get(
                type(expr), "logsoftmax"
            )
            axes = self.nodes[body.name].axes
            if op in ("lse", "max", "min"):
                axes = tuple(a for a in axes if a not in expr.over)
            return self._add(op, axes, (body.name,), over=expr.over)
        if not expr.args:
            return expr
        return expr.func(*(self.lower(a) for a in expr.args))

    # -------------------------------------------------------------- the sweeps
    def vjp(
        self, outputs: list[Output], cotangents: list[str], wrt: list[tuple[str, tuple]]
    ) -> list[Output]:
        """The VJP of ``outputs`` (cotangent inputs named ``cotangents``, one per output,
        each read in the layouts of the output's parts) for the inputs ``wrt``
        ((name, declared layout) pairs)."""
        adjoint: dict[str, list[sympy.Expr]] = {}
        for out, ct in zip(outputs, cotangents):
            for node, layout in out.parts:
                seed = self.reduce(self.leaf(ct, layout), set(layout) - set(self.nodes[node].axes))
                adjoint.setdefault(node, []).append(seed)
        parts: dict[str, list[tuple[str, tuple]]] = {name: [] for name, _ in wrt}
        for name in reversed(list(self.nodes)):
            if name not in adjoint:
                continue
            node = self.nodes[name]
            g = self.node_of(sympy.Add(*adjoint.pop(name)))
            if node.op == "leaf":
                if node.input in parts:
                    parts[node.input].append((g.name, node.axes))
                continue
            if node.op == "onehot":  # class indices: integers, no gradient
                continue
            for arg, contribution in self._pullback(node, g):
                if contribution != 0:
                    adjoint.setdefault(arg, []).append(contribution)
        return [Output(f"grad_{name}", tuple(parts[name]), name) for name, _ in wrt]

    def _pullback(self, node: Node, g: sympy.Symbol):
        f = self.symbol(node.name)
        if node.op == "elem":
            for arg in node.args:
                a = self.symbol(arg)
                d = sympy.diff(node.expr, a)
                if d == 0:
                    continue
                contribution = g * d
                if any(
                    p.exp.is_Rational and 0 < p.exp < 1 and self._scaled(p.base, a)
                    for p in node.expr.atoms(sympy.Pow)
                ):
                    # sqrt(a) at a = 0: finite, its derivative not. The subgradient 0 there,
                    # as torch's norms (a constant channel of a batch norm: 0 * inf masked)
                    contribution = sympy.Piecewise((0, sympy.Eq(a, 0)), (contribution, True))
                yield arg, self.reduce(contribution, set(node.axes) - set(self.nodes[arg].axes))
        elif node.op == "sum":
            union = set().union(*(self.nodes[a].axes for a in node.args))
            for j, arg in enumerate(node.args):
                others = [self.symbol(a) for i, a in enumerate(node.args) if i != j]
                yield arg, self.reduce(g * sympy.Mul(*others), union - set(self.nodes[arg].axes))
        else:
            (arg,) = node.args
            b = self.symbol(arg)
            b_axes = self.nodes[arg].axes
            if node.op == "lse":
                yield arg, g * self._add("softmax", b_axes, (arg,), over=node.over)
            elif node.op == "logsoftmax":
                s = self._add("softmax", b_axes, (arg,), over=node.over)
                yield arg, g - s * self.reduce(g, node.over)
            elif node.op == "softmax":
                yield arg, f * (g - self.reduce(g * f, node.over))
            else:  # max, min: ties share the gradient, as torch.amax
                mask = self.node_of(sympy.Piecewise((1, sympy.Eq(b, f)), (0, True)))
                yield arg, g * mask / self.node_of(self.reduce(mask, node.over))

    def _scaled(self, expr: sympy.Expr, a: sympy.Symbol) -> bool:
        """``expr`` is ``a`` times a factor that is no node (zero exactly where ``a`` is)."""
        ratio = expr / a
        return expr.has(a) and not any(s.name in self.nodes for s in ratio.free_symbols)

    def jvp(self, out: str, tangents: dict[str, str | None]) -> sympy.Expr:
        """The tangent of node ``out``; ``tangents`` maps each input to its tangent input
        (None: a constant)."""
        tan: dict[str, sympy.Expr] = {}
        for name in list(self.nodes):
            node = self.nodes[name]
            if node.op in ("leaf", "onehot"):
                t = tangents.get(node.input) if node.op == "leaf" else None
                tan[name] = self.leaf(t, node.axes) if t else sympy.Integer(0)
            elif node.op == "elem":
                tan[name] = sympy.Add(
                    *(sympy.diff(node.expr, self.symbol(a)) * tan[a] for a in node.args)
                )
            elif node.op == "sum":
                terms = []
                over = set().union(*(self.nodes[a].axes for a in node.args)) - set(node.axes)
                for j, arg in enumerate(node.args):
                    if tan[arg] == 0:
                        continue
                    factors = [self.symbol(a) for i, a in enumerate(node.args) if i != j]
                    terms.append(self.reduce(tan[arg] * sympy.Mul(*factors), over))
                tan[name] = sympy.Add(*terms)
            else:
                (arg,) = node.args
                tb = tan[arg]
                if tb == 0:
                    tan[name] = sympy.Integer(0)
                    continue
                f = self.symbol(name)
                b = self.symbol(arg)
                s = self._add("softmax", self.nodes[arg].axes, (arg,), over=node.over)
                if node.op == "lse":
                    tan[name] = self.reduce(s * tb, node.over)
                elif node.op == "logsoftmax":
                    tan[name] = tb - self.reduce(s * tb, node.over)
                elif node.op == "softmax":
                    tan[name] = f * (tb - self.reduce(f * tb, node.over))
                else:
                    mask = self.node_of(sympy.Piecewise((1, sympy.Eq(b, f)), (0, True)))
                    count = self.node_of(self.reduce(mask, node.over))
                    tan[name] = self.reduce(mask * tb, node.over) / count
            if name == out:
                return tan[name]
        raise KeyError(out)

    # -------------------------------------------------------------- reading
    def needed(self, roots, given: frozenset[str] = frozenset()) -> list[str]:
        """The nodes ``roots`` depend on, in tape order (not past those ``given``)."""
        seen: set[str] = set()
        stack = [r for r in roots if r in self.nodes]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in given:
                continue
            node = self.nodes[name]
            stack.extend(node.args)
        return [n for n in self.nodes if n in seen]

    def inputs_of(self, roots, given: frozenset[str] = frozenset()) -> set[str]:
        """The inputs (class indices included) that ``roots`` read."""
        return {
            self.nodes[n].input
            for n in self.needed(roots, given)
            if self.nodes[n].op in ("leaf", "onehot")
        }

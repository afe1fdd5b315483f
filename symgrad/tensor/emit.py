"""Tape -> framework source: einsum/matmul for contractions, fused kernels for reductions.

Every computed value is stored with its axes in the function's one axis order; an operand
with fewer axes is viewed (``t[:, None]``) where an elementwise formula needs it. No node
has more axes than its operands together: a contraction is one ``einsum`` over the
operands, never their broadcast product (asserted in :func:`check_no_broadcast_product`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import sympy
from sympy.printing.precedence import PRECEDENCE

from symgrad.printers.tensorflow import TensorFlowPrinter
from symgrad.printers.torch import TorchPrinter
from symgrad.tensor.lang import ELLIPSIS
from symgrad.tensor.tape import Node, Output, Tape


def _dividing(printer_cls: type) -> type:
    """``printer_cls``, printing a quotient by several tensors as successive divisions:
    ``a / b / c**3`` keeps each step in range where ``a / (b * c**3)`` overflows float32
    (a batch norm's second order at a variance of 1e19: ``b * c**3`` is 1e47), as
    autograd's step-by-step chain rule does."""

    class Printer(printer_cls):
        def _print_Add(self, expr, order=None):
            # positive terms first: `a - b` is one subtraction, `-b + a` a negation too
            terms = sorted(expr.args, key=lambda t: t.could_extract_minus_sign())
            if not terms[0].could_extract_minus_sign() and len(terms) > 1:
                text = self.parenthesize(terms[0], PRECEDENCE["Add"])
                for term in terms[1:]:
                    if term.could_extract_minus_sign():
                        text += " - " + self.parenthesize(-term, PRECEDENCE["Add"], strict=True)
                    else:
                        text += " + " + self.parenthesize(term, PRECEDENCE["Add"])
                return text
            return super()._print_Add(expr, order)

        def _print_Mul(self, expr):
            coeff, factors = expr.as_coeff_mul()
            den = [
                f
                for f in factors
                if f.is_Pow and f.exp.is_number and f.exp < 0 and not self.is_scalar(f)
            ]
            if len(den) < 2:
                return super()._print_Mul(expr)
            num = coeff * sympy.Mul(*(f for f in factors if f not in den))
            parts = [self.parenthesize(num, PRECEDENCE["Mul"])]
            parts += [self.parenthesize(1 / f, PRECEDENCE["Mul"], strict=True) for f in den]
            return " / ".join(parts)

    Printer.__name__ = f"Dividing{printer_cls.__name__}"
    return Printer


_PRINTERS = {"torch": _dividing(TorchPrinter), "tensorflow": _dividing(TensorFlowPrinter)}


@dataclass(frozen=True)
class Result:
    """``target += output`` when ``guard`` holds (None: always)."""

    target: str
    output: Output
    guard: str | None


class Code:
    """Prints the nodes of a tape for one framework."""

    def __init__(
        self, tape: Tape, framework: str, names: dict[str, str], given: frozenset[str] = frozenset()
    ):
        self.tape = tape
        self.given = given  # nodes the forward computed and saved: arguments here
        self.framework = framework
        self.names = names  # input name -> variable (leaves)
        self.letters = self._letters()
        self.scalars = {s for s in tape.formula.scalars.values()}
        self.inline: set[str] = set()

    # ---------------------------------------------------------------- helpers
    def _letters(self) -> dict[str, str]:
        letters: dict[str, str] = {}
        free = [c for c in string.ascii_lowercase]
        for axis in self.tape.order:
            if axis == ELLIPSIS:
                continue
            pick = axis if len(axis) == 1 and axis in free else free[0]
            free.remove(pick)
            letters[axis] = pick
        return letters

    def var(self, name: str) -> str:
        node = self.tape.nodes[name]
        if node.op == "leaf":
            return self.names.get(node.input, node.input)
        if name in self.inline:
            return self.node(node)
        return name

    def dims(self, node: Node, over) -> list[int]:
        named = [a for a in node.axes if a != ELLIPSIS]
        return [named.index(a) - len(named) for a in over]

    def _dims_text(self, dims: list[int]) -> str:
        if self.framework == "torch":
            return str(dims[0]) if len(dims) == 1 else f"({', '.join(map(str, dims))})"
        return str(dims[0]) if len(dims) == 1 else f"[{', '.join(map(str, dims))}]"

    def size(self, symbol: sympy.Symbol) -> str:
        dim = self.tape.formula.sizes[symbol]
        for inp in self.tape.formula.function.inputs:
            if inp.shape and dim in inp.shape:
                named = [a for a in inp.shape if a != ELLIPSIS]
                return (
                    f"{self.names.get(inp.name, inp.name)}.shape[{named.index(dim) - len(named)}]"
                )
        raise AssertionError(dim)

    def align(self, name: str, target: tuple[str, ...]) -> str:
        """Node ``name`` viewed so that it broadcasts against a value with axes ``target``."""
        node = self.tape.nodes[name]
        text = self.var(name)
        have = [a for a in node.axes]
        want = [a for a in target if a in have]
        if have != want:  # a transposed view (a leaf indexed against the axis order)
            if node.op == "sum" and name in self.inline:  # the einsum, in the order wanted
                text = self.einsum(list(node.args), tuple(want))
            else:
                text = self.einsum([name], tuple(want))
            have = want
        if not have or set(have) == set(target):
            return text
        entries: list[str] = []
        started = False
        for axis in target:
            if axis == ELLIPSIS:
                if ELLIPSIS in have:
                    entries.append("...")
                    started = True
                continue
            if axis in have:
                started = True
                entries.append(":")
            elif started:
                entries.append("None")
        if entries and entries[0] == "...":
            while len(entries) > 1 and entries[1] == ":":
                entries.pop(1)
        while entries and entries[-1] == ":":
            entries.pop()
        if not any(e == "None" for e in entries):
            return text
        return f"{text}[{', '.join(entries)}]"

    def einsum(self, args: list[str], out: tuple[str, ...]) -> str:
        def sub(axes):
            return "".join("..." if a == ELLIPSIS else self.letters[a] for a in axes)

        nodes = [self.tape.nodes[a] for a in args]
        batch_summed = any(ELLIPSIS in n.axes for n in nodes) and ELLIPSIS not in out
        operands = []
        for n in nodes:
            text = self.var(n.name)
            if batch_summed and self.framework == "tensorflow" and ELLIPSIS in n.axes:
                # tf.einsum cannot sum batch axes '...' away: flatten them into one axis
                r = len(n.axes) - 1
                if r:
                    text = f"tf.reshape({text}, tf.concat([[-1], tf.shape({text})[{-r}:]], 0))"
                else:
                    text = f"tf.reshape({text}, [-1])"
            operands.append(text)
        subs = []
        for n in nodes:
            s = sub(n.axes)
            if batch_summed and self.framework == "tensorflow":
                s = s.replace("...", "Z")
            subs.append(s)
        spec = f"{','.join(subs)}->{sub(out)}"
        module = "torch" if self.framework == "torch" else "tf"
        return f'{module}.einsum("{spec}", {", ".join(operands)})'

    def formula(self, node: Node, expr: sympy.Expr, axes: tuple[str, ...]) -> str:
        """``expr`` (over ``node``'s operands) printed, its operands viewed against ``axes``."""
        sizes = {s for s in expr.free_symbols if s in self.tape.formula.sizes}
        names = {self.tape.symbol(a): self.align(a, axes) for a in node.args}
        names.update({s: self.size(s) for s in sizes})
        printer = _PRINTERS[self.framework](scalars=self.scalars | sizes, names=names)
        return printer.doprint(expr)

    # ---------------------------------------------------------------- nodes
    def node(self, node: Node) -> str:
        torch = self.framework == "torch"
        if node.op == "elem":
            return self.scatter(node) or self.formula(node, node.expr, node.axes)
        if node.op == "onehot":
            return self.onehot(node)
        (arg, *_) = node.args or (None,)
        if node.op == "sum":
            if len(node.args) == 1:
                a = self.tape.nodes[arg]
                over = [x for x in a.axes if x not in node.axes]
                kept = [x for x in a.axes if x in node.axes]
                if kept == list(node.axes) and over:
                    dims = self._dims_text(self.dims(a, over))
                    if torch:
                        return f"{self.var(arg)}.sum({dims})"
                    return f"tf.reduce_sum({self.var(arg)}, axis={dims})"
            return self.gather(node) or self.einsum(list(node.args), node.axes)
        a = self.tape.nodes[arg]
        dims = self.dims(a, node.over)
        d = self._dims_text(dims)
        x = self.var(arg)
        if node.op in ("lse", "max", "min"):
            fn = {
                ("lse", True): "torch.logsumexp",
                ("max", True): "torch.amax",
                ("min", True): "torch.amin",
                ("lse", False): "tf.reduce_logsumexp",
                ("max", False): "tf.reduce_max",
                ("min", False): "tf.reduce_min",
            }[node.op, torch]
            return f"{fn}({x}, {d})" if torch else f"{fn}({x}, axis={d})"
        if len(dims) == 1:
            fn = {
                ("softmax", True): "torch.softmax",
                ("logsoftmax", True): "torch.log_softmax",
                ("softmax", False): "tf.nn.softmax",
                ("logsoftmax", False): "tf.nn.log_softmax",
            }[node.op, torch]
            return f"{fn}({x}, {d})" if torch else f"{fn}({x}, axis={d})"
        lse = (
            f"torch.logsumexp({x}, {d}, keepdim=True)"
            if torch
            else f"tf.reduce_logsumexp({x}, axis={d}, keepdims=True)"
        )
        exp = "torch.exp" if torch else "tf.exp"
        return f"{exp}({x} - {lse})" if node.op == "softmax" else f"{x} - {lse}"

    def _float_input(self) -> str:
        for inp in self.tape.formula.function.inputs:
            if inp.is_tensor and inp.differentiable:
                return self.names.get(inp.name, inp.name)
        raise AssertionError("a class index needs a floating input")

    def onehot(self, node: Node) -> str:
        """A class index as a one-hot float tensor (its axis last)."""
        (axis,) = node.over
        size = self.size(self.tape.formula.size([axis]))
        label, ref = self.names.get(node.input, node.input), self._float_input()
        if self.framework == "torch":
            return f"torch.nn.functional.one_hot({label}, {size}).to({ref}.dtype)"
        return f"tf.one_hot({label}, {size}, dtype={ref}.dtype)"

    def gather(self, node: Node) -> str | None:
        """``sum(x * onehot(label), c)`` with c x's last axis: ``x[..., label]``."""
        if node.op != "sum" or len(node.args) != 2:
            return None
        a, b = (self.tape.nodes[n] for n in node.args)
        if a.op == "onehot":
            a, b = b, a
        if b.op != "onehot" or a.op == "onehot" or a.axes != b.axes or a.axes[-1] != b.over[0]:
            return None
        if node.axes != a.axes[:-1]:
            return None
        label, x = self.names.get(b.input, b.input), self.var(a.name)
        if self.framework == "torch":
            return f"{x}.gather(-1, {label}.unsqueeze(-1)).squeeze(-1)"
        return f"tf.gather({x}, {label}, axis=-1, batch_dims={label}.shape.rank)"

    def scatter(self, node: Node) -> str | None:
        """``a + onehot(label) * v`` (v over the label's axes, the class axis last):
        ``a.scatter_add(-1, label[..., None], v[..., None])`` (torch), no one-hot tensor."""
        if self.framework != "torch" or node.op != "elem" or not node.expr.is_Add:
            return None
        for term in node.expr.args:
            factors = sympy.Mul.make_args(term)
            hot = [f for f in factors if self.tape.is_onehot(f)]
            if len(hot) != 1:
                continue
            oh = self.tape.nodes[hot[0].name]
            rest = sympy.Mul(*(f for f in factors if f is not hot[0]))
            tensors = [a for a in rest.free_symbols if a.name in self.tape.nodes]
            if oh.axes != node.axes or not tensors or self.tape.axes(rest) - set(oh.axes[:-1]):
                continue
            others = node.expr - term
            if self.tape.axes(others) != set(node.axes):
                continue
            base = self.formula(node, others, node.axes)
            value = self.formula(node, rest, oh.axes[:-1])
            label = self.names.get(oh.input, oh.input)
            value = value if value.isidentifier() else f"({value})"
            if self.tape.axes(rest) != set(oh.axes[:-1]):
                value = f"{value}.expand({label}.shape)"
            base = base if base.isidentifier() else f"({base})"
            return f"{base}.scatter_add(-1, {label}.unsqueeze(-1), {value}.unsqueeze(-1))"
        return None

    def output(self, out: Output) -> str:
        """The value of ``out``: its parts in the layout of the tensor it is like."""
        like = self.names.get(out.like, out.like)
        if not out.parts:
            module = "torch" if self.framework == "torch" else "tf"
            return f"{module}.zeros_like({like})"
        layout = out.parts[0][1]
        texts = [self.align(node, layout) for node, layout in out.parts]
        text = " + ".join(texts)
        covered = set().union(*(self.tape.nodes[n].axes for n, _ in out.parts))
        if covered != set(layout):
            text = f"({text})" if len(texts) > 1 else text
            if self.framework == "torch":
                return f"{text}.expand_as({like})"
            return f"tf.broadcast_to({text}, tf.shape({like}))"
        return text

    # ---------------------------------------------------------------- bodies
    def body(self, results: list[Result]) -> list[str]:
        """Lines computing ``results``, each node once, under the guards of what uses it."""
        uses: dict[str, set[int]] = {}
        for i, r in enumerate(results):
            for name in self.tape.needed([n for n, _ in r.output.parts], self.given):
                if name not in self.given:
                    uses.setdefault(name, set()).add(i)
        # a one-hot class index that only gathers read is never built
        for name in list(uses):
            if self.tape.nodes[name].op != "onehot":
                continue
            consumers = [self.tape.nodes[n] for n in uses if name in self.tape.nodes[n].args]
            if consumers and all(self.gather(c) or self.scatter(c) for c in consumers):
                del uses[name]
        # a node that only one result reads, and nothing else: written in that result
        readers: dict[str, int] = {}
        for name in uses:
            for arg in self.tape.nodes[name].args:
                readers[arg] = readers.get(arg, 0) + 1
        for r in results:
            for node, _ in r.output.parts:
                readers[node] = readers.get(node, 0) + 1
        self.inline = {
            n
            for n in uses
            if readers.get(n) == 1
            and self.tape.nodes[n].op != "leaf"
            and any(len(r.output.parts) == 1 and r.output.parts[0][0] == n for r in results)
        }
        lines: list[str] = []
        targets = list(dict.fromkeys(r.target for r in results))
        guarded = {r.target for r in results if r.guard is not None}
        if guarded:
            lines.append(" = ".join([t for t in targets if t in guarded] + ["None"]))
        current: str | None = None
        indent = ""
        for name in self.tape.nodes:
            if name not in uses or self.tape.nodes[name].op == "leaf" or name in self.inline:
                continue
            guard = self._guard([results[i] for i in sorted(uses[name])])
            if guard != current:
                current = guard
                indent = "" if guard is None else "    "
                if guard is not None:
                    lines.append(f"if {guard}:")
            lines.append(f"{indent}{name} = {self.node(self.tape.nodes[name])}")
        assigned: set[str] = set()
        for r in results:
            value = self.output(r.output)
            if r.target in assigned:
                value = f"{value} if {r.target} is None else {r.target} + {value}"
            assigned.add(r.target)
            if r.guard is None:
                lines.append(f"{r.target} = {value}")
                current = None
            else:
                if r.guard != current:
                    lines.append(f"if {r.guard}:")
                    current = r.guard
                lines.append(f"    {r.target} = {value}")
        return lines

    @staticmethod
    def _guard(results: list[Result]) -> str | None:
        guards = [r.guard for r in results]
        if any(g is None for g in guards):
            return None
        unique = list(dict.fromkeys(guards))
        if len(unique) == 1:
            return unique[0]
        return " or ".join(f"({g})" if " and " in g else g for g in unique)


def check_no_broadcast_product(tape: Tape) -> None:
    """No product holds more axes than any input or output: a contraction that would
    materialise every index combination (an elementwise function of such a product, such
    as exp(x[n, i] * y[m, i]), needs its tensor and is not one)."""
    formula = tape.formula
    widest = max(
        [len(i.shape) for i in formula.function.inputs if i.shape is not None]
        + [len(formula.shape)]
    )
    for node in tape.nodes.values():
        product = node.op == "elem" and node.expr.is_Mul
        if product and len(node.axes) > widest:
            raise AssertionError(
                f"{formula.function.name}: node {node.name} has axes {node.axes}, more than "
                f"any input or output ({widest}): a broadcast product"
            )

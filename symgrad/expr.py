"""Safe formula parsing: a whitelisted Python AST turned into SymPy, nothing evaluated.

SymPy's ``sympify``/``parse_expr`` call ``eval`` on their input, so a spec could run code
through them. Here the text only goes through ``ast.parse`` (which executes nothing) and
every node is checked against a whitelist before the matching SymPy object is built.
"""

from __future__ import annotations

import ast
import difflib
import math
from collections.abc import Callable, Mapping

import sympy

from symgrad import functions as F
from symgrad.errors import Location, SpecError
from symgrad.ops import OPS

MAX_FORMULA_LENGTH = 4000
MAX_POWER_BITS = 4096
MAX_SPECIAL_ARGUMENT = 1000  # gamma & co. of a larger number constant are refused
#: Functions SymPy evaluates exactly at a number: a large constant argument is refused.
_EAGER = frozenset(name for op in OPS if op.exact_at_numbers for name in op.spelled)


def _where(cond: sympy.Basic, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return sympy.Piecewise((a, cond), (b, True))


#: Words that build arithmetic or branches, not a primitive (symgrad.ops has those).
_SYNTAX: dict[str, tuple[Callable[..., sympy.Basic], tuple[int, ...]]] = {
    "sqrt": (sympy.sqrt, (1,)),
    "Piecewise": (sympy.Piecewise, tuple(range(1, 17))),
    "where": (_where, (3,)),
}
#: Function name in a formula -> (SymPy constructor, allowed argument counts).
FUNCTIONS: dict[str, tuple[Callable[..., sympy.Basic], tuple[int, ...]]] = {
    **{name: (op.constructor, op.arity) for op in OPS for name in op.spelled},
    **_SYNTAX,
}

CONSTANTS: dict[str, sympy.Basic] = {
    "pi": sympy.pi,
    "E": sympy.E,
    "true": sympy.true,
    "True": sympy.true,
    "False": sympy.false,
}

_BINOPS: dict[type, Callable[[sympy.Expr, sympy.Expr], sympy.Expr]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_COMPARE: dict[type, Callable[[sympy.Expr, sympy.Expr], sympy.Basic]] = {
    ast.Lt: sympy.Lt,
    ast.LtE: sympy.Le,
    ast.Gt: sympy.Gt,
    ast.GtE: sympy.Ge,
    ast.Eq: sympy.Eq,
    ast.NotEq: sympy.Ne,
}
#: Where users look for the language (functions, keys): shipped with the repository.
LANGUAGE_DOC = "docs/spec-language.md"
#: Tensor-language words (reductions, contractions) that a user may reach for.
TENSOR_WORDS = frozenset(
    {"sum", "mean", "prod", "logsumexp", "softmax", "log_softmax", "matmul", "einsum", "dot"}
    | {"size", "norm", "var", "std", "amax", "amin", "cumsum", "transpose", "reshape"}
)
ELEMENTWISE_ONLY = (
    "indexing, reductions such as sum and matrix products are tensor expressions: give the "
    "inputs a shape and write the output as {shape: [...], expr: ...} with x[n, k] and "
    f"sum(e, k) (see {LANGUAGE_DOC}, Tensor expressions)"
)
_HINTS: dict[type, str] = {
    ast.BitXor: "use ** for powers (^ is not a power)",
    ast.Attribute: "attribute access is not allowed; write the function name alone, e.g. exp(x)",
    ast.Subscript: ELEMENTWISE_ONLY,
    ast.MatMult: ELEMENTWISE_ONLY,
    ast.Lambda: "lambdas are not allowed in formulas",
    ast.Starred: "* unpacking is not allowed in formulas",
}


class _Builder:
    """Walks a whitelisted AST and builds SymPy; raises SpecError on anything else."""

    def __init__(self, text: str, symbols: Mapping[str, sympy.Basic], where: Location):
        self.text = text
        self.symbols = symbols
        self.where = where

    def fail(self, node: ast.AST | None, message: str, hint: str | None = None) -> SpecError:
        line = self.where.line
        if node is not None and line is not None and hasattr(node, "lineno"):
            line += node.lineno - 1
        if node is not None and hasattr(node, "col_offset"):
            token = ast.get_source_segment(self.text, node) or ""
            if token:
                message = f"{message}: '{token}'"
        return SpecError(self.where.at(line=line), message, hint)

    def build(self, node: ast.AST) -> sympy.Basic:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            name = type(node).__name__
            hint = _HINTS.get(type(node))
            raise self.fail(node, f"'{name}' is not allowed in a formula", hint)
        return method(node)

    def _Expression(self, node: ast.Expression) -> sympy.Basic:
        return self.build(node.body)

    def _Constant(self, node: ast.Constant) -> sympy.Basic:
        value = node.value
        if isinstance(value, bool):
            return sympy.true if value else sympy.false
        if isinstance(value, int):
            return sympy.Integer(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self.fail(node, "number is not finite")
            # Exact decimal: 0.1 -> 1/10, so SymPy simplifies with the value the user wrote.
            return sympy.Rational(repr(value))
        raise self.fail(node, "only numbers are allowed as constants")

    def _Name(self, node: ast.Name) -> sympy.Basic:
        if node.id in self.symbols:
            return self.symbols[node.id]
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise self.fail(node, f"function '{node.id}' used without arguments")
        known = list(self.symbols) + list(CONSTANTS)
        close = difflib.get_close_matches(node.id, known, n=1)
        hint = (
            f"did you mean '{close[0]}'? Else declare it under inputs:"
            if close
            else f"declare it under inputs: ({node.id}: {{}} for a tensor, "
            f"{node.id}: {{kind: scalar, default: 1.0}} for a number); known names: "
            + ", ".join(known)
        )
        raise self.fail(node, "unknown name", hint)

    def _UnaryOp(self, node: ast.UnaryOp) -> sympy.Basic:
        operand = self.build(node.operand)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return operand
        if isinstance(node.op, ast.Not):
            return sympy.Not(operand)
        raise self.fail(node, f"operator '{type(node.op).__name__}' is not allowed")

    def _BinOp(self, node: ast.BinOp) -> sympy.Basic:
        op = _BINOPS.get(type(node.op))
        if op is None:
            hint = _HINTS.get(type(node.op))
            raise self.fail(node, f"operator '{type(node.op).__name__}' is not allowed", hint)
        left, right = self.build(node.left), self.build(node.right)
        if isinstance(node.op, ast.Pow) and left.is_Number and right.is_Number:
            bits = abs(float(right)) * math.log2(max(abs(float(left)), 2.0))
            if bits > MAX_POWER_BITS:
                raise self.fail(node, "numeric power is too large")
        if isinstance(node.op, ast.Pow) and right.is_Number and abs(float(right)) > 1000:
            raise self.fail(node, "exponent is too large (at most 1000)")
        return op(left, right)

    def _Compare(self, node: ast.Compare) -> sympy.Basic:
        if len(node.ops) != 1:
            raise self.fail(node, "chained comparisons are not allowed", "use & between them")
        op = _COMPARE.get(type(node.ops[0]))
        if op is None:
            raise self.fail(node, f"comparison '{type(node.ops[0]).__name__}' is not allowed")
        return op(self.build(node.left), self.build(node.comparators[0]))

    def _BoolOp(self, node: ast.BoolOp) -> sympy.Basic:
        values = [self.build(v) for v in node.values]
        return sympy.And(*values) if isinstance(node.op, ast.And) else sympy.Or(*values)

    def _Tuple(self, node: ast.Tuple) -> sympy.Basic:
        return sympy.Tuple(*(self.build(e) for e in node.elts))

    def _Call(self, node: ast.Call) -> sympy.Basic:
        if not isinstance(node.func, ast.Name):
            method = getattr(node.func, "attr", None)
            hint = ELEMENTWISE_ONLY if method in TENSOR_WORDS else _HINTS.get(type(node.func))
            raise self.fail(node.func, "only plain function names can be called", hint)
        name = node.func.id
        if name not in FUNCTIONS:
            close = difflib.get_close_matches(name, list(FUNCTIONS), n=1)
            if name in TENSOR_WORDS:
                hint = ELEMENTWISE_ONLY
            elif close:
                hint = f"did you mean '{close[0]}'?"
            else:
                hint = f"the functions are listed in {LANGUAGE_DOC}"
            raise self.fail(node.func, "unknown function", hint)
        if node.keywords:
            raise self.fail(node, f"'{name}' takes no keyword arguments")
        constructor, arities = FUNCTIONS[name]
        if len(node.args) not in arities:
            expected = " or ".join(str(a) for a in arities[:3])
            raise self.fail(node, f"'{name}' takes {expected} arguments, got {len(node.args)}")
        if name == "Piecewise":
            pieces = []
            for arg in node.args:
                if not isinstance(arg, ast.Tuple) or len(arg.elts) != 2:
                    raise self.fail(arg, "Piecewise takes (value, condition) pairs")
                pieces.append((self.build(arg.elts[0]), self.build(arg.elts[1])))
            try:
                return sympy.Piecewise(*pieces)
            except (TypeError, ValueError) as exc:
                raise self.fail(node, f"invalid Piecewise ({exc})") from None
        args = [self.build(a) for a in node.args]
        for arg, sub in zip(args, node.args):
            if isinstance(arg, sympy.Tuple):
                raise self.fail(sub, "a tuple is only allowed inside Piecewise")
            if name in _EAGER and arg.is_Number and abs(float(arg)) > MAX_SPECIAL_ARGUMENT:
                # SymPy evaluates gamma(10**7) exactly (a 60-million-digit factorial).
                raise self.fail(
                    sub, f"constant argument of {name} is too large", "use a smaller constant"
                )
        try:
            return constructor(*args)
        except (TypeError, ValueError) as exc:
            raise self.fail(node, f"invalid call ({exc})") from None


def parse_formula_tree(text: str, where: Location) -> ast.Expression:
    """The syntax tree of a formula (``ast.parse`` executes nothing), or a located error."""
    if len(text) > MAX_FORMULA_LENGTH:
        raise SpecError(where, f"formula is longer than {MAX_FORMULA_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        line = (where.line or 0) + (exc.lineno or 1) - 1 if where.line else None
        source = text.strip().splitlines()[(exc.lineno or 1) - 1] if text.strip() else ""
        column = max(exc.offset or 1, 1)
        raise SpecError(
            where.at(line=line),
            f"syntax error in formula at column {column} ({exc.msg}):\n    {source}\n"
            f"    {' ' * (column - 1)}^",
            f"formulas are Python-like: + - * / ** and calls such as exp(x); see {LANGUAGE_DOC}",
        ) from None
    return tree


def parse_formula(text: str, symbols: Mapping[str, sympy.Basic], where: Location) -> sympy.Expr:
    """Parse one formula over ``symbols``; never executes anything from ``text``."""
    tree = parse_formula_tree(text, where)
    builder = _Builder(text.strip(), symbols, where)
    result = builder.build(tree)
    if isinstance(result, sympy.Tuple) or not isinstance(result, sympy.Expr):
        raise SpecError(where, f"formula must be a number-valued expression: {text.strip()!r}")
    # Min(Max(e, 0), 1) is torch.clamp (its gradient and one op), whichever way it is written
    return F.known_functions(F.as_clamps(result))

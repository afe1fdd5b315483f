"""The planner's typed IR: a tape of framework operations over named values.

A :class:`Tape` is straight-line code, one :class:`Node` a statement: the value it
defines and the operation tree that computes it (framework calls, arithmetic, selects,
as a Python expression tree: ``torch.exp(-t0)``). Every name a tape reads or writes is a
:class:`Value` that says what it is: an input of the code, a saved tensor, an upstream
gradient, a temporary the code owns, a result, or a Python number. The passes of
:mod:`symgrad.plan` (in-place updates, guards, pass counts) read these roles instead of
guessing from names; only :meth:`Tape.lines` makes text.

``axes`` is where a value will carry its named axes (tensor expressions: ``("b", "i")``);
elementwise code leaves it empty.
"""

from __future__ import annotations

import ast
import enum
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field


class Role(enum.Enum):
    """What a value is to the code that reads it."""

    INPUT = "input"  # an argument of the code: never written
    SAVED = "saved"  # a tensor autograd saved (an input or an output of the forward)
    UPSTREAM = "upstream"  # an upstream gradient
    TEMPORARY = "temporary"  # computed and owned by this code: may be updated in place
    RESULT = "result"  # what the code returns: never updated once defined
    NUMBER = "number"  # a Python number (a scalar input, or a formula of them)


#: The kinds of value: surely floating point, boolean, or anything else (an integer
#: target, a tensor of unknown dtype).
KINDS = ("float", "bool", "other")


@dataclass(frozen=True)
class Value:
    """A named value of a tape."""

    name: str
    role: Role
    kind: str = "float"
    #: named axes (tensor expressions); () for elementwise code
    axes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r} is none of {KINDS}")


@dataclass
class Node:
    """One statement: ``target = expr``."""

    target: Value
    expr: ast.expr

    def reads(self) -> list[str]:
        """The names the operation reads, in evaluation order, with repeats."""
        return [n.id for n in ast.walk(self.expr) if isinstance(n, ast.Name)]

    def line(self) -> str:
        return f"{self.target.name} = {unparse(self.expr)}"


#: Python frames that :func:`unparse` may use: ast.unparse takes about three a level, and
#: a chain of in-place updates is a level a link (the second derivative of Wilkinson's
#: product (x - 1)*...*(x - 20), Herbie's demo, is 381 levels deep; at the default limit
#: of 1000 it raised RecursionError). Six thousand: about 2000 levels, and in Python 3.10,
#: whose Python calls grow the C stack, a few MB of the main thread's 8.
UNPARSE_FRAMES = 6_000


def unparse(expr: ast.expr) -> str:
    """``ast.unparse(expr)``, with room for deep expressions (:data:`UNPARSE_FRAMES`)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, UNPARSE_FRAMES))
    try:
        return ast.unparse(expr)
    finally:
        sys.setrecursionlimit(limit)


def parse_expr(code: str) -> ast.expr:
    """The operation tree of a printed framework expression."""
    return ast.parse(code, mode="eval").body


@dataclass
class Tape:
    """Straight-line code: ``values`` the code starts from, then its ``nodes``."""

    values: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        lines: Iterable[str],
        inputs: Mapping[str, str] | None = None,
        results: Iterable[str] = (),
        numbers: Iterable[str] = (),
        role: Role = Role.INPUT,
    ) -> Tape:
        """A tape from ``name = expr`` lines: ``inputs`` (name -> kind) of ``role``,
        ``results`` the names it returns, ``numbers`` Python numbers. Other names it
        defines are its temporaries."""
        tape = cls({n: Value(n, role, kind) for n, kind in (inputs or {}).items()})
        tape.values |= {n: Value(n, Role.NUMBER, "other") for n in numbers}
        results = set(results)
        for line in lines:
            name, _, code = line.partition(" = ")
            tape.define(name, parse_expr(code), Role.RESULT if name in results else Role.TEMPORARY)
        return tape

    def define(self, name: str, expr: ast.expr, role: Role = Role.TEMPORARY) -> Node:
        """Append ``name = expr`` (a temporary unless ``role`` says otherwise)."""
        node = Node(Value(name, role, "other" if role is Role.NUMBER else "float"), expr)
        self.nodes.append(node)
        return node

    def role_of(self, name: str) -> Role | None:
        for node in reversed(self.nodes):
            if node.target.name == name:
                return node.target.role
        value = self.values.get(name)
        return None if value is None else value.role

    def names(self, *roles: Role) -> set[str]:
        """The names of the values (given and defined) with one of ``roles``."""
        found = {n for n, v in self.values.items() if v.role in roles}
        return found | {node.target.name for node in self.nodes if node.target.role in roles}

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def lines(self) -> list[str]:
        """The code as text, one statement a line."""
        return [node.line() for node in self.nodes]

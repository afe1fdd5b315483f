"""The rewrite phases, in the order a formula meets them, and the rewrites of each.

A rewrite is a plain function registered with its phase where it is written, its
docstring opening with what it rewrites, ``lhs -> rhs``::

    @register("stabilize")
    def log_one_plus(node):
        # docstring: log(1 + u) -> log1p(u).
        ...

A phase applies its rewrites in the order they are registered, which is the order they
are written in their module. Adding a rewrite is one decorated function and its case in
tests/test_stabilize.py (``CASES`` or ``PHASE_CASES``), which every registered rewrite
must have.

Each phase's rewrites live in one module (:attr:`Phase.module`), so a phase is complete
once that module is imported; nothing registers after import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


@dataclasses.dataclass
class Phase:
    """One step of the rewrite pipeline: its name, the module its rewrites live in, how
    they are applied, and the rewrites, in order."""

    name: str
    module: str
    applied: str
    rewrites: tuple[Callable, ...] = ()

    def names(self) -> tuple[str, ...]:
        return tuple(r.__name__ for r in self.rewrites)


_RULES = "symgrad.rewrite.rules"
_REGIMES = "symgrad.rewrite.regimes"

#: The phases in the order a formula meets them in :func:`symgrad.derive.finish`.
PHASES: tuple[Phase, ...] = (
    Phase(
        "stabilize",
        _RULES,
        "node rules `lhs -> rhs` (exact identities), each node's arguments first, the first "
        "rule that applies, to a fixed point (rules.stabilize); on every formula, before and "
        "after simplify",
    ),
    Phase(
        "whole",
        _REGIMES,
        "node -> replacement, tried on each formula before its parts by "
        "regimes.split_regimes, the first that applies; the formula's parts are then left as "
        "they are (a quotient rescaled as a whole, numerator with denominator)",
    ),
    Phase(
        "asymptotes",
        _REGIMES,
        "node -> (value, condition): the formula's own form for large inputs, tried on each "
        "formula before its parts by regimes.split_regimes; each that applies is a branch "
        "taken first, the first registered outermost",
    ),
    Phase(
        "limits",
        _REGIMES,
        "node -> (value, condition): the formula's own polynomial near 0, tried on each "
        "formula before its parts by regimes.split_regimes, the first that applies; a "
        "formula's parts below one are not searched for their own",
    ),
    Phase(
        "regimes",
        _REGIMES,
        "node rules -> Piecewise by input range, each node's arguments first, the first "
        "that applies, one pass (regimes.split_regimes, after the three phases above); on "
        "each stabilised form, a candidate beside it",
    ),
    Phase(
        "candidates",
        _REGIMES,
        "formula -> another form of the whole formula or None, offered to the measured "
        "choice beside the stabilised forms (derive.finish, with points only)",
    ),
    Phase(
        "tails",
        _REGIMES,
        "passes formula -> formula, in order, on the chosen form only (derive.finish): "
        "what the code computes, never what is differentiated",
    ),
    Phase(
        "clamp",
        _RULES,
        "node rules as in stabilize, on the chosen form only, after the tails "
        "(rules.stabilize(expr, phase('clamp').rewrites))",
    ),
)

_BY_NAME = {p.name: p for p in PHASES}


def phase(name: str) -> Phase:
    """The phase called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"no rewrite phase {name!r}: one of {', '.join(_BY_NAME)}") from None


def register(name: str) -> Callable[[F], F]:
    """Decorator: add the function to phase ``name``, after those registered before it."""
    target = phase(name)

    def add(rewrite: F) -> F:
        if rewrite.__module__ != target.module:
            raise ValueError(
                f"{rewrite.__name__} is in {rewrite.__module__}; the {name!r} rewrites live in "
                f"{target.module}, so that the phase is complete once it is imported"
            )
        if rewrite.__name__ in target.names():
            raise ValueError(f"{rewrite.__name__} is registered with {name!r} twice")
        target.rewrites = (*target.rewrites, rewrite)
        return rewrite

    return add

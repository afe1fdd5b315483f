"""What a formula costs to evaluate, for choosing between equally accurate forms.

Counting SymPy operations treats ``tanh(x)`` like ``x + 1``; on a CPU the first costs about
25 of the second. Here every elementwise operation weighs what it was measured to cost in
PyTorch eager, relative to a multiply (``python benchmarks/op_costs.py`` measures them:
float32 and float64, 1M elements, one thread, x86-64 with AVX-512; the weights are the
rounded mean of the two dtypes). On a GPU the ops are memory-bound and nearly alike, and
the weights only break ties the same way as before: fewer transcendental calls.
"""

from __future__ import annotations

import sympy
from sympy.functions.elementary.piecewise import ExprCondPair

from symgrad.ops import OPS

#: Cost of one elementwise call relative to a multiply, by SymPy function name (the rows'
#: ``cost``; ``benchmarks/op_costs.py`` measures them).
OP_COST: dict[str, float] = {op.name: op.cost for op in OPS if op.cost is not None}
#: Functions not in the table: as dear as the dear ones.
UNKNOWN_FUNCTION = 40
#: A non-integer power (pow with a float exponent); sqrt and 1/sqrt are cheaper.
POW_COST = 22
SQRT_COST = 6
#: One branch more of a Piecewise: a select (generated code blends the bits, ~8 multiplies;
#: torch.where itself is 20-50 on unpredictable conditions).
BRANCH_COST = 8
COMPARE_COST = 3


#: What one more operation costs in eager code beyond its arithmetic, in multiplies: each
#: op is a pass over whole tensors and most allocate a result (measured: a Horner
#: polynomial of 12 multiply-adds ran 2.5x slower eagerly than tanh(softplus(x)), whose
#: arithmetic op_cost rates higher). Compiled code fuses the passes into one loop.
PASS_COST = 4


def op_cost(expr: sympy.Basic, pass_cost: float = 0.0) -> float:
    """Estimated cost of evaluating ``expr`` elementwise, in multiplies; a subexpression that
    occurs more than once is counted once (the generated code computes it once).

    ``pass_cost``: added per operation (see :func:`eager_cost`); 0 for fused code, where
    only arithmetic counts.
    """
    total = 0.0
    seen: set[sympy.Basic] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if node.is_Atom or node in seen:
            continue
        seen.add(node)
        stack.extend(node.args)
        total += _node_cost(node) + pass_cost * _node_ops(node)
    return total


def eager_cost(expr: sympy.Basic) -> float:
    """:func:`op_cost` for eager code: each operation also a pass over memory."""
    return op_cost(expr, PASS_COST)


#: Operations of the primitives the printers write out as several (their regimes).
REGIME_OPS: dict[str, int] = {op.name: op.passes for op in OPS if op.passes != 1}


def _node_ops(node: sympy.Basic) -> int:
    if isinstance(node, sympy.Function):
        return REGIME_OPS.get(type(node).__name__, 1)
    if isinstance(node, (sympy.Add, sympy.Mul)):
        return len(node.args) - 1
    if isinstance(node, ExprCondPair):
        return 0
    if isinstance(node, sympy.Piecewise):
        return len(node.args) - 1
    return 1


def _node_cost(node: sympy.Basic) -> float:
    if isinstance(node, (sympy.Add, sympy.Mul)):
        return len(node.args) - 1
    if isinstance(node, sympy.Pow):
        e = node.exp
        if e.is_Integer:
            return 1
        if e.is_Rational and e.q == 2:
            return SQRT_COST + (e != sympy.S.Half)
        return POW_COST
    if isinstance(node, sympy.Piecewise):
        return BRANCH_COST * (len(node.args) - 1)
    if isinstance(node, ExprCondPair):
        return 0
    if isinstance(node, sympy.core.relational.Relational):
        return COMPARE_COST
    if isinstance(node, (sympy.Function, sympy.Max, sympy.Min)):
        return OP_COST.get(type(node).__name__, UNKNOWN_FUNCTION)
    return 1

"""Rewrites that make formulas numerically stable.

- :mod:`~symgrad.rewrite.rules`: one-node identities (``lhs -> rhs``) applied bottom-up
  to a fixed point by :func:`~symgrad.rewrite.rules.stabilize`; pure SymPy.
- :mod:`~symgrad.rewrite.regimes`: passes that split a formula by input range (series,
  tails, conjugates, rational forms of one exponential); these measure with mpmath.
"""

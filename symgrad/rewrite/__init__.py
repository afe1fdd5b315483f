"""Rewrites that make formulas numerically stable, registered by phase.

- :mod:`~symgrad.rewrite.phases`: the phases in the order a formula meets them, and
  :func:`~symgrad.rewrite.phases.register`, which adds a rewrite to one.
- :mod:`~symgrad.rewrite.rules`: the ``stabilize`` and ``clamp`` phases, one-node
  identities (``lhs -> rhs``) applied bottom-up to a fixed point by
  :func:`~symgrad.rewrite.rules.stabilize`; pure SymPy.
- :mod:`~symgrad.rewrite.regimes`: the ``whole``, ``asymptotes``, ``limits`` and
  ``regimes`` phases, which split a formula by input range
  (:func:`~symgrad.rewrite.regimes.split_regimes`; these measure with mpmath), the
  ``candidates`` phase (other forms of a whole formula for the measured choice) and the
  ``tails`` phase (passes on the chosen form).
"""

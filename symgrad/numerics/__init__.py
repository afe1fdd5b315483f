"""symgrad's numerics: the lowest layer, below every stage.

- :mod:`~symgrad.numerics.floats`: float bit patterns, ulps and bits of error;
- :mod:`~symgrad.numerics.mp`: exact values of formulas with mpmath (adaptive precision);
- :mod:`~symgrad.numerics.native`: formulas evaluated with NumPy as the frameworks do;
- :mod:`~symgrad.numerics.points`: the points formulas are measured and tested at.

It knows formulas, spec inputs and points; nothing of derived functions or of generated
code.
"""

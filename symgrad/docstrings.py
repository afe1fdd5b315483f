"""The formulas of the generated docstrings, printed as `symgrad show` prints them."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import sympy
from sympy.printing.pretty.pretty import PrettyPrinter
from sympy.printing.pretty.pretty_symbology import pretty_use_unicode
from sympy.printing.pretty.stringpict import prettyForm, stringPict
from sympy.printing.str import StrPrinter

from symgrad.derived import Derived
from symgrad.functions import rounded_like, without_float64


def formula_doc(derived: Derived, fused: bool = False) -> list[str]:
    """The formulas, as text for the generated docstrings; with ``fused``, also the forms
    the fused path compiles instead. Printed as `symgrad show` prints them."""
    formulas = [(name, *shown_formula(expr)) for name, expr in derived.outputs]
    for i, expr in derived.vjps.items():
        shown, note = shown_formula(expr)
        if i in derived.overridden:
            note = "  (user-defined)"
        formulas.append((f"grad_{i}", shown, note))
    for i, row in derived.second.items():
        formulas += [(f"d grad_{i} / d {w}", *shown_formula(expr)) for w, expr in row.items()]
    what = "Forward, gradients (VJP)" if derived.vjps else "Forward"
    if derived.second:
        what += " and second order (d grad_<input> / d <w>)"
    lines = [f"{what}::", "", *_pretty_formulas(formulas)]
    if derived.accuracy:
        lines += ["", "Measured float64 error of the chosen forms vs mpmath::", ""]
        alike: dict[str, list[str]] = {}  # the same error: one line
        for label, acc in derived.accuracy.items():
            alike.setdefault(str(acc), []).append(label)
        for acc, labels in alike.items():
            # broken between labels, or before the error; never inside one
            nbsp = [s.replace(" ", "\N{NO-BREAK SPACE}") for s in (*labels, acc)]
            text = f"{', '.join(nbsp[:-1])}: {nbsp[-1]}"
            wrapped = textwrap.wrap(text, 84, initial_indent="    ", subsequent_indent="        ")
            lines += [line.replace("\N{NO-BREAK SPACE}", " ") for line in wrapped]
    if fused and derived.fused:
        lines += ["", "Compiled instead by the fused path (as accurate, less arithmetic)::", ""]
        lines += _pretty_formulas(
            [(label, *shown_formula(e)) for label, e in derived.fused.items()]
        )
    return lines


#: The note of a formula computed in float64 for float32 inputs (choose.in_float64).
IN_FLOAT64_NOTE = "  (float32 in float64)"


def shown_formula(expr: sympy.Expr) -> tuple[sympy.Expr, str]:
    """A formula as the docstring shows it, and its note: one computed in float64 for
    float32 inputs without its casts, and the note saying so."""
    if not expr.has(rounded_like):
        return expr, ""
    return without_float64(expr), IN_FLOAT64_NOTE


def _pretty_formulas(formulas: Sequence[tuple[str, sympy.Expr, str]]) -> list[str]:
    """``label = expr`` for each (label, expr, note), indented 4, as `symgrad show` prints
    expressions (``sympy.pretty``), the label and the note on the formula's baseline; a
    blank line between two where either has several rows. In ASCII, whatever the
    terminal: unicode's e, nu and root sign are letters ruff (RUF002) takes for others.
    One too wide for 80 columns is one line instead (as ``sympy.sstr``, a Piecewise as
    ``a if c else b``, wrapped at 80 columns): cut into blocks of 80 columns, its 2D
    form would be unreadable."""
    lines: list[str] = []
    tall = False  # the formula before has several rows
    for label, expr, note in formulas:
        form = _pretty_form(expr)
        form = prettyForm(*stringPict.next(prettyForm(f"{label} = "), form, prettyForm(note)))
        if form.width() <= 80:
            text = [line.rstrip() for line in form.render(wrap_line=False).split("\n")]
        else:
            text = f"{label} = {one_line(expr)}{note}"
            text = textwrap.wrap(text, 80, subsequent_indent="    ", break_long_words=False)
        if lines and (tall or len(text) > 1):
            lines.append("")
        lines += [f"    {line}" for line in text]
        tall = len(text) > 1
    return lines


def _pretty_form(expr: sympy.Expr) -> prettyForm:
    """``expr`` as ``sympy.pretty(expr, use_unicode=False)`` prints it, as a form with a
    baseline (sympy.pretty sets the module's unicode flag around the printing, too)."""
    unicode = pretty_use_unicode(False)
    try:
        return PrettyPrinter({"use_unicode": False})._print(expr)
    finally:
        pretty_use_unicode(unicode)


class _OneLine(StrPrinter):
    """``sympy.sstr``, but a Piecewise as Python's ``a if c else b``."""

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        text = ""
        for value, cond in expr.args:
            if cond == sympy.true:
                return f"({text}{self._print(value)})"
            text += f"{self._print(value)} if {self._print(cond)} else "
        return f"({text}nan)"

    def doprint(self, expr: sympy.Basic) -> str:
        text = super().doprint(expr)
        return text[1:-1] if isinstance(expr, sympy.Piecewise) else text


def one_line(expr: sympy.Basic) -> str:
    """``expr`` in one line: ``sympy.sstr``, but a Piecewise as ``a if c else b``."""
    return _OneLine().doprint(expr)

"""The accuracy report as text: the table, the summary, the rows worth a look."""

from __future__ import annotations

import math
from collections.abc import Sequence

from symgrad.report.measure import Row


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def regressions(rows: Sequence[Row]) -> list[Row]:
    """Rows where symgrad is worse than plain autograd of the naive formula."""
    return [r for r in rows if r.worse_than_naive]


def nonfinite(rows: Sequence[Row]) -> list[Row]:
    """Rows where symgrad returns NaN or +-inf at points whose exact value is finite."""
    return [r for r in rows if r.ok and r.symgrad_nonfinite > 0]


def summary(rows: Sequence[Row]) -> str:
    """One line: overall mean bits (the mean of the rows' means), non-finite totals, flags."""
    ok = [r for r in rows if r.ok]
    both = [r for r in ok if r.naive_mean_bits is not None]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    mine_all = mean([r.symgrad_mean_bits for r in ok])
    mine_both = mean([r.symgrad_mean_bits for r in both])
    naive = mean([r.naive_mean_bits or 0.0 for r in both])
    return (
        f"{len(rows)} rows ({len(rows) - len(ok)} without numbers), "
        f"{sum(r.points for r in ok)} points. Mean bits of error: symgrad {mine_all:.2f} "
        f"(all rows); on the {len(both)} rows with both, symgrad {mine_both:.2f} vs naive "
        f"{naive:.2f}. Non-finite where exact is finite: symgrad "
        f"{sum(r.symgrad_nonfinite for r in ok)}, naive {sum(r.naive_nonfinite or 0 for r in both)}. "
        f"Left out: {sum(r.undefined for r in rows)} undefined, "
        f"{sum(r.disputed for r in rows)} disputed. "
        f"symgrad worse than naive in {len(regressions(rows))} rows, "
        f"non-finite in {len(nonfinite(rows))} rows."
    )


HEADERS = (
    "function",
    "quantity",
    "dtype",
    "points",
    "sg mean",
    "sg max",
    "sg nonfin",
    "naive mean",
    "naive max",
    "naive nonfin",
    "undef",
    "disp",
    "note",
)


def table_cells(row: Row) -> list[str]:
    """The cells of one table line, in :data:`HEADERS` order."""
    return [
        row.function,
        row.quantity,
        row.dtype,
        str(row.points),
        _fmt(row.symgrad_mean_bits),
        _fmt(row.symgrad_max_bits, 1),
        str(row.symgrad_nonfinite),
        _fmt(row.naive_mean_bits),
        _fmt(row.naive_max_bits, 1),
        _fmt(row.naive_nonfinite),
        str(row.undefined),
        str(row.disputed),
        row.note,
    ]


def format_table(rows: Sequence[Row]) -> str:
    """An aligned text table of ``rows`` (bits of error: sg = symgrad) and a summary line."""
    lines = [list(HEADERS)] + [table_cells(r) for r in rows]
    widths = [max(len(line[c]) for line in lines) for c in range(len(HEADERS) - 1)]
    numeric = range(3, len(HEADERS) - 1)

    def render(cells: list[str]) -> str:
        parts = [
            cell.rjust(w) if c in numeric else cell.ljust(w)
            for c, (cell, w) in enumerate(zip(cells, widths))
        ]
        return "  ".join([*parts, cells[-1]]).rstrip()

    text = [render(lines[0]), render(["-" * w for w in widths] + [""])]
    text += [render(line) for line in lines[1:]]
    text.append("")
    text.append(summary(rows))
    return "\n".join(text) + "\n"


def worst(rows: Sequence[Row], n: int = 15) -> list[Row]:
    """The ``n`` rows with the highest symgrad mean bits (non-finite counts first)."""
    ok = [r for r in rows if r.ok]
    return sorted(ok, key=lambda r: (r.symgrad_nonfinite, r.symgrad_mean_bits), reverse=True)[:n]

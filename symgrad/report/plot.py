"""The accuracy report as pictures: per-point CSV files and, with matplotlib, PNGs."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from symgrad.numerics.floats import bits_of_error, ordinal
from symgrad.report.measure import Row


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def plot(rows: Sequence[Row], directory: str | Path) -> list[Path]:
    """Write the per-point data of each row as CSV, one file per function and quantity,
    and, where matplotlib is installed (``pip install symgrad[plot]``), one PNG per function
    and dtype: bits of error against the first input, symgrad vs naive autograd.

    CSV columns: the tensor inputs' values, the exact value, symgrad's and naive autograd's
    results and their bits of error.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for row in rows:
        if not row.samples:
            continue
        path = directory / f"{_slug(row.function)}__{_slug(row.quantity)}__{row.dtype}.csv"
        names = row.input_names or tuple(f"input{k}" for k in range(len(row.samples[0].inputs)))
        with path.open("w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow([*names, "exact", "symgrad", "symgrad_bits", "naive", "naive_bits"])
            for s in row.samples:
                naive_bits = "" if s.naive is None else bits_of_error(s.naive, s.exact, row.dtype)
                out.writerow(
                    [
                        *map(repr, s.inputs),
                        repr(s.exact),
                        repr(s.symgrad),
                        bits_of_error(s.symgrad, s.exact, row.dtype),
                        "" if s.naive is None else repr(s.naive),
                        naive_bits,
                    ]
                )
        written.append(path)
    return written + _png(rows, directory)


#: Tick values of the x axis (where the data reaches them), placed by their float ordinal.
_TICKS = (0.0, *(s * 10.0**e for e in (-100, 0, 100, 300) for s in (-1, 1)))


def _panel(ax, row: Row) -> None:
    """Bits of error against the first input, symgrad and naive autograd.

    The x axis is the float ordinal of the input (as Herbie plots error): every binade
    gets the same width, so 1e-300, 1 and 1e300 are all visible. The y axis is the dtype's
    full width (64 or 32 bits); a non-finite result, where the exact value is finite, is
    drawn at the top as a red triangle: nothing the table counts falls outside the axes.
    """
    bits = 64 if row.dtype == "float64" else 32

    def series(pick):
        finite, bad = [], []
        for s in row.samples:
            value = pick(s)
            if value is None:
                continue
            x = ordinal(s.inputs[0])
            if math.isfinite(value) or not math.isfinite(s.exact):
                finite.append((x, bits_of_error(value, s.exact, row.dtype)))
            else:
                bad.append(x)
        return finite, bad

    for pick, label, marker in (
        (lambda s: s.symgrad, "symgrad", "o"),
        (lambda s: s.naive, "naive autograd", "x"),
    ):
        finite, bad = series(pick)
        if finite:
            ax.scatter(*zip(*finite), s=9, marker=marker, label=label)
        if bad:
            ax.scatter(
                bad,
                [bits + 1] * len(bad),
                s=18,
                marker="^" if label == "symgrad" else "v",
                color="red" if label == "symgrad" else "darkred",
                label=f"{label}: non-finite",
            )
    xs = [ordinal(s.inputs[0]) for s in row.samples]
    lo, hi = min(xs), max(xs)
    ticks = [(ordinal(t), t) for t in _TICKS if lo <= ordinal(t) <= hi]
    ax.set_xticks([t for t, _ in ticks], [f"{v:g}" for _, v in ticks], fontsize=7)
    ax.set_ylim(-1, bits + 3)
    ax.set_yticks([0, bits // 4, bits // 2, 3 * bits // 4, bits])
    ax.set_ylabel("bits of error")
    ax.set_title(row.quantity, fontsize=9)
    ax.grid(alpha=0.3)


def _png(rows: Sequence[Row], directory: Path) -> list[Path]:
    """One figure per function and dtype, a panel per quantity (nothing without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if row.samples:
            groups.setdefault((row.function, row.dtype), []).append(row)
    written = []
    for (function, dtype), group in groups.items():
        fig, axes = plt.subplots(
            len(group), 1, figsize=(7, 2.4 * len(group)), squeeze=False, sharex=True
        )
        for ax, row in zip(axes[:, 0], group):
            _panel(ax, row)
        names = group[0].input_names or ("input 0",)
        axes[-1, 0].set_xlabel(names[0])
        axes[0, 0].legend(fontsize=8)
        fig.suptitle(f"{function} ({dtype})")
        fig.tight_layout()
        path = directory / f"{_slug(function)}__{dtype}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written

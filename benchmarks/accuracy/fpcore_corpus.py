"""Translate FPBench and Herbie benchmarks (FPCore) into symgrad specs: the public corpus.

    python benchmarks/accuracy/fpcore_corpus.py FPBENCH_CHECKOUT HERBIE_CHECKOUT

writes ``public_tuning.yaml`` and ``public_heldout.yaml`` (draw 1), and
``public_tuning2.yaml`` and ``public_heldout2.yaml`` (draw 2), next to this file. The inputs are
checkouts of https://github.com/FPBench/FPBench and https://github.com/herbie-fp/herbie (the
commits used are recorded in the specs' headers). Nothing in an FPCore file is executed: it
is read as S-expressions and translated term by term.

Selection (decided before any measurement, see README.md in this folder):

- real formulas of one or two arguments, from FPBench ``benchmarks/*.fpcore`` and Herbie
  ``bench/<folder>/*.fpcore`` (draw 1; its pattern, ``bench/**/*.fpcore``, was matched
  with pathlib's ``match``, which reads ``**`` as one folder), and from Herbie's other
  ``bench/`` files at the same commit less draw 1's formulas (draw 2, session 56), that
  use only operations symgrad's spec language has (``if``,
  ``while``, tensors, ``cbrt`` and the rounding/remainder operations are left out);
- ``let``/``let*`` bindings are substituted; ``fma(a, b, c)`` is written ``a*b + c``,
  ``exp2``/``log10`` through ``exp``/``log``, ``fabs``/``fmax``/``fmin`` as
  ``Abs``/``Max``/``Min``;
- formulas with the same SymPy expression (arguments renamed by position) are kept once,
  FPBench first;
- the precondition becomes each input's ``domain`` where it is a conjunction of bounds on
  single arguments by numbers (``positive: true`` where the lower bound is > 0); the
  precondition itself is kept in a comment.

Split (the fixed rule, README.md): a formula whose FPCore name is quoted in one of the
project's older corpora (``corpus.yaml``, ``trig.yaml``; those were studied in earlier
sessions) goes to the tuning half. Every other formula goes to the held-out half when the
first hex digit of sha256 of its spec name is 8 or above, to the tuning half otherwise.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import sympy

HERE = Path(__file__).resolve().parent
OLD_CORPORA = ("corpus.yaml", "trig.yaml")

# --------------------------------------------------------------------------- S-expressions
_TOKEN = re.compile(r'\s+|;[^\n]*|#\|.*?\|#|"(?:[^"\\]|\\.)*"|[()\[\]]|[^\s()\[\]";]+', re.S)


def parse_sexprs(text: str) -> list:
    """All top-level S-expressions of ``text``: lists, strings (kept quoted) and atoms."""
    stack: list[list] = [[]]
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if tok[0].isspace() or tok[0] == ";" or tok.startswith("#|"):
            continue
        if tok in "([":
            stack.append([])
        elif tok in ")]":
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise ValueError("unbalanced parentheses")
    return stack[0]


def show(e) -> str:
    """An S-expression back as FPCore text."""
    if isinstance(e, list):
        return "(" + " ".join(show(x) for x in e) + ")"
    return e


# --------------------------------------------------------------------------- translation
class Unsupported(Exception):
    """The formula uses something symgrad's spec language has no word for."""


_UNARY = {
    "sqrt": "sqrt",
    "exp": "exp",
    "log": "log",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "fabs": "Abs",
    "expm1": "expm1",
    "log1p": "log1p",
    "erf": "erf",
    "erfc": "erfc",
    "lgamma": "loggamma",
    "tgamma": "gamma",
    "log2": "log2",
}
_BINARY = {"atan2": "atan2", "hypot": "hypot", "fmax": "Max", "fmin": "Min"}
_CONSTANTS = {
    "PI": "pi",
    "E": "E",
    "PI_2": "(pi/2)",
    "PI_4": "(pi/4)",
    "M_1_PI": "(1/pi)",
    "M_2_PI": "(2/pi)",
    "SQRT2": "sqrt(2)",
    "SQRT1_2": "sqrt(1/2)",
    "LN2": "log(2)",
    "LN10": "log(10)",
    "LOG2E": "(1/log(2))",
    "LOG10E": "(1/log(10))",
    "M_2_SQRTPI": "(2/sqrt(pi))",
}
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_RATIONAL = re.compile(r"[+-]?\d+/\d+$")


def _strip(e):
    """``(! :prop v ... body)`` annotations removed."""
    while isinstance(e, list) and e and e[0] == "!":
        e = e[-1]
    return e


def translate(e, env: dict[str, str]) -> str:
    """FPCore expression -> symgrad formula text (fully parenthesised)."""
    e = _strip(e)
    if isinstance(e, str):
        if e in env:
            return env[e]
        if e in _CONSTANTS:
            return _CONSTANTS[e]
        if _NUMBER.match(e) or _RATIONAL.match(e):
            return f"({e})" if e[0] in "+-" or "/" in e else e
        raise Unsupported(f"atom {e}")
    if not e:
        raise Unsupported("()")
    op, args = e[0], e[1:]
    if op in ("let", "let*"):
        inner = dict(env)
        for name, value in args[0]:
            inner[name] = translate(value, inner if op == "let*" else env)
        return translate(args[1], inner)
    t = [translate(a, env) for a in args]
    if op == "+" and t:
        return "(" + " + ".join(t) + ")"
    if op == "*" and t:
        return "(" + "*".join(t) + ")"
    if op == "-":
        return f"(-{t[0]})" if len(t) == 1 else "(" + " - ".join(t) + ")"
    if op == "/" and len(t) == 2:
        return f"({t[0]}/{t[1]})"
    if op == "pow" and len(t) == 2:
        return f"({t[0]}**{t[1]})"
    if op == "fma" and len(t) == 3:
        return f"({t[0]}*{t[1]} + {t[2]})"
    if op == "exp2" and len(t) == 1:
        return f"(2**{t[0]})"
    if op == "log10" and len(t) == 1:
        return f"(log({t[0]})/log(10))"
    if op in _UNARY and len(t) == 1:
        return f"{_UNARY[op]}({t[0]})"
    if op in _BINARY and len(t) == 2:
        return f"{_BINARY[op]}({t[0]}, {t[1]})"
    raise Unsupported(f"operation {op}")


# --------------------------------------------------------------------------- preconditions
def _number(e) -> float | None:
    """A constant bound as a float (``(- PI)``, ``1e+308``, ``(/ PI 2)``), else None."""
    try:
        text = translate(e, {})
    except Unsupported:
        return None
    try:
        value = sympy.sympify(text, locals={"E": sympy.E, "pi": sympy.pi})
        return float(value)
    except (sympy.SympifyError, TypeError, ValueError):
        return None


def bounds(pre, args: list[str]) -> dict[str, list[float]]:
    """Per-argument [lo, hi] from a precondition's conjunction of numeric bounds."""
    out = {a: [-math.inf, math.inf] for a in args}

    def visit(p) -> None:
        p = _strip(p)
        if not isinstance(p, list) or not p:
            return
        if p[0] == "and":
            for q in p[1:]:
                visit(q)
            return
        if p[0] not in ("<", "<=", ">", ">="):
            return
        terms = p[1:] if p[0] in ("<", "<=") else p[1:][::-1]  # ascending chain
        for lo, hi in itertools.pairwise(terms):
            lo, hi = _strip(lo), _strip(hi)
            if isinstance(hi, str) and hi in out and (v := _number(lo)) is not None:
                out[hi][0] = max(out[hi][0], v)
            if isinstance(lo, str) and lo in out and (v := _number(hi)) is not None:
                out[lo][1] = min(out[lo][1], v)

    visit(pre)
    return out


# --------------------------------------------------------------------------- the corpus
@dataclass
class Formula:
    source: str  # "FPBench benchmarks/rump.fpcore"
    fpname: str
    args: list[str]
    names: list[str]  # the spec's input names
    formula: str
    pre: str | None
    domains: dict[str, list[float]]
    key: str = ""
    spec_name: str = ""


_SAFE = re.compile(r"[^A-Za-z0-9_]")
_TAKEN = {
    "E",
    "I",
    "N",
    "S",
    "O",
    "Q",
    "pi",
    "gamma",
    "beta",
    "lambda",
    "grad",
    "ctx",
    "out",
    "torch",
    "tf",
    "math",
    "self",
    "inputs",
    "output",
    "where",
    "sign",
    "erf",
    "exp",
    "log",
    "e",
}


def input_name(arg: str, taken: set[str]) -> str:
    name = _SAFE.sub("_", arg).strip("_") or "x"
    if name[0].isdigit() or name in _TAKEN or name in taken:
        name = f"{name}_"
    while name in taken:
        name += "_"
    return name


def spec_name(fpname: str, taken: set[str]) -> str:
    name = re.sub(r"_+", "_", _SAFE.sub("_", fpname.lower())).strip("_") or "formula"
    if name[0].isdigit():
        name = f"f{name}"
    base, k = name, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def read_fpcores(text: str, source: str) -> tuple[list[Formula], dict[str, int]]:
    found: list[Formula] = []
    skipped: dict[str, int] = {}
    for form in parse_sexprs(text):
        if not isinstance(form, list) or not form or form[0] != "FPCore":
            continue
        rest = form[1:]
        if isinstance(rest[0], str):  # (FPCore ident (args) ...)
            rest = rest[1:]
        raw_args, rest = rest[0], rest[1:]
        props: dict[str, object] = {}
        while len(rest) > 1 and isinstance(rest[0], str) and rest[0].startswith(":"):
            props[rest[0]] = rest[1]
            rest = rest[2:]
        body = rest[-1]
        fpname = str(props.get(":name", '"?"')).strip('"')
        if any(isinstance(a, list) and a[0] != "!" for a in raw_args):
            skipped["array argument"] = skipped.get("array argument", 0) + 1
            continue
        args = [_strip(a) for a in raw_args]
        if not 1 <= len(args) <= 2:
            skipped["not 1 or 2 arguments"] = skipped.get("not 1 or 2 arguments", 0) + 1
            continue
        taken: set[str] = set()
        names = []
        for a in args:
            names.append(input_name(a, taken))
            taken.add(names[-1])
        try:
            formula = translate(body, dict(zip(args, names, strict=True)))
        except Unsupported as exc:
            why = str(exc).split()[0] + " " + str(exc).split()[-1]
            skipped[why] = skipped.get(why, 0) + 1
            continue
        pre = props.get(":pre")
        dom = bounds(pre, args) if pre is not None else {a: [-math.inf, math.inf] for a in args}
        found.append(
            Formula(
                source=source,
                fpname=fpname,
                args=args,
                names=names,
                formula=formula,
                pre=show(pre) if pre is not None else None,
                domains={n: dom[a] for a, n in zip(args, names, strict=True)},
            )
        )
    return found, skipped


def canonical(f: Formula) -> str | None:
    """srepr of the formula with arguments renamed by position; None if it is constant or
    does not parse."""
    from symgrad.errors import Location
    from symgrad.expr import parse_formula

    symbols = {n: sympy.Symbol(f"a{k}", real=True) for k, n in enumerate(f.names)}
    try:
        expr = parse_formula(f.formula, symbols, Location(f.source, None, f.fpname))
    except Exception:  # noqa: BLE001 - any parse failure leaves the formula out
        return None
    if not expr.free_symbols:
        return None
    return sympy.srepr(expr)


def _fmt(v: float) -> str:
    if v == math.inf:
        return "inf"
    if v == -math.inf:
        return "-inf"
    return repr(float(v)) if v != int(v) or abs(v) >= 1e16 else str(int(v))


def render(formulas: list[Formula], half: str, commits: dict[str, str], draw: int = 1) -> str:
    tuning = half == "tuning"
    module = f"public_{half}" if draw == 1 else f"public_{half}{draw}"
    name = f"{half} half" if draw == 1 else f"{half} half of draw {draw}"
    lines = [
        f"# Public accuracy corpus, {name}: FPBench and Herbie benchmark formulas in one or",
        "# two real arguments, translated to symgrad specs by fpcore_corpus.py (do not edit by",
        "# hand: rerun it). Each function's comments name its source file, its FPCore name and",
        "# its precondition; the domain is the precondition's bounds on single arguments.",
        f"# Sources: FPBench/FPBench@{commits['FPBench']}, herbie-fp/herbie@{commits['Herbie']}.",
        "# The split rule and how this corpus is measured: README.md in this folder.",
    ]
    if draw != 1:
        lines.append(
            f"# Draw {draw}: Herbie's bench/ files that draw 1 (public_tuning/heldout) missed."
        )
    if tuning:
        lines.append("# Tuning half: rules may be studied and written on these formulas.")
    else:
        lines.append("# HELD-OUT half: measured, never tuned on.")
    lines += [
        f"module: {module}",
        f"doc: FPBench/Herbie formulas ({name}) for measuring symgrad's accuracy.",
        "targets: [torch]",
        "order: 2",
        "functions:",
    ]
    for f in formulas:
        lines.append("")
        lines.append(f"  {f.spec_name}:")
        lines.append(f'    # {f.source}: "{f.fpname}"')
        if f.pre:
            pre = f.pre if len(f.pre) <= 80 else f.pre[:77] + "..."
            lines.append(f"    # precondition: {pre}")
        parts = []
        for n in f.names:
            lo, hi = f.domains[n]
            opts = []
            if (lo, hi) != (-math.inf, math.inf):
                opts.append(f"domain: [{_fmt(lo)}, {_fmt(hi)}]")
            if lo > 0:
                opts.append("positive: true")
            parts.append(f"{n}: {{{', '.join(opts)}}}")
        lines.append(f"    inputs: {{{', '.join(parts)}}}")
        lines.append(f"    output: {ast.unparse(ast.parse(f.formula, mode='eval'))}")
    return "\n".join(lines) + "\n"


def old_corpus_names() -> set[str]:
    names: set[str] = set()
    for file in OLD_CORPORA:
        names |= set(re.findall(r'"([^"\n]+)"', (HERE / file).read_text()))
    return names


def held_out(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest()[0], 16) >= 8


def _commit(repo: Path) -> str:
    git = ["git", "-C", str(repo)]
    if (repo / "HEAD").exists() and not (repo / ".git").exists():
        git = ["git", f"--git-dir={repo}"]
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _files(repo: Path, wanted) -> list[tuple[str, str]]:
    """(path, text) of the ``.fpcore`` files whose path (relative, with ``/``) ``wanted``
    accepts, in a checkout or a bare mirror, sorted by path."""
    if (repo / ".git").exists() or not (repo / "HEAD").exists():
        listing = [p.relative_to(repo).as_posix() for p in repo.rglob("*.fpcore")]
        paths = sorted(p for p in listing if wanted(p))
        return [(p, (repo / p).read_text()) for p in paths]
    git = ["git", f"--git-dir={repo}"]
    listing = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.split()
    paths = sorted(p for p in listing if p.endswith(".fpcore") and wanted(p))
    return [
        (
            p,
            subprocess.run(
                [*git, "show", f"HEAD:{p}"], capture_output=True, text=True, check=True
            ).stdout,
        )
        for p in paths
    ]


def _depth(path: str, folder: str) -> int | None:
    """How many folders below ``folder`` the file ``path`` is (None: not under it)."""
    if not path.startswith(folder + "/"):
        return None
    return path[len(folder) + 1 :].count("/")


def _draw(
    sources: list[tuple[str, str, str]], seen: set[str], skipped: dict[str, int]
) -> tuple[list[Formula], int]:
    """The formulas of ``sources`` ((who, path, text)) whose canonical form is not in
    ``seen`` (which they are added to), in order, and the number of duplicates dropped."""
    formulas: list[Formula] = []
    duplicates = 0
    for who, path, text in sources:
        found, why = read_fpcores(text, f"{who} {path}")
        for k, v in why.items():
            skipped[k] = skipped.get(k, 0) + v
        for f in found:
            key = canonical(f)
            if key is None:
                skipped["constant or unparsable"] = skipped.get("constant or unparsable", 0) + 1
                continue
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            formulas.append(f)
    return formulas, duplicates


def _split(formulas: list[Formula], taken: set[str]) -> dict[str, list[Formula]]:
    """Name the formulas (names in ``taken`` are not reused) and split them by the rule."""
    for f in formulas:
        f.spec_name = spec_name(f.fpname, taken)
        taken.add(f.spec_name)
    studied = old_corpus_names()
    halves: dict[str, list[Formula]] = {"tuning": [], "heldout": []}
    for f in formulas:
        half = "tuning" if f.fpname in studied or not held_out(f.spec_name) else "heldout"
        halves[half].append(f)
    return halves


def main(fpbench: Path, herbie: Path) -> None:
    commits = {"FPBench": _commit(fpbench), "Herbie": _commit(herbie)}
    sources = [
        ("FPBench", p, t) for p, t in _files(fpbench, lambda p: _depth(p, "benchmarks") == 0)
    ]
    # Draw 1 took Herbie's bench/<folder>/<file>.fpcore only: its pattern,
    # ``bench/**/*.fpcore``, was matched with pathlib's ``match``, which reads ``**`` as
    # one folder. Kept, so that draw 1 reproduces byte for byte.
    herbie_files = _files(herbie, lambda p: _depth(p, "bench") == 1)
    sources += [("Herbie", p, t) for p, t in herbie_files]
    skipped: dict[str, int] = {}
    seen: set[str] = set()
    formulas, duplicates = _draw(sources, seen, skipped)
    taken: set[str] = set()
    halves = _split(formulas, taken)
    for half, fs in halves.items():
        (HERE / f"public_{half}.yaml").write_text(render(fs, half, commits))
    print(
        f"draw 1: {len(formulas)} formulas ({duplicates} duplicates dropped): "
        f"{len(halves['tuning'])} tuning, {len(halves['heldout'])} held out"
    )
    # Draw 2: the Herbie benchmark files that draw 1's pattern missed (bench/*.fpcore and
    # files three or more folders deep), at the same commit, less draw 1's formulas.
    drawn = {p for p, _ in herbie_files}
    rest = [
        ("Herbie", p, t)
        for p, t in _files(herbie, lambda p: _depth(p, "bench") is not None)
        if p not in drawn
    ]
    formulas2, duplicates2 = _draw(rest, seen, skipped)
    halves2 = _split(formulas2, taken)
    for half, fs in halves2.items():
        (HERE / f"public_{half}2.yaml").write_text(render(fs, half, commits, draw=2))
    print(
        f"draw 2: {len(formulas2)} formulas ({duplicates2} duplicates dropped): "
        f"{len(halves2['tuning'])} tuning, {len(halves2['heldout'])} held out"
    )
    for why, n in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"  left out: {n:4d} {why}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(Path(sys.argv[1]), Path(sys.argv[2]))

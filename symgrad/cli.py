"""The `symgrad` command: gen, show, check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from symgrad import __version__
from symgrad.errors import DerivationError, SpecError
from symgrad.spec import TARGETS, Spec, load_spec


def _fail(error: SpecError) -> None:
    click.echo(f"error: {error}", err=True)
    sys.exit(1)


def _spec_path_text(path: Path) -> str:
    """The spec path as written into headers: relative to the cwd when possible (stable)."""
    try:
        return Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix()
    except ValueError:
        return path.as_posix()


def _targets(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(t.strip() for t in value.split(",") if t.strip())
    for name in names:
        if name not in TARGETS:
            raise click.BadParameter(f"unknown target {name!r}; use {', '.join(TARGETS)}")
    return names


class _Group(click.Group):
    """The command group; an unexpected exception ends as one error line, not a traceback
    (SYMGRAD_DEBUG=1 shows the traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted; nothing was written", err=True)
            sys.exit(130)
        except Exception as exc:
            if os.environ.get("SYMGRAD_DEBUG"):
                raise
            if isinstance(exc, OSError) and exc.strerror:
                click.echo(f"error: {exc.filename or ''}: {exc.strerror}", err=True)
            else:
                first = (str(exc).splitlines() or [""])[0]
                click.echo(
                    f"error: internal error ({type(exc).__name__}: {first})\n"
                    "  fix: this is a symgrad bug: please report it with the spec and the "
                    "command (SYMGRAD_DEBUG=1 shows where it happened)",
                    err=True,
                )
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="symgrad")
def main() -> None:
    """Derive numerically stable custom gradients for PyTorch and TensorFlow."""


#: A chosen form whose measured float64 error is above this (bits, mean over the sampled
#: points) is reported by gen and check: the stable rewrites did not reach it.
WARN_MEAN_BITS = 8.0


def _accuracy_warnings(derived) -> list[SpecError]:
    """Per function, the formulas whose chosen form still has non-finite float64 results
    where the exact value is finite, or a large mean error."""
    found = []
    for d in derived:
        bad = [
            f"{label}: "
            + (f"{acc.non_finite64} non-finite, " if acc.non_finite64 else "")
            + f"{acc.mean_bits:.1f} bits mean error over {acc.points} points, "
            + f"worst at {acc.worst or 'n/a'}"
            for label, acc in d.accuracy.items()
            if acc.non_finite64 or acc.mean_bits > WARN_MEAN_BITS
        ]
        if bad:
            found.append(
                SpecError(
                    d.function.location,
                    "still inaccurate after the stable rewrites:\n    " + "\n    ".join(bad),
                    "if the function is only used on part of the line, say so with domain: "
                    "(the error is measured there); else write the formula another way. "
                    "--strict makes this an error",
                )
            )
    return found


def _generated(
    paths: tuple[Path, ...],
    out_dir: Path | None,
    targets: tuple[str, ...] | None,
    tests: bool,
    run: bool,
) -> tuple[list, list[SpecError], list[str]]:
    """Every spec loaded and validated, then derived, generated and (``run``) smoke-run.

    Returns the planned files, the accuracy warnings and notes; raises every problem at
    once as a SpecError (nothing is written before this returns).
    """
    from symgrad.derive import derive_spec, internal_error, validate_spec
    from symgrad.errors import raise_all
    from symgrad.generate import generate
    from symgrad.render import ruff_binary
    from symgrad.smoke import smoke_run
    from symgrad.write import Planned

    specs, errors = [], []
    for path in paths:
        try:
            spec = load_spec(path)
            validate_spec(spec)
            specs.append((path, spec))
        except SpecError as error:
            errors.append(error)
    raise_all(errors)  # every spec parses before any is derived
    ruff_binary()  # the formatter is there before any spec is derived
    planned: list[Planned] = []
    warnings: list[SpecError] = []
    notes: list[str] = []
    modules: dict[Path, Path] = {}
    for path, spec in specs:
        directory = out_dir if out_dir is not None else path.parent / "generated"
        key = (directory / spec.module).resolve()
        if key in modules:
            raise SpecError(
                None,
                f"{path} and {modules[key]} both generate module '{spec.module}' into {directory}",
                "give each spec its own module: name, or another -o directory",
            )
        modules[key] = path
        try:
            derived = derive_spec(spec)
            chosen = tuple(t for t in spec.targets if targets is None or t in targets)
            files = generate(
                spec, chosen, tests=tests, spec_path=_spec_path_text(path), derived=derived
            )
        except SpecError as error:
            errors.append(error)
            continue
        except Exception as exc:  # noqa: BLE001 - a symgrad bug, reported as an error
            errors.append(internal_error(spec, "generating code for", exc))
            continue
        warnings += _accuracy_warnings(derived)
        for d in derived:
            notes += [
                f"{d.function.location}: {line}; the code is generated without that form: "
                "this is a symgrad bug, please report it with this function's spec"
                for line in d.skipped
            ]
        if run:
            failures, skipped = smoke_run(spec, [(f.name, f.text) for f in files], chosen)
            errors += [
                DerivationError(
                    f.function.location,
                    str(f),
                    "this is a symgrad bug: please report it with this function's spec",
                )
                for f in failures
            ]
            for t in skipped:
                note = f"{t} is not installed here: the generated {t} code was not run"
                notes += [] if note in notes else [note]
        planned += [Planned(directory / f.name, f.text) for f in files]
    raise_all(errors)
    return planned, warnings, notes


def _report(warnings: list[SpecError], notes: list[str], strict: bool) -> None:
    for note in notes:
        click.echo(f"note: {note}", err=True)
    for warning in warnings:
        click.echo(f"{'error' if strict else 'warning'}: {warning}", err=True)
    if strict and warnings:
        click.echo(
            f"{len(warnings)} inaccurate formula(s) under --strict; nothing written", err=True
        )
        sys.exit(1)


_STRICT = click.option(
    "--strict", is_flag=True, help="Inaccurate formulas (see warnings) are errors, not warnings."
)


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the generated files (default: generated/ beside each spec).",
)
@click.option(
    "--targets",
    "targets_opt",
    metavar="torch,tensorflow",
    help="Only these targets (default: the spec's targets).",
)
@click.option("--no-tests", is_flag=True, help="Do not generate the test modules.")
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 listing files that are missing or would change.",
)
@_STRICT
def gen(
    specs: tuple[Path, ...],
    out_dir: Path | None,
    targets_opt: str | None,
    no_tests: bool,
    check_only: bool,
    strict: bool,
) -> None:
    """Generate framework modules (and their tests) from SPEC files.

    Before anything is written, each generated module is run once per function
    (forward, backward, double backward, forward mode) where its framework is installed.
    """
    from symgrad.write import check, write_all

    targets = _targets(targets_opt)
    try:
        planned, warnings, notes = _generated(
            specs, out_dir, targets, tests=not no_tests, run=not check_only
        )
    except SpecError as error:
        _fail(error)
    if check_only:
        problems = check(planned)
        for f, status in problems:
            click.echo(
                f"would {'create' if status == 'missing' else 'regenerate'} {f.path}", err=True
            )
        if problems:
            click.echo(f"{len(problems)} file(s) out of date; run `symgrad gen`", err=True)
            sys.exit(1)
        click.echo(f"{len(planned)} file(s) up to date")
        return
    _report(warnings, notes, strict)
    try:
        written = write_all(planned)
    except OSError as exc:
        where = Path(exc.filename).parent if exc.filename else out_dir
        click.echo(f"error: cannot write {where}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"{len(written)} written, {len(planned) - len(written)} unchanged")


def _load(path: Path) -> Spec:
    try:
        return load_spec(path)
    except SpecError as error:
        _fail(error)
        raise  # unreachable


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@_STRICT
def check(specs: tuple[Path, ...], strict: bool) -> None:
    """Validate SPEC files: derive, generate and run the code in memory; write nothing."""
    try:
        _, warnings, notes = _generated(specs, None, None, tests=True, run=True)
    except SpecError as error:
        _fail(error)
    _report(warnings, notes, strict)
    for path in specs:
        click.echo(f"{path}: ok")


def _latex_name(name: str) -> str | None:
    """A symbol name as LaTeX where SymPy would print a product of letters (``scale`` as
    s c a l e): multi-letter names upright-italic as one word, ``grad_x`` as grad with x
    below. Greek letter names and single letters are SymPy's (None)."""
    from sympy.printing.latex import greek_letters_set, other_symbols

    base, _, sub = name.partition("_")
    if len(base) <= 1 or base.lower() in greek_letters_set | other_symbols:
        return None
    text = rf"\mathit{{{base}}}"
    if sub:
        word = sub.replace("_", r"\_")
        text += "_{" + (word if len(sub) == 1 else rf"\mathit{{{word}}}") + "}"
    return text


def _latex(expr) -> str:
    import sympy

    names = {s: text for s in expr.free_symbols if (text := _latex_name(s.name)) is not None}
    return sympy.latex(expr, symbol_names=names)


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--function", "function_name", help="Only this function.")
@click.option("--latex", is_flag=True, help="Print LaTeX instead of text.")
def show(spec_path: Path, function_name: str | None, latex: bool) -> None:
    """Print the derived (stable, simplified) formulas of SPEC."""
    import sympy

    from symgrad.derive import derive_function, internal_error, validate_spec
    from symgrad.docstrings import shown_formula

    spec = _load(spec_path)
    functions = [f for f in spec.functions if function_name in (None, f.name)]
    tensors = [f for f in spec.tensor_functions if function_name in (None, f.name)]
    if not functions and not tensors:
        names = ", ".join(f.name for f in (*spec.functions, *spec.tensor_functions))
        click.echo(f"error: no function '{function_name}' in {spec_path} (has: {names})", err=True)
        sys.exit(1)
    fmt = _latex if latex else sympy.pretty
    try:
        validate_spec(spec)
        for fn in functions:
            try:
                d = derive_function(fn)
            except SpecError:
                raise
            except Exception as exc:  # a symgrad bug, said as an error
                raise internal_error(fn, "deriving", exc) from exc
            click.echo(f"== {fn.name}")
            formulas = [*d.outputs, *((f"grad_{i}", e) for i, e in d.vjps.items())]
            for i, row in d.second.items():
                formulas += [(f"d grad_{i} / d {w}", e) for w, e in row.items()]
            for label, expr in formulas:
                shown, note = shown_formula(expr)  # one computed in float64: the note says so
                head = f"{label} = {note.strip()}" if note else f"{label} ="
                click.echo(f"{head}\n{fmt(shown)}\n")
        for fn in tensors:
            _show_tensor(fn)
    except SpecError as error:
        _fail(error)


def _show_tensor(fn) -> None:
    """A tensor expression: its stable form in the spec's words, and the generated torch
    code of its backward (its gradients are a tape, not one formula each)."""
    from symgrad.tensor.lang import spec_text
    from symgrad.tensor.plan import plan_tensor

    plan = plan_tensor(fn, "torch")
    shape = ", ".join(fn.outputs[0].shape)
    click.echo(f"== {fn.name} (tensor expression)")
    click.echo(f"out[{shape}] =\n{spec_text(plan.formula.expr)}\n")
    for title, math in (("forward", plan.forward), ("backward", plan.backward)):
        click.echo(f"{title} (torch):")
        click.echo("\n".join(f"    {line}" for line in math.body) + "\n")


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True
)
@click.option("--function", "function_names", multiple=True, help="Only these functions.")
@click.option("--points", default=256, show_default=True, help="Sampled points per function.")
@click.option(
    "--budget",
    default=30.0,
    show_default=True,
    help="Seconds of exact (mpmath) evaluation per function.",
)
@click.option("--workers", default=1, show_default=True, help="Processes for exact values.")
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write per-point error data (CSV) per function into DIR.",
)
@click.option(
    "--fused",
    is_flag=True,
    help="Measure the fused path (use_fused(): the math compiled by torch.compile).",
)
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="Torch device the generated and naive code run on (e.g. cuda).",
)
def accuracy(
    spec_path: Path,
    dtype: str,
    function_names: tuple[str, ...],
    points: int,
    budget: float,
    workers: int,
    plot_dir: Path | None,
    fused: bool,
    device: str,
) -> None:
    """Bits of error of the generated torch code vs plain autograd of the naive formula."""
    from symgrad import report as acc
    from symgrad.derive import validate_spec

    spec = _load(spec_path)
    try:
        validate_spec(spec)  # every formula parses before any is measured
    except SpecError as error:
        _fail(error)
    problem = acc.device_problem(device)
    if problem is not None:
        click.echo(f"error: --device {device}: {problem}", err=True)
        sys.exit(1)
    try:
        rows = acc.measure_spec(
            spec,
            dtype=dtype,
            points=points,
            budget=budget,
            workers=workers,
            functions=function_names or None,
            progress=lambda message: click.echo(message, err=True),
            fused=fused,
            device=device,
        )
        if spec.tensor_functions and (fused or device != "cpu"):
            click.echo("note: tensor functions are measured eagerly on the CPU only", err=True)
        else:
            rows += acc.tensor_rows(
                spec,
                dtype,
                function_names or None,
                progress=lambda message: click.echo(message, err=True),
            )
    except SpecError as error:
        _fail(error)
    click.echo(acc.format_table(rows))
    if plot_dir is not None:
        for path in acc.plot(rows, plot_dir):
            click.echo(f"wrote {path}", err=True)
    # naive autograd failing is the formula's business; symgrad's code failing is an error
    failed = [r for r in rows if r.error is not None and not r.error.startswith("naive:")]
    for row in failed:
        click.echo(f"error: {spec_path} ({row.function}) {row.quantity}: {row.error}", err=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

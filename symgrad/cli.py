"""The `symgrad` command: gen, show, check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from symgrad import __version__
from symgrad.errors import SpecError
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="symgrad")
def main() -> None:
    """Derive numerically stable custom gradients for PyTorch and TensorFlow."""


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
def gen(
    specs: tuple[Path, ...],
    out_dir: Path | None,
    targets_opt: str | None,
    no_tests: bool,
    check_only: bool,
) -> None:
    """Generate framework modules (and their tests) from SPEC files."""
    from symgrad.generate import generate
    from symgrad.write import Planned, check, write_all

    targets = _targets(targets_opt)
    planned: list[Planned] = []
    modules: dict[Path, Path] = {}
    try:
        for path in specs:
            spec = load_spec(path)
            directory = out_dir if out_dir is not None else path.parent / "generated"
            key = (directory / spec.module).resolve()
            if key in modules:
                raise SpecError(
                    None,
                    f"{path} and {modules[key]} both generate module "
                    f"'{spec.module}' into {directory}",
                )
            modules[key] = path
            for f in generate(
                spec, targets=targets, tests=not no_tests, spec_path=_spec_path_text(path)
            ):
                planned.append(Planned(directory / f.name, f.text))
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
    written = write_all(planned)
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
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
def check(spec_path: Path) -> None:
    """Validate SPEC (formulas and derivatives included); exit 1 with errors."""
    from symgrad.derive import derive_spec

    spec = _load(spec_path)
    try:
        derived = derive_spec(spec)
    except SpecError as error:
        _fail(error)
    click.echo(f"{spec_path}: ok ({len(derived)} function(s))")


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--function", "function_name", help="Only this function.")
@click.option("--latex", is_flag=True, help="Print LaTeX instead of text.")
def show(spec_path: Path, function_name: str | None, latex: bool) -> None:
    """Print the derived (stable, simplified) formulas of SPEC."""
    import sympy

    from symgrad.derive import derive_function

    spec = _load(spec_path)
    functions = [f for f in spec.functions if function_name in (None, f.name)]
    if not functions:
        names = ", ".join(f.name for f in spec.functions)
        click.echo(f"error: no function '{function_name}' in {spec_path} (has: {names})", err=True)
        sys.exit(1)
    fmt = sympy.latex if latex else sympy.pretty
    try:
        for fn in functions:
            d = derive_function(fn)
            click.echo(f"== {fn.name}")
            for name, expr in d.outputs:
                click.echo(f"{name} =\n{fmt(expr)}\n")
            for name, expr in d.vjps.items():
                click.echo(f"grad_{name} =\n{fmt(expr)}\n")
            for name, row in d.second.items():
                for w, expr in row.items():
                    click.echo(f"d grad_{name} / d {w} =\n{fmt(expr)}\n")
    except SpecError as error:
        _fail(error)


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
    from symgrad import accuracy as acc

    spec = _load(spec_path)
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
    except SpecError as error:
        _fail(error)
    click.echo(acc.format_table(rows))
    if plot_dir is not None:
        for path in acc.plot(rows, plot_dir):
            click.echo(f"wrote {path}", err=True)


if __name__ == "__main__":
    main()

"""What a new user meets at the command line: errors that say what to do, never a
traceback; nothing written on failure; generated code run before "ok"."""

from __future__ import annotations

import os
import stat

import pytest
from conftest import import_file
from test_cli import GOOD, run

from symgrad import derive as derive_module
from symgrad.generate import GeneratedFile

PSEUDO_HUBER = """\
module: ph
functions:
  pseudo_huber:
    inputs:
      x: {}
      delta: {kind: scalar, default: 1.0}
    output: delta**2*(sqrt(1 + (x/delta)**2) - 1)
"""
TWO_BAD = """\
module: two_bad
functions:
  fine:
    inputs: {x: {}}
    output: x**2
  first_bad:
    inputs: {x: {}}
    output: exp(x +* 2)
  second_bad:
    inputs: {x: {}}
    output: x*w
"""


def test_every_bad_function_is_reported_before_any_is_derived(tmp_path, monkeypatch):
    derived = []
    real = derive_module.derive_function
    monkeypatch.setattr(derive_module, "derive_function", lambda fn: derived.append(fn) or real(fn))
    (tmp_path / "s.yaml").write_text(TWO_BAD)
    result = run("check", "s.yaml", cwd=tmp_path)
    assert result.exit_code == 1
    assert "2 problems" in result.output
    assert "s.yaml:8 (function 'first_bad')" in result.output
    assert "s.yaml:11 (function 'second_bad')" in result.output
    assert derived == []  # nothing was derived: the errors came at once


def test_a_syntax_error_shows_its_column(tmp_path):
    (tmp_path / "s.yaml").write_text(TWO_BAD)
    out = run("check", "s.yaml", cwd=tmp_path).output
    assert "syntax error in formula at column 8" in out
    lines = out.splitlines()
    (k,) = [k for k, line in enumerate(lines) if line.strip() == "exp(x +* 2)"]
    assert lines[k + 1].index("^") == lines[k].index("*")  # the caret under the column


def test_an_undeclared_name_says_declare_it_under_inputs(tmp_path):
    (tmp_path / "s.yaml").write_text(TWO_BAD)
    out = run("check", "s.yaml", cwd=tmp_path).output
    assert "unknown name: 'w'" in out and "declare it under inputs:" in out


@pytest.mark.parametrize(
    ("formula", "said"),
    [
        ("x[0]", "'Subscript' is not allowed"),
        ("sum(x)", "unknown function: 'sum'"),
        ("x @ x", "operator 'MatMult' is not allowed"),
        ("x.sum()", "only plain function names can be called"),
    ],
)
def test_tensor_syntax_in_an_elementwise_formula_points_to_tensor_expressions(
    tmp_path, formula, said
):
    spec = f"module: t\nfunctions:\n  f:\n    inputs: {{x: {{}}}}\n    output: {formula}\n"
    (tmp_path / "s.yaml").write_text(spec)
    out = run("check", "s.yaml", cwd=tmp_path).output
    assert said in out and "are tensor expressions: give the inputs a shape" in out
    assert "x[n, k]" in out and "Tensor expressions" in out


def test_a_shaped_input_of_an_elementwise_formula_points_to_tensor_expressions(tmp_path):
    spec = "module: t\nfunctions:\n  f:\n    inputs: {x: {shape: [n]}}\n    output: x\n"
    (tmp_path / "s.yaml").write_text(spec)
    out = run("check", "s.yaml", cwd=tmp_path).output
    assert "s.yaml:4 (function 'f'): input 'x' has a shape" in out
    assert "output: {shape: [...], expr:" in out


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("module: m\nfunctions:\n  f:\n    inputs: {x: {}}\n   output: x\n", "indented"),
        ("module: m\nfunctions:\n  f:\n\tinputs: {x: {}}\n", "a tab character"),
        ("module: m\nfunctions:\n  f:\n    inputs: {x: {}\n    output: x\n", "unclosed {"),
    ],
)
def test_yaml_mistakes_are_said_in_plain_words(tmp_path, text, said):
    (tmp_path / "s.yaml").write_text(text)
    out = run("check", "s.yaml", cwd=tmp_path).output
    assert said in out and "column" in out and "fix:" in out
    assert "<block" not in out  # none of PyYAML's own wording


def test_an_internal_failure_is_an_error_naming_the_function_not_a_traceback(tmp_path, monkeypatch):
    def boom(fn):
        raise TypeError("Cannot convert complex to float")

    monkeypatch.setattr(derive_module, "derive_function", boom)
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    for command in ("check", "gen"):
        result = run(command, "a.yaml", cwd=tmp_path)
        assert result.exit_code == 1
        assert result.exception is None or isinstance(result.exception, SystemExit)
        assert "a.yaml:3 (function 'softplus')" in result.output
        assert "internal error" in result.output and "TypeError" in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "generated").exists()


TWO_FINE = """\
module: two_fine
targets: [torch]
functions:
  square:
    inputs: {x: {}}
    output: x**2
  cube:
    inputs: {x: {}}
    output: x**3
"""


def _gen_of_two_fails(tmp_path, said: list[str], unsaid: str) -> None:
    """``symgrad gen`` of TWO_FINE fails saying each of ``said`` and not ``unsaid`` (nor a
    traceback), and writes nothing."""
    (tmp_path / "s.yaml").write_text(TWO_FINE)
    result = run("gen", "s.yaml", cwd=tmp_path)
    assert result.exit_code == 1
    assert all(text in result.output for text in said), result.output
    assert unsaid not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "generated").exists()


@pytest.mark.parametrize("stage", ["planning", "tests"])
def test_an_internal_failure_after_deriving_names_the_function_it_met(tmp_path, monkeypatch, stage):
    """A symgrad bug while planning a function's code or writing its tests is that
    function's error (not the spec's first function's), and nothing is written."""
    from symgrad import generate as generate_module
    from symgrad import testgen

    def failing(real, of):
        def work(derived):
            if derived.function.name == "cube":
                raise MemoryError("too many digits")
            return real(derived)

        monkeypatch.setattr(of, real.__name__, work)

    if stage == "planning":
        failing(generate_module.plan_torch, generate_module)
    else:
        failing(testgen.function_tests, testgen)
    _gen_of_two_fails(
        tmp_path,
        ["s.yaml:7 (function 'cube'): internal error while", "MemoryError: too many digits"],
        unsaid="square",
    )


def test_an_internal_failure_writing_a_module_names_the_spec(tmp_path, monkeypatch):
    from symgrad import generate as generate_module

    def broken(*args, **kwargs):
        raise RuntimeError("template trouble")

    monkeypatch.setattr(generate_module, "copy_in", broken)
    _gen_of_two_fails(
        tmp_path,
        [
            "s.yaml: internal error while generating code for this spec",
            "RuntimeError: template trouble",
        ],
        unsaid="function '",
    )


def test_a_missing_formatter_is_one_error_saying_how_to_install_it(tmp_path, monkeypatch):
    """Without an importable ruff (a broken install), gen says so once, before deriving,
    with the fix; not an "internal error" per function that calls it a symgrad bug."""
    import sys

    derived = []
    real = derive_module.derive_function
    monkeypatch.setattr(derive_module, "derive_function", lambda fn: derived.append(fn) or real(fn))
    monkeypatch.setitem(sys.modules, "ruff.__main__", None)  # import raises ImportError
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    (tmp_path / "b.yaml").write_text(GOOD.format(module="b"))
    result = run("gen", "a.yaml", "b.yaml", cwd=tmp_path)
    assert result.exit_code == 1
    assert result.output.count("ruff, which formats the generated code, cannot be run") == 1
    assert "fix: install symgrad with its dependencies" in result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert derived == [] and not (tmp_path / "generated").exists()


def test_check_takes_many_specs(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    (tmp_path / "b.yaml").write_text(GOOD.format(module="b"))
    result = run("check", "a.yaml", "b.yaml", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "a.yaml: ok" in result.output and "b.yaml: ok" in result.output


def test_an_unwritable_output_directory_is_one_line_not_a_traceback(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    (tmp_path / "a_file").write_text("not a directory\n")
    result = run("gen", "a.yaml", "-o", "a_file/out", "--no-tests", cwd=tmp_path)
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot write a_file")
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_generated_files_follow_the_umask(tmp_path, umask, mode):
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    old = os.umask(umask)
    try:
        result = run("gen", "a.yaml", "--no-tests", "--targets", "torch", cwd=tmp_path)
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "generated" / "a_torch.py").stat().st_mode) == mode


def test_a_regenerated_file_keeps_its_mode(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    assert run("gen", "a.yaml", "--no-tests", "--targets", "torch", cwd=tmp_path).exit_code == 0
    target = tmp_path / "generated" / "a_torch.py"
    target.chmod(0o640)
    target.write_text("# stale\n")
    assert run("gen", "a.yaml", "--no-tests", "--targets", "torch", cwd=tmp_path).exit_code == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and target.read_text() != "# stale\n"


# --------------------------------------------------------------------------- smoke run
def test_a_scalar_without_positive_generates_a_backward_that_runs(tmp_path):
    """delta >= 0 on a Python float was handed to where() as a bool: backward raised."""
    torch = pytest.importorskip("torch")
    (tmp_path / "ph.yaml").write_text(PSEUDO_HUBER)
    result = run("gen", "ph.yaml", "--no-tests", "--targets", "torch", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    m = import_file(tmp_path / "generated" / "ph_torch.py")
    x = torch.tensor([-3.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    for delta in (1.0, -2.0):
        (g,) = torch.autograd.grad(m.pseudo_huber(x, delta=delta).sum(), x, create_graph=True)
        want = x / torch.sqrt(1 + (x / delta) ** 2)
        torch.testing.assert_close(g, want)
        (h,) = torch.autograd.grad(g.sum(), x)
        torch.testing.assert_close(h, (1 + (x / delta) ** 2) ** -1.5)


def _broken(files: list[GeneratedFile]) -> list[GeneratedFile]:
    """The torch module with its softplus backward math replaced by a crash."""
    out = []
    for f in files:
        if f.name.endswith("_torch.py") and not f.name.startswith("test_"):
            text = f.text.replace(
                "def _softplus_grad_x(x, grad):\n",
                "def _softplus_grad_x(x, grad):\n    raise AttributeError('a generated bug')\n",
            )
            assert text != f.text
            f = GeneratedFile(f.name, text)
        out.append(f)
    return out


@pytest.mark.parametrize("command", ["gen", "check"])
def test_generated_code_that_crashes_is_an_error_and_nothing_is_written(
    tmp_path, monkeypatch, command
):
    pytest.importorskip("torch")
    import symgrad.generate

    real = symgrad.generate.generate
    monkeypatch.setattr(symgrad.generate, "generate", lambda *a, **k: _broken(real(*a, **k)))
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    result = (
        run(command, "a.yaml", "--targets", "torch", cwd=tmp_path)
        if command == "gen"
        else (run(command, "a.yaml", cwd=tmp_path))
    )
    assert result.exit_code == 1
    assert "a.yaml:3 (function 'softplus')" in result.output
    assert "the generated torch backward (float32) raised AttributeError: a generated bug" in (
        result.output
    )
    assert "in _softplus_grad_x" in result.output
    assert not (tmp_path / "generated").exists()


def test_smoke_run_skips_a_framework_that_is_not_installed(tmp_path, monkeypatch):
    from symgrad import smoke

    monkeypatch.setattr(smoke, "_framework", lambda target: None)
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    result = run("gen", "a.yaml", "--no-tests", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "torch is not installed here: the generated torch code was not run" in result.output


# --------------------------------------------------------------------------- accuracy warnings
SINH_COSH = """\
module: sq
targets: [torch]
functions:
  sinh_cosh:
    inputs: {x: {}}
    outputs:
      s: sinh(x)
      c: cosh(x)
"""


def test_gen_warns_about_a_formula_that_stays_inaccurate_and_strict_fails(tmp_path):
    """cosh(x) + sinh(x) (both outputs' gradients) is inf - inf = NaN below x = -710,
    where the exact e**x is finite: said on stderr, with the worst point."""
    (tmp_path / "s.yaml").write_text(SINH_COSH)
    result = run("gen", "s.yaml", "--no-tests", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "warning: s.yaml:4 (function 'sinh_cosh'): still inaccurate" in result.output
    assert "grad_x: " in result.output and "non-finite" in result.output
    assert "worst at x = -" in result.output
    (tmp_path / "generated" / "sq_torch.py").unlink()
    strict = run("gen", "s.yaml", "--no-tests", "--strict", cwd=tmp_path)
    assert strict.exit_code == 1 and "error: s.yaml:4" in strict.output
    assert not (tmp_path / "generated" / "sq_torch.py").exists()


def test_no_warning_for_an_accurate_formula(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    result = run("gen", "a.yaml", "--no-tests", "--strict", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output and "inaccurate" not in result.output


def test_any_unexpected_exception_is_one_error_line(tmp_path, monkeypatch):
    """Outside the per-function guards too (here: loading), no traceback reaches a user;
    SYMGRAD_DEBUG=1 shows it to a developer."""
    import symgrad.cli

    def boom(path):
        raise RuntimeError("something symgrad did not expect")

    monkeypatch.setattr(symgrad.cli, "load_spec", boom)
    (tmp_path / "a.yaml").write_text(GOOD.format(module="a"))
    result = run("show", "a.yaml", cwd=tmp_path)
    assert result.exit_code == 1
    assert "error: internal error (RuntimeError: something symgrad did not expect)" in (
        result.output
    )
    assert "Traceback" not in result.output
    monkeypatch.setenv("SYMGRAD_DEBUG", "1")
    result = run("show", "a.yaml", cwd=tmp_path)
    assert isinstance(result.exception, RuntimeError)

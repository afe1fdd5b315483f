"""Every bad spec gives a SpecError naming the file, the line and the function."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from symgrad.derive import derive_function
from symgrad.errors import SpecError
from symgrad.spec import load_spec

HEAD = "module: m\nfunctions:\n  f:\n"


def load(tmp_path, text):
    """Write ``text`` as a spec, load it and parse every formula (derive)."""
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    for fn in load_spec(path).functions:
        derive_function(fn)
    return path


def check(tmp_path, text, line, function, match):
    path = tmp_path / "spec.yaml"
    with pytest.raises(SpecError, match=match) as info:
        load(tmp_path, text)
    message = str(info.value)
    assert f"{path}:{line}" in message
    if function is not None:
        assert f"'{function}'" in message
    return message


# (yaml, line, function, regex)
CASES = {
    "unknown input key": (
        HEAD + "    inputs:\n      x: {dmain: [0, 1]}\n    output: x\n",
        5,
        "f",
        r"unknown key 'dmain'(.|\n)*did you mean 'domain'",
    ),
    "unknown function key": (
        HEAD + "    inputs: {x: {}}\n    output: x\n    gradiant: {x: grad}\n",
        6,
        "f",
        r"unknown key 'gradiant'(.|\n)*did you mean 'gradient'",
    ),
    "bad function name": (
        "module: m\nfunctions:\n  bad-name:\n    inputs: {x: {}}\n    output: x\n",
        3,
        "bad-name",
        r"function name 'bad-name' is not a valid Python identifier",
    ),
    "bad input name": (
        HEAD + "    inputs:\n      1x: {}\n    output: x\n",
        5,
        "f",
        r"input name '1x' is not a valid Python identifier",
    ),
    "bad module": (
        "module: my-mod\nfunctions:\n  f:\n    inputs: {x: {}}\n    output: x\n",
        1,
        None,
        r"module 'my-mod' is not a valid Python identifier",
    ),
    "unknown symbol": (
        HEAD + "    inputs: {x: {}}\n    output: x + zz\n",
        5,
        "f",
        r"unknown name: 'zz'",
    ),
    "unknown function": (
        HEAD + "    inputs: {x: {}}\n    output: foo(x)\n",
        5,
        "f",
        r"unknown function: 'foo'",
    ),
    "misspelt function": (
        HEAD + "    inputs: {x: {}}\n    output: sinn(x)\n",
        5,
        "f",
        r"unknown function(.|\n)*did you mean 'sin'",
    ),
    "default on tensor": (
        HEAD + "    inputs:\n      x: {}\n      y: {default: 1.0}\n    output: x*y\n",
        6,
        "f",
        r"tensor input 'y' cannot have a default",
    ),
    "domain lo >= hi": (
        HEAD + "    inputs:\n      x: {domain: [1, 1]}\n    output: x\n",
        5,
        "f",
        r"domain lower bound 1 must be below the upper bound 1",
    ),
    "duplicate function": (
        HEAD + "    inputs: {x: {}}\n    output: x\n  f:\n    inputs: {x: {}}\n    output: x\n",
        6,
        None,
        r"duplicate key 'f' \(first given on line 3\)",
    ),
    "duplicate input": (
        HEAD + "    inputs:\n      x: {}\n      x: {}\n    output: x\n",
        6,
        None,
        r"duplicate key 'x' \(first given on line 5\)",
    ),
    "missing output": (HEAD + "    inputs: {x: {}}\n", 3, "f", r"missing 'output'"),
    "output and outputs": (
        HEAD + "    inputs: {x: {}}\n    output: x\n    outputs: {a: x}\n",
        6,
        "f",
        r"either 'output' or 'outputs', not both",
    ),
    "gradient of unknown input": (
        HEAD + "    inputs: {x: {}}\n    output: x\n    gradient:\n      xx: grad\n",
        7,
        "f",
        r"unknown input 'xx'(.|\n)*did you mean 'x'",
    ),
    "gradient of non-differentiable": (
        HEAD + "    inputs:\n      x: {}\n      t: {differentiable: false}\n"
        "    output: x*t\n    gradient:\n      t: grad\n",
        9,
        "f",
        r"gradient given for 't', which is not differentiable",
    ),
    "function order 3": (
        HEAD + "    order: 3\n    inputs: {x: {}}\n    output: x\n",
        4,
        "f",
        r"order must be 1 or 2",
    ),
    "spec order 0": (
        "module: m\norder: 0\nfunctions:\n  f:\n    inputs: {x: {}}\n    output: x\n",
        2,
        None,
        r"order must be 1 or 2",
    ),
    "unknown target": (
        "module: m\ntargets: [jax]\nfunctions:\n  f:\n    inputs: {x: {}}\n    output: x\n",
        2,
        None,
        r"unknown target 'jax'",
    ),
    "invalid yaml": (
        HEAD + "    inputs: {x: {}\n    output: x\n",
        5,
        None,
        r"invalid YAML",
    ),
    "reserved input": (
        HEAD + "    inputs:\n      grad: {}\n    output: grad\n",
        5,
        "f",
        r"'grad' is reserved",
    ),
    "x^2": (
        HEAD + "    inputs: {x: {}}\n    output: x^2\n",
        5,
        "f",
        r"(.|\n)*use \*\* for powers",
    ),
    "class of another's gradient": (  # f's gradient is the Function FGrad
        HEAD + "    inputs: {x: {}}\n    output: x\n  f_grad:\n    inputs: {x: {}}\n"
        "    output: x\n",
        6,
        "f_grad",
        r"'f_grad' and the gradient of 'f' both give class FGrad",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_spec_error_names_file_line_function(tmp_path, name):
    text, line, function, match = CASES[name]
    check(tmp_path, text, line, function, match)


def test_misspelt_output_key_gets_did_you_mean(tmp_path):
    text = HEAD + "    inputs: {x: {}}\n    ouput: x\n"
    check(tmp_path, text, 5, "f", r"unknown key 'ouput'(.|\n)*did you mean 'output'")


def test_valid_spec_loads(tmp_path):
    text = HEAD + "    inputs:\n      x: {}\n      beta: {kind: scalar}\n    output: x*beta\n"
    spec = load_spec(load(tmp_path, text))
    assert [i.name for i in spec.functions[0].inputs] == ["x", "beta"]
    assert not spec.functions[0].input("beta").has_default  # the user must pass it


# ------------------------------------------------------------------ malicious specs
PAYLOADS = [
    "__import__('os').system('touch {m}')",
    "x.__class__",
    "(lambda: 1)()",
    "exec(\"open('{m}', 'w')\")",
    "open('{m}', 'w')",
    "x[0]",
    "getattr(x, 'a')",
    "9**9**9**9",
    "x + 2**10**10",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_malicious_formula_is_refused_without_running(tmp_path, payload):
    marker = tmp_path / "MARKER"
    formula = payload.format(m=marker).replace('"', '\\"')
    text = HEAD + f'    inputs: {{x: {{}}}}\n    output: "{formula}"\n'
    start = time.monotonic()
    check(tmp_path, text, 5, "f", None)
    assert time.monotonic() - start < 5
    assert not marker.exists()


def test_python_yaml_tag_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    text = (
        HEAD
        + f'    inputs: {{x: {{}}}}\n    output: !!python/object/apply:os.system ["touch {marker}"]\n'
    )
    check(tmp_path, text, 5, None, "invalid YAML")
    assert not marker.exists()


def test_gamma_of_huge_integer_is_a_spec_error(tmp_path):
    check(tmp_path, HEAD + "    inputs: {x: {}}\n    output: x + gamma(10**300)\n", 5, "f", None)


@pytest.mark.parametrize("formula", ["x + gamma(10**7)", "x + digamma(10**6)"])
def test_huge_special_function_argument_does_not_hang(tmp_path, formula):
    path = tmp_path / "spec.yaml"
    path.write_text(HEAD + f"    inputs: {{x: {{}}}}\n    output: {formula}\n")
    code = (
        "import sys\nfrom symgrad.spec import load_spec\nfrom symgrad.derive import derive_function\n"
        "from symgrad.errors import SpecError\ntry:\n"
        f"    [derive_function(f) for f in load_spec({str(path)!r}).functions]\n"
        "except SpecError as e:\n    print(e)\n    sys.exit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=4, check=False
    )
    assert proc.returncode == 3 and f"{path}:5" in proc.stdout

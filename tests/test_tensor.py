"""Tensor expressions: the language's checks, the stable forms, the tape and its code."""

from __future__ import annotations

import textwrap

import pytest
import sympy

from symgrad.errors import SpecError
from symgrad.spec import load_spec
from symgrad.tensor.lang import RLSE, RLogSoftmax, RSoftmax, RSum, parse_tensor_function
from symgrad.tensor.plan import derive_tensor, plan_tensor

HEAD = "module: m\ntargets: [torch]\nfunctions:\n"


def spec_of(tmp_path, body: str):
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + textwrap.indent(textwrap.dedent(body), "  "))
    return load_spec(path)


def function(tmp_path, body: str):
    spec = spec_of(tmp_path, body)
    (fn,) = spec.tensor_functions
    return fn


def error_of(tmp_path, body: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_tensor_function(function(tmp_path, body))
    return info.value


# ------------------------------------------------------------------ language checks
def test_an_axis_free_in_the_expression_must_be_in_the_output_shape(tmp_path):
    error = error_of(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [n, k]}, w: {shape: [m, k]}}
          output: {shape: [n], expr: "sum(x[n, k] * w[m, k], k)"}
        """,
    )
    assert "axis 'm' is free in the output expression but not in its shape ['n']" in str(error)
    assert "m.yaml:7" in str(error) and "function 'f'" in str(error)
    assert "sum(..., m)" in error.hint


def test_an_output_axis_must_appear_in_the_expression(tmp_path):
    error = error_of(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [n]}}
          output: {shape: [n, m], expr: "x[n]"}
        """,
    )
    assert "axis 'm' of the output shape" in str(error)


def test_an_input_is_indexed_with_as_many_axes_as_it_has(tmp_path):
    error = error_of(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [n, k]}}
          output: {shape: [n], expr: "sum(x[k], k)"}
        """,
    )
    assert "has 2 named axes ['n', 'k'], indexed with 1" in str(error)
    assert error.hint == "write x[n, k]"


def test_a_scalar_cannot_be_indexed_and_a_shaped_input_must_be(tmp_path):
    error = error_of(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [n]}, s: {kind: scalar, default: 1.0}}
          output: {shape: [n], expr: "x[n] * s[n]"}
        """,
    )
    assert "'s' is not a tensor with a shape" in str(error)
    error = error_of(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [n]}}
          output: {shape: [n], expr: "exp(x)"}
        """,
    )
    assert "input 'x' has axes ['n']: index it" in str(error)


def test_a_reduced_axis_must_index_something(tmp_path):
    error = error_of(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [n, k]}}
          output: {shape: [n], expr: "sum(x[n, k], (k, j))"}
        """,
    )
    assert "axis 'j' is reduced but no input" in str(error)


def test_shapes_belong_to_tensor_expressions(tmp_path):
    with pytest.raises(SpecError, match="has a shape, but the output is an elementwise"):
        spec_of(tmp_path, "f:\n  inputs: {x: {shape: [n]}}\n  output: exp(x)\n")
    with pytest.raises(SpecError, match="needs a shape"):
        spec_of(tmp_path, 'f:\n  inputs: {x: {}}\n  output: {shape: [], expr: "x"}\n')
    with pytest.raises(SpecError, match=r"'\.\.\.' may only come first"):
        spec_of(
            tmp_path, 'f:\n  inputs: {x: {shape: [n, ...]}}\n  output: {shape: [n], expr: "x[n]"}\n'
        )


def test_tensorflow_code_uses_its_own_kernels(tmp_path):
    fn = function(
        tmp_path,
        """
        lse:
          inputs: {z: {shape: [n, c]}}
          output: {shape: [n], expr: "log(sum(exp(z[n, c]), c))"}
        """,
    )
    plan = plan_tensor(fn, "tensorflow")
    assert plan.forward.result == "tf.reduce_logsumexp(z, axis=-1)"
    assert "tf.nn.softmax(z, axis=-1)" in "\n".join(plan.backward.lines)


# ------------------------------------------------------------------ scoping, stable forms
def test_bound_axes_are_renamed_to_the_axis_they_index(tmp_path):
    fn = function(
        tmp_path,
        """
        f:
          inputs: {x: {shape: [..., d]}}
          output: {shape: [..., d], expr: "x[d] - mean(x[j], j) + mean(x[i], i)"}
        """,
    )
    # mean(x[j], j) and mean(x[i], i) are one expression: they cancel
    assert parse_tensor_function(fn).expr == sympy.Symbol("x[d]", real=True)


def test_naive_cross_entropy_becomes_log_softmax(tmp_path):
    fn = function(
        tmp_path,
        """
        ce:
          inputs: {z: {shape: [n, c]}, t: {shape: [n, c], differentiable: false}}
          output: {shape: [], expr: "mean(-sum(t[n, c] * log(exp(z[n, c]) / sum(exp(z[n, j]), j)), c), n)"}
        """,
    )
    expr = parse_tensor_function(fn).expr
    assert expr.atoms(RLogSoftmax) and not expr.atoms(sympy.exp) and not expr.atoms(sympy.log)


def test_naive_attention_becomes_softmax(tmp_path):
    fn = function(
        tmp_path,
        """
        att:
          inputs: {q: {shape: [s, e]}, k: {shape: [t, e]}, v: {shape: [t, d]}}
          output: {shape: [s, d], expr: "sum(exp(sum(q[s, e]*k[t, e], e)) / sum(exp(sum(q[s, f]*k[u, f], f)), u) * v[t, d], t)"}
        """,
    )
    expr = parse_tensor_function(fn).expr
    assert expr.atoms(RSoftmax) and not expr.atoms(sympy.exp) and not expr.atoms(RLSE)


def test_one_pass_variance_becomes_two_pass(tmp_path):
    fn = function(
        tmp_path,
        """
        var:
          inputs: {x: {shape: [n, d]}}
          output: {shape: [n], expr: "mean(x[n, j]**2, j) - mean(x[n, i], i)**2"}
        """,
    )
    expr = parse_tensor_function(fn).expr
    (outer,) = [s for s in expr.atoms(RSum) if s.body.is_Pow]
    assert outer.body.base.atoms(RSum), "the squared deviation from the mean is summed"


def test_log_of_one_plus_exp_inside_a_mean_is_softplus(tmp_path):
    fn = function(
        tmp_path,
        """
        bce:
          inputs: {z: {shape: [n]}}
          output: {shape: [], expr: "mean(log(1 + exp(z[n])), n)"}
        """,
    )
    assert "softplus" in str(parse_tensor_function(fn).expr)


# ------------------------------------------------------------------ the tape and its code
def test_contractions_are_einsums_with_no_broadcast_product(tmp_path):
    fn = function(
        tmp_path,
        """
        bilinear:
          inputs: {x: {shape: [n, i]}, a: {shape: [i, j]}, y: {shape: [n, j]}}
          output: {shape: [n], expr: "sum(x[n, i] * a[i, j] * y[n, j], (i, j))"}
        """,
    )
    d = derive_tensor(fn)
    assert max(len(node.axes) for node in d.tape.nodes.values()) == 2
    plan = plan_tensor(fn, "torch")
    assert plan.forward.lines == ()
    assert plan.forward.result == 'torch.einsum("ni,ij,nj->n", x, a, y)'


def test_saves_are_guarded_by_the_gradients_that_read_them(tmp_path):
    fn = function(
        tmp_path,
        """
        linear:
          inputs: {x: {shape: [n, k]}, w: {shape: [m, k]}, b: {shape: [m]}}
          output: {shape: [n, m], expr: "sum(x[n, k] * w[m, k], k) + b[m]"}
        """,
    )
    plan = plan_tensor(fn, "torch")
    assert dict(plan.saves) == {"x": "need_w", "w": "need_x"}  # b: no gradient reads it


def test_an_axis_shared_by_inputs_is_checked_by_the_wrapper(tmp_path):
    fn = function(
        tmp_path,
        """
        linear:
          inputs: {x: {shape: [n, k]}, w: {shape: [m, k]}}
          output: {shape: [n, m], expr: "sum(x[n, k] * w[m, k], k)"}
        """,
    )
    plan = plan_tensor(fn, "torch")
    assert plan.axis_checks == (("k", (("x", -1), ("w", -1))),)


def test_class_indices_are_a_gather_and_no_one_hot_in_the_forward(tmp_path):
    fn = function(
        tmp_path,
        """
        ce:
          inputs:
            logits: {shape: [n, c]}
            label: {shape: [n], integer: true, differentiable: false}
          output: {shape: [], expr: "-mean(logits[n, label[n]] - logsumexp(logits[n, c], c), n)"}
        """,
    )
    plan = plan_tensor(fn, "torch")
    forward = "\n".join(plan.forward.body)
    assert "logits.gather(-1, label.unsqueeze(-1)).squeeze(-1)" in forward
    assert "one_hot" not in forward
    with pytest.raises(SpecError, match="integer: true and differentiable: false"):
        parse_tensor_function(
            function(
                tmp_path,
                """
                ce:
                  inputs: {logits: {shape: [n, c]}, label: {shape: [n]}}
                  output: {shape: [n], expr: "logits[n, label[n]]"}
                """,
            )
        )


def test_let_names_an_intermediate_indexed_like_an_input(tmp_path):
    fn = function(
        tmp_path,
        """
        gram_trace:
          inputs: {x: {shape: [n, k]}}
          let:
            g: {shape: [n, m], expr: "sum(x[n, k] * x[m, k], k)"}
          output: {shape: [], expr: "sum(g[i, i], i)"}
        """,
    )
    # trace(X X^T) = sum of squares: the same expression either way
    expr = parse_tensor_function(fn).expr
    assert str(expr) == "RSum(x[n,k]**2, (k, n))"  # (nested sums merged: one reduction)
    with pytest.raises(SpecError, match="free axes"):
        parse_tensor_function(
            function(
                tmp_path,
                """
                f:
                  inputs: {x: {shape: [n, k]}}
                  let:
                    s: {shape: [n], expr: "x[n, k]"}
                  output: {shape: [n], expr: "s[n]"}
                """,
            )
        )


def test_an_optional_input_gives_a_variant_without_its_terms(tmp_path):
    fn = function(
        tmp_path,
        """
        linear:
          inputs: {x: {shape: [n, k]}, w: {shape: [m, k]}, b: {shape: [m], optional: true}}
          output: {shape: [n, m], expr: "sum(x[n, k] * w[m, k], k) + b[m]"}
        """,
    )
    plan = plan_tensor(fn, "torch")
    assert plan.forward.body[0] == "if b is None:"
    assert plan.forward.body[1] == '    return torch.einsum("nk,mk->nm", x, w)'
    assert "b: torch.Tensor | None = None" in plan.methods.signature
    with pytest.raises(SpecError, match="follows the optional input"):
        spec_of(
            tmp_path,
            "f:\n  inputs: {b: {shape: [m], optional: true}, x: {shape: [m]}}\n"
            '  output: {shape: [m], expr: "x[m] + b[m]"}\n',
        )


def test_a_quotient_by_several_tensors_is_divided_step_by_step():
    from symgrad.tensor.emit import _PRINTERS

    a, b, c = sympy.symbols("a b c", real=True)
    text = _PRINTERS["torch"]().doprint(a / (b * c**3))
    assert text.replace(" ", "") == "a/b/c**3"  # each step in range where b*c**3 overflows


def test_accuracy_of_tensor_functions_against_exact_values(tmp_path):
    """CI-sized: 0 non-finite where the exact value is finite and no row worse than
    autograd of the naive formula, which is non-finite at large logits."""
    from symgrad.report.tensor import tensor_rows

    spec = spec_of(
        tmp_path,
        """
        ce:
          inputs:
            z: {shape: [n, c]}
            t: {shape: [n, c], differentiable: false, domain: [0, 1]}
          output: {shape: [], expr: "mean(-sum(t[n, c] * log(exp(z[n, c]) / sum(exp(z[n, j]), j)), c), n)"}
        ln1:
          inputs: {x: {shape: [..., d]}}
          output: {shape: [..., d], expr: "(x[d] - mean(x[i], i)) / sqrt(mean(x[j]**2, j) - mean(x[i], i)**2 + 1e-5)"}
        """,
    )
    for dtype in ("float32", "float64"):
        rows = tensor_rows(spec, dtype)
        assert {r.quantity for r in rows} == {"out", "grad_z", "second_z", "grad_x", "second_x"}
        for row in rows:
            assert row.ok and row.symgrad_nonfinite == 0, row
            assert not row.worse_than_naive, row
        assert sum(r.naive_nonfinite for r in rows if r.function == "ce") > 0
        ln = {r.quantity: r for r in rows if r.function == "ln1"}
        assert ln["out"].symgrad_mean_bits < ln["out"].naive_mean_bits  # two-pass


def test_max_and_min_split_ties_like_amax(tmp_path):
    torch = pytest.importorskip("torch")
    from symgrad.generate import generate
    from symgrad.load import imported

    spec = spec_of(
        tmp_path,
        """
        spread:
          inputs: {x: {shape: [n, k]}}
          output: {shape: [n], expr: "max(x[n, k], k) - min(x[n, j], j)"}
        """,
    )
    (file,) = generate(spec, targets=("torch",), tests=False)
    with imported(file.name, file.text) as (module, _):
        x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
        mine = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(module.spread(mine).sum(), mine)
        theirs = x.clone().requires_grad_()
        (want,) = torch.autograd.grad((theirs.amax(1) - theirs.amin(1)).sum(), theirs)
        assert g.tolist() == want.tolist() == [[0.0, 0.5, 0.5, -1.0], [0.0, 0.0, 0.0, 0.0]]
        assert torch.autograd.gradcheck(
            module.spread, (torch.rand(3, 4, dtype=torch.float64, requires_grad=True),)
        )

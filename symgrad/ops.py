"""The primitives: one row per SymPy function a formula or a derivative can contain.

A row holds everything symgrad knows of one primitive, from the word a formula spells it
with to what it costs in eager PyTorch. Every other table is a view of :data:`OPS`: the
parser's functions (``expr.FUNCTIONS``), the mpmath evaluation (``numerics.mp``), the NumPy
one (``numerics.native.stable_numpy``), the printers' ``functions``, ``math_functions`` and
``scalar_formats``, the costs (``cost.OP_COST``, ``cost.REGIME_OPS``) and the torch planner's
in-place, fresh and compiled forms (``plan``). Adding a primitive is adding a row (and its
tests: ``tests/test_ops.py`` checks that every row is complete or says why not).

What a row cannot hold stays where it is done: a printer method ``_print_<name>`` where a
framework needs more than a call (the row names the printer classes that have one), the
derivative (the SymPy class's ``fdiff``) and the stabilising rewrites (``rewrite/``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import mpmath
import numpy as np
import sympy
from sympy.codegen import cfunctions

from symgrad import functions as F

#: A cell's value where the primitive is written out as its ``regimes()`` (elementary
#: functions and branches) instead of one call: in NumPy, in the printers.
REGIMES = "regimes"

#: The printer classes (``symgrad.printers``) a row may name for a ``_print_<name>`` method;
#: one of FrameworkPrinter prints the primitive for every framework and Python numbers.
PRINTER_CLASSES = ("FrameworkPrinter", "TorchPrinter", "TensorFlowPrinter")

#: The generated torch module's helpers around a formula computed in float64 (see
#: symgrad/runtime/torch_helpers.py): its leaves in float64, its value rounded back.
WIDE_HELPER = "_in_float64"
ROUNDED_HELPER = "_rounded_like"


@dataclass(frozen=True)
class Op:
    """One primitive. A cell left empty (``None``) is a deliberate gap: :attr:`why_not`
    says why, under the cell's name.

    - ``sympy``: its SymPy class; the class name is the key of every view (:attr:`name`).
    - ``spelled``, ``arity``, ``build``: the names a formula calls it by, the argument
      counts it takes, and what builds it from the parsed arguments (the class itself
      unless given). No name: only derivatives and rewrites produce it.
    - ``mp``: its exact value with mpmath, of mpmath numbers (at the caller's precision).
    - ``numpy``: its value with NumPy, as the frameworks compute it: a function of arrays;
      or the name lambdify's NumPy printer calls it by (computed by the C library where
      :data:`LIBM` has the name, by NumPy itself otherwise); or :data:`REGIMES`.
    - ``python``: its value of Python numbers (a function of scalar inputs only): a
      function (``"math.exp"``), a format of the printed arguments (``"max({0}, 0.0)"``)
      or :data:`REGIMES`.
    - ``torch``: the torch function that computes it, or :data:`REGIMES`;
      ``torch_inplace``: the method that updates its first argument in place instead;
      ``torch_compiled``: the generated module's helper that replaces it in code
      ``torch.compile`` fuses (the template defines it), where inductor's own loses
      accuracy or speed (none: inductor's own is used).
    - ``tf``: the TensorFlow function that computes it, or :data:`REGIMES`.
    - ``printer_methods``: the printer classes with a ``_print_<name>`` method for it (a
      call with keyword arguments, a framework without the op, special values); such a
      method fills a framework's cell.
    - ``cost``: what one call costs in eager PyTorch, in multiplies
      (``benchmarks/op_costs.py`` measures it); ``passes``: the tensor operations its
      printed form takes where that is more than one (its regimes).
    - ``exact_at_numbers``: SymPy evaluates it exactly at a number (gamma(10**7) is a
      60-million-digit factorial): the parser refuses large constant arguments.
    - ``mp_derivative``: its derivative with mpmath, for a function of one argument whose
      condition number ``|a f'(a) / f(a)|`` can be large (periodic functions and exp as
      ``|a|`` grows, log near 1, the inverse functions near their branch points): the
      exact evaluation counts a rounded argument's error times it as bits lost, and the
      precision rises with them.
    """

    sympy: type[sympy.Basic]
    spelled: tuple[str, ...] = ()
    arity: tuple[int, ...] = (1,)
    build: Callable[..., sympy.Basic] | None = None
    mp: Callable[..., Any] | None = None
    numpy: Callable[..., Any] | str | None = None
    python: str | None = None
    torch: str | None = None
    torch_inplace: str | None = None
    torch_compiled: str | None = None
    tf: str | None = None
    printer_methods: tuple[str, ...] = ()
    cost: float | None = None
    passes: int = 1
    exact_at_numbers: bool = False
    mp_derivative: Callable[[Any], Any] | None = None
    why_not: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "why_not", MappingProxyType(dict(self.why_not)))

    @property
    def name(self) -> str:
        """The SymPy class name: what every view is keyed by."""
        return self.sympy.__name__

    @property
    def constructor(self) -> Callable[..., sympy.Basic]:
        """What builds the node from a formula's parsed arguments."""
        return self.build or self.sympy


#: The cells a row may leave empty with a reason (:attr:`Op.why_not`'s keys).
CELLS = tuple(f.name for f in fields(Op) if f.name not in ("sympy", "why_not"))


# ------------------------------------------------------------------------ NumPy helpers
#: NumPy ufuncs whose SIMD loops round differently on different CPUs (float64 tanh on AVX2
#: against SSE; sinh, expm1, ... with AVX-512's SVML), each with the C library's function.
LIBM: Mapping[str, Callable[..., float]] = MappingProxyType(
    {
        "exp": math.exp,
        "expm1": math.expm1,
        "exp2": lambda v: math.pow(2.0, v),
        "log": math.log,
        "log1p": math.log1p,
        "log2": math.log2,
        "log10": math.log10,
        "sin": math.sin,
        "cos": math.cos,
        "tan": math.tan,
        "arcsin": math.asin,
        "arccos": math.acos,
        "arctan": math.atan,
        "arctan2": math.atan2,
        "sinh": math.sinh,
        "cosh": math.cosh,
        "tanh": math.tanh,
        "arcsinh": math.asinh,
        "arccosh": math.acosh,
        "arctanh": math.atanh,
        "cbrt": math.cbrt,
        "power": math.pow,
    }
)


def libm(name: str) -> Callable[..., Any]:
    """NumPy's ufunc ``name`` computed by the C library in double, rounded to the
    arguments' dtype: the same bits on every CPU, so the measured errors, and with them
    the chosen forms and the generated files, do not depend on the machine that made
    them. Special values (overflow, poles, outside the domain) are NumPy's own."""
    ufunc, scalar = getattr(np, name), LIBM[name]

    def one(*args: float) -> float:
        try:
            return scalar(*args)
        except (OverflowError, ValueError):
            with np.errstate(all="ignore"):
                value = float(ufunc(*args))
            # one NaN: the SIMD loops differ in its sign bit (AVX-512's log(-1) is -nan)
            return math.nan if math.isnan(value) else value

    elementwise = np.vectorize(one, otypes=[np.float64])

    def evaluate(*args):
        dtype = np.result_type(*args)
        if dtype.kind != "f":  # log(2): numbers in, a float out (not an integer)
            dtype = np.dtype(np.float64)
        with np.errstate(over="ignore"):  # to float32: inf, as float32 arithmetic gives
            if all(np.ndim(a) == 0 for a in args):
                return dtype.type(one(*(float(a) for a in args)))
            return elementwise(*args).astype(dtype)

    return evaluate


def elementwise(fn: Callable[..., float]) -> Callable[..., Any]:
    """A function of Python floats applied to each element (float64 out)."""
    # plain Python floats in: mpmath takes no NumPy float32
    return np.vectorize(lambda *args: fn(*(float(a) for a in args)), otypes=[np.float64])


_exp, _log, _log1p, _expm1 = libm("exp"), libm("log"), libm("log1p"), libm("expm1")


def _softplus(x):
    return np.logaddexp(0.0, x)


def _log1mexp(x):
    return np.where(x > -math.log(2), _log(-_expm1(x)), _log1p(-_exp(x)))


def _xlogy(x, y):
    return np.where(x == 0, 0.0, x * _log(y))


def _xlog1py(x, y):
    return np.where(x == 0, 0.0, x * _log1p(y))


def _in_float64(x):
    return np.float64(x) if np.ndim(x) == 0 else np.asarray(x, dtype=np.float64)


def _rounded_like(value, *like):
    dtype = np.result_type(*like)
    if dtype.kind != "f":
        dtype = np.dtype(np.float64)
    with np.errstate(over="ignore"):  # to float32: inf, as a cast in torch and TF gives
        return dtype.type(value) if np.ndim(value) == 0 else np.asarray(value).astype(dtype)


def _heaviside_mp(x, h0):
    return mpmath.mpf(1) if x > 0 else h0 if x == 0 else mpmath.mpf(0)


# ------------------------------------------------------------------------ the rows
_NO_COST = "not measured: costs cost.UNKNOWN_FUNCTION, as dear as the dear ones"
_DERIVED = "no formula word: only the stabilising rewrites produce it"
_NO_INPLACE = "torch has no in-place form of it"

OPS: tuple[Op, ...] = (
    Op(sympy.exp, ("exp",), mp=mpmath.exp,
       mp_derivative=mpmath.exp, numpy="exp", python="math.exp",
       torch="torch.exp", torch_inplace="exp_", tf="tf.math.exp", cost=8),
    Op(sympy.log, ("log",), mp=mpmath.log, mp_derivative=lambda a: 1 / a, numpy="log",
       python="math.log",
       torch="torch.log", torch_inplace="log_", tf="tf.math.log", cost=10),
    # log2: TF's is log(x) / log(2), within 2 ulp; cost as benchmarks/op_costs.py measures
    Op(cfunctions.log2, ("log2",), mp=lambda v: mpmath.log(v, 2),
       mp_derivative=lambda a: 1 / (a * mpmath.log(2)), numpy="log2",
       python="math.log2", torch="torch.log2", torch_inplace="log2_",
       tf="tf.experimental.numpy.log2", cost=10),
    Op(sympy.sin, ("sin",), mp=mpmath.sin,
       mp_derivative=mpmath.cos, numpy="sin", python="math.sin",
       torch="torch.sin", torch_inplace="sin_", tf="tf.math.sin", cost=15),
    Op(sympy.cos, ("cos",), mp=mpmath.cos,
       mp_derivative=lambda a: -mpmath.sin(a), numpy="cos", python="math.cos",
       torch="torch.cos", torch_inplace="cos_", tf="tf.math.cos", cost=15),
    Op(sympy.tan, ("tan",), mp=mpmath.tan,
       mp_derivative=lambda a: mpmath.sec(a) ** 2, numpy="tan", python="math.tan",
       torch="torch.tan", torch_inplace="tan_", tf="tf.math.tan", cost=20),
    Op(sympy.asin, ("asin",), mp=mpmath.asin,
       mp_derivative=lambda a: 1 / mpmath.sqrt(1 - a * a), numpy="arcsin", python="math.asin",
       torch="torch.asin", torch_inplace="asin_", tf="tf.math.asin",
       why_not={"cost": _NO_COST}),
    Op(sympy.acos, ("acos",), mp=mpmath.acos,
       mp_derivative=lambda a: -1 / mpmath.sqrt(1 - a * a), numpy="arccos", python="math.acos",
       torch="torch.acos", torch_inplace="acos_", tf="tf.math.acos",
       why_not={"cost": _NO_COST}),
    Op(sympy.atan, ("atan",), mp=mpmath.atan, numpy="arctan", python="math.atan",
       torch="torch.atan", torch_inplace="atan_", tf="tf.math.atan", cost=28),
    Op(sympy.atan2, ("atan2",), (2,), mp=mpmath.atan2, numpy="arctan2", python="math.atan2",
       torch="torch.atan2", torch_inplace="atan2_", tf="tf.math.atan2",
       why_not={"cost": _NO_COST}),
    # sinh, cosh: FrameworkPrinter keeps them finite up to |a| = 710.47, past exp's overflow
    Op(sympy.sinh, ("sinh",), mp=mpmath.sinh,
       mp_derivative=mpmath.cosh, numpy="sinh", python="math.sinh",
       torch="torch.sinh", torch_inplace="sinh_", tf="tf.math.sinh", cost=11,
       printer_methods=("FrameworkPrinter",)),
    Op(sympy.cosh, ("cosh",), mp=mpmath.cosh,
       mp_derivative=mpmath.sinh, numpy="cosh", python="math.cosh",
       torch="torch.cosh", torch_inplace="cosh_", tf="tf.math.cosh", cost=10,
       printer_methods=("FrameworkPrinter",)),
    Op(sympy.tanh, ("tanh",), mp=mpmath.tanh, numpy="tanh", python="math.tanh",
       torch="torch.tanh", torch_inplace="tanh_", tf="tf.math.tanh", cost=24),
    Op(sympy.asinh, ("asinh",), mp=mpmath.asinh, numpy="arcsinh", python="math.asinh",
       torch="torch.asinh", torch_inplace="asinh_", tf="tf.math.asinh", cost=150),
    Op(sympy.acosh, ("acosh",), mp=mpmath.acosh,
       mp_derivative=lambda a: 1 / mpmath.sqrt(a * a - 1), numpy="arccosh", python="math.acosh",
       torch="torch.acosh", torch_inplace="acosh_", tf="tf.math.acosh", cost=150),
    Op(sympy.atanh, ("atanh",), mp=mpmath.atanh,
       mp_derivative=lambda a: 1 / (1 - a * a), numpy="arctanh", python="math.atanh",
       torch="torch.atanh", torch_inplace="atanh_", torch_compiled="_atanh",
       tf="tf.math.atanh", cost=150),
    Op(sympy.erf, ("erf",), mp=mpmath.erf, numpy=elementwise(math.erf), python="math.erf",
       torch="torch.erf", torch_inplace="erf_", torch_compiled="_erf", tf="tf.math.erf",
       cost=13),
    Op(sympy.erfc, ("erfc",), mp=mpmath.erfc,
       mp_derivative=lambda a: -2 * mpmath.exp(-a * a) / mpmath.sqrt(mpmath.pi),
       numpy=elementwise(math.erfc),
       python="math.erfc", torch="torch.erfc", torch_inplace="erfc_", torch_compiled="_erfc",
       tf="tf.math.erfc", cost=20),
    Op(sympy.gamma, ("gamma",), mp=mpmath.gamma,
       mp_derivative=lambda a: mpmath.gamma(a) * mpmath.digamma(a),
       numpy=elementwise(lambda v: math.gamma(v) if v > 0 or v != int(v) else math.nan),
       python="math.gamma", printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=45,
       exact_at_numbers=True,
       why_not={"torch": "torch has no gamma: exp(lgamma) with gamma's sign",
                "tf": "as for torch: exp(lgamma) with gamma's sign"}),
    Op(sympy.loggamma, ("loggamma",), mp=mpmath.loggamma, numpy=elementwise(math.lgamma),
       python="math.lgamma", torch="torch.lgamma", torch_inplace="lgamma_",
       tf="tf.math.lgamma", cost=45, exact_at_numbers=True),
    # SymPy writes digamma(x) as polygamma(0, x): the polygamma row prints and costs it
    Op(sympy.digamma, ("digamma",), mp=mpmath.digamma,
       numpy=elementwise(
           lambda v: float(mpmath.digamma(v)) if v > 0 or v != int(v) else math.nan
       ),
       torch="torch.digamma", torch_inplace="digamma_", tf="tf.math.digamma", cost=150,
       exact_at_numbers=True,
       why_not={"python": "the math module has no digamma: make an input a tensor"}),
    Op(sympy.Abs, ("Abs", "abs"), mp=abs, numpy="abs", python="abs", torch="torch.abs",
       torch_inplace="abs_", tf="tf.math.abs", cost=1),
    Op(sympy.sign, ("sign",), mp=lambda v: mpmath.mpf((v > 0) - (v < 0)), numpy="sign",
       python="((({0}) > 0) - (({0}) < 0))", torch="torch.sign", torch_inplace="sign_",
       tf="tf.math.sign", cost=3),
    # Heaviside(x, h0): the value at 0 is the second argument (1/2 unless given)
    Op(sympy.Heaviside, ("Heaviside",), (1, 2),
       build=lambda x, h0=sympy.S.Half: sympy.Heaviside(x, h0), mp=_heaviside_mp,
       numpy=lambda x, h0=0.5: np.heaviside(x, h0), printer_methods=("FrameworkPrinter",),
       cost=3, why_not={"torch": "printed as its branches (where)", "tf": "as for torch",
                        "python": "as for torch: a conditional expression"}),
    Op(sympy.Max, ("Max",), tuple(range(2, 9)), mp=max, numpy="maximum",
       torch="torch.maximum", tf="tf.math.maximum",
       printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=1.5,
       why_not={"torch_inplace": "torch.maximum has no in-place method"}),
    Op(sympy.Min, ("Min",), tuple(range(2, 9)), mp=min, numpy="minimum",
       torch="torch.minimum", tf="tf.math.minimum",
       printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=1.5,
       why_not={"torch_inplace": "torch.minimum has no in-place method"}),
    Op(F.sigmoid, ("sigmoid",), mp=F.sigmoid.mp, numpy=lambda x: _exp(-np.logaddexp(0.0, -x)),
       python="(1 / (1 + math.exp(-({0}))))", torch="torch.sigmoid", torch_inplace="sigmoid_",
       torch_compiled="_sigmoid", tf="tf.math.sigmoid", cost=3),  # a faster exp than torch.exp
    # softplus: torch's default threshold (20) is too low for float64 (TorchPrinter)
    Op(F.softplus, ("softplus",), mp=F.softplus.mp, numpy=_softplus,
       python="(max({0}, 0.0) + math.log1p(math.exp(-abs({0}))))",
       torch="torch.nn.functional.softplus", torch_compiled="_softplus",
       tf="tf.math.softplus", printer_methods=("TorchPrinter",), cost=16,
       why_not={"torch_inplace": _NO_INPLACE}),
    Op(F.log1p, ("log1p",), mp=F.log1p.mp, mp_derivative=lambda a: 1 / (1 + a),
       numpy="log1p", python="math.log1p",
       torch="torch.log1p", torch_inplace="log1p_", torch_compiled="_log1p",
       tf="tf.math.log1p", cost=7),
    Op(F.expm1, ("expm1",), mp=F.expm1.mp, mp_derivative=mpmath.exp, numpy="expm1",
       python="math.expm1",
       torch="torch.expm1", torch_inplace="expm1_", torch_compiled="_expm1",
       tf="tf.math.expm1", cost=9),
    Op(F.logaddexp, ("logaddexp",), (2,), mp=F.logaddexp.mp, numpy=np.logaddexp,
       python="(max({0}, {1}) + math.log1p(math.exp(-abs({0} - {1}))))",
       torch="torch.logaddexp", printer_methods=("TensorFlowPrinter",), cost=20,
       why_not={"torch_inplace": _NO_INPLACE, "tf": "TF has none: max + softplus"}),
    Op(F.xlogy, ("xlogy",), (2,), mp=F.xlogy.mp, numpy=_xlogy,
       python="({0} * math.log({1}) if {0} else 0.0)", torch="torch.xlogy",
       torch_inplace="xlogy_", tf="tf.math.xlogy", cost=25),
    # hypot: torch.hypot takes no Python number, TF has no hypot
    Op(F.hypot, ("hypot",), (2,), mp=F.hypot.mp, numpy=np.hypot, python="math.hypot",
       torch="torch.hypot", torch_inplace="hypot_",
       printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=10,
       why_not={"tf": "TF has none: big * sqrt(1 + (small/big)**2)"}),
    # arctan2: what the rewrites write for atan2 (SymPy's becomes atan(y/x) for x > 0)
    Op(F.arctan2, (), (2,), mp=F.arctan2.mp, numpy="arctan2", python="math.atan2",
       torch="torch.atan2", torch_inplace="atan2_", tf="tf.math.atan2",
       printer_methods=("TorchPrinter",),
       why_not={"spelled": "formulas spell atan2 (SymPy's); the rewrites make this one",
                "cost": _NO_COST}),
    Op(F.relu, ("relu",), mp=F.relu.mp, numpy=lambda x: np.maximum(x, 0.0),
       python="max({0}, 0.0)", torch="torch.relu", torch_inplace="relu_", tf="tf.nn.relu",
       cost=1.5),
    Op(F.log1mexp, ("log1mexp",), mp=F.log1mexp.mp, numpy=_log1mexp,
       printer_methods=("FrameworkPrinter",), cost=20,
       why_not={"torch": "printed as Maechler's two regimes (log/expm1, log1p/exp)",
                "tf": "as for torch", "python": "as for torch"}),
    Op(F.xlog1py, ("xlog1py",), (2,), mp=F.xlog1py.mp, numpy=_xlog1py,
       torch="torch.special.xlog1py", tf="tf.math.xlog1py", cost=90,
       why_not={"torch_inplace": _NO_INPLACE,
                "python": "no Python form written: make an input a tensor"}),
    Op(F.erfcx, ("erfcx",), mp=F.erfcx.mp,
       numpy=elementwise(lambda v: float(F.erfcx.mp(mpmath.mpf(v)))),
       torch="torch.special.erfcx", printer_methods=("TensorFlowPrinter",), cost=200,
       why_not={"torch_inplace": _NO_INPLACE,
                "tf": "TF has none: exp(a**2) erfc(a), the asymptotic series past 9",
                "python": "the math module has no erfcx: make an input a tensor"}),
    Op(F.round, ("round",), mp=F.round.mp, numpy=np.rint, python="round",  # ties to even
       torch="torch.round", torch_inplace="round_", tf="tf.math.round", cost=1),
    Op(F.floor, ("floor",), mp=F.floor.mp, numpy=np.floor, python="math.floor",
       torch="torch.floor", torch_inplace="floor_", tf="tf.math.floor", cost=1),
    Op(F.ceil, ("ceil",), mp=F.ceil.mp, numpy=np.ceil, python="math.ceil",
       torch="torch.ceil", torch_inplace="ceil_", tf="tf.math.ceil", cost=1),
    # trunc: not vectorised on CPU, 7-45x a multiply (op_costs.py)
    Op(F.trunc, ("trunc",), mp=F.trunc.mp, numpy=np.trunc, python="math.trunc",
       torch="torch.trunc", torch_inplace="trunc_", printer_methods=("TensorFlowPrinter",),
       cost=15, why_not={"tf": "tf.math has no trunc: ceil below 0, floor above"}),
    # clamp: torch.clamp takes number bounds or tensor bounds, not one of each
    Op(F.clamp, ("clamp",), (3,), mp=F.clamp.mp,
       numpy=lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),  # hi where lo > hi
       python="min(max({0}, {1}), {2})", torch="torch.clamp", torch_inplace="clamp_",
       tf="tf.clip_by_value", printer_methods=("TorchPrinter", "TensorFlowPrinter"),
       cost=1.5),
    # ---- produced by derivatives and the stabilising rewrites only
    Op(sympy.polygamma, arity=(2,), mp=lambda n, x: mpmath.polygamma(int(n), x),
       numpy=elementwise(lambda n, v: float(mpmath.polygamma(int(n), v))),
       torch="torch.polygamma", tf="tf.math.polygamma",
       printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=200,
       why_not={"spelled": "digamma's derivatives",
                "torch_inplace": "torch.polygamma's first argument is the order, not a tensor",
                "python": "the math module has no polygamma: make an input a tensor"}),
    Op(sympy.DiracDelta, arity=(1, 2), mp=lambda *args: mpmath.mpf(0),
       why_not={n: "derive replaces it with 0 (a step's derivative almost everywhere)"
                for n in ("spelled", "numpy", "python", "torch", "tf", "cost")}),
    # dsigmoid: exp(-|x|) / (1 + exp(-|x|))**2
    Op(F.dsigmoid, mp=F.dsigmoid.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES,
       tf=REGIMES, cost=13, passes=6, why_not={"spelled": _DERIVED}),
    Op(F.one_plus_erf, mp=F.one_plus_erf.mp, numpy=elementwise(lambda v: math.erfc(-v)),
       printer_methods=("FrameworkPrinter",), cost=20, passes=2,  # erfc(-x)
       why_not={"spelled": _DERIVED, "torch": "printed as erfc(-x)", "tf": "as for torch",
                "python": "as for torch"}),
    Op(F.log1p_square, mp=F.log1p_square.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES,
       tf=REGIMES, cost=21, passes=6,  # a log1p, two multiplies and its tan_half_atan
       why_not={"spelled": _DERIVED}),
    # in_float64, rounded_like: a formula computed in float64 for float32 inputs
    # (choose.in_float64): its leaves cast up, its value cast back; each a pass (a copy)
    Op(F.in_float64, mp=F.in_float64.mp, numpy=_in_float64, python="{0}",
       printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=1,
       why_not={"spelled": _DERIVED, "torch": "the module helper _in_float64 (not on MPS)",
                "tf": "tf.cast to tf.float64"}),
    # (arity: the value and one tensor or more, as many as the formula has)
    Op(F.rounded_like, arity=(2,), mp=F.rounded_like.mp, numpy=_rounded_like,
       python="{0}", printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=1,
       why_not={"spelled": _DERIVED, "torch": "the module helper _rounded_like",
                "tf": "tf.cast to the first tensor's dtype (TF does not promote)"}),
    # tan_half_atan: torch calls the generated module's helper, TF guards q = +-inf
    Op(F.tan_half_atan, mp=F.tan_half_atan.mp, numpy=REGIMES, python=REGIMES,
       printer_methods=("TorchPrinter", "TensorFlowPrinter"), cost=12, passes=3,  # hypot, /
       why_not={"spelled": _DERIVED, "torch": "the module helper _tan_half_atan",
                "tf": "its regimes, and sign(q) at q = +-inf"}),
    Op(F.hypot_ratio, arity=(3,), mp=F.hypot_ratio.mp, numpy=REGIMES, python=REGIMES,
       torch=REGIMES, tf=REGIMES, cost=12, passes=2, why_not={"spelled": _DERIVED}),
    # hypot_ratio_scaled: |x|, |y|, <=, sign, /, hypot, / and the plain ratio, selected
    Op(F.hypot_ratio_scaled, arity=(3,), mp=F.hypot_ratio.mp, numpy=REGIMES,
       python=REGIMES, torch=REGIMES, tf=REGIMES, cost=30, passes=10,
       why_not={"spelled": _DERIVED}),
    Op(F.erfcx_inv, mp=F.erfcx_inv.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES,
       tf=REGIMES, cost=200, passes=10, why_not={"spelled": _DERIVED}),
    Op(F.exprel, mp=F.exprel.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES, tf=REGIMES,
       cost=15, passes=8, why_not={"spelled": _DERIVED}),
    Op(F.exprel_d, arity=(2,), mp=F.exprel_d.mp, numpy=REGIMES, python=REGIMES,
       torch=REGIMES, tf=REGIMES, cost=25, passes=12, why_not={"spelled": _DERIVED}),
    Op(F.log1prel, mp=F.log1prel.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES,
       tf=REGIMES, cost=25, passes=5, why_not={"spelled": _DERIVED}),  # timed as exprel's
    Op(F.log1prel_d, arity=(2,), mp=F.log1prel_d.mp, numpy=REGIMES, python=REGIMES,
       torch=REGIMES, tf=REGIMES, cost=110, passes=45, why_not={"spelled": _DERIVED}),
    Op(F.sinc_d, arity=(2,), mp=F.sinc_d.mp, numpy=REGIMES, python=REGIMES,
       torch=REGIMES, tf=REGIMES, cost=25, passes=12, why_not={"spelled": _DERIVED}),
    Op(F.sincpi_d, arity=(2,), mp=F.sincpi_d.mp, numpy=REGIMES, python=REGIMES,
       torch=REGIMES, tf=REGIMES, cost=40, passes=20, why_not={"spelled": _DERIVED}),
    Op(F.logcosh, mp=F.logcosh.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES,
       tf=REGIMES, cost=25, passes=10, why_not={"spelled": _DERIVED}),
    Op(F.sinpi, mp=F.sinpi.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES, tf=REGIMES,
       cost=20, passes=8, why_not={"spelled": _DERIVED}),
    Op(F.cospi, mp=F.cospi.mp, numpy=REGIMES, python=REGIMES, torch=REGIMES, tf=REGIMES,
       cost=18, passes=7, why_not={"spelled": _DERIVED}),
)  # fmt: skip

#: torch functions the printers and the planner write for arithmetic and branches (a
#: square root, a select, gamma's sign), no one primitive's: each with the method the
#: planner updates a buffer in place with (None: it does not).
TORCH_ARITHMETIC: Mapping[str, str | None] = MappingProxyType(
    {
        "torch.sqrt": "sqrt_",
        "torch.rsqrt": "rsqrt_",
        "torch.remainder": "remainder_",
        "torch.where": None,
        "torch.full_like": None,
        "torch.zeros_like": None,
        "torch.ones_like": None,
        "torch.square": None,
        "torch.neg": None,
    }
)

#: The rows by SymPy class and by class name.
BY_CLASS: Mapping[type, Op] = MappingProxyType({op.sympy: op for op in OPS})
BY_NAME: Mapping[str, Op] = MappingProxyType({op.name: op for op in OPS})


def spelled(cell: str | None) -> bool:
    """``cell`` names a function (not empty, not :data:`REGIMES`)."""
    return isinstance(cell, str) and cell != REGIMES

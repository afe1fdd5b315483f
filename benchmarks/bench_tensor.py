"""Tensor expressions (specs/tensor.yaml) against the builtins and autograd of the naive
formula, side by side in one run: forward + backward time, bytes saved for backward, and
the double backward (a Hessian-vector product).

    python benchmarks/bench_tensor.py            # the suite, ~3-5 min on 2 CPU cores
    python benchmarks/bench_tensor.py --quick    # small sizes, 3 repeats, < 1 min
    python benchmarks/bench_tensor.py --functions layer_norm attention --device cuda

Variants per function:
  gen      the generated wrapper, eager (tensor_torch.<name>)
  fused    the same with the module's use_fused() on (its torch.compile path)
  naive    autograd of the naive formula transcribed into torch ops, as a user would write it
  builtin  the framework's own op where there is one (F.linear, F.cross_entropy, ...)

Ratios printed: gen/naive and fused/builtin (time, median of interleaved rounds), saved
bytes of gen vs builtin (unique storages that backward keeps, inputs excluded), and the
double backward gen/naive (grad of <grad, v>, create_graph=True). Before timing, every
variant's forward and gradients are compared with gen's (float32: rel. 1e-3).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


def generate(outdir: Path):
    from symgrad.generate import generate as gen
    from symgrad.load import import_path
    from symgrad.spec import load_spec

    spec = load_spec(ROOT / "specs" / "tensor.yaml")
    (file,) = gen(spec, targets=("torch",), tests=False)
    path = outdir / file.name
    path.write_text(file.text)
    eager = import_path(path, "tensor_torch_eager")
    fused = import_path(path, "tensor_torch_fused")
    fused.use_fused(True)
    return eager, fused


# ----------------------------------------------------------------- the suite
EPS = 1e-5


def _bn(x, dims, eps):
    mu = x.mean(dims, keepdim=True)
    n = 1
    for d in dims:
        n *= x.shape[d]
    var = ((x - x.mean(dims, keepdim=True)) ** 2).sum(dims, keepdim=True) / (n - 1)
    return (x - mu) / (torch.sqrt(var) + eps)


@dataclass
class Case:
    name: str
    make: callable  # (scale, device, dtype, generator) -> args (tensors requiring grad first)
    naive: callable
    builtin: callable | None
    note: str = ""


def _r(shape, g, dev, dt, grad=True, lo=None):
    t = torch.randn(shape, generator=g, dtype=dt).to(dev)
    if lo is not None:
        t = t.abs() + lo
    return t.requires_grad_(grad)


def _attention_math(q, k, v, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)


def suite(s: float) -> list[Case]:
    n, c, d = int(4096 * s), 1000, 1024
    return [
        Case(
            "linear",
            lambda g, dev, dt: [
                _r((int(2048 * s), 512), g, dev, dt),
                _r((512, 512), g, dev, dt),
                _r((512,), g, dev, dt),
            ],
            lambda x, w, b: x @ w.T + b,
            F.linear,
        ),
        Case(
            "softmax_cross_entropy",
            lambda g, dev, dt: [
                _r((n, c), g, dev, dt),
                torch.softmax(_r((n, c), g, dev, dt, False), 1),
            ],
            lambda z, t: (
                -(t * torch.log(torch.exp(z) / torch.exp(z).sum(1, keepdim=True))).sum(1).mean()
            ),
            F.cross_entropy,
        ),
        Case(
            "cross_entropy_class_index",
            lambda g, dev, dt: [
                _r((n, c), g, dev, dt),
                torch.randint(0, c, (n,), generator=g).to(dev),
            ],
            lambda z, y: (
                -(z.gather(1, y[:, None]).squeeze(1) - torch.log(torch.exp(z).sum(1))).mean()
            ),
            F.cross_entropy,
        ),
        Case(
            "log_softmax",
            lambda g, dev, dt: [_r((n, c), g, dev, dt)],
            lambda z: torch.log(torch.exp(z) / torch.exp(z).sum(1, keepdim=True)),
            lambda z: F.log_softmax(z, 1),
        ),
        Case(
            "logsumexp_rows",
            lambda g, dev, dt: [_r((n, c), g, dev, dt)],
            lambda z: torch.log(torch.exp(z).sum(1)),
            lambda z: torch.logsumexp(z, 1),
        ),
        Case(
            "bce_logits_mean",
            lambda g, dev, dt: [
                _r((n, c), g, dev, dt),
                torch.rand((n, c), generator=g, dtype=dt).to(dev),
            ],
            lambda z, y: (torch.log(1 + torch.exp(z)) - y * z).mean(),
            F.binary_cross_entropy_with_logits,
        ),
        Case(
            "layer_norm",
            lambda g, dev, dt: [_r((n, d), g, dev, dt)],
            lambda x: (
                (x - x.mean(-1, keepdim=True))
                / torch.sqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + EPS)
            ),
            lambda x: F.layer_norm(x, x.shape[-1:], eps=EPS),
        ),
        Case(
            "layer_norm_one_pass",
            lambda g, dev, dt: [_r((n, d), g, dev, dt)],
            lambda x: (
                (x - x.mean(-1, keepdim=True))
                / torch.sqrt((x**2).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2 + EPS)
            ),
            lambda x: F.layer_norm(x, x.shape[-1:], eps=EPS),
        ),
        Case(
            "rms_norm",
            lambda g, dev, dt: [_r((n, d), g, dev, dt), _r((d,), g, dev, dt)],
            lambda x, w: x * w / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6),
            lambda x, w: F.rms_norm(x, x.shape[-1:], w, eps=1e-6),
        ),
        Case(
            "batch_norm_train",
            lambda g, dev, dt: [_r((int(32 * s), 64, 32, 32), g, dev, dt)],
            lambda x: _bn(x, (0, 2, 3), 1e-3),
            lambda x: F.batch_norm(x, None, None, training=True, eps=1e-3),
            "builtin: eps inside the root, biased variance (speed reference only)",
        ),
        Case(
            "conv1x1_bn",
            lambda g, dev, dt: [
                _r((int(32 * s), 64, 32, 32), g, dev, dt),
                _r((64, 64), g, dev, dt),
            ],
            lambda x, w: _bn(torch.einsum("nchw,oc->nohw", x, w), (0, 2, 3), 1e-3),
            lambda x, w: F.batch_norm(
                F.conv2d(x, w[:, :, None, None]), None, None, training=True, eps=1e-3
            ),
            "builtin: conv2d + batch_norm (eps inside the root, biased variance)",
        ),
        Case(
            "attention",
            lambda g, dev, dt: [_r((int(8 * s), 256, 64), g, dev, dt) for _ in range(3)],
            lambda q, k, v: torch.einsum(
                "bst,btd->bsd",
                torch.exp(0.125 * q @ k.mT) / torch.exp(0.125 * q @ k.mT).sum(-1, keepdim=True),
                v,
            ),
            lambda q, k, v: _attention_math(q, k, v, 0.125),
        ),
    ]


# ----------------------------------------------------------------- measuring
def step(fn, args):
    """Forward and backward, the upstream gradient a fixed random tensor (ones would make
    a normalisation layer's input gradient 0 up to rounding: nothing to compare)."""
    out = fn(*args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    key = (out.shape, out.dtype, out.device)
    if key not in _UPSTREAM:  # made once: not timed
        g = torch.Generator().manual_seed(7)
        _UPSTREAM[key] = torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad(out, leaves, _UPSTREAM[key])
    return out, grads


_UPSTREAM: dict = {}


def hvp(fn, args, vs):
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    out = fn(*args)
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out), create_graph=True)
    dot = sum((g * v).sum() for g, v in zip(grads, vs))
    return torch.autograd.grad(dot, leaves, allow_unused=True)


def saved_bytes(fn, args) -> int:
    """Bytes of the unique storages saved for backward, the inputs' own excluded."""
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(seen.values())


def timed(fns: dict, args, repeats: int, sync) -> dict[str, float]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():  # interleaved: drift hits every variant alike
            sync()
            t0 = time.perf_counter()
            f()
            sync()
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def close(a, b, tol) -> bool:
    scale = max(b.abs().max().item(), 1.0)
    return (a - b).abs().max().item() <= tol * scale


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--functions", nargs="*")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-fused", action="store_true", help="skip the torch.compile path")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    scale, repeats = (0.125, 3) if a.quick else (1.0, a.repeats)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dt = torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        eager, fused = generate(Path(tmp))
        print(
            f"generated specs/tensor.yaml in {time.perf_counter() - t0:.1f} s; "
            f"device {dev}, float32, {a.threads} thread(s), {repeats} repeats\n"
        )
        rows = []
        for case in suite(scale):
            if a.functions and case.name not in a.functions:
                continue
            g = torch.Generator().manual_seed(0)
            args = case.make(g, dev, dt)
            variants = {"gen": getattr(eager, case.name), "naive": case.naive}
            if not a.no_fused:
                variants["fused"] = getattr(fused, case.name)
            if case.builtin is not None:
                variants["builtin"] = case.builtin
            ref_out, ref_grads = step(variants["gen"], args)
            notes = []
            for k, f in variants.items():
                out, grads = step(f, args)  # (first call: compiles the fused path)
                ok = close(out, ref_out, 1e-3) and all(
                    close(x, y, 1e-3) for x, y in zip(grads, ref_grads)
                )
                if not ok and k != "builtin":
                    notes.append(f"{k} disagrees with gen")
            times = timed(
                {k: (lambda f=f, args=args: step(f, args)) for k, f in variants.items()},
                args,
                repeats,
                sync,
            )
            saved = {k: saved_bytes(f, args) for k, f in variants.items() if k != "fused"}
            leaves = [x for x in args if isinstance(x, torch.Tensor) and x.requires_grad]
            vs = [torch.randn_like(x) for x in leaves]
            h = timed(
                {
                    k: (lambda f=variants[k], args=args, vs=vs: hvp(f, args, vs))
                    for k in ("gen", "naive")
                },
                args,
                max(3, repeats // 2),
                sync,
            )
            rows.append((case, times, saved, h, notes))
        header = (
            f"{'function':26s} {'gen ms':>8s} {'naive':>8s} {'fused':>8s} {'builtin':>8s}"
            f" {'gen/naive':>9s} {'fused/bi':>8s} {'saved gen':>10s} {'builtin':>9s}"
            f" {'hvp gen/naive':>13s}"
        )
        print(header)
        print("-" * len(header))
        ratios = {"gen/naive": [], "fused/builtin": [], "hvp": []}
        for case, t, saved, h, notes in rows:
            ms = {k: v * 1e3 for k, v in t.items()}
            gn = t["gen"] / t["naive"]
            fb = t["fused"] / t["builtin"] if "fused" in t and "builtin" in t else None
            hv = h["gen"] / h["naive"]
            ratios["gen/naive"].append(gn)
            ratios["hvp"].append(hv)
            if fb is not None:
                ratios["fused/builtin"].append(fb)
            print(
                f"{case.name:26s} {ms['gen']:8.2f} {ms['naive']:8.2f} "
                f"{ms.get('fused', float('nan')):8.2f} {ms.get('builtin', float('nan')):8.2f} "
                f"{gn:9.2f} {fb if fb is not None else float('nan'):8.2f} "
                f"{saved['gen'] / 1e6:9.2f}M {saved.get('builtin', 0) / 1e6:8.2f}M {hv:13.2f}"
            )
            for note in notes + ([case.note] if case.note else []):
                print(f"    {note}")
        print()
        for k, v in ratios.items():
            if v:
                print(f"median {k:14s} {statistics.median(v):.2f}  (over {len(v)} functions)")
        print(
            "targets: gen/naive <= 0.6, fused/builtin <= 1.0 (linear <= 1.05 eager), "
            "saved bytes <= builtin, hvp gen/naive <= 0.7"
        )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

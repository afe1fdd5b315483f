#!/usr/bin/env bash
# The GPU checks, run on a machine with a CUDA GPU and PyTorch (nothing here needs
# TensorFlow). Each step writes its log under $OUT (default benchmarks/results/gpu-run):
#
#   bash benchmarks/gpu.sh tests      # the generated torch test suites, CUDA cases included
#   bash benchmarks/gpu.sh accuracy   # `symgrad accuracy --device cuda`, eager and fused
#                                     # (DTYPES, SPECS, MODES="--fused", POINTS, BUDGET, WORKERS)
#   bash benchmarks/gpu.sh bench      # benchmarks/bench_torch.py --device cuda
#
# symgrad itself must be importable (pip install -e ., or PYTHONPATH=. with its
# dependencies installed): the accuracy and benchmark steps generate code.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu-run}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

env_report() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv 2>&1
    "$PY" -c 'import sys, torch, sympy
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "sympy", sympy.__version__, "gpu", torch.cuda.get_device_name())'
}

run_tests() {
    # -n: the suites compile many small kernels (Triton for CUDA), one process each.
    # (-p no:benchmark: a pytest-benchmark plugin in the image warns under xdist, at length.)
    local workers=()
    "$PY" -c 'import xdist' 2>/dev/null && workers=(-n "${WORKERS:-8}")
    "$PY" -m pytest -q -p no:cacheprovider -p no:benchmark "${workers[@]}" -rs \
        examples/generated/test_*_torch.py 2>&1 | tee "$OUT/tests.log" | tail -n 25
}

needs_symgrad() {
    # accuracy and bench generate code: symgrad's modules import its other dependencies;
    # ruff, which formats the output, is imported only when used (the CUDA image has none:
    # carry its wheel there)
    if ! "$PY" -c 'import symgrad.cli, symgrad.generate, ruff' 2>/dev/null; then
        echo "error: '$1' generates code and needs symgrad's dependencies:" \
            "pip install -e . (or install ruff==0.17.6 and put symgrad on PYTHONPATH)" >&2
        exit 1
    fi
}

run_accuracy() {
    needs_symgrad accuracy
    local specs=${SPECS:-specs/stability.yaml specs/activations.yaml specs/tutorial.yaml \
        benchmarks/accuracy/corpus.yaml}
    for dtype in ${DTYPES:-float32 float64}; do
        for spec in $specs; do
            for fused in ${MODES:-"" --fused}; do
                local name
                name=$(basename "$spec" .yaml)-$dtype${fused:+-fused}
                echo "== $name"
                "$PY" -m symgrad.cli accuracy "$spec" --device cuda --dtype "$dtype" $fused \
                    --points "${POINTS:-96}" --workers "${WORKERS:-8}" --budget "${BUDGET:-30}" \
                    >"$OUT/accuracy-$name.txt" 2>"$OUT/accuracy-$name.err"
                tail -n 1 "$OUT/accuracy-$name.txt"
            done
        done
    done
}

run_bench() {
    needs_symgrad bench
    "$PY" benchmarks/bench_torch.py --device cuda "$@" 2>&1 | tee "$OUT/bench-torch-cuda.txt"
}

if ! "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "error: $0 needs PyTorch with a CUDA GPU (torch.cuda.is_available() is False here);" \
        "on a CPU machine run pytest and benchmarks/bench_torch.py instead" >&2
    exit 1
fi
mkdir -p "$OUT"
env_report | tee "$OUT/env.txt"
case "${1:-all}" in
    tests) run_tests ;;
    accuracy) run_accuracy ;;
    bench) shift; run_bench "$@" ;;
    all) run_tests; run_accuracy; run_bench ;;
    *) echo "usage: $0 [tests|accuracy|bench [bench_torch options]|all]" >&2; exit 2 ;;
esac

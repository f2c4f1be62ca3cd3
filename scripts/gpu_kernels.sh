#!/usr/bin/env bash
# Everything GPU for the bundled kernels, in one call: build the CUDA extension, run the GPU tests,
# compute-sanitizer (memcheck + racecheck) over scripts/sanitize_kernels.py, and the benchmark.
#   bash scripts/gpu_kernels.sh OUTDIR [--quick]
# Logs and results land in OUTDIR (build.log, pytest_gpu.log, memcheck.log, racecheck.log, bench.log,
# bench_kernels.csv, bench_kernels.md: 7 files).  Exit status: non-zero if any step failed.
# Each step has a time limit (T_BUILD, T_TESTS, T_MEMCHECK, T_RACECHECK, T_BENCH seconds; SKIP_TESTS=1,
# SKIP_SANITIZE=1 skip steps).
set -uo pipefail
OUT_DIR="${1:?usage: gpu_kernels.sh OUTDIR [--quick]}"
QUICK="${2:-}"
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export PROFKIT_KERNELS_CACHE="${PROFKIT_KERNELS_CACHE:-/tmp/profkit_kernels_cache}"
status=0
step() { echo "== $1 ($(date +%T))"; }

step "env"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

step "build"
( time timeout ${T_BUILD:-300} python3 -c "from kernels import _build; _build.ensure_loaded(); print('built into', _build.cache_dir())" ) \
  2>&1 | tee "$OUT_DIR/build.log" || status=1

if [ -z "${SKIP_TESTS:-}" ]; then
step "gpu tests"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n ${XDIST_N:-8}"
timeout ${T_TESTS:-240} python3 -m pytest tests/kernels -m gpu -q $XDIST --maxfail=30 -p no:cacheprovider 2>&1 \
  | tail -80 | tee "$OUT_DIR/pytest_gpu.log" || status=1

fi
if [ -n "${SKIP_SANITIZE:-}" ]; then :
elif command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck (both backends)"
  timeout ${T_MEMCHECK:-150} compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitize_kernels.py \
    2>&1 | tail -30 | tee "$OUT_DIR/memcheck.log" || status=1
  step "compute-sanitizer racecheck (CUDA backend)"
  timeout ${T_RACECHECK:-120} compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/sanitize_kernels.py --backends cuda \
    2>&1 | tail -30 | tee "$OUT_DIR/racecheck.log" || status=1
else
  echo "compute-sanitizer not found; skipped" | tee "$OUT_DIR/memcheck.log"
fi

step "benchmark"
timeout ${T_BENCH:-300} python3 scripts/bench_kernels.py --out "$OUT_DIR" $QUICK ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/bench.log" || status=1
step "done, status $status"
exit $status

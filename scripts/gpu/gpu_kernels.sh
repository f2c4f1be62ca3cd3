#!/usr/bin/env bash
# Everything GPU for the bundled kernels, in one call (about 4.5 minutes on an H200):
#   bash scripts/gpu/gpu_kernels.sh OUTDIR [--quick]
# 1. build the CUDA extension            -> OUTDIR/build.log
# 2. GPU tests (pytest -m gpu)            -> OUTDIR/pytest_gpu.log
# 3. compute-sanitizer memcheck (both backends) + racecheck (CUDA backend) over
#    scripts/gpu/sanitize_kernels.py          -> OUTDIR/sanitize.log
# 4. the benchmark: auto, triton, cuda, cuda_v0 (previous launch configuration), liger (if
#    importable), eager, torch.compile; GPU time under CUDA graphs + host cost per plain call
#                                         -> OUTDIR/bench.log, bench_kernels.csv, bench_kernels.md
# 5. the launch variants of softmax and add_layernorm side by side (VARIANTS, default "0 2 3";
#    PROFKIT_KERNELS_LAUNCH=softmax=V,add_layernorm=V; cuda, triton, liger; decode shapes and two
#    large ones)                          -> OUTDIR/bench_variants.csv
# 6. ncu over the decode shapes, CUDA kernels, current vs previous launch configuration
#                                         -> OUTDIR/ncu_decode.log
# Optional: REPEAT_BENCH=1 runs the benchmark a second time (-> OUTDIR/repeat/, the run-to-run
# spread); PROBES="MODE ..." runs scripts/gpu/probe_variants.py modes (-> OUTDIR/probe_variants_MODE.json).
# 8 files.  Exit status non-zero if any step failed.  Time limits per step (seconds): T_BUILD,
# T_TESTS, T_MEMCHECK, T_RACECHECK, T_BENCH, T_NCU; SKIP_TESTS=1, SKIP_SANITIZE=1, SKIP_NCU=1, SKIP_VARIANTS=1 skip
# steps; BENCH_ARGS adds benchmark arguments (default shapes: BENCH_SHAPES).
# Liger-Kernel is optional: install it beforehand (e.g. pip install --target DIR + PYTHONPATH).
set -uo pipefail
OUT_DIR="${1:?usage: gpu_kernels.sh OUTDIR [--quick]}"
QUICK="${2:-}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
export PROFKIT_KERNELS_CACHE="${PROFKIT_KERNELS_CACHE:-/tmp/profkit_kernels_cache}"
BENCH_SHAPES="${BENCH_SHAPES:-1x4096,16x4096,64x8192,4096x4096,16384x4096,65536x8192}"
status=0
step() { echo "== $1 ($(date +%T))"; }

step "env"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
python3 -c "import liger_kernel; print('liger_kernel found')" 2>/dev/null || echo "liger_kernel not importable: benchmark without it"

step "build"
( time timeout ${T_BUILD:-180} python3 -c "from kernels import _build; _build.ensure_loaded(); print('built into', _build.cache_dir()); print('launch variants', {op: _build.get_launch_variant(op) for op in _build.LAUNCH_OPS})" ) \
  2>&1 | tee "$OUT_DIR/build.log" || status=1

if [ -z "${SKIP_TESTS:-}" ]; then
  step "gpu tests"
  XDIST=""
  python3 -c "import xdist" 2>/dev/null && XDIST="-n ${XDIST_N:-8}"
  timeout ${T_TESTS:-100} python3 -m pytest tests/kernels -m gpu -q $XDIST --maxfail=30 -p no:cacheprovider 2>&1 \
    | tail -80 | tee "$OUT_DIR/pytest_gpu.log" || status=1
fi

if [ -n "${SKIP_SANITIZE:-}" ]; then :
elif command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck (both backends) + racecheck (CUDA backend)"
  { echo "== memcheck"
    timeout ${T_MEMCHECK:-150} compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/gpu/sanitize_kernels.py 2>&1 | tail -30
    echo "memcheck exit ${PIPESTATUS[0]}"
    echo "== racecheck"
    timeout ${T_RACECHECK:-90} compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/gpu/sanitize_kernels.py --backends cuda 2>&1 | tail -30
    echo "racecheck exit ${PIPESTATUS[0]}"
  } | tee "$OUT_DIR/sanitize.log"
  grep -q "memcheck exit 0" "$OUT_DIR/sanitize.log" && grep -q "racecheck exit 0" "$OUT_DIR/sanitize.log" || status=1
else
  echo "compute-sanitizer not found; skipped" | tee "$OUT_DIR/sanitize.log"
fi

step "benchmark"
SHAPE_ARG="--shapes $BENCH_SHAPES"
[ -n "$QUICK" ] && SHAPE_ARG="--quick"
timeout ${T_BENCH:-120} python3 scripts/bench/bench_kernels.py --out "$OUT_DIR" $SHAPE_ARG ${BENCH_ARGS:-} 2>&1 | tee "$OUT_DIR/bench.log" || status=1

if [ -n "${REPEAT_BENCH:-}" ]; then
  # the same benchmark once more, for the run-to-run spread (the page's bench_kernels_h200_run2.csv.xz)
  step "benchmark, repeated"
  timeout ${T_BENCH:-120} python3 scripts/bench/bench_kernels.py --out "$OUT_DIR/repeat" $SHAPE_ARG ${BENCH_ARGS:-} \
    > "$OUT_DIR/bench_repeat.log" 2>&1 || status=1
fi

for mode in ${PROBES:-}; do
  # kernel-variant probes (scripts/gpu/probe_variants.py), e.g. PROBES="reload consumer"
  step "probe $mode"
  OUT="$OUT_DIR" timeout ${T_PROBE:-150} python3 scripts/gpu/probe_variants.py "$mode" > "$OUT_DIR/probe_$mode.log" 2>&1 || status=1
done

if [ -z "${SKIP_VARIANTS:-}" ]; then
  step "launch variants ${VARIANTS:-0 2 3} of softmax and add_layernorm"
  for v in ${VARIANTS:-0 2 3}; do
    PROFKIT_KERNELS_LAUNCH="softmax=$v,add_layernorm=$v" timeout ${T_VARIANT:-90} python3 scripts/bench/bench_kernels.py \
      --out "$OUT_DIR/variant_$v" --ops softmax,add_layernorm --impls cuda,triton,liger --no-host \
      --shapes 1x4096,16x4096,64x8192,4096x4096,16384x4096 > "$OUT_DIR/variant_$v.log" 2>&1 || status=1
  done
  python3 - "$OUT_DIR" ${VARIANTS:-0 2 3} <<'PY' || status=1
import csv, sys
from pathlib import Path
out, variants = Path(sys.argv[1]), sys.argv[2:]
rows = []
for v in variants:
    with open(out / f"variant_{v}" / "bench_kernels.csv", newline="") as f:
        rows += [{"launch_variant": v, **r} for r in csv.DictReader(f)]
with open(out / "bench_variants.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print(f"bench_variants.csv: {len(rows)} rows, variants {' '.join(variants)}")
PY
  rm -rf "$OUT_DIR"/variant_*
fi

if [ -z "${SKIP_NCU:-}" ] && command -v ncu >/dev/null; then
  step "ncu, decode shapes, CUDA kernels, the default launch variants then 0 (previous)"
  # filtered by kernel name (the CUDA row kernels and bias+GELU), one launch per op/shape/variant
  timeout ${T_NCU:-40} ncu --kernel-name regex:"reg_kernel|rows_kernel|bias_gelu_kernel" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    python3 - <<'PY' 2>&1 | grep -v "^==PROF==" | tail -400 > "$OUT_DIR/ncu_decode.log" || status=1
import torch, kernels
from kernels import _build
_build.ensure_loaded()
for variant, choice in (("default", dict(_build.LAUNCH_DEFAULTS)), (0, {op: 0 for op in _build.LAUNCH_OPS})):
    for op, v in choice.items():
        _build.set_launch_variant(op, v)
    for rows, n in ((1, 4096), (16, 4096), (64, 8192)):
        x, r = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        print(f"variant {variant} shape {rows}x{n}: add_rmsnorm, add_layernorm, softmax, bias_gelu", flush=True)
        kernels.add_rmsnorm(x, r, w, backend="cuda"); kernels.add_layernorm(x, r, w, b, backend="cuda")
        kernels.softmax(x, backend="cuda"); kernels.bias_gelu(x, b, backend="cuda")
        torch.cuda.synchronize()
PY
fi
step "done, status $status"
exit $status

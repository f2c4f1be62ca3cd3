#!/usr/bin/env bash
# On a GPU machine: measured peaks, and the traces behind the case studies in analyses/ —
# each bundled op with its PyTorch baseline and its fused backends, the bundled kernels'
# benchmark, and the small model eager and with the fused add+RMSNorm — all through
# `profkit capture` (nsys, and ncu where noted).  Usage: scripts/gpu/capture_case_studies.sh OUTDIR
set -u
out=${1:?usage: capture_case_studies.sh OUTDIR}
mkdir -p "$out/traces" "$out/logs"
export PYTHONUNBUFFERED=1
pk() { python3 -m profkit "$@"; }
step() { echo "== $* ($(date -u +%T))"; }

step peaks
pk peaks -o "$out/peaks_h200.json" 2>&1 | tee "$out/logs/peaks.log"

for case in add_rmsnorm add_layernorm bias_gelu softmax; do
  for backend in torch triton cuda; do
    [ "$backend" = cuda ] && [ "$case" != add_rmsnorm ] && [ "$case" != softmax ] && continue
    step "fused $case $backend"
    pk capture --force -o "$out/traces/fused_${case}_${backend}.sqlite" \
      scripts/workloads/fused.py "$case" "$backend" > "$out/logs/fused_${case}_${backend}.log" 2>&1 \
      || echo "   failed: see logs/fused_${case}_${backend}.log"
  done
done

step "model eager --aten --ncu"
pk capture --force --aten --ncu --ncu-count 60 -o "$out/traces/model_tiny_llama.sqlite" \
  scripts/workloads/tiny_llama.py --steps 6 > "$out/logs/model_eager.log" 2>&1 || echo "   failed"
step "model fused (triton add_rmsnorm) --aten"
pk capture --force --aten -o "$out/traces/model_tiny_llama_fused.sqlite" \
  scripts/workloads/tiny_llama.py --steps 6 --fused triton > "$out/logs/model_fused.log" 2>&1 || echo "   failed"

step "bench_kernels --quick under nsys + ncu"
pk capture --force --ncu --ncu-count 60 -o "$out/traces/bench_kernels_quick.sqlite" \
  scripts/bench/bench_kernels.py --quick --out /tmp/bench_quick > "$out/logs/bench_capture.log" 2>&1 || echo "   failed"

for t in model_tiny_llama model_tiny_llama_fused; do
  for r in cuda_gpu_kern_sum nvtx_gpu_proj_sum; do
    nsys stats -q -r "$r" --format csv -o "$out/logs/$t" "$out/traces/$t.sqlite" > /dev/null 2>&1
  done
done
rm -f "$out"/traces/*.nsys-rep
ls -la "$out"/traces
step done

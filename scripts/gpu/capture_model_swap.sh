#!/usr/bin/env bash
# On a GPU machine: the small model without emit_nvtx (GPU-bound), eager and with the bundled
# add+RMSNorm swapped in; the fused cases' PyTorch baselines with an ncu pass over the op's range
# (so the advisor predicts from measured bytes); and the kernels' benchmark under nsys + ncu.
# Usage: scripts/gpu/capture_model_swap.sh OUTDIR
set -u
out=${1:?usage: capture_model_swap.sh OUTDIR}
mkdir -p "$out/traces" "$out/logs"
export PYTHONUNBUFFERED=1
pk() { python3 -m profkit "$@"; }
step() { echo "== $* ($(date -u +%T))"; }

for variant in eager triton cuda; do
  step "model $variant"
  extra=(); [ "$variant" != eager ] && extra=(--fused "$variant")
  pk capture --force -o "$out/traces/model_tiny_llama_plain_${variant}.sqlite" \
    scripts/workloads/tiny_llama.py --steps 10 "${extra[@]}" > "$out/logs/model_$variant.log" 2>&1 || echo "   failed"
done

for case in add_rmsnorm add_layernorm bias_gelu softmax; do
  step "baseline $case with ncu"
  pk capture --force --ncu --ncu-range "$case" --ncu-count 20 -o "$out/traces/fused_${case}_torch_ncu.sqlite" \
    scripts/workloads/fused.py "$case" torch > "$out/logs/ncu_${case}.log" 2>&1 || echo "   failed"
done

step "bench_kernels --quick under nsys + ncu (prefill shapes)"
pk capture --force --ncu --ncu-range 'regex:16384x4096' --ncu-count 40 -o "$out/traces/bench_kernels_quick.sqlite" \
  scripts/bench/bench_kernels.py --quick --out /tmp/bench_quick > "$out/logs/bench_capture.log" 2>&1 || echo "   failed"
cp /tmp/bench_quick/* "$out/logs/" 2>/dev/null
for t in model_tiny_llama_plain_eager model_tiny_llama_plain_triton; do
  for r in cuda_gpu_kern_sum nvtx_gpu_proj_sum; do
    nsys stats -q -r "$r" --format csv -o "$out/logs/$t" "$out/traces/$t.sqlite" > /dev/null 2>&1
  done
done
rm -f "$out"/traces/*.nsys-rep "$out"/traces/*.ncu-rep
ls -la "$out"/traces
step done

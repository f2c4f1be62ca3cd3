#!/usr/bin/env bash
# On a GPU machine: capture the real programs behind profkit's run-summary, rule and accuracy
# tests with `profkit capture`, each next to the variant that applies the fix an expert would
# make first. Usage: scripts/gpu/capture_real_programs.sh OUTDIR SECONDS STEP...
# Steps: train train_eager_attn gpt2 gpt2_pad gpt2_rec gpt2_pad_rec train_rec_ncu
#        train train_fused train_compiled train_kineto train_aten train_rec generate generate_static generate_graphs
#        generate_fused generate_rerun generate_fused_rerun
#        loader loader_fixed sync sync_fixed cnn_metrics cnn_compiled train_ncu train_ncu_auto sync_ncu cnn_ncu
set -u
out=${1:?usage: capture_real_programs.sh OUTDIR SECONDS STEP...}; budget=${2:?}; shift 2
deadline=$(( $(date +%s) + budget ))
mkdir -p "$out/traces" "$out/logs"
export PYTHONUNBUFFERED=1
W=scripts/workloads
left() { echo $(( deadline - $(date +%s) )); }
pk() {  # pk NAME [capture options] -- SCRIPT ARGS
  local name=$1; shift
  local t; t=$(left); [ "$t" -le 20 ] && { echo "== skip $name (no time left)"; return; }
  echo "== $name ($(date -u +%T), ${t}s left)"
  local s=$(date +%s)
  timeout "$t" python3 -m profkit capture --force -o "$out/traces/$name.sqlite" "$@" \
    > "$out/logs/$name.log" 2>&1 || echo "   $name failed: $(tail -3 "$out/logs/$name.log")"
  echo "   $name took $(( $(date +%s) - s ))s"
}
for step in "$@"; do
  case $step in
    train)        pk train_llama $W/train_llama.py ;;
    train_eager_attn) pk train_llama_eager_attn $W/train_llama.py --attn eager ;;
    gpt2)         pk train_gpt2 $W/train_gpt2.py ;;
    gpt2_pad)     pk train_gpt2_padded $W/train_gpt2.py --pad-vocab ;;
    gpt2_rec)     pk train_gpt2_rec --aten $W/train_gpt2.py --steps 8 ;;
    gpt2_pad_rec) pk train_gpt2_padded_rec --aten $W/train_gpt2.py --steps 8 --pad-vocab ;;
    train_rec_ncu) pk train_llama_rec_ncu --aten --ncu $W/train_llama.py --steps 6 ;;  # whole iteration
    train_fused)  pk train_llama_fused $W/train_llama.py --fused ;;
    train_compiled) pk train_llama_compiled $W/train_llama.py --compile --steps 16 ;;
    train_aten)   pk train_llama_aten --aten --aten-source emit_nvtx $W/train_llama.py --steps 8 ;;
    train_rec)    pk train_llama_rec --aten $W/train_llama.py --steps 8 ;;
    train_ncu)    pk train_llama_ncu --ncu --ncu-range ncu_iter --ncu-count 2000 $W/train_llama.py --steps 6 ;;
    train_ncu_auto) pk train_llama_ncu_auto --ncu $W/train_llama.py --steps 6 ;;  # one whole iteration, all threads
    train_kineto) echo "== train_kineto"; timeout "$(left)" python3 $W/train_llama.py \
                    --kineto "$out/traces/train_llama_kineto.json" > "$out/logs/train_kineto.log" 2>&1 \
                    && gzip -f "$out/traces/train_llama_kineto.json" ;;
    sync_ncu)     pk sync_loop_ncu --ncu --ncu-range ncu_iter --ncu-count 500 $W/sync_loop.py --steps 6 ;;
    cnn_ncu)      pk cnn_infer_ncu --ncu $W/cnn_infer.py --iters 6 ;;  # one whole iteration
    generate)     pk generate_llama $W/generate_llama.py ;;
    generate_static) pk generate_llama_static $W/generate_llama.py --static ;;
    generate_graphs) pk generate_llama_graphs $W/generate_llama.py --static --graphs ;;
    generate_fused) pk generate_llama_fused $W/generate_llama.py --fused auto ;;
    generate_rerun) pk generate_llama_rerun $W/generate_llama.py ;;
    generate_fused_rerun) pk generate_llama_fused_rerun $W/generate_llama.py --fused auto ;;
    loader)       pk loader_cnn $W/dataloader_cnn.py ;;
    loader_fixed) pk loader_cnn_workers $W/dataloader_cnn.py --workers 8 --pin ;;
    sync)         pk sync_loop $W/sync_loop.py ;;
    sync_fixed)   pk sync_loop_nosync $W/sync_loop.py --no-sync ;;
    cnn_metrics)  pk cnn_infer --nsys-args "--gpu-metrics-devices=0 --gpu-metrics-frequency=10000" \
                    $W/cnn_infer.py && python3 scripts/tools/trim_gpu_metrics.py "$out/traces/cnn_infer.sqlite" ;;
    cnn_compiled) pk cnn_infer_compiled $W/cnn_infer.py --compile --iters 20 ;;
    *) echo "unknown step $step" ;;
  esac
done
for t in "$out"/traces/*.sqlite; do
  [ -f "$t" ] || continue
  b=$(basename "$t" .sqlite)
  nsys stats -q -r nvtx_gpu_proj_sum,cuda_gpu_kern_sum --format csv -o "$out/logs/$b" "$t" >/dev/null 2>&1
done
rm -f "$out"/traces/*.nsys-rep "$out"/traces/*.ncu-rep
ls -la "$out"/traces

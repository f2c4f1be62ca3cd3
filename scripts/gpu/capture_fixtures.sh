#!/usr/bin/env bash
# Capture the micro-case traces and a small model on a GPU machine, with nsys's own reference
# numbers beside each (nsys stats and the nvtx_gpu_proj_sum recipe), plus an ncu raw CSV.
# Usage: scripts/gpu/capture_fixtures.sh OUTDIR   (needs nsys and ncu on PATH, torch with CUDA)
set -u
out=${1:?usage: capture_fixtures.sh OUTDIR}
mkdir -p "$out/traces" "$out/ref" "$out/ncu"
work=$(mktemp -d)
{
  date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  nsys --version; ncu --version | tail -1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} > "$out/env.txt" 2>&1

NSYS_FLAGS=(-t cuda,nvtx,cublas,cudnn -s none --cpuctxsw none --cuda-graph-trace=node --force-overwrite true)

capture() {  # name, command...
  local name=$1; shift
  echo "== capture $name: $*"
  local t0=$SECONDS
  nsys profile "${NSYS_FLAGS[@]}" -o "$work/$name" "$@" > "$out/ref/$name.log" 2>&1 || echo "nsys failed for $name"
  nsys export --type sqlite --force-overwrite true -o "$work/$name.sqlite" "$work/$name.nsys-rep" >> "$out/ref/$name.log" 2>&1
  cp "$work/$name.sqlite" "$out/traces/"
  for r in cuda_gpu_kern_sum cuda_gpu_mem_time_sum nvtx_sum nvtx_gpu_proj_sum nvtx_gpu_proj_trace nvtx_kern_sum; do
    nsys stats -q -r "$r" --format csv -o "$out/ref/$name" "$work/$name.sqlite" >> "$out/ref/$name.log" 2>&1 || echo "stats $r failed for $name"
  done
  nsys recipe nvtx_gpu_proj_sum --input "$work/$name.nsys-rep" --output "$work/${name}_recipe" --csv >> "$out/ref/$name.log" 2>&1 \
    && cp "$work/${name}_recipe"/*.csv "$out/ref/" 2>/dev/null && for f in "$work/${name}_recipe"/*.csv; do cp "$f" "$out/ref/${name}_recipe_$(basename "$f")"; done
  echo "   $name took $((SECONDS - t0)) s"
}

for c in gemm chain addnorm memcpy softmax graph hinted; do
  capture "micro_$c" python3 scripts/workloads/micro.py "$c"
done
capture model_tiny_llama_aten python3 scripts/workloads/tiny_llama.py --emit-nvtx --steps 2

echo "== ncu on addnorm + gemm"
t0=$SECONDS
ncu --clock-control none --nvtx -c 60 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section LaunchStats --section Occupancy --section SpeedOfLight_RooflineChart \
  --section SpeedOfLight_HierarchicalTensorRooflineChart \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,sm__sass_thread_inst_executed_op_fadd_pred_on.sum,sm__sass_thread_inst_executed_op_fmul_pred_on.sum,sm__sass_thread_inst_executed_op_ffma_pred_on.sum,sm__sass_thread_inst_executed_op_hadd_pred_on.sum,sm__sass_thread_inst_executed_op_hmul_pred_on.sum,sm__sass_thread_inst_executed_op_hfma_pred_on.sum,sm__sass_thread_inst_executed_op_dadd_pred_on.sum,sm__sass_thread_inst_executed_op_dmul_pred_on.sum,sm__sass_thread_inst_executed_op_dfma_pred_on.sum \
  -o "$work/ncu_addnorm_gemm" python3 scripts/workloads/micro.py addnorm gemm > "$out/ncu/ncu_run.log" 2>&1 || echo "ncu run failed"
ncu --import "$work/ncu_addnorm_gemm.ncu-rep" --csv --page raw > "$out/ncu/addnorm_gemm_raw.csv" 2>> "$out/ncu/ncu_run.log"
ncu --import "$work/ncu_addnorm_gemm.ncu-rep" --csv --page details > "$out/ncu/addnorm_gemm_details.csv" 2>> "$out/ncu/ncu_run.log"
echo "   ncu took $((SECONDS - t0)) s"
# the same workload under nsys, so the ncu rows can be matched to a trace
capture micro_addnorm_gemm python3 scripts/workloads/micro.py addnorm gemm
ncu --list-sections > "$out/ncu/sections.txt" 2>&1
ncu --query-metrics --chip gh100 > "$out/ncu/metrics_gh100.txt" 2>&1
ls -la "$out"/*

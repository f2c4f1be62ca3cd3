#!/usr/bin/env bash
# Capture a 2-GPU DistributedDataParallel training step, one Nsight Systems report per rank,
# export each to SQLite and keep nsys's own numbers beside them.
#   Usage: scripts/capture_ddp.sh OUTDIR [NPROC]   (nsys on PATH, torch with CUDA, >= NPROC GPUs)
# Writes OUTDIR/ddp2.tar.gz holding traces/ddp2/rank{R}.sqlite, tests/data/nsys_ref/ddp2_rank{R}_*.csv,
# env.txt and logs. NVLink multicast stays off in every process (inherited by torchrun's children).
set -u
out=${1:?usage: capture_ddp.sh OUTDIR [NPROC]}
nproc=${2:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/ddp
rm -rf "$work"; mkdir -p "$work/stage/traces/ddp2" "$work/stage/tests/data/nsys_ref" "$work/stage/logs" "$out"
stage=$work/stage
{
  date -u +%FT%TZ; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m
  nsys --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} > "$stage/logs/env.txt" 2>&1
cat "$stage/logs/env.txt"

t0=$SECONDS
# One nsys per rank: torchrun starts `nsys profile ... python3 ddp_step.py` with RANK set,
# and %q{RANK} names each report after its rank.
ddp_run() {  # extra args for ddp_step.py
  timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" --no-python \
    nsys profile -t cuda,nvtx -s none --cpuctxsw none --force-overwrite true \
    -o "$work/rank%q{RANK}" python3 scripts/workloads/ddp_step.py --steps 6 "$@" \
    >> "$stage/logs/torchrun.log" 2>&1
}
ddp_run; rc=$?
echo "torchrun rc=$rc in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then  # fall back to autograd's own threads
  echo "retrying with --threaded-backward"; rm -f "$work"/rank*.nsys-rep; ddp_run --threaded-backward
  echo "torchrun (threaded backward) rc=$? at $((SECONDS - t0)) s"
fi
tail -20 "$stage/logs/torchrun.log"

stats() {  # rank
  local r=$1
  nsys export --type sqlite --force-overwrite true -o "$work/rank$r.sqlite" "$work/rank$r.nsys-rep" > "$stage/logs/export$r.log" 2>&1
  nsys stats -q -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,nvtx_gpu_proj_sum,nvtx_sum --format csv \
    -o "$work/ddp2_rank$r" "$work/rank$r.sqlite" > "$stage/logs/stats$r.log" 2>&1 || echo "stats failed for rank $r"
}
for ((r = 0; r < nproc; r++)); do
  [ -f "$work/rank$r.nsys-rep" ] && stats $r &
done
wait
echo "exports and stats done at $((SECONDS - t0)) s"
for ((r = 0; r < nproc; r++)); do
  cp "$work/rank$r.sqlite" "$stage/traces/ddp2/rank$r.sqlite" 2>/dev/null || echo "no rank$r.sqlite"
  cp "$work"/ddp2_rank${r}_*.csv "$stage/tests/data/nsys_ref/" 2>/dev/null
done
ls -la "$stage"/traces/ddp2 "$stage"/tests/data/nsys_ref
tar -C "$stage" -czf "$out/ddp2.tar.gz" .
echo "capture_ddp: done in $((SECONDS - t0)) s"

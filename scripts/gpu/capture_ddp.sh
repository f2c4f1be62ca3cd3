#!/usr/bin/env bash
# Capture a 2-GPU DistributedDataParallel training step, one Nsight Systems report per rank,
# export each to SQLite and keep nsys's own numbers beside them; then the same step with the
# fix profkit advises for it (--no-sync: no per-step synchronisation), for the before/after pair.
#   Usage: scripts/gpu/capture_ddp.sh OUTDIR [NPROC]   (nsys on PATH, torch with CUDA, >= NPROC GPUs)
# Writes OUTDIR/ddp2.tar.gz holding traces/ddp2/rank{R}.sqlite (baseline),
# traces/ddp2_nosync/rank{R}.sqlite (the variant), tests/data/nsys_ref/ddp2_rank{R}_*.csv
# (baseline), env.txt and logs. NVLink multicast stays off in every process (inherited by
# torchrun's children). About 1.5 minutes on 2 H200s.
set -u
out=${1:?usage: capture_ddp.sh OUTDIR [NPROC]}
nproc=${2:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/ddp
rm -rf "$work"; mkdir -p "$work/stage/traces/ddp2" "$work/stage/traces/ddp2_nosync" \
  "$work/stage/tests/data/nsys_ref" "$work/stage/logs" "$work/nosync" "$out"
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
# 30 steps: with 6 (the committed traces/ddp2*) the five steady iterations gave 95% intervals of
# the median too wide for `profkit diff` to resolve a 10% change.
ddp_run() {  # DIR LOG [extra args for ddp_step.py]
  local dir=$1 log=$2; shift 2
  timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" --no-python \
    nsys profile -t cuda,nvtx -s none --cpuctxsw none --force-overwrite true \
    -o "$dir/rank%q{RANK}" python3 scripts/workloads/ddp_step.py --steps 30 "$@" \
    >> "$stage/logs/$log" 2>&1
}
threaded=()
ddp_run "$work" torchrun.log; rc=$?
echo "torchrun rc=$rc in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then  # fall back to autograd's own threads
  threaded=(--threaded-backward)
  echo "retrying with --threaded-backward"; rm -f "$work"/rank*.nsys-rep; ddp_run "$work" torchrun.log ${threaded[@]+"${threaded[@]}"}
  echo "torchrun (threaded backward) rc=$? at $((SECONDS - t0)) s"
fi
tail -20 "$stage/logs/torchrun.log"
# The variant: the same step without the per-step sync (same backward threading as the baseline).
ddp_run "$work/nosync" torchrun_nosync.log --no-sync ${threaded[@]+"${threaded[@]}"}
echo "torchrun --no-sync rc=$? at $((SECONDS - t0)) s"
tail -12 "$stage/logs/torchrun_nosync.log"

stats() {  # rank
  local r=$1
  nsys export --type sqlite --force-overwrite true -o "$work/rank$r.sqlite" "$work/rank$r.nsys-rep" > "$stage/logs/export$r.log" 2>&1
  nsys stats -q -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,nvtx_gpu_proj_sum,nvtx_sum --format csv \
    -o "$work/ddp2_rank$r" "$work/rank$r.sqlite" > "$stage/logs/stats$r.log" 2>&1 || echo "stats failed for rank $r"
}
for ((r = 0; r < nproc; r++)); do
  [ -f "$work/rank$r.nsys-rep" ] && stats $r &
  [ -f "$work/nosync/rank$r.nsys-rep" ] && nsys export --type sqlite --force-overwrite true \
    -o "$work/nosync/rank$r.sqlite" "$work/nosync/rank$r.nsys-rep" > "$stage/logs/export_nosync$r.log" 2>&1 &
done
wait
echo "exports and stats done at $((SECONDS - t0)) s"
for ((r = 0; r < nproc; r++)); do
  cp "$work/rank$r.sqlite" "$stage/traces/ddp2/rank$r.sqlite" 2>/dev/null || echo "no rank$r.sqlite"
  cp "$work"/ddp2_rank${r}_*.csv "$stage/tests/data/nsys_ref/" 2>/dev/null
  cp "$work/nosync/rank$r.sqlite" "$stage/traces/ddp2_nosync/rank$r.sqlite" 2>/dev/null || echo "no nosync rank$r.sqlite"
done
ls -la "$stage"/traces/ddp2 "$stage"/traces/ddp2_nosync "$stage"/tests/data/nsys_ref
tar -C "$stage" -czf "$out/ddp2.tar.gz" .
echo "capture_ddp: done in $((SECONDS - t0)) s"

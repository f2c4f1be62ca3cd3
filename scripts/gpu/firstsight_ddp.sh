#!/usr/bin/env bash
# On a machine with 2 GPUs, from the repository root: capture every data-parallel program of the
# what-if corpus (the registry's programs of several ranks: scripts/whatif/programs_firstsight_c.py)
# one Nsight Systems trace per rank, calibrated, then time each program's baseline and fixes
# interleaved in one job of its ranks, all within SECONDS.
#
#   scripts/gpu/firstsight_ddp.sh OUTDIR SECONDS      (nsys on PATH, torch with CUDA, >= 2 GPUs)
#
# 1. `whatif_accuracy.py capture-ranks OUTDIR` (scripts/whatif/ranks.py), with 55% of the time:
#    per program a calibration run without the profiler, then each rank under its own nsys,
#    exported to OUTDIR/traces/NAME/rank{R}.sqlite with its calibration in PROFKIT_META;
#    OUTDIR/captured.json says what each pass did.
# 2. `whatif_accuracy.py interleave OUTDIR --programs ...` with what is left: per rep and program
#    one torchrun job builds the baseline and every fix and times them in blocks that take turns
#    (scripts/workloads/_ddp.py); OUTDIR/measured.json and OUTDIR/calib/ in the format
#    `whatif_accuracy.py merge` takes. Reps that the time does not reach are listed as skipped.
#
# NVLink multicast stays off in every process. SECONDS=560 fits one 10-minute call: captures
# at most 5 minutes, then 2-3 interleaved reps of each program (about 2 minutes a rep of both).
# Afterwards (any machine): xz -9 each OUTDIR/traces/NAME/rankR.sqlite into
# traces/corpus/NAME/rankR.sqlite.xz, `whatif_accuracy.py merge OUTDIR/measured.json --folder
# LABEL`, commit; then `whatif_accuracy.py firstsight --programs NAMES`, commit; then `page`.
set -u
out=${1:?usage: firstsight_ddp.sh OUTDIR SECONDS}; budget=${2:?usage: firstsight_ddp.sh OUTDIR SECONDS}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$out/logs"
t0=$(date +%s)
{
  date -u +%FT%TZ; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m; nsys --version
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
names=$(python3 scripts/whatif_accuracy.py list --multirank | cut -f1 | paste -sd, -)
[ -n "$names" ] || { echo "no program of several ranks in the registry"; exit 1; }
echo "== programs: $names"
python3 scripts/whatif_accuracy.py capture-ranks "$out" --budget $(( budget * 55 / 100 ))
left=$(( budget - ($(date +%s) - t0) ))
echo "== captures done at $(( $(date +%s) - t0 ))s; ${left}s left for the timing"
python3 scripts/whatif_accuracy.py interleave "$out" --programs "$names" --reps 3 --budget "$left" --min-left 45
python3 scripts/whatif_accuracy.py table "$out/measured.json"
ls -la "$out"/traces/*/
echo "firstsight_ddp: done in $(( $(date +%s) - t0 ))s"

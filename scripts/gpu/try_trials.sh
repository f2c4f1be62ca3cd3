#!/usr/bin/env bash
# On the GPU machine, from the repository root (after `source .gpu/setup.sh`, which makes nsys
# usable there): `profkit capture --try` on one program, then `profkit classify` of its trace,
# as text and JSON, and the trace itself (xz) into OUTDIR.
#
#   scripts/gpu/try_trials.sh OUTDIR NAME TRY MAX_ITERATIONS SCRIPT [ARGS...]
#   scripts/gpu/try_trials.sh /tmp/out gpt2_fp32_train tf32,bf16,fused_optim 16 \
#       scripts/workloads/w_gpt2_fp32_train.py --steps 40
#
# TRY is what --try takes (auto, or switches separated by commas). The capture's own output goes
# to OUTDIR/NAME.capture.log; its last lines (the trials' results) are printed.
set -u
out=${1:?usage: try_trials.sh OUTDIR NAME TRY MAX_ITERATIONS SCRIPT [ARGS...]}
name=${2:?}; try=${3:?}; n=${4:?}; shift 4
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160}
s=$(date +%s)
python3 -m profkit capture --force --try="$try" --max-iterations "$n" -o "/tmp/$name.sqlite" "$@" \
  < /dev/null > "$out/$name.capture.log" 2>&1
echo "== capture of $name: exit status $?, $(( $(date +%s) - s )) s"
grep -E "^profkit: (\[|tried|--try|the profiled)" "$out/$name.capture.log" | tail -40
[ -f "/tmp/$name.sqlite" ] || exit 1
python3 -m profkit classify "/tmp/$name.sqlite" --top 5 > "$out/$name.classify.txt" 2>&1
sed -n '1,/^rules/p' "$out/$name.classify.txt"
python3 -m profkit classify "/tmp/$name.sqlite" --format json --top 5 > "$out/$name.json" 2>/dev/null
xz -T0 -6 -c "/tmp/$name.sqlite" > "$out/$name.sqlite.xz"
ls -la "$out"

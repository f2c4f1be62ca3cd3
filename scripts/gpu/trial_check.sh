#!/usr/bin/env bash
# On a GPU machine, from the repository root: recapture corpus programs with profkit's own trials
# of the switches named, one program at a time within SECONDS, so that the page's `tried` column
# can be set against the same fixes applied by hand. Each PAIR is NAME=SWITCHES (SWITCHES as
# --try takes them: tf32,bf16 or channels_last+bf16). Traces go to OUTDIR/traces, logs to
# OUTDIR/logs; with TRIAL_PACK=FILE.tar the traces (xz) and logs are packed after each program.
#
#   scripts/gpu/trial_check.sh OUTDIR SECONDS PER_PROGRAM pinn_burgers_train=tf32 ...
set -u
usage="usage: trial_check.sh OUTDIR SECONDS PER_PROGRAM NAME=SWITCHES..."
out=${1:?$usage}; budget=${2:?$usage}; per=${3:?$usage}; shift 3
deadline=$(( $(date +%s) + budget ))
mkdir -p "$out/traces" "$out/logs"
for pair in "$@"; do
  name=${pair%%=*}; try=${pair#*=}
  left=$(( deadline - $(date +%s) )); s=$(( left < per ? left : per ))
  [ "$s" -ge 40 ] || { echo "== skip $name ($left s left)"; continue; }
  PROFKIT_CAPTURE_EXTRA="--try $try --try-runs 1 --try-timeout 90 --try-budget $(( s / 2 )) --max-iterations 30" \
    bash scripts/gpu/corpus_capture.sh "$out" "$s" "$name"
  grep -E "^profkit: (tried|\[|--try)|alternat|work" "$out/logs/$name.log" | tail -12
  if [ -n "${TRIAL_PACK:-}" ] && [ -f "$out/traces/$name.sqlite" ]; then
    xz -T0 -6 -f "$out/traces/$name.sqlite"
    tar cf "$TRIAL_PACK" -C "$out" traces logs
  fi
done

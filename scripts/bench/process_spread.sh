#!/usr/bin/env bash
# How much a host-bound program's step time moves between processes, run one after another on
# one machine, free to use any CPU or pinned to the same few cores (taskset): each run times the
# program's baseline interleaved with one fix in its own process (w_*.py --interleave), and the
# baseline's median per process is printed.
#   scripts/bench/process_spread.sh RUNS CORES PROGRAM:FIX...
#   e.g. scripts/bench/process_spread.sh 6 2-5 w_vae_distributions_train:fused_adam
set -u
runs=$1 cores=$2; shift 2
cd "$(dirname "$0")/../workloads"
lscpu | grep -E "^CPU\(s\)|NUMA node|Model name|Thread\(s\)|Socket" || true
for spec in "$@"; do
  prog=${spec%%:*} fix=${spec#*:}
  for i in $(seq 1 "$runs"); do
    for mode in free pinned; do
      pre=""; [ "$mode" = pinned ] && pre="taskset -c $cores"
      out=/tmp/spread_${prog}_${mode}_$i.json
      $pre python "$prog.py" --interleave "$out" --variants "baseline,$fix" --rounds 5 >/dev/null 2>&1 || { echo "$prog $mode $i failed"; continue; }
      python - "$out" "$prog" "$mode" "$i" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))["variants"]
names = list(v)
b, f = v[names[0]]["median_ns"] / 1e6, v[names[1]]["median_ns"] / 1e6
print(f"{sys.argv[2]} {sys.argv[3]:6s} run {sys.argv[4]}: baseline {b:.3f} ms, {names[1]} {f:.3f} ms ({b / f:.3f}x in-process)")
PY
    done
  done
done

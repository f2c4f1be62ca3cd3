#!/usr/bin/env bash
# On a GPU machine, from the repository root: capture the baseline of every what-if corpus
# program (or only the NAMEs given) with `profkit capture`, within a time budget. A NAME of the
# form PROGRAM__FIX captures the program with that fix applied.
#
#   scripts/gpu/corpus_capture.sh OUTDIR SECONDS [NAME...]
#
# The programs and their baseline arguments come from the registry (scripts/whatif/registry.py),
# through scripts/whatif_accuracy.py (`list --capture`: name<TAB>profkit capture flags or -<TAB>script<TAB>args...). Traces go to
# OUTDIR/traces/NAME.sqlite, each capture's output to OUTDIR/logs/NAME.log, and nsys's NVTX and
# kernel summaries to OUTDIR/logs/NAME_*.csv. A capture never gets more time than is left.
# One GPU, one process: the programs of several ranks (DDP) are left out, and named, say so
# (scripts/gpu/firstsight_ddp.sh captures and times them on a machine with their GPUs).
# PROFKIT_CAPTURE_EXTRA: more `profkit capture` flags for every capture (scripts/gpu/firstsight.sh
# sets its trials' flags there).
set -u
out=${1:?usage: corpus_capture.sh OUTDIR SECONDS [NAME...]}; budget=${2:?usage: corpus_capture.sh OUTDIR SECONDS [NAME...]}
shift 2
deadline=$(( $(date +%s) + budget ))
mkdir -p "$out/traces" "$out/logs"
export PYTHONUNBUFFERED=1
left() { echo $(( deadline - $(date +%s) )); }
captured=()
read -r -a extra <<< "${PROFKIT_CAPTURE_EXTRA:-}"

python3 scripts/whatif_accuracy.py list --capture --fixed > "$out/programs.tsv" || { echo "cannot read the registry"; exit 1; }
# programs of several ranks (one GPU each) are not in that list: firstsight_ddp.sh captures them
python3 scripts/whatif_accuracy.py list --multirank | cut -f1 > "$out/multirank.txt"
for want in "$@"; do  # names asked for that the registry does not have
  if grep -qx -- "${want%%__*}" "$out/multirank.txt"; then
    echo "== $want runs as several ranks: scripts/gpu/firstsight_ddp.sh captures it"
  else
    cut -f1 "$out/programs.tsv" | grep -qx -- "$want" || echo "== unknown program $want"
  fi
done

while IFS=$'\t' read -r -a f <&3; do
  name=${f[0]}; flags=(); [ "${f[1]}" != "-" ] && read -r -a flags <<< "${f[1]}"
  script=${f[2]}; args=("${f[@]:3}")
  if [ $# -eq 0 ]; then
    case $name in *__*) continue ;; esac  # fixed programs only when asked for by name
  else
    hit=0; for want in "$@"; do [ "$want" = "$name" ] && hit=1; done
    [ $hit -eq 1 ] || continue
  fi
  t=$(left); [ "$t" -le 20 ] && { echo "== skip $name (no time left)"; continue; }
  echo "== $name ($(date -u +%T), ${t}s left): ${flags[*]} $script ${args[*]}"
  s=$(date +%s)
  # SIGINT at the limit, as Ctrl-C: trials cut short, the trace and what they measured kept
  timeout -s INT -k 30 "$t" python3 -m profkit capture --force "${flags[@]}" "${extra[@]}" -o "$out/traces/$name.sqlite" "$script" "${args[@]}" \
    < /dev/null > "$out/logs/$name.log" 2>&1 || echo "   $name failed: $(tail -3 "$out/logs/$name.log")"
  echo "   $name took $(( $(date +%s) - s ))s"
  captured+=("$name")
done 3< "$out/programs.tsv"

for b in "${captured[@]}"; do  # this call's traces only (a later call into OUTDIR may have trimmed others)
  t="$out/traces/$b.sqlite"
  [ -f "$t" ] || continue
  nsys stats -q -r nvtx_gpu_proj_sum,cuda_gpu_kern_sum --format csv -o "$out/logs/$b" "$t" >/dev/null 2>&1
done
rm -f "$out"/traces/*.nsys-rep
ls -la "$out"/traces

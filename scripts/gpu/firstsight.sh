#!/usr/bin/env bash
# On a GPU machine, from the repository root: the first sight of single-GPU what-if programs, in
# one call within SECONDS. For each NAME (default: every first-sight program of SET a or b that
# has no committed trace yet), `profkit capture` with its trials (`--try auto --max-iterations
# 30`) and the registry's capture arguments, then the baseline and every fix timed interleaved in
# one process, then each trace trimmed to the iterations the pages need and compressed.
#
#   scripts/gpu/firstsight.sh OUTDIR SECONDS a|b|NAME...
#
# Budget: 60% of SECONDS for the captures (scripts/gpu/corpus_capture.sh, each capture cut at
# what is left), the rest for `whatif_accuracy.py interleave --reps 1 --rounds 9`. What to bring
# back and commit, in this order:
#   OUTDIR/bring/NAME.sqlite.xz   -> traces/corpus/   (trimmed to 14 iterations of the step range)
#   OUTDIR/measured.json          -> `whatif_accuracy.py merge OUTDIR/measured.json --folder LABEL`
#   OUTDIR/logs/                  the captures' logs (the trials' seconds, the replacement timings)
# then, before any change, on a clean tree: `whatif_accuracy.py firstsight --programs NAMES` and
# commit its record; only then `whatif_accuracy.py page`.
set -u
usage="usage: firstsight.sh OUTDIR SECONDS a|b|NAME..."
out=${1:?$usage}; budget=${2:?$usage}; shift 2
[ $# -ge 1 ] || { echo "$usage"; exit 2; }
t0=$(date +%s)
mkdir -p "$out/bring" "$out/logs"
export PYTHONUNBUFFERED=1
names=$(python3 scripts/whatif_accuracy.py list --first-sight "$@") || exit 2
[ -n "$names" ] || { echo "firstsight: nothing to capture for: $*"; exit 0; }
echo "== programs: $names"
# shellcheck disable=SC2086
PROFKIT_CAPTURE_EXTRA="--try auto --max-iterations 30" \
  scripts/gpu/corpus_capture.sh "$out" $(( budget * 60 / 100 )) $names
left=$(( budget - ($(date +%s) - t0) - 30 ))
echo "== captures done at $(( $(date +%s) - t0 ))s; ${left}s left for the timing"
if [ "$left" -gt 60 ]; then
  python3 scripts/whatif_accuracy.py interleave "$out" --programs "$(echo $names | tr ' ' ',')" \
    --reps 1 --rounds 9 --budget "$left" --min-left 45
  python3 scripts/whatif_accuracy.py table "$out/measured.json"
fi
while IFS=$'\t' read -r name range; do
  f="$out/traces/$name.sqlite"
  [ -f "$f" ] || continue
  python3 scripts/tools/trim_tail.py "$f" "$range" 14 || echo "   $name: not trimmed (kept whole)"
  xz -T0 -9 -c "$f" > "$out/bring/$name.sqlite.xz"
done < <(python3 scripts/whatif_accuracy.py list --ranges --first-sight $names)
ls -la "$out/bring"
echo "firstsight: done in $(( $(date +%s) - t0 ))s"

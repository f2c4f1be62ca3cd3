#!/usr/bin/env bash
# On a GPU machine, from the repository root: the first sight of single-GPU what-if programs, in
# one call within SECONDS, one program at a time so that each finished program is whole. For
# each NAME (default: every first-sight program of SET a to z (no c) that has no committed trace yet):
# `profkit capture` with its trials (PROFKIT_CAPTURE_EXTRA, by default `--try auto --try-runs 1 --try-timeout 90
# --max-iterations 30`, and `--try-budget` half the capture's time unless it names one) and the
# registry's capture arguments; then the baseline and every fix
# timed interleaved in one process; then the trace trimmed to the iterations the pages need and
# compressed. With FIRSTSIGHT_PACK=FILE.tar, what to bring back is packed into FILE.tar.00 (.01,
# ... past 15 MB) after each program (a call cut short still returns the programs it finished).
#
#   scripts/gpu/firstsight.sh OUTDIR SECONDS a|b|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t|u|v|w|x|y|z|NAME...
#
# A program is started only when at least FIRSTSIGHT_MIN_LEFT seconds (default 150) are left;
# its capture gets at most 60% of what is left, its timing the rest; FIRSTSIGHT_CAPTURE_MAX and
# FIRSTSIGHT_TIMING_MAX (seconds) cap each, so that one slow program leaves time for the next. What to bring back and
# commit, in this order:
#   OUTDIR/bring/NAME.sqlite.xz   -> traces/corpus/   (trimmed to 14 iterations of the step range)
#   OUTDIR/measured.json          -> `whatif_accuracy.py merge OUTDIR/measured.json --folder LABEL`
#   OUTDIR/logs/                  the captures' logs (the trials' seconds, the replacement timings)
#   OUTDIR/calib/                 the interleaved blocks (`merge` reads them beside measured.json)
#   OUTDIR/apart/measured.json    a program the registry does not interleave: its variants' runs
#                                 of their own (merged as another folder)
# then, before any change, on a clean tree: `whatif_accuracy.py firstsight --programs NAMES` and
# commit its record; only then `whatif_accuracy.py page`.
set -u
usage="usage: firstsight.sh OUTDIR SECONDS a|b|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t|u|v|w|x|y|z|NAME..."
out=${1:?$usage}; budget=${2:?$usage}; shift 2
[ $# -ge 1 ] || { echo "$usage"; exit 2; }
t0=$(date +%s)
deadline=$(( t0 + budget ))
min_left=${FIRSTSIGHT_MIN_LEFT:-150}
# the timing of a program's fixes needs more than this many seconds (the interleaved process builds
# every variant, warms each up and runs its rounds); a cap at or under it would time nothing
min_timing=45
if [ -n "${FIRSTSIGHT_TIMING_MAX:-}" ] && [ "$FIRSTSIGHT_TIMING_MAX" -le "$min_timing" ]; then
  echo "firstsight: FIRSTSIGHT_TIMING_MAX=$FIRSTSIGHT_TIMING_MAX leaves no time to time a program's fixes: give more than $min_timing (seconds)"
  exit 2
fi
mkdir -p "$out/bring" "$out/logs"
export PYTHONUNBUFFERED=1
export PROFKIT_CAPTURE_EXTRA=${PROFKIT_CAPTURE_EXTRA:---try auto --try-runs 1 --try-timeout 90 --max-iterations 30}
names=$(python3 scripts/whatif_accuracy.py list --first-sight "$@") || exit 2
[ -n "$names" ] || { echo "firstsight: nothing to capture for: $*"; exit 0; }
echo "== programs: $names"
python3 scripts/whatif_accuracy.py list --ranges --first-sight $names > "$out/ranges.tsv"
interleaves() {  # whether the registry lets NAME's variants be timed side by side in one process
  python3 -c "import sys; sys.path.insert(0, 'scripts'); from whatif import registry; \
sys.exit(0 if registry.select('$1')[0].get('interleave') else 1)"
}
pack() {
  [ -n "${FIRSTSIGHT_PACK:-}" ] || return 0
  # calib/: the interleaved processes' blocks, which `whatif_accuracy.py merge` reads. In pieces
  # of 15 MB (FILE.tar.00, .01, ...: `cat FILE.tar.* | tar x`), for transfers that limit a file's size.
  tar -C "$out" -cf "$out/pack.tar" bring logs $( [ -d "$out/calib" ] && echo calib ) \
    $( [ -f "$out/measured.json" ] && echo measured.json ) $( [ -d "$out/apart" ] && echo apart ) || return 0
  rm -f "$FIRSTSIGHT_PACK".[0-9][0-9]
  split -b 15m -d "$out/pack.tar" "$FIRSTSIGHT_PACK."
}
for name in $names; do
  left=$(( deadline - $(date +%s) ))
  [ "$left" -ge "$min_left" ] || { echo "== $name: skipped (${left}s left)"; continue; }
  echo "== $name at $(( $(date +%s) - t0 ))s, ${left}s left"
  cap=$(( left * 60 / 100 ))
  [ -n "${FIRSTSIGHT_CAPTURE_MAX:-}" ] && [ "$FIRSTSIGHT_CAPTURE_MAX" -lt "$cap" ] && cap=$FIRSTSIGHT_CAPTURE_MAX
  # the trials within half the capture's share, so that they end on their own (a baseline run
  # beside them) rather than at its time limit
  case " $PROFKIT_CAPTURE_EXTRA " in
    *" --try-budget "*) extra=$PROFKIT_CAPTURE_EXTRA ;;
    *) extra="$PROFKIT_CAPTURE_EXTRA --try-budget $(( cap / 2 ))" ;;
  esac
  PROFKIT_CAPTURE_EXTRA=$extra scripts/gpu/corpus_capture.sh "$out" "$cap" "$name"
  left=$(( deadline - $(date +%s) - 10 ))
  [ -n "${FIRSTSIGHT_TIMING_MAX:-}" ] && [ "$FIRSTSIGHT_TIMING_MAX" -lt "$left" ] && left=$FIRSTSIGHT_TIMING_MAX
  f="$out/traces/$name.sqlite"
  # a program with no capture cannot be scored: its fixes are not timed
  if [ ! -f "$f" ]; then
    echo "   $name: no capture, fixes not timed"
  elif [ "$left" -gt "$min_timing" ] && interleaves "$name"; then
    python3 scripts/whatif_accuracy.py interleave "$out" --programs "$name" \
      --reps 1 --rounds 9 --budget "$left" --min-left 30
  elif [ "$left" -gt "$min_timing" ]; then
    # a program whose variants cannot share a process (cuDNN's benchmark cache, workers): each
    # variant in runs of its own, into a measured.json of their own (OUTDIR/apart)
    python3 scripts/whatif_accuracy.py measure "$out/apart" --programs "$name" \
      --reps 1 --budget "$left" --min-left 30
  else
    echo "   $name: fixes not timed (${left}s left, more than $min_timing needed)"
  fi
  if [ -f "$f" ]; then
    range=$(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$out/ranges.tsv")
    python3 scripts/tools/trim_tail.py "$f" "$range" 14 || echo "   $name: not trimmed (kept whole)"
    xz -T0 -9 -c "$f" > "$out/bring/$name.sqlite.xz"
  fi
  pack
done
[ -f "$out/measured.json" ] && python3 scripts/whatif_accuracy.py table "$out/measured.json"
ls -la "$out/bring"
echo "firstsight: done in $(( $(date +%s) - t0 ))s"

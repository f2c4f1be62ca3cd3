#!/usr/bin/env bash
# On a GPU machine, from the repository root: the captures that check the replacement timings
# against the program they stand for. Each NAME is a registry program (captured as the corpus
# captures it, with its calibration run and replacement timings) or PROGRAM__FIX (the program
# with that fix applied: no calibration, no replacements, only its kernels are read). Each
# trace is cut to 8 iterations of its step range and compressed into OUTDIR/bring.
#
#   scripts/gpu/replacement_check.sh OUTDIR SECONDS NAME...
#
# Then, here: `python scripts/whatif_accuracy.py replacements --add OUTDIR/bring`.
set -u
out=${1:?usage: replacement_check.sh OUTDIR SECONDS NAME...}; budget=${2:?usage}; shift 2
deadline=$(( $(date +%s) + budget ))
mkdir -p "$out/bring"
python3 scripts/whatif_accuracy.py list --ranges > "$out/ranges_all.tsv"
for name in "$@"; do
  left=$(( deadline - $(date +%s) ))
  [ "$left" -ge 40 ] || { echo "== $name: skipped (${left}s left)"; continue; }
  case $name in
    *__*) extra="--no-calibrate --no-replacements --max-iterations 12" ;;
    *) extra="--max-iterations 12" ;;
  esac
  PROFKIT_CAPTURE_EXTRA="$extra" scripts/gpu/corpus_capture.sh "$out" "$left" "$name"
  f="$out/traces/$name.sqlite"
  [ -f "$f" ] || continue
  range=$(awk -F'\t' -v n="${name%%__*}" '$1 == n {print $2}' "$out/ranges_all.tsv")
  python3 scripts/tools/trim_tail.py "$f" "$range" 8 || echo "   $name: not trimmed"
  xz -T0 -9 -c "$f" > "$out/bring/$name.sqlite.xz"
  ls -la "$out/bring/$name.sqlite.xz"
done
tar -C "$out" -cf "$out/pack.tar" bring logs

#!/usr/bin/env bash
# On a GPU machine with nsys: the aten recorder's overhead and a recorder capture of the Llama step.
# Usage: scripts/gpu/gpu_recorder_run.sh OUTDIR   (from the repository root; about 4 minutes)
# Writes OUTDIR/bench_recorder.{json,log}, OUTDIR/traces/train_llama_{rec,aten}.sqlite,
# OUTDIR/logs/*, OUTDIR/check_rec.log, OUTDIR/classify_rec_aten.txt, OUTDIR/classify_aten_aten.txt.
set -u
out=${1:?usage: gpu_recorder_run.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
echo "== bench ($(date -u +%T))"
timeout 150 python3 scripts/bench/bench_recorder.py --out "$out/bench_recorder.json" 2>&1 \
  | tee "$out/bench_recorder.log"
echo "== captures ($(date -u +%T))"
scripts/gpu/capture_real_programs.sh "$out" 200 train_rec train_aten
echo "== checks ($(date -u +%T))"
python3 scripts/tools/check_recorder_trace.py "$out/traces/train_llama_rec.sqlite" 2>&1 | tee "$out/check_rec.log"
for t in rec aten; do
  [ -f "$out/traces/train_llama_$t.sqlite" ] && python3 -m profkit classify \
    "$out/traces/train_llama_$t.sqlite" --by aten --top 20 > "$out/classify_${t}_aten.txt" 2>&1
done
ls -la "$out" "$out/traces"

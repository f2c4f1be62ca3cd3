#!/usr/bin/env python3
"""How often profkit's verdict without counters agrees with an ncu-derived truth.

    python scripts/pages/accuracy.py --remerge           # rewrite analyses/accuracy.md from traces/
    python scripts/pages/accuracy.py --remerge --check   # exit 1 when the committed page is stale
    python scripts/pages/accuracy.py [TRACE.sqlite ...] [-o PAGE.md]

Each trace must hold ncu counters (``PROFKIT_NCU_METRICS``, e.g. from ``profkit capture --ncu``,
ideally one whole iteration). For every kernel name with counters:

* **truth** (the rule): a kernel whose ncu duration is under TINY_KERNEL_FACTOR x the launch
  floor is ``launch``; otherwise its measured roofline position decides: memory use = ncu DRAM
  bytes / ncu duration / the bandwidth roof, compute use = ncu FLOPs (tensor + fp16/32/64
  instruction counts) / ncu duration / the roof of the counted precision; ``memory`` when
  memory use >= compute use, else ``compute``. (ncu's "SM throughput" is not used: it is the
  busiest SM sub-unit, load/store included, so memory-bound elementwise kernels read high.)
  A kernel name's truth is the GPU-time-weighted majority over its profiled launches.
* **prediction**: ``profkit classify --by kernel`` on the same trace with the counters hidden
  (what a user without an ncu pass sees: shapes are not available at kernel level, so this is
  the timeline/name/GPU-metrics path).

Reported per trace: class agreement by GPU time and by count (over kernel names with counters;
``unknown`` counts as a disagreement); at the aten level (traces captured with ``--aten``), the
ratio of profkit's shape-model bytes per call to ncu's DRAM bytes per call for ops with
counters, and the share of their steady-state GPU time (calls x median) within +-25%; and the number of rows above a roof at
every level (with counters visible). Nothing is estimated: traces without counters are skipped and said so.

``--remerge``: where ``STEM.ncu.csv`` (or ``STEM.ncu.csv.gz``, ``.xz``) lies beside ``STEM.sqlite``, merge it again into a temporary
copy with the current matcher (pairs that do not line up left out) before measuring, so traces
merged by an older profkit are judged on correctly paired counters.
"""
from __future__ import annotations

import argparse
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import profkit  # noqa: E402
from profkit.judge.classify import TINY_KERNEL_FACTOR  # noqa: E402
from profkit.read import aten_record  # noqa: E402
from profkit.judge import evidence as ev  # noqa: E402
from profkit.run.attribution import aten_key  # noqa: E402
from profkit.judge.dtypes import recorded_dtype  # noqa: E402
from profkit.errors import ProfkitError  # noqa: E402
from profkit.read.compressed import decompressed, find_traces, is_compressed, trace_stem  # noqa: E402
from profkit.read.ncu import read_ncu_metrics  # noqa: E402
from _page import write_or_check  # noqa: E402  (scripts/pages/)

# GEMM, convolution and attention ops: their element type decides the roof they are judged on.
TENSOR_OP_RE = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_?convolution|cudnn_convolution"
                          r"|_scaled_dot_product_\w+|_flash_attention\w*|_efficient_attention\w*)\b")
PCT_KEYS = ("pct_of_roof", "pct_of_memory_roof", "pct_of_compute_roof")


@dataclass
class TraceAccuracy:
    trace: str
    kernels: int = 0                  # kernel names compared
    gpu_ns: float = 0.0               # their GPU time
    agree_ns: float = 0.0
    agree_n: int = 0
    byte_ratios: list[float] = field(default_factory=list)
    bytes_ns: float = 0.0             # aten GPU time with both byte counts
    bytes_ok_ns: float = 0.0          # ... of it within +-25%
    truth: str = ""                   # hbm (DRAM reads + L2 stores) or dram (older captures)
    unmodelled: dict = field(default_factory=dict)  # aten op -> steady GPU ns without a byte model
    dtype_ops: list = field(default_factory=list)   # (GEMM/attention op, ncu precision, profkit's)
    off: dict = field(default_factory=dict)         # op key -> (model / truth, steady GPU ns)
    above_roof: int = 0
    confusion: dict = field(default_factory=dict)   # (truth, predicted) -> GPU ns
    coverage: float = 0.0             # share of the trace's kernel time with counters
    note: str = ""


def truth_by_kernel(prof, floor_ns: float) -> pd.DataFrame:
    """Per kernel name: truth class, ncu-time-weighted, and ncu DRAM bytes per launch."""
    acts = prof.trace.activities
    ncu = prof.trace.ncu
    m = acts.merge(ncu, left_on=["globalPid", "deviceId", "start"],
                   right_on=["globalPid", "deviceId", "kernel_start"], how="inner")
    if m.empty:
        return pd.DataFrame()
    t = m["gpu_time_ns"].where(m["gpu_time_ns"] > 0, (m["end"] - m["start"]).astype(float))
    dram_b = m["dram_bytes_read"].fillna(0) + m["dram_bytes_write"].fillna(0)
    if "l2_write_bytes" in m and m["l2_write_bytes"].notna().any():
        dram_b = ev.hbm_bytes(m)  # cold reads + every store (one fitting in L2 reaches DRAM later)
    peaks = prof.peaks
    mem_use = dram_b / t * 1e9 / peaks.memory_bandwidth
    comp_use = np.zeros(len(m))
    for col, prec in (("flops_fp64", "fp64"), ("flops_fp32", "fp32"), ("flops_fp16", "fp16")):
        comp_use += (m[col].fillna(0) / t * 1e9 / peaks.compute_peak(prec)[1]).to_numpy()
    tens_peak = m["tensor_precision"].map(lambda p: peaks.compute_peak(p if isinstance(p, str) else "bf16")[1])
    comp_use += (m["flops_tensor"].fillna(0) / t * 1e9 / tens_peak).to_numpy()
    cls = np.where(t < TINY_KERNEL_FACTOR * floor_ns, "launch",
                   np.where(mem_use.to_numpy() >= comp_use, "memory", "compute"))
    m = m.assign(t=t, truth=cls, dram_bytes=dram_b)
    rows = []
    for name, g in m.groupby("name", observed=True):
        w = g.groupby("truth")["t"].sum()
        rows.append({"name": name, "truth": w.idxmax(), "ncu_bytes": float(g["dram_bytes"].mean())})
    return pd.DataFrame(rows).set_index("name")


def model_bytes(prof, key: str, records: dict) -> Optional[float]:
    """The shape model's bytes per call of an aten op whose verdict did not use them (dropped
    for landing above a roof: the data came from L2 in the real run), from its record."""
    rec = records.get(key)
    dtype = recorded_dtype(rec) if rec is not None else None
    if dtype is None:
        return None
    w = ev.from_shapes(key, dtype, causal=rec.causal, record=rec)
    return w.bytes if w is not None else None


def count_above_roof(prof) -> int:
    n = 0
    for by in ("range", "kernel", "aten"):
        try:
            df = prof.ops(by=by)
        except ProfkitError:
            continue
        for _, row in df.iterrows():
            ev = row["evidence"]
            for k in PCT_KEYS:
                v = row["pct_of_roof"] if k == "pct_of_roof" else ev.get(k)
                if v is not None and v == v and v > 1.0:
                    n += 1
                    break
    return n


def remerged(path: Path, tmpdir: Path) -> tuple[Path, str]:
    """A copy of ``path`` with its sibling ncu CSV merged again (or ``path`` itself)."""
    import shutil

    from profkit.capture.ncu_merge import merge_ncu, read_meta
    plain_csv = path.with_name(trace_stem(path) + ".ncu.csv")
    csv = next((c for c in (plain_csv, plain_csv.with_name(plain_csv.name + ".gz"),
                            plain_csv.with_name(plain_csv.name + ".xz")) if c.exists()), None)
    if csv is None:
        return path, ""
    plain = decompressed(path) if is_compressed(path) else path
    copy = tmpdir / f"{trace_stem(path)}.sqlite"
    shutil.copyfile(plain, copy)
    meta = read_meta(plain)
    rng = meta.get("ncu_range") or None
    # a whole-iteration capture: only the nsys kernels of the profiled iteration are candidates
    win = meta.get("ncu_window", "")
    window = tuple(int(v) for v in win.split(",")) if win.count(",") == 1 else None
    res = merge_ncu(copy, csv, rng, window=window, allow_mismatch=True, force=True)  # re-paired on purpose
    return copy, res.summary()


def has_counters(path: Path) -> bool:
    """Whether the trace holds ncu counters, read from their table alone (most committed traces
    have none: loading each whole to find that out was most of this page's time)."""
    import sqlite3
    plain = decompressed(path) if is_compressed(path) else path
    conn = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
    try:
        return not read_ncu_metrics(conn).empty
    finally:
        conn.close()


def measure(path: Path, label: Optional[str] = None) -> TraceAccuracy:
    res = TraceAccuracy(label or str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
    if not has_counters(path):
        res.note = "no ncu counters: skipped"
        return res
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profkit.load(path, window="all", attribution="thread")  # counters may sit in set-up
        if prof.trace.ncu.empty:
            res.note = "no ncu counters: skipped"
            return res
        truth = truth_by_kernel(prof, prof.peaks.launch_floor_ns)
        a = prof.trace.activities
        k = a[a["kind"].astype(str) == "kernel"]
        hit = k.merge(prof.trace.ncu[["globalPid", "deviceId", "kernel_start"]],
                      left_on=["globalPid", "deviceId", "start"],
                      right_on=["globalPid", "deviceId", "kernel_start"], how="inner")
        total = float((k["end"] - k["start"]).sum())
        res.coverage = float((hit["end"] - hit["start"]).sum()) / total if total else 0.0
        res.above_roof = count_above_roof(prof)
        blind = profkit.load(path, window="all", attribution="thread")
        blind.trace.ncu = blind.trace.ncu.iloc[0:0]   # what profkit says without the counters
        pred = blind.ops(by="kernel")
        try:
            seen_aten, blind_aten = prof.ops(by="aten"), blind.ops(by="aten")
        except ProfkitError:
            seen_aten = blind_aten = None
    if seen_aten is not None:
        records = aten_record.records_by_key(prof.trace.ranges["name"], aten_key)
        for name, row in seen_aten.iterrows():
            ev = row["evidence"]
            ncu_b = ev.get("hbm_bytes_per_call") or ev.get("dram_bytes_per_call")
            if row["source"] != "ncu" or not ncu_b or name not in blind_aten.index:
                continue
            res.truth = "hbm" if ev.get("hbm_bytes_per_call") else "dram"
            # Steady-state time (calls x median): a first call's autotuning (cuDNN attention's
            # first call took 0.9 s in train_llama_rec_ncu) must not outweigh every other op.
            steady = float(row["count"]) * float(row["gpu_time_median_ns"])
            res.bytes_ns += steady
            if TENSOR_OP_RE.match(str(name)) and (ev.get("flops_per_call") or 0) > 0:
                # element type: the blind verdict's against ncu's tensor-pipe precision
                truth_p, pred_p = row.get("precision"), blind_aten.loc[name].get("precision")
                res.dtype_ops.append((str(name), truth_p, pred_p))
            b = blind_aten.loc[name]
            model_b = (b["evidence"].get("bytes_per_call") if b["source"] == "shapes"
                       else model_bytes(blind, str(name), records))
            if not model_b:
                op = str(name).split(" ", 1)[0]
                res.unmodelled[op] = res.unmodelled.get(op, 0.0) + steady
                continue  # no byte model for this op: a miss, not left out
            ratio = float(model_b) / float(ncu_b)
            res.byte_ratios.append(ratio)
            if 0.75 <= ratio <= 1.25:
                res.bytes_ok_ns += steady
            else:
                res.off[str(name)] = (ratio, steady)
    for name, t in truth.iterrows():
        if name not in pred.index:
            continue
        row = pred.loc[name]
        ns = float(row["gpu_time_ns"])
        ok = row["class"] == t["truth"]
        res.kernels += 1
        res.gpu_ns += ns
        res.agree_ns += ns if ok else 0.0
        res.agree_n += int(ok)
        key = (t["truth"], row["class"])
        res.confusion[key] = res.confusion.get(key, 0.0) + ns
    return res


def _dtype_cell(r: TraceAccuracy) -> str:
    if not r.dtype_ops:
        return "—"
    ok = sum(1 for _, t, p in r.dtype_ops if t == p)
    return f"{ok} of {len(r.dtype_ops)}"


def render(results: list[TraceAccuracy]) -> str:
    lines = ["# Accuracy against ncu counters", "",
             "Generated by `python scripts/pages/accuracy.py` (rule and method in its docstring) from the",
             "committed traces; the real programs were captured on an NVIDIA H200 on 2026-11-30. The truth",
             "per kernel name is its roofline position measured by ncu (DRAM bytes and FLOPs over ncu's",
             f"duration; launch below {TINY_KERNEL_FACTOR:g}x the launch floor); the prediction is",
             "`profkit classify --by kernel` on the same trace with the counters hidden. Only kernel",
             "names that ncu profiled are compared, so a trace with counters on part of a run says",
             "nothing about the rest: \"kernel time with counters\" is that part (a training step",
             "profiled with `--ncu-range` on the main thread has no counters on the backward kernels",
             "that autograd launches from its own thread; `profkit capture --ncu` without a range now",
             "profiles a whole iteration from every thread). Two traces hold counters on every kernel of",
             "one whole steady-state iteration (`*_ncu_auto`: the training step with forward, backward",
             "and optimizer, and the sync loop); the others cover part of an iteration only.", "",
             "Bytes: profkit's shape model (at the element types the aten recorder wrote down, in",
             "`train_llama_rec_ncu`: every kernel of one whole training step) against what ncu says",
             "reaches HBM per call: DRAM reads plus every store into L2",
             "(`lts__t_sectors_srcunit_tex_op_write`). ncu flushes L2 before each kernel, so its DRAM",
             "reads are cold; but a store smaller than the 60 MB L2 is written back after the kernel",
             "ends, so DRAM write counters miss it (DRAM bytes alone were 0.5x the model for most",
             "elementwise ops and GEMMs). Device copies and memsets of an op enter at their exact",
             "bytes. Weighted by steady-state time (calls x median); an op with no byte model counts",
             "as a miss. Traces captured before the L2 store counter was collected are judged on",
             "DRAM bytes (marked `dram`), which undercount stores. Off by more than 25% on",
             "`train_llama_rec_ncu`: the LM head's weight-gradient GEMM ([32000, 4096] x [4096, 1024],",
             "0.69x: its 262 MB operand is read more than once), cuDNN's attention backward (0.50x:",
             "its fp32 dQ accumulation goes through L2 atomics, which the store counter counts once",
             "per add), and small ops.", "",
             "| trace | kernel time with counters | kernel names | agreement by GPU time | by count | aten bytes / ncu bytes: median (ops) | aten GPU time within ±25% | byte truth | GEMM/attention element type right | rows above a roof |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in results:
        if r.note:
            lines.append(f"| {r.trace} | {r.note} | | | | | | | | |")
            continue
        by_t = r.agree_ns / r.gpu_ns if r.gpu_ns else float("nan")
        by_n = r.agree_n / r.kernels if r.kernels else float("nan")
        br = (f"{np.median(r.byte_ratios):.2f} ({len(r.byte_ratios)})" if r.byte_ratios else "—")
        within = f"{r.bytes_ok_ns / r.bytes_ns:.0%}" if r.bytes_ns else "—"
        lines.append(f"| {r.trace} | {r.coverage:.0%} | {r.kernels} | {by_t:.0%} | {by_n:.0%} | {br} | {within} | "
                     f"{r.truth or '—'} | {_dtype_cell(r)} | {r.above_roof} |")
    tot = sum(r.gpu_ns for r in results if not r.note)
    agree = sum(r.agree_ns for r in results if not r.note)
    if tot:
        lines += ["", f"Over the whole corpus (every compared kernel name, weighted by its GPU time): "
                      f"{agree / tot:.1%} class agreement."]
    bns = sum(r.bytes_ns for r in results if not r.note)
    if bns:
        ok = sum(r.bytes_ok_ns for r in results if not r.note)
        lines[-1] += (f" Aten byte model within ±25% of ncu: {ok / bns:.1%} of the steady-state GPU "
                      "time of the ops with counters (each trace against its own byte truth).")
    lines += ["", "Disagreements by GPU time (truth → predicted):", ""]
    for r in results:
        bad = {k: v for k, v in r.confusion.items() if k[0] != k[1]}
        if bad and r.gpu_ns:
            text = ", ".join(f"{a} → {b} {v / r.gpu_ns:.0%}" for (a, b), v in
                             sorted(bad.items(), key=lambda kv: -kv[1]))
            lines.append(f"- {r.trace}: {text}")
    return "\n".join(lines) + "\n"


def build(traces: Optional[list[Path]] = None, remerge: bool = False) -> tuple[str, list[TraceAccuracy]]:
    """The page for ``traces`` (default: every export under traces/) and every trace's result
    (those without counters carry a note). ``remerge``: pair each trace's counters again
    (:func:`remerged`) before measuring, as the committed page is made."""
    import tempfile

    traces = traces or find_traces(ROOT / "traces", recursive=True)
    results, merges = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for p in traces:
            label = str(p)
            p = p.resolve()
            if p.is_relative_to(ROOT):
                label = str(p.relative_to(ROOT))
            src, how = remerged(p, Path(tmp)) if remerge else (p, "")
            if how:
                merges.append(f"- {label}: {how}")
            results.append(measure(src, label))
    text = render([r for r in results if not r.note] or results)
    if merges:
        text += "\nCounters merged again with the current matcher (`--remerge`):\n\n" + "\n".join(merges) + "\n"
    return text, results


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=ROOT / "analyses" / "accuracy.md")
    ap.add_argument("--remerge", action="store_true",
                    help="merge each trace's sibling STEM.ncu.csv again with the current matcher "
                         "(the committed page is made this way)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the page at --out differs from a fresh run")
    args = ap.parse_args(argv)
    text, _ = build(args.traces, args.remerge)
    if not args.check:
        sys.stdout.write(text)
    return write_or_check({args.out: text}, args.check, command="python scripts/pages/accuracy.py --remerge")


if __name__ == "__main__":
    sys.exit(main())

"""Cross-check profkit's GPU idle share against Holistic Trace Analysis (HTA).

Two comparisons, both on the steady state (the iterations after the first):

1. Same events: the GPU activities of profkit's window in the Nsight Systems export are written
   as a Kineto trace and HTA's temporal breakdown runs on it. Any difference is in the
   arithmetic (union of busy intervals, span), not in the program.
2. Same program, other run: HTA on a torch.profiler (Kineto) trace of the same script, cut
   after the first optimizer step. torch.profiler records every CPU op, which slows a
   host-bound program, so this run's idle share differs for a real reason; the step times of
   both runs are printed beside it.

    pip install holistictraceanalysis
    python scripts/bench/hta_compare.py KINETO.json[.gz|.xz] NSYS.sqlite [--marker Optimizer.step]
"""
from __future__ import annotations

import argparse
import gzip
import json
import lzma
import tempfile
from pathlib import Path


def trim_kineto(src: Path, dst_dir: Path, marker: str) -> tuple[int, float]:
    """Keep GPU events that start after the first `marker` CPU op ends; returns (kept, cut_us)."""
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(src.suffix)
    with opener(src, "rt") if opener else open(src) as fh:
        trace = json.load(fh)
    events = trace["traceEvents"]
    marks = sorted(e["ts"] + e["dur"] for e in events
                   if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") and str(e.get("name", "")).startswith(marker))
    if not marks:
        raise SystemExit(f"no CPU op named {marker}* in {src}")
    cut = marks[0]
    gpu = {"kernel", "gpu_memcpy", "gpu_memset"}
    kept = [e for e in events if e.get("cat") not in gpu or e["ts"] >= cut]
    trace["traceEvents"] = kept
    trace.setdefault("distributedInfo", {"rank": 0})
    with gzip.open(dst_dir / "rank-0.json.gz", "wt") as fh:
        json.dump(trace, fh)
    return sum(1 for e in kept if e.get("cat") in gpu), cut


def nsys_as_kineto(prof, dst_dir: Path) -> int:
    """The window's GPU activities of a profkit Profile as a minimal Kineto trace for HTA."""
    acts = prof.full_trace.activities
    w = prof.window
    a = acts[(acts["end"] > w.start_ns) & (acts["start"] < w.end_ns)]
    cat = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
    events = []
    for r in a.itertuples(index=False):
        s, e = max(r.start, w.start_ns), min(r.end, w.end_ns)
        events.append({"ph": "X", "cat": cat[str(r.kind)], "name": r.name, "pid": int(r.deviceId),
                       "tid": int(r.streamId), "ts": s / 1e3, "dur": (e - s) / 1e3,
                       "args": {"device": int(r.deviceId), "stream": int(r.streamId),
                                "correlation": int(r.correlationId)}})
    trace = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}
    with gzip.open(dst_dir / "rank-0.json.gz", "wt") as fh:
        json.dump(trace, fh)
    return len(events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kineto")
    ap.add_argument("nsys")
    ap.add_argument("--marker", default="Optimizer.step")
    args = ap.parse_args()
    from hta.trace_analysis import TraceAnalysis  # optional: pip install holistictraceanalysis

    import profkit

    prof = profkit.load(args.nsys)
    run = prof.run()
    pk_idle = 100.0 * run.gpu_idle_fraction
    with tempfile.TemporaryDirectory() as tmp:
        n = nsys_as_kineto(prof, Path(tmp))
        same = TraceAnalysis(trace_dir=tmp).get_temporal_breakdown(visualize=False).iloc[0]
    with tempfile.TemporaryDirectory() as tmp:
        kept, cut = trim_kineto(Path(args.kineto), Path(tmp), args.marker)
        other = TraceAnalysis(trace_dir=tmp).get_temporal_breakdown(visualize=False).iloc[0]
    # HTA's span runs from the first to the last GPU op; profkit's is the window's wall time.
    span_idle = 100.0 * (1 - run.gpu_busy_ns / (same["kernel_time(us)"] * 1e3))
    print(f"profkit                 idle {pk_idle:.1f}% of {run.wall_time_ns / 1e6:.1f} ms wall "
          f"({run.window.source}); {span_idle:.1f}% of the span from first to last GPU op")
    print(f"HTA, same events        idle {same['idle_time_pctg']:.1f}% of "
          f"{same['kernel_time(us)'] / 1e3:.1f} ms ({n} GPU ops); difference "
          f"{abs(span_idle - same['idle_time_pctg']):.1f} points")
    print(f"HTA, torch.profiler run idle {other['idle_time_pctg']:.1f}% of "
          f"{other['kernel_time(us)'] / 1e3:.1f} ms ({kept} GPU ops after the first {args.marker}); "
          f"difference {abs(pk_idle - other['idle_time_pctg']):.1f} points")
    print(f"step time: nsys run {(run.window.iteration_median_ns or 0) / 1e6:.2f} ms (median); "
          f"torch.profiler run {other['kernel_time(us)'] / 1e3 / max(run.window.iterations, 1):.2f} ms "
          "(span / the same number of steps)")


if __name__ == "__main__":
    main()

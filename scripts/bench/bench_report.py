"""Benchmark `profkit report` (and the pictures) on a large trace: wall time, peak RSS, phases.

    python scripts/bench/bench_report.py                        # builds a 1M-kernel trace in a temp dir
    python scripts/bench/bench_report.py --trace /tmp/big.sqlite --runs 3 --out analyses/report_benchmark.md

Each run is `python -m profkit report TRACE -o DIR` in a fresh subprocess; its wall time and its
own peak RSS (os.wait4) are recorded and the median reported. Then the phases (load, ops, roofline,
timeline, HTML) are timed in this process through the library. The large trace is made by
scripts/tools/make_large_trace.py (a real trace repeated; the source is only read).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import bench_classify  # noqa: E402
import make_large_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO / "traces" / "micro_addnorm.sqlite.xz"
LIMIT_S = 30.0


def machine() -> dict[str, str]:
    import matplotlib
    return {**bench_classify.machine(), "matplotlib": matplotlib.__version__}


def run_cli(trace: Path, out: Path, by: str) -> tuple[float, float, float]:
    """One `profkit report` in a subprocess: (wall seconds, peak RSS MiB, CPU seconds user+sys)."""
    cmd = [sys.executable, "-m", "profkit", "report", str(trace), "-o", str(out), "--by", by]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"profkit report failed: {err}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def phases(trace: Path, out: Path, by: str) -> dict[str, float]:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import profkit
    from profkit.show import report
    from profkit.show.plots import roofline, timeline

    t = {}
    s = time.perf_counter()
    prof = profkit.load(trace)
    t["load trace"] = time.perf_counter() - s
    s = time.perf_counter()
    df = prof.ops(by=by)
    t[f"ops (--by {by})"] = time.perf_counter() - s
    s = time.perf_counter()
    report.summarize(prof, df, by)
    t["summary (gain plan)"] = time.perf_counter() - s
    s = time.perf_counter()
    report._png(roofline(prof, by=by, ops=df))
    t["roofline PNG"] = time.perf_counter() - s
    s = time.perf_counter()
    report._png(timeline(prof, by=by, ops=df))
    t["timeline PNG (whole trace)"] = time.perf_counter() - s
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, help="large trace to use (default: build one)")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace to repeat")
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--by", default="range", choices=["range", "kernel", "aten"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the result as Markdown here too")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="profkit-bench-report-") as tmp:
        tmpd = Path(tmp)
        trace = a.trace
        build_s = None
        if trace is None:
            trace = tmpd / "large.sqlite"
            s = time.perf_counter()
            counts = make_large_trace.build(a.source, trace, a.kernels)
            build_s = time.perf_counter() - s
            print(f"built {trace} ({counts['CUPTI_ACTIVITY_KIND_KERNEL']:,} kernels) in {build_s:.1f} s")
        runs = [run_cli(trace, tmpd / f"report{i}", a.by) for i in range(a.runs)]
        walls = [w for w, _, _ in runs]
        cpus = [c for _, _, c in runs]
        rss = max(r for _, r, _ in runs)
        load = os.getloadavg()
        size = (tmpd / "report0" / "index.html").stat().st_size
        ph = phases(trace, tmpd / "phases", a.by)
        import sqlite3
        conn = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
        n_k = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        n_r = conn.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
        conn.close()
    med = statistics.median(walls)
    lines = ["# `profkit report` on a 1M-kernel trace", ""]
    lines += [f"- {k}: {v}" for k, v in machine().items()]
    made = f"{a.source.name} repeated to" if a.trace is None else f"{a.trace.name}:"
    lines += [f"- trace: {made} {n_k:,} kernels, {n_r:,} NVTX events (scripts/tools/make_large_trace.py)",
              f"- command: `python -m profkit report TRACE -o DIR --by {a.by}` in a fresh process, {a.runs} runs",
              "", "| result | value |", "|---|---:|",
              f"| wall time, median | {med:.1f} s |",
              f"| wall time, runs | {', '.join(f'{w:.1f}' for w in walls)} s |",
              f"| CPU time (user+sys), median | {statistics.median(cpus):.1f} s |",
              f"| load average during the runs (1/5/15 min) | {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} |",
              f"| peak RSS | {rss:,.0f} MiB |",
              f"| index.html size | {size / 1024:,.0f} KiB |",
              f"| limit | {LIMIT_S:.0f} s: {'PASS' if med < LIMIT_S else 'FAIL'} |",
              "", "Phases, in one process (the rest of a CLI run is Python start-up and imports):", "",
              "| phase | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in ph.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
        print(f"wrote {a.out}")
    sys.exit(0 if med < LIMIT_S else 1)


if __name__ == "__main__":
    main()

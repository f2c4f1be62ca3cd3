"""Benchmark `profkit classify` on a large trace: wall time, peak RSS, and a per-phase breakdown.

    python scripts/bench/bench_classify.py                      # builds a 1M-kernel trace in a temp dir
    python scripts/bench/bench_classify.py --trace /tmp/big.sqlite --by kernel --out bench.md
    python scripts/bench/bench_classify.py --source traces/micro_addnorm.sqlite.xz --cprofile 25

Each run is `python -m profkit classify TRACE --by BY --format json -o /dev/null` in a fresh
subprocess; its wall time and its own peak RSS (from os.wait4) are recorded, and the median
is reported. Before each run, the bare fetch of the kernel/runtime join (JOIN_SQL: every
kernel with its launch call, fetched by Python's sqlite3 in a fresh subprocess) is timed the
same way: the machine is shared, so the ratio of the two medians, measured in the same run,
is the figure to compare (target: classify within 1.5x of the join). The phases are then timed
in this process through the library API.

To measure a modified copy of the package, run from outside the repository (the repository
root on sys.path would win) with PYTHONPATH pointing at the copy:
    cd /tmp && PYTHONPATH=/tmp/pk python /work/main/scripts/bench_classify.py --trace big.sqlite
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import os
import platform
import pstats
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import make_large_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# 23 kernels in 10 ranges per copy: 1M kernels come with 435k NVTX ranges (micro_chain: 50k).
DEFAULT_SOURCE = REPO / "traces" / "micro_addnorm.sqlite.xz"
T = TypeVar("T")
# The floor any reader of this trace pays: each kernel joined to its launch call, as rows.
JOIN_SQL = ("SELECT k.start, k.end, k.streamId, k.correlationId, r.start, r.end, r.globalTid "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r "
            "ON r.correlationId = k.correlationId")
JOIN_TARGET = 1.5


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy
    import pandas
    return {"date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "nproc": str(os.cpu_count()), "cpu": cpu, "python": platform.python_version(),
            "pandas": pandas.__version__, "numpy": numpy.__version__, "sqlite": sqlite3.sqlite_version}


def trace_counts(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)

    def one(sql: str) -> int:
        return conn.execute(sql).fetchone()[0]

    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    out = {"kernels": f"{one('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL'):,}"}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        out["runtime calls"] = f"{one('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME'):,}"
    if "NVTX_EVENTS" in tables:
        out["NVTX ranges"] = f"{one('SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59,60,70,71)'):,}"
    conn.close()
    out["file size"] = f"{path.stat().st_size / 2**20:.0f} MiB"
    return out


def run_cli(trace: Path, by: str) -> tuple[float, float, float]:
    """One `profkit classify` in a subprocess: (wall s, CPU s = user + sys, peak RSS MiB)."""
    cmd = [sys.executable, "-m", "profkit", "classify", str(trace), "--by", by,
           "--format", "json", "-o", os.devnull]
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # maxrss: KiB on Linux


def run_join(trace: Path) -> tuple[float, float]:
    """The bare fetch of JOIN_SQL in a fresh subprocess: (wall s, CPU s)."""
    code = ("import sqlite3, sys; from urllib.parse import quote; "
            "c = sqlite3.connect('file:' + quote(sys.argv[1]) + '?mode=ro&immutable=1', uri=True); "
            "rows = c.execute(sys.argv[2]).fetchall(); assert rows")
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(trace.resolve()), JOIN_SQL])
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"the join fetch failed on {trace}")
    return wall, usage.ru_utime + usage.ru_stime


def timed(label: str, phases: dict[str, tuple[float, float]], fn: Callable[[], T]) -> T:
    """Run ``fn``, recording (wall s, CPU s of this process) under ``label``."""
    t, c = time.perf_counter(), time.process_time()
    result = fn()
    phases[label] = (time.perf_counter() - t, time.process_time() - c)
    return result


def phase_breakdown(trace: Path, by: str) -> dict[str, tuple[float, float]]:
    """Time the steps of `classify --format json` in process, through the library API."""
    phases: dict[str, tuple[float, float]] = {}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import profkit.cli.classify"])
    usage = os.wait4(proc.pid, 0)[2]
    phases["python start + import profkit.cli (subprocess)"] = (
        time.perf_counter() - t, usage.ru_utime + usage.ru_stime)
    from profkit.show import render
    from profkit.api import load
    from profkit.run.ops import group_ops
    from profkit.run.attribution import activity_pairs
    from profkit.read.nsys import TraceReader

    reader = TraceReader(trace)
    timed("  TraceReader.activities()", phases, reader.activities)
    timed("  TraceReader.nvtx_ranges()", phases, reader.nvtx_ranges)
    reader.close()
    prof = timed("profkit.load(): Trace(path) + peaks + precision", phases, lambda: load(trace))
    if by in ("range", "aten"):
        timed("activity_pairs() (NVTX projection, cached; reads NVTX first if lazy)", phases,
              lambda: activity_pairs(prof.trace, by, by == "aten"))
    timed("group_ops()", phases, lambda: group_ops(prof.trace, by=by))
    timed("Profile.ops()", phases, lambda: prof.ops(by=by))
    timed("Profile.report() + render.to_json() (the op table kept from ops())", phases,
          lambda: render.to_json(prof.report(by=by)))
    return phases


def cprofile_top(trace: Path, by: str, top: int) -> str:
    """cProfile of load + ops + report, as the CLI runs them; top functions by own time."""
    from profkit.show import render
    from profkit.api import load
    pr = cProfile.Profile()
    pr.enable()
    prof = load(trace)
    prof.ops(by=by)
    render.to_json(prof.report(by=by))
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def table(rows: dict[str, str], head: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    lines += [f"| {k} | {v} |" for k, v in rows.items()]
    return "\n".join(lines)


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, help="trace to classify (default: build one)")
    ap.add_argument("--by", default="range", choices=["range", "kernel", "aten"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace to repeat")
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--no-phases", action="store_true", help="skip the in-process breakdown")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="print cProfile top N")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        trace = a.trace
        build_s = None
        if trace is None:
            trace = Path(tmp) / "large.sqlite"
            t = time.perf_counter()
            make_large_trace.build(a.source, trace, a.kernels)
            build_s = time.perf_counter() - t
        load_before = load_avg()
        joins, runs = [], []
        for _ in range(a.runs):  # alternated, so that both see the same load
            joins.append(run_join(trace))
            runs.append(run_cli(trace, a.by))
        walls, cpus, rss = ([r[i] for r in runs] for i in range(3))
        join_walls, join_cpus = [j[0] for j in joins], [j[1] for j in joins]
        ratio = statistics.median(walls) / statistics.median(join_walls)
        info = {**machine(), "trace": str(a.trace) if a.trace else f"{a.source.name} x N (temp)",
                **trace_counts(trace)}
        if build_s is not None:
            info["trace build time"] = f"{build_s:.1f} s"
        results = {"command": f"`python -m profkit classify TRACE --by {a.by} --format json -o /dev/null`",
                   "runs": str(a.runs),
                   "wall time, median": f"{statistics.median(walls):.2f} s",
                   "wall times": ", ".join(f"{w:.2f}" for w in walls) + " s",
                   "bare join fetch, median (same run)": f"{statistics.median(join_walls):.2f} s",
                   "bare join fetch times": ", ".join(f"{w:.2f}" for w in join_walls) + " s",
                   "classify / join (medians)": f"{ratio:.2f}x",
                   "CPU time (user+sys), median": f"{statistics.median(cpus):.2f} s",
                   "join CPU time, median; CPU ratio": (
                       f"{statistics.median(join_cpus):.2f} s; "
                       f"{statistics.median(cpus) / statistics.median(join_cpus):.2f}x"),
                   "load average (1/5/15 min) before, after": f"{load_before}; {load_avg()}",
                   "peak RSS, median": f"{statistics.median(rss):.0f} MiB",
                   "peak RSS, max": f"{max(rss):.0f} MiB",
                   "target": f"within {JOIN_TARGET}x of the join, < 1 GB"}
        md = [f"## profkit classify --by {a.by}", "", table(info, ("setup", "value")), "",
              table(results, ("result", "value")), "",
              f"The bare join: `{JOIN_SQL}`, `fetchall()` in a fresh `python -c`."]
        if not a.no_phases:
            phases = phase_breakdown(trace, a.by)
            md += ["", table({k: f"{w:.2f} s | {c:.2f} s" for k, (w, c) in phases.items()},
                             ("phase (in process)", "wall", "CPU"))]
        text = "\n".join(md) + "\n"
        print(text)
        if a.out:
            a.out.write_text(text)
        if a.cprofile:
            print(cprofile_top(trace, a.by, a.cprofile))


if __name__ == "__main__":
    main()

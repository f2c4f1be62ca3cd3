"""Benchmark `profkit classify` on two 1M-kernel traces against the bare kernel/runtime joins.

    python scripts/bench/bench_classify.py --out analyses/classify_benchmark_run.md
    python scripts/bench/bench_classify.py --dir /tmp/bench --runs 7      # keeps the traces built there
    python scripts/bench/bench_classify.py --trace /tmp/big.sqlite --by kernel --cprofile 25

Two traces, each built by scripts/tools/make_large_trace.py from a committed real capture (the
capture is only read; every timestamp of kernels, runtime calls, NVTX events, copies, memsets
and synchronizations shifted, correlation ids kept unique):

- ``repeated``: traces/real/train_gpt2.sqlite.xz (a 4-layer GPT-2 training run, 12 steps: 5,029
  kernels, 14,058 runtime calls) repeated 200 times in time, 1,005,800 kernels: a few hundred
  long copies, as a capture of a long run is; its steady-state window holds almost all of them.
- ``tiled``: traces/micro_addnorm.sqlite.xz (the add + RMSNorm micro-benchmark, 23 kernels)
  repeated until it holds a million kernels (43,479 copies): 435k NVTX ranges, a short window.

The package is byte-compiled first (``compiled_package``), as an installed copy is. Each
measurement runs in a fresh subprocess, its wall time and own peak RSS (os.wait4) kept:
`python -m profkit classify TRACE --by BY --format json -o /dev/null` (the command line as a
user runs it, imports included) and two bare fetches of the kernel/runtime join by Python's
sqlite3 (JOINS: the 4 columns of each kernel's and its launch call's times, and 7 columns with
the stream and the thread). The machine is shared: every repetition runs the joins and classify
of both traces back to back (interleaved), and the figure kept is the ratio of the medians of
one run, with each repetition's own ratio beside it. Where `nsys` is on the PATH, `nsys stats
--report cuda_gpu_kern_sum` on the same trace is timed the same way. The phases are then timed
in this process through the library API.

To measure a modified copy of the package, run from outside the repository (the repository
root on sys.path would win) with PYTHONPATH pointing at the copy:
    cd /tmp && PYTHONPATH=/tmp/pk python /path/to/repo/scripts/bench/bench_classify.py --dir /tmp/bench
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import make_large_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
# The traces: (source, copies or None, kernels wanted when copies is None).
TRACES = {
    "repeated": (REPO / "traces" / "real" / "train_gpt2.sqlite.xz", 200, None),
    "tiled": (REPO / "traces" / "micro_addnorm.sqlite.xz", None, 1_000_000),
}
# The floor any reader of the trace pays: each kernel joined to its launch call, as rows.
_JOIN = ("FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r "
         "ON r.correlationId = k.correlationId")
JOINS = {
    "join4": f"SELECT k.start, k.end, r.start, r.end {_JOIN}",
    "join7": f"SELECT k.start, k.end, k.streamId, k.correlationId, r.start, r.end, r.globalTid {_JOIN}",
}
JOIN_TARGET = 1.5
RSS_TARGET_MIB = 1000
# `nsys stats --report cuda_gpu_kern_sum` on the repeated trace, measured before this benchmark
# had both traces (on a machine with nsys; not re-measured where nsys is missing).
NSYS_EARLIER = "3.98 s, 288 MB"


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
    for label, table in (("memcpys", "CUPTI_ACTIVITY_KIND_MEMCPY"), ("memsets", "CUPTI_ACTIVITY_KIND_MEMSET")):
        if table in tables:
            out[label] = f"{one(f'SELECT count(*) FROM {table}'):,}"
    conn.close()
    out["file size"] = f"{path.stat().st_size / 2**20:.0f} MiB"
    return out


def timed_run(cmd: list[str]) -> tuple[float, float, float]:
    """``cmd`` in a subprocess: (wall s, CPU s = user + sys, peak RSS MiB); exits on failure."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            sys.exit(f"{' '.join(cmd[:6])} failed: {err.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # maxrss: KiB on Linux


def classify_cmd(trace: Path, by: str) -> list[str]:
    return [sys.executable, "-m", "profkit", "classify", str(trace), "--by", by,
            "--format", "json", "-o", os.devnull]


def join_cmd(trace: Path, sql: str) -> list[str]:
    """The bare fetch of ``sql`` in a fresh `python -c`."""
    code = ("import sqlite3, sys; from urllib.parse import quote; "
            "c = sqlite3.connect('file:' + quote(sys.argv[1]) + '?mode=ro&immutable=1', uri=True); "
            "rows = c.execute(sys.argv[2]).fetchall(); assert rows")
    return [sys.executable, "-c", code, str(trace.resolve()), sql]


def nsys_cmd(trace: Path) -> Optional[list[str]]:
    nsys = shutil.which("nsys")
    return None if nsys is None else [nsys, "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv",
                                      "--force-export", "false", str(trace)]


def timed(label: str, phases: dict[str, tuple[float, float]], fn: Callable[[], T]) -> T:
    """Run ``fn``, recording (wall s, CPU s of this thread) under ``label``."""
    t, c = time.perf_counter(), time.thread_time()
    result = fn()
    phases[label] = (time.perf_counter() - t, time.thread_time() - c)
    return result


def phase_breakdown(trace: Path, by: str) -> dict[str, tuple[float, float]]:
    """Time the steps of `classify --format json` in process, through the library API."""
    phases: dict[str, tuple[float, float]] = {}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import profkit.cli.classify, profkit.api"])
    usage = os.wait4(proc.pid, 0)[2]
    phases["python start + imports (subprocess)"] = (time.perf_counter() - t, usage.ru_utime + usage.ru_stime)
    from profkit.show import render
    from profkit.api import load
    prof = timed("profkit.load(): read, window, peaks", phases, lambda: load(trace))
    timed("Profile.run(): run summary, step model, rules", phases, prof.run)
    df = timed("Profile.ops(): op table", phases, lambda: prof.ops(by=by))
    timed("Profile.report() + render.to_json()", phases, lambda: render.to_json(prof.report(by=by, ops=df)))
    return phases


def cprofile_top(trace: Path, by: str, top: int) -> str:
    """cProfile of load + ops + report, as the CLI runs them; top functions by own time."""
    from profkit.show import render
    from profkit.api import load
    pr = cProfile.Profile()
    pr.enable()
    prof = load(trace)
    df = prof.ops(by=by)
    render.to_json(prof.report(by=by, ops=df))
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def table(rows: list[list[str]], head: list[str]) -> str:
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def build_traces(where: Path, names: list[str]) -> dict[str, tuple[Path, str]]:
    """Each named trace, built in ``where`` unless already there: (path, how it was made)."""
    out = {}
    for name in names:
        src, copies, kernels = TRACES[name]
        path = where / f"{name}.sqlite"
        how = (f"`{src.relative_to(REPO)}` x {copies} (make_large_trace.py --copies {copies})" if copies else
               f"`{src.relative_to(REPO)}` to {kernels:,} kernels (make_large_trace.py --kernels {kernels})")
        if not path.exists():
            t = time.perf_counter()
            make_large_trace.build(src, path, kernels or 0, copies=copies)
            how += f", built in {time.perf_counter() - t:.0f} s"
        out[name] = (path, how)
    return out


def measure(traces: dict[str, tuple[Path, str]], by: str, runs: int) -> dict[str, dict[str, list]]:
    """Per trace, per command: [(wall, cpu, rss)] over ``runs`` interleaved repetitions."""
    res: dict[str, dict[str, list]] = {name: {} for name in traces}
    for _ in range(runs):
        for name, (path, _) in traces.items():
            cmds = {j: join_cmd(path, sql) for j, sql in JOINS.items()}
            cmds["classify"] = classify_cmd(path, by)
            if nsys_cmd(path):
                cmds["nsys"] = nsys_cmd(path)
            for label, cmd in cmds.items():
                res[name].setdefault(label, []).append(timed_run(cmd))
    return res


def report(traces: dict[str, tuple[Path, str]], res: dict, by: str, runs: int, loads: tuple[str, str]) -> str:
    med = lambda xs, i=0: statistics.median(x[i] for x in xs)  # noqa: E731
    summary, detail = [], []
    for name, (path, how) in traces.items():
        r = res[name]
        c = r["classify"]
        ratios = {j: [a[0] / b[0] for a, b in zip(c, r[j])] for j in JOINS}
        ok = all(med(c) / med(r[j]) <= JOIN_TARGET for j in JOINS) and max(x[2] for x in c) < RSS_TARGET_MIB
        nsys = (f"{med(r['nsys']):.2f} s, {max(x[2] for x in r['nsys']):.0f} MiB" if "nsys" in r else
                f"not on this machine (earlier: {NSYS_EARLIER})" if name == "repeated" else "not on this machine")
        summary.append([name, trace_counts(path)["kernels"], f"{med(c):.2f} s",
                        f"{med(r['join4']):.2f} s", f"**{med(c) / med(r['join4']):.2f}x**",
                        f"{med(r['join7']):.2f} s", f"**{med(c) / med(r['join7']):.2f}x**",
                        f"{max(x[2] for x in c):.0f} MiB", nsys, "met" if ok else "missed"])
        counts = trace_counts(path)
        detail.append(f"**{name}**: {how}; " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ".")
        detail.append(f"classify wall {', '.join(f'{x[0]:.2f}' for x in c)} s (CPU median {med(c, 1):.2f} s, "
                      f"peak RSS {', '.join(f'{x[2]:.0f}' for x in c)} MiB); "
                      + "; ".join(f"{j} {', '.join(f'{x[0]:.2f}' for x in r[j])} s (CPU median {med(r[j], 1):.2f} s), "
                                  f"per repetition {min(ratios[j]):.2f}-{max(ratios[j]):.2f}x" for j in JOINS) + ".")
        detail.append("")
    head = ["trace", "kernels", "classify (median)", "join4 (median)", "classify / join4",
            "join7 (median)", "classify / join7", "peak RSS (max)", "nsys stats cuda_gpu_kern_sum",
            f"target (<= {JOIN_TARGET}x each join, < 1 GB)"]
    info = machine()
    lines = [f"## profkit classify --by {by}: {runs} interleaved repetitions", "",
             f"{info['date (UTC)']} UTC; {info['nproc']} cores ({info['cpu']}); Python {info['python']}, "
             f"pandas {info['pandas']}, numpy {info['numpy']}, SQLite {info['sqlite']}; load average "
             f"(1/5/15 min) {loads[0]} before, {loads[1]} after.", "",
             table(summary, head), "", *detail,
             f"Command: `python -m profkit classify TRACE --by {by} --format json -o /dev/null`. "
             f"join4: `{JOINS['join4']}`; join7: `{JOINS['join7']}`; each `fetchall()` in a fresh `python -c`."]
    return "\n".join(lines) + "\n"


def compiled_package() -> None:
    """profkit byte-compiled, as ``pip install`` leaves it: where PYTHONDONTWRITEBYTECODE is set
    (as on the development machine), nothing else writes the .pyc files, and every classify run
    would compile 80-odd modules again (0.2 s of 3 s on the repeated trace), a cost no installed
    copy pays."""
    import compileall
    if not compileall.compile_dir(str(REPO / "profkit"), quiet=1):
        sys.exit("profkit could not be byte-compiled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, help="measure this trace alone (instead of building both)")
    ap.add_argument("--only", choices=sorted(TRACES), action="append", help="build and measure this one")
    ap.add_argument("--dir", type=Path, help="build the traces here, and reuse them when there")
    ap.add_argument("--by", default="range", choices=["range", "kernel", "aten"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--phases", action="store_true", help="also time the phases in process")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="print cProfile top N")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if a.trace is not None:
            traces = {a.trace.name: (a.trace, str(a.trace))}
        else:
            where = a.dir or Path(tmp)
            where.mkdir(parents=True, exist_ok=True)
            traces = build_traces(where, a.only or list(TRACES))
        compiled_package()
        before = load_avg()
        res = measure(traces, a.by, a.runs)
        text = report(traces, res, a.by, a.runs, (before, load_avg()))
        for name, (path, _) in traces.items() if a.phases else ():
            ph = phase_breakdown(path, a.by)
            text += "\n" + table([[k, f"{w:.2f} s", f"{c:.2f} s"] for k, (w, c) in ph.items()],
                                 [f"phase, {name} (in process)", "wall", "CPU (this thread)"]) + "\n"
        print(text)
        if a.out:
            a.out.write_text(text)
        for name, (path, _) in traces.items() if a.cprofile else ():
            print(f"== {name}\n" + cprofile_top(path, a.by, a.cprofile))


if __name__ == "__main__":
    main()

"""Benchmark the merged multi-rank classify: wall time and peak memory, local processes vs Dask.

    python scripts/bench/bench_multirank.py --ranks 64 --kernels 100000 --workdir /tmp/profkit_bench

Makes RANKS rank traces of about KERNELS kernels each from the real 2-GPU DDP capture
(traces/ddp2/rank{0,1}.sqlite, repeated in time by scripts/tools/make_large_trace.py: the real nsys
schema, launches still linked to their kernels), rank r a copy of the base built from rank r % 2.
One rank (--straggler) gets its non-NCCL kernels stretched by 25% so the merge has a straggler
to find. Then runs ``profkit.compare.multirank.classify_ranks`` on the first N ranks for each N in
--scales, with local worker processes and with a local Dask cluster (LocalCluster, one thread
per worker process), and reports wall time and peak resident memory (this process plus all its
child processes, summed, sampled every 50 ms with psutil), with the 1-minute load average before
and after each run (other jobs on the machine slow it down). Prints a Markdown table and writes
--json. psutil is a dependency of distributed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sqlite3
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from profkit.compare.multirank import classify_ranks  # noqa: E402


def _load_make_large():
    spec = importlib.util.spec_from_file_location("make_large_trace", ROOT / "scripts" / "tools" / "make_large_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def build_ranks(workdir: Path, ranks: int, kernels: int, straggler: int) -> list[Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    mk = _load_make_large()
    bases = []
    for b in (0, 1):
        out = workdir / f"base{b}.sqlite"
        if not out.exists():
            t = time.perf_counter()
            counts = mk.build(ROOT / "traces" / "ddp2" / f"rank{b}.sqlite.xz", out, kernels)
            print(f"built {out.name}: {counts['CUPTI_ACTIVITY_KIND_KERNEL']:,} kernels, "
                  f"{out.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s", flush=True)
        bases.append(out)
    rdir = workdir / "ranks"
    rdir.mkdir(exist_ok=True)
    paths = []
    for r in range(ranks):
        p = rdir / f"rank{r}.sqlite"
        if not p.exists():
            shutil.copyfile(bases[r % 2], p)
            if r == straggler:
                con = sqlite3.connect(p)
                con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = start + "
                            "CAST((\"end\" - start) * 1.25 AS INTEGER) WHERE demangledName NOT IN "
                            "(SELECT id FROM StringIds WHERE value LIKE 'nccl%')")
                con.commit()
                con.close()
        paths.append(p)
    return paths


class PeakRss:
    """Peak of (this process + all descendants) resident memory, sampled in a thread."""

    def __init__(self, every: float = 0.05) -> None:
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self.me = psutil.Process()

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.me] + self.me.children(recursive=True)
            except psutil.Error:
                procs = [self.me]
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def __enter__(self):
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def run_one(paths: list[Path], mode: str, workers: int) -> dict:
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    with PeakRss() as mem:
        res = classify_ranks(paths, by="range", workers=workers,
                             dask="local" if mode == "dask" else None)
    wall = time.perf_counter() - t
    per_rank = [r.analysis_s for r in res.good]
    strag = sorted({s["rank"] for s in res.stragglers if s["metric"] == "compute_busy"})
    return {"mode": mode, "ranks": len(paths), "workers": workers, "wall_s": round(wall, 2),
            "peak_rss_mb": round(mem.peak / 1e6), "ranks_ok": len(res.good),
            "rank_analysis_median_s": round(sorted(per_rank)[len(per_rank) // 2], 2) if per_rank else None,
            "ops": len(res.ops), "compute_stragglers": strag,
            "load_avg_1min": [round(load0, 1), round(os.getloadavg()[0], 1)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--kernels", type=int, default=100_000, help="kernels per rank trace (about)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/profkit_bench"))
    ap.add_argument("--scales", default="8,16,32,64", help="rank counts to time (local processes)")
    ap.add_argument("--dask-scales", default="8,64", help="rank counts to time on a LocalCluster")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--straggler", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    paths = build_ranks(a.workdir, a.ranks, a.kernels, a.straggler)
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} rank traces, {size / 1e9:.2f} GB in all", flush=True)
    runs = []
    plan = [("processes", int(n)) for n in a.scales.split(",") if n] + \
           [("dask", int(n)) for n in a.dask_scales.split(",") if n]
    for mode, n in plan:
        r = run_one(paths[:n], mode, a.workers)
        print(json.dumps(r), flush=True)
        runs.append(r)
    env = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
                      f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM",
           "python": platform.python_version(), "kernels_per_rank": a.kernels,
           "trace_mb_per_rank": round(paths[0].stat().st_size / 1e6)}
    print("\n| mode | ranks | workers | wall (s) | s per rank | peak RSS (MB) | compute stragglers |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in runs:
        print(f"| {r['mode']} | {r['ranks']} | {r['workers']} | {r['wall_s']} | "
              f"{r['wall_s'] / r['ranks']:.2f} | {r['peak_rss_mb']} | {r['compute_stragglers']} |")
    if a.json:
        a.json.write_text(json.dumps({"env": env, "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()

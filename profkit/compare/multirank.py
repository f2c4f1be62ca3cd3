"""Many ranks, one answer: classify one Nsight Systems export per rank in parallel, then merge.

    from profkit.compare.multirank import classify_ranks
    res = classify_ranks(["traces/ddp2/rank0.sqlite.xz", "traces/ddp2/rank1.sqlite.xz"])
    res.ops          # one row per op: time across ranks (min / median / max and which rank),
                     # class and next step from the median rank
    res.stragglers   # ranks well above the median (rule in STRAGGLER_RULE)
    res.report()     # the JSON contract (docs/multirank.md)

Each rank's trace is analysed on its own (reader -> attribution -> verdicts -> communication)
by :func:`analyze_rank`, in local worker processes (``concurrent.futures.ProcessPoolExecutor``)
or on a Dask cluster (``dask.distributed.Client``); only the small per-rank result (the per-op
frame and a few numbers) travels back. A rank that fails comes back as an error result naming
its file; the others still finish.

Rank ids: the last ``rank<N>``, ``rank_<N>``, ``rank-<N>`` or ``r<N>`` in the file name (not
preceded by a letter; case-insensitive), when every file has one and they are all distinct;
otherwise the files' sorted order (0, 1, ...). Ranks are aligned in time by each export's
session start (``TARGET_INFO_SESSION_START_TIME.utcEpochNs``), as Nsight's multi-report recipes do.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
import pandas as pd

from profkit.read.compressed import expand_inputs, trace_stem
from profkit.run import attribution

from profkit.judge import comm
from profkit.errors import ProfkitError

SCHEMA_VERSION = 1
STEP_RANGE = "step"          # NVTX range whose instances are training steps (when present)
STRAGGLER_MIN_EXCESS = 0.05  # a straggler is above median + max(5% of the median, ...
STRAGGLER_K_MAD = 3.0        # ... 3 x the median absolute deviation across ranks)
STRAGGLER_RULE = (f"value > median + max({STRAGGLER_MIN_EXCESS:.0%} x median, "
                  f"{STRAGGLER_K_MAD:g} x MAD) across ranks (MAD: median absolute deviation); "
                  "needs 3 or more ranks")
OP_STRAGGLER_MIN_SHARE = 0.01  # per-op straggler checks only for ops with >= 1% of GPU time
DASK_CONNECT_TIMEOUT = "20s"   # how long to try reaching a Dask scheduler
_RANK_RE = re.compile(r"(?<![a-z])(?:rank[_-]?|r)(\d+)", re.I)

OP_COLUMNS = ["count", "gpu_time_ns", "gpu_time_median_ns", "busy_ns", "share", "class",
              "confidence", "source", "reason", "rung", "action", "expected_op_speedup",
              "expected_end_to_end_speedup", "basis", "worth_it"]


# -- inputs ------------------------------------------------------------------------------------------
def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))]


def rank_ids(paths: list[Path]) -> list[tuple[int, Path]]:
    """(rank, path) pairs, sorted by rank (see the module docstring for the rule)."""
    parsed = []
    for p in paths:
        m = _RANK_RE.findall(trace_stem(p))
        parsed.append(int(m[-1]) if m else None)
    if all(r is not None for r in parsed) and len(set(parsed)) == len(parsed):
        return sorted(zip(parsed, paths))  # type: ignore[arg-type]
    return list(enumerate(sorted(paths, key=_natural_key)))


# -- one rank -----------------------------------------------------------------------------------------
@dataclass
class RankResult:
    """What one rank's analysis sends back: small, picklable."""
    rank: int
    path: str
    ok: bool = True
    error: Optional[str] = None
    gpu: Optional[str] = None
    nsys_version: Optional[str] = None
    session_start_ns: Optional[int] = None   # utcEpochNs of the capture start
    first_gpu_ns: Optional[int] = None       # first GPU activity, trace-relative ns
    last_gpu_ns: Optional[int] = None
    total_gpu_time_ns: int = 0
    gpu_busy_ns: int = 0
    steps: int = 0
    step_time_median_ns: Optional[float] = None
    step_starts_ns: list = field(default_factory=list)   # trace-relative GPU start of each step
    step_times_ns: list = field(default_factory=list)
    compute_busy_ns: int = 0
    comm_time_ns: int = 0
    exposed_comm_ns: int = 0
    ops: Optional[pd.DataFrame] = None
    comm: Optional[dict] = None
    warnings: list = field(default_factory=list)
    analysis_s: float = 0.0

    @property
    def aligned_first_gpu_ns(self) -> Optional[int]:
        if self.session_start_ns is None or self.first_gpu_ns is None:
            return None
        return self.session_start_ns + self.first_gpu_ns


def _session_start_ns(path: str) -> Optional[int]:
    from profkit.read.nsys import open_readonly
    conn = open_readonly(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "TARGET_INFO_SESSION_START_TIME" not in tables:
            return None
        cols = {r[1] for r in conn.execute('PRAGMA table_info("TARGET_INFO_SESSION_START_TIME")')}
        if "utcEpochNs" not in cols:
            return None
        row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        return int(row[0]) if row and row[0] is not None else None
    finally:
        conn.close()


def analyze_rank(path: str, rank: int, by: str = "range", innermost: bool = False,
                 peaks_file: Optional[str] = None, n_ranks: Optional[int] = None,
                 step_range: str = STEP_RANGE, window: str = "auto",
                 attribution_mode: str = "process") -> RankResult:
    """Analyse one rank's export; never raises (a failure comes back as ``ok=False``)."""
    t0 = time.perf_counter()
    res = RankResult(rank=rank, path=str(path))
    try:
        from profkit.api import load
        prof = load(path, peaks=peaks_file, window=window, attribution=attribution_mode)
        tr = prof.trace
        df = prof.ops(by=by, innermost=innermost)
        res.ops = df[[c for c in OP_COLUMNS if c in df.columns]].copy()
        res.gpu = prof.gpu.name
        res.nsys_version = tr.info.nsys_version
        res.warnings = list(prof.warnings)
        res.session_start_ns = _session_start_ns(path)
        res.first_gpu_ns = int(tr.activities["start"].min())
        res.last_gpu_ns = int(tr.activities["end"].max())
        res.total_gpu_time_ns = tr.total_gpu_time_ns
        res.gpu_busy_ns = tr.gpu_busy_ns
        if not tr.ranges.empty and tr.linked_fraction > 0 and (tr.ranges["name"] == step_range).any():
            rng = tr.ranges_of_level("range")
            pairs = attribution.activity_pairs(tr, "range")
            inst = attribution.range_instances(rng, tr.activities, pairs) if len(pairs) else None
            if inst is not None and len(inst):
                st = inst[inst["name"] == step_range].sort_values("gpu_start")
                res.steps = len(st)
                res.step_starts_ns = [int(x) for x in st["gpu_start"]]
                res.step_times_ns = [int(x) for x in st["span_ns"]]
                res.step_time_median_ns = float(np.median(st["span_ns"])) if len(st) else None
        c = comm.analyze(tr, n_ranks=n_ranks, gpu_name=res.gpu)
        res.comm = c.as_dict()
        res.compute_busy_ns, res.comm_time_ns, res.exposed_comm_ns = \
            c.compute_busy_ns, c.comm_time_ns, c.exposed_ns
    except ProfkitError as exc:
        res.ok, res.error = False, str(exc)
    except Exception as exc:  # a bug or an odd file must not take the other ranks down
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" at {Path(last.filename).name}:{last.lineno}" if last else ""
        res.ok, res.error = False, f"{path}: {exc.__class__.__name__}: {exc}{where}"
    res.analysis_s = time.perf_counter() - t0
    return res


# -- running the ranks ------------------------------------------------------------------------------
ProgressFn = Callable[[Optional[RankResult], int, int], None]  # (result or None at the start, done, total)


def run_ranks(items: list[tuple[int, Path]], *, by: str = "range", innermost: bool = False,
              peaks_file: Optional[str] = None, workers: Optional[int] = None,
              dask: Optional[str] = None, dask_processes: bool = True,
              progress: Optional[ProgressFn] = None, window: str = "auto",
              attribution: str = "process") -> list[RankResult]:
    """Analyse every (rank, path) in parallel; results sorted by rank.

    ``dask``: None (local processes), ``"local"`` (a ``dask.distributed.LocalCluster`` started
    here with ``workers`` workers, ``processes=dask_processes``) or a scheduler address
    (``tcp://host:8786``). ``workers``: local processes (default: CPU count, at most one per rank);
    1 runs in this process.
    """
    n = len(items)
    kw = dict(by=by, innermost=innermost, peaks_file=peaks_file, n_ranks=n, window=window,
              attribution_mode=attribution)
    results: list[RankResult] = []

    def done(r: RankResult) -> None:
        results.append(r)
        if progress:
            progress(r, len(results), n)

    if progress:
        progress(None, 0, n)  # started

    if dask is not None:
        _run_dask(items, kw, dask, workers, dask_processes, done)
    else:
        nw = max(1, min(workers or os.cpu_count() or 1, n))
        if nw == 1:
            for rank, p in items:
                done(analyze_rank(str(p), rank, **kw))
        else:
            with ProcessPoolExecutor(max_workers=nw) as pool:
                futs = {pool.submit(analyze_rank, str(p), rank, **kw): (rank, p) for rank, p in items}
                for f in as_completed(futs):
                    rank, p = futs[f]
                    try:
                        done(f.result())
                    except Exception as exc:  # the worker process died (memory, signal)
                        done(RankResult(rank=rank, path=str(p), ok=False,
                                        error=f"{p}: worker failed: {exc.__class__.__name__}: {exc}"))
    return sorted(results, key=lambda r: r.rank)


def _run_dask(items, kw, address, workers, processes, done) -> None:
    try:
        from distributed import Client, LocalCluster, as_completed as dask_completed
    except ImportError as exc:  # pragma: no cover - a dependency
        raise ProfkitError(f"--dask needs the distributed package ({exc})") from None
    cluster = None
    try:
        if address == "local":
            nw = max(1, min(workers or os.cpu_count() or 1, len(items)))
            cluster = LocalCluster(n_workers=nw, threads_per_worker=1, processes=processes,
                                   dashboard_address=None)
            client = Client(cluster)
        else:
            try:
                client = Client(address, timeout=DASK_CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                raise ProfkitError(f"cannot reach the Dask scheduler at {address} ({exc})") from None
        try:
            futs = {}
            for rank, p in items:
                f = client.submit(analyze_rank, str(p), rank, **kw, pure=False,
                                  key=f"profkit-rank-{rank}-{os.getpid()}-{time.monotonic_ns()}")
                futs[f] = (rank, p)
            for f in dask_completed(list(futs)):
                rank, p = futs[f]
                try:
                    done(f.result())
                except Exception as exc:
                    done(RankResult(rank=rank, path=str(p), ok=False,
                                    error=f"{p}: Dask task failed: {exc.__class__.__name__}: {exc}"))
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()


# -- merging -----------------------------------------------------------------------------------------
def straggler_threshold(values: np.ndarray) -> tuple[float, float, float]:
    """(median, MAD, threshold) of the straggler rule for one metric across ranks."""
    med = float(np.median(values))
    mad = float(np.median(np.abs(values - med)))
    return med, mad, med + max(STRAGGLER_MIN_EXCESS * med, STRAGGLER_K_MAD * mad)


def _stragglers(metric: str, ranks: list[int], values: list[float]) -> list[dict]:
    v = np.asarray(values, dtype=float)
    if len(v) < 3:
        return []
    med, mad, thr = straggler_threshold(v)
    out = []
    for r, x in zip(ranks, v):
        if x > thr:
            out.append({"rank": int(r), "metric": metric, "value_ns": float(x), "median_ns": med,
                        "mad_ns": mad, "threshold_ns": thr,
                        "excess_over_median": (x - med) / med if med else None})
    return out


def _pick_median_rank(ranks: np.ndarray, times: np.ndarray) -> int:
    """The rank whose time is the (lower) median; ties go to the lowest rank."""
    order = np.lexsort((ranks, times))
    return int(ranks[order[(len(order) - 1) // 2]])


@dataclass
class MultiRankResult:
    by: str
    ranks: list[RankResult]
    ops: pd.DataFrame
    stragglers: list[dict]
    communication: dict
    world_size: int
    step_skew: dict

    @property
    def good(self) -> list[RankResult]:
        return [r for r in self.ranks if r.ok]

    @property
    def errors(self) -> list[RankResult]:
        return [r for r in self.ranks if not r.ok]

    def report(self) -> dict:
        return report_json(self)


def merge(results: list[RankResult], by: str = "range", top: Optional[int] = None) -> MultiRankResult:
    good = [r for r in results if r.ok]
    world = len(results)
    if not good:
        return MultiRankResult(by, results, pd.DataFrame(), [], {}, world, {})
    frames = []
    for r in good:
        f = r.ops.reset_index()
        f["rank"] = r.rank
        frames.append(f)
    allops = pd.concat(frames, ignore_index=True)
    rows = []
    for name, g in allops.groupby("name", sort=False):
        t = g["gpu_time_ns"].to_numpy(float)
        rk = g["rank"].to_numpy()
        mr = _pick_median_rank(rk, t)
        m = g[g["rank"] == mr].iloc[0]
        imin, imax = int(np.argmin(t)), int(np.argmax(t))
        med = float(np.median(t))
        rows.append({
            "name": name, "ranks": len(g), "count_median": float(np.median(g["count"])),
            "gpu_time_min_ns": float(t[imin]), "gpu_time_median_ns": med, "gpu_time_max_ns": float(t[imax]),
            "min_rank": int(rk[imin]), "max_rank": int(rk[imax]),
            "spread": float(t[imax] / med) if med else None,
            "share_median": float(np.median(g["share"])), "median_rank": mr,
            "call_median_ns": float(m["gpu_time_median_ns"]),
            "class": m["class"], "confidence": m["confidence"], "source": m["source"],
            "reason": m["reason"], "rung": m["rung"], "action": m["action"],
            "expected_op_speedup": float(m["expected_op_speedup"]),
            "expected_end_to_end_speedup": float(m["expected_end_to_end_speedup"]),
            "basis": m["basis"], "worth_it": bool(m["worth_it"]),
            "_times": dict(zip(rk.tolist(), t.tolist())),
        })
    ops = pd.DataFrame(rows).set_index("name").sort_values("gpu_time_median_ns", ascending=False,
                                                           kind="stable")
    # stragglers: step time, compute time, and per op (communication ops excluded: a long
    # collective is a rank waiting for the others, not a slow rank)
    stragglers = []
    with_steps = [r for r in good if r.step_time_median_ns is not None]
    if len(with_steps) == len(good):
        stragglers += _stragglers("step_time", [r.rank for r in good],
                                  [r.step_time_median_ns for r in good])
    else:
        stragglers += _stragglers("gpu_span", [r.rank for r in good],
                                  [r.last_gpu_ns - r.first_gpu_ns for r in good])
    stragglers += _stragglers("compute_busy", [r.rank for r in good],
                              [r.compute_busy_ns for r in good])
    for name, row in ops.iterrows():
        if row["class"] == "communication" or row["share_median"] < OP_STRAGGLER_MIN_SHARE \
                or row["ranks"] < 3:
            continue
        times = row["_times"]
        stragglers += _stragglers(f"op:{name}", list(times), list(times.values()))
    ops = ops.drop(columns=["_times"])
    if top is not None:
        ops = ops.head(top)
    return MultiRankResult(by, results, ops, stragglers, _merge_comm(good, world), world,
                           _step_skew(good))


def _step_skew(good: list[RankResult]) -> dict:
    """Per step index: spread of the step's GPU start across ranks on the aligned (UTC) clock."""
    if not good or any(r.session_start_ns is None or not r.step_starts_ns for r in good):
        return {}
    n = min(len(r.step_starts_ns) for r in good)
    skews = []
    for i in range(n):
        starts = np.array([r.session_start_ns + r.step_starts_ns[i] for r in good], dtype=np.int64)
        skews.append(int(starts.max() - starts.min()))
    return {"steps": n, "start_skew_ns": skews,
            "median_start_skew_ns": float(np.median(skews)) if skews else None,
            "note": "spread of each step's first GPU activity across ranks, clocks aligned by "
                    "each export's session start (utcEpochNs)"}


def _merge_comm(good: list[RankResult], world: int) -> dict:
    per_rank = [{"rank": r.rank, "comm_time_ns": r.comm_time_ns, "exposed_ns": r.exposed_comm_ns,
                 "compute_busy_ns": r.compute_busy_ns,
                 "exposed_share": (r.exposed_comm_ns / r.comm_time_ns) if r.comm_time_ns else None}
                for r in good]
    rows: dict[str, list[tuple[int, dict]]] = {}
    notes: list[str] = []
    link = peak = None
    for r in good:
        c = r.comm or {}
        link, peak = c.get("link") or link, c.get("link_peak_bytes_per_s") or peak
        for n_ in c.get("notes", []):
            if n_ not in notes and not n_.startswith("no NCCL kernels"):
                notes.append(n_)
        for coll in c.get("collectives", []):
            rows.setdefault(coll["name"], []).append((r.rank, coll))
    colls = []
    for name, lst in rows.items():
        t = np.array([c["gpu_time_ns"] for _, c in lst], dtype=float)
        ex = np.array([c["exposed_ns"] for _, c in lst], dtype=float)
        rk = np.array([rank for rank, _ in lst])
        bw = [c["busbw_bytes_per_s"] for _, c in lst if c["busbw_bytes_per_s"] is not None]
        mr = _pick_median_rank(rk, t)
        m = next(c for rank, c in lst if rank == mr)
        colls.append({
            "name": name, "collective": m["collective"], "ranks": len(lst),
            "count_median": float(np.median([c["count"] for _, c in lst])),
            "gpu_time_min_ns": float(t.min()), "gpu_time_median_ns": float(np.median(t)),
            "gpu_time_max_ns": float(t.max()), "min_rank": int(rk[t.argmin()]),
            "max_rank": int(rk[t.argmax()]),
            "exposed_median_ns": float(np.median(ex)), "exposed_max_ns": float(ex.max()),
            "exposed_share_median": float(np.median(ex / np.where(t > 0, t, 1))),
            "bytes_per_rank_median": m["bytes"], "calls_with_bytes": m["calls_with_bytes"],
            "busbw_median_bytes_per_s": float(np.median(bw)) if bw else None,
            "pct_of_link_peak": (float(np.median(bw)) / peak) if (bw and peak) else None,
            "median_rank": mr, "action": m["action"],
        })
    colls.sort(key=lambda c: -c["gpu_time_median_ns"])
    if not rows:
        notes.append("no NCCL kernels in any rank")
    return {"link": link, "link_peak_bytes_per_s": peak, "world_size": world, "per_rank": per_rank,
            "collectives": colls, "notes": notes,
            "exposed_rule": "collective time not overlapped by any non-NCCL kernel on the same GPU"}


# -- the JSON contract --------------------------------------------------------------------------------
def _num(x):
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        f = float(x)
        if f != f:
            return None
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    return x


def rank_json(r: RankResult) -> dict:
    d = {"rank": r.rank, "path": r.path, "ok": r.ok}
    if not r.ok:
        d["error"] = r.error
        return d
    d.update({"gpu": r.gpu, "nsys_version": r.nsys_version, "session_start_utc_ns": r.session_start_ns,
              "first_gpu_ns": r.first_gpu_ns, "last_gpu_ns": r.last_gpu_ns,
              "total_gpu_time_ns": r.total_gpu_time_ns, "gpu_busy_ns": r.gpu_busy_ns,
              "steps": r.steps, "step_time_median_ns": _num(r.step_time_median_ns),
              "compute_busy_ns": r.compute_busy_ns, "comm_time_ns": r.comm_time_ns,
              "exposed_comm_ns": r.exposed_comm_ns, "ops": 0 if r.ops is None else len(r.ops),
              "warnings": list(r.warnings), "analysis_s": round(r.analysis_s, 3)})
    return d


def report_json(res: MultiRankResult) -> dict:
    good = res.good
    t0 = min((r.aligned_first_gpu_ns for r in good if r.aligned_first_gpu_ns is not None), default=None)
    ranks = []
    for r in res.ranks:
        d = rank_json(r)
        if r.ok and t0 is not None and r.aligned_first_gpu_ns is not None:
            d["aligned_first_gpu_offset_ns"] = r.aligned_first_gpu_ns - t0
        ranks.append(d)
    ops = []
    for name, row in res.ops.iterrows():
        ops.append({
            "name": name, "level": res.by, "ranks": int(row["ranks"]),
            "count_median": _num(row["count_median"]),
            "gpu_time_ns": {"min": _num(row["gpu_time_min_ns"]), "median": _num(row["gpu_time_median_ns"]),
                            "max": _num(row["gpu_time_max_ns"]), "min_rank": int(row["min_rank"]),
                            "max_rank": int(row["max_rank"]), "max_over_median": _num(row["spread"])},
            "share_median": _num(row["share_median"]), "call_median_ns": _num(row["call_median_ns"]),
            "class": row["class"], "confidence": row["confidence"], "median_rank": int(row["median_rank"]),
            "evidence": {"source": row["source"], "reason": row["reason"]},
            "suggestion": {"rung": row["rung"], "action": row["action"],
                           "expected_op_speedup": round(float(row["expected_op_speedup"]), 3),
                           "expected_end_to_end_speedup": round(float(row["expected_end_to_end_speedup"]), 4),
                           "basis": row["basis"], "worth_it": bool(row["worth_it"])},
        })
    return {
        "schema_version": SCHEMA_VERSION, "kind": "multirank", "level": res.by,
        "world_size": res.world_size, "ranks_ok": len(good), "ranks_failed": len(res.errors),
        "gpu": good[0].gpu if good else None,
        "alignment": "session start (TARGET_INFO_SESSION_START_TIME.utcEpochNs) of each export",
        "ranks": ranks, "ops": ops,
        "stragglers": {"rule": STRAGGLER_RULE, "min_excess": STRAGGLER_MIN_EXCESS,
                       "k_mad": STRAGGLER_K_MAD,
                       "metrics": "step_time (median GPU span of the 'step' NVTX range; gpu_span when "
                                  "absent), compute_busy (union of non-NCCL kernel time), op:<name> "
                                  "(ops with >= 1% of GPU time, communication ops excluded)",
                       "ranks": [{k: _num(v) for k, v in s.items()} for s in res.stragglers]},
        "step_skew": {k: ([_num(x) for x in v] if isinstance(v, list) else _num(v))
                      for k, v in res.step_skew.items()},
        "communication": _clean(res.communication),
        "errors": [{"rank": r.rank, "path": r.path, "error": r.error} for r in res.errors],
    }


def _clean(x):
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return _num(x)


def classify_ranks(paths: Iterable[str | Path], by: str = "range", innermost: bool = False,
                   top: Optional[int] = None, peaks_file: Optional[str] = None,
                   workers: Optional[int] = None, dask: Optional[str] = None,
                   dask_processes: bool = True,
                   progress: Optional[ProgressFn] = None, window: str = "auto",
                   attribution: str = "process") -> MultiRankResult:
    """Expand ``paths`` (files or directories), analyse every rank in parallel, merge."""
    files = expand_inputs(paths)
    if not files:
        raise ProfkitError("no trace files given")
    items = rank_ids(files)
    results = run_ranks(items, by=by, innermost=innermost, peaks_file=peaks_file, workers=workers,
                        dask=dask, dask_processes=dask_processes, progress=progress,
                        window=window, attribution=attribution)
    return merge(results, by=by, top=top)


# -- text output ---------------------------------------------------------------------------------------
def _ft(ns) -> str:
    from profkit.show.render import fmt_time
    return "-" if ns is None or ns != ns else fmt_time(float(ns))


def _bw(x) -> str:
    from profkit.show.render import fmt_rate
    return "unknown" if x is None or x != x else fmt_rate(float(x), "B/s")


def ops_csv(res: MultiRankResult) -> str:
    df = res.ops.reset_index()
    cols = ["name", "ranks", "count_median", "gpu_time_min_ns", "gpu_time_median_ns", "gpu_time_max_ns",
            "min_rank", "max_rank", "spread", "share_median", "median_rank", "class", "confidence",
            "source", "reason", "rung", "action", "expected_op_speedup", "expected_end_to_end_speedup"]
    if not len(df):
        return ",".join(cols) + "\n"
    df = df[cols].copy()
    for c in ("ranks", "count_median", "gpu_time_min_ns", "gpu_time_median_ns", "gpu_time_max_ns",
              "min_rank", "max_rank", "median_rank"):
        if (df[c] % 1 == 0).all():
            df[c] = df[c].astype("int64")
    return df.to_csv(index=False)


def _sections(res: MultiRankResult) -> dict:
    """Rows of each output section, as text cells (shared by the table and Markdown)."""
    from profkit.show.render import short_name
    ranks = [[str(r.rank), Path(r.path).name, "ok" if r.ok else "FAILED",
              _ft(r.step_time_median_ns) if r.ok else "-", str(r.steps) if r.ok else "-",
              _ft(r.gpu_busy_ns) if r.ok else "-", _ft(r.compute_busy_ns) if r.ok else "-",
              _ft(r.comm_time_ns) if r.ok else "-", _ft(r.exposed_comm_ns) if r.ok else "-",
              f"{r.analysis_s:.1f} s"] for r in res.ranks]
    ops = [[short_name(str(n), 48), str(int(r["ranks"])), _ft(r["gpu_time_min_ns"]) + f" (r{r['min_rank']})",
            _ft(r["gpu_time_median_ns"]), _ft(r["gpu_time_max_ns"]) + f" (r{r['max_rank']})",
            f"{r['share_median']:.1%}", r["class"], f"{r['rung']}: {r['action']}"]
           for n, r in res.ops.iterrows()]
    strag = [[str(s["rank"]), s["metric"], _ft(s["value_ns"]), _ft(s["median_ns"]), _ft(s["threshold_ns"]),
              f"+{s['excess_over_median']:.1%}" if s.get("excess_over_median") is not None else "-"]
             for s in res.stragglers]
    c = res.communication or {}
    comm_rows = [[short_name(x["name"], 40), x["collective"], _ft(x["gpu_time_median_ns"]),
                  _ft(x["gpu_time_max_ns"]) + f" (r{x['max_rank']})", _ft(x["exposed_median_ns"]),
                  f"{x['exposed_share_median']:.0%}", _bw(x["busbw_median_bytes_per_s"]),
                  "-" if x["pct_of_link_peak"] is None else f"{x['pct_of_link_peak']:.0%}", x["action"]]
                 for x in c.get("collectives", [])]
    return {"ranks": ranks, "ops": ops, "stragglers": strag, "comm": comm_rows}


RANK_HEAD = ["rank", "file", "status", "step (median)", "steps", "GPU busy", "compute busy", "comm",
             "comm exposed", "analysis"]
OPS_HEAD = ["op", "ranks", "min", "median", "max", "share", "class", "next step (median rank)"]
STRAG_HEAD = ["rank", "metric", "value", "median", "threshold", "excess"]
COMM_HEAD = ["collective kernel", "kind", "median", "max", "exposed (median)", "exposed %",
             "bus bw (median)", "of link peak", "next step"]
# Narrow terminals: each table drops these columns first to last until it fits (--wide keeps all).
_DROP = {"ranks": ["file", "analysis", "steps", "comm", "status", "compute busy"],
         "ops": ["ranks", "min", "max", "class"],
         "stragglers": ["threshold"],
         "comm": ["kind", "max", "bus bw (median)", "of link peak", "exposed (median)"]}
_NEEDS = {"rank": 4, "file": 14, "status": 6, "step (median)": 13, "steps": 5, "GPU busy": 9,
          "compute busy": 12, "comm": 9, "comm exposed": 12, "analysis": 8, "op": 20, "ranks": 5,
          "min": 14, "median": 9, "max": 14, "share": 6, "class": 8, "next step (median rank)": 30,
          "metric": 14, "value": 9, "threshold": 9, "excess": 7, "collective kernel": 22, "kind": 10,
          "exposed %": 9, "bus bw (median)": 12, "of link peak": 7, "next step": 30}


def _title(res: MultiRankResult) -> str:
    good = res.good
    gpu = good[0].gpu if good else "?"
    return (f"{res.world_size} ranks ({len(good)} analysed, {len(res.errors)} failed) - {gpu} - "
            f"ops by {res.by}")


def to_markdown(res: MultiRankResult) -> str:
    s = _sections(res)

    from profkit.show.render import markdown_cell as cell

    def tab(head, rows, right=()):
        out = ["| " + " | ".join(head) + " |",
               "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
        out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
        return out

    c = res.communication or {}
    lines = [f"**{cell(_title(res))}**", "", "### Ranks", ""] + tab(RANK_HEAD, s["ranks"], {3, 4, 5, 6, 7, 8, 9})
    lines += ["", "### Ops across ranks", ""] + tab(OPS_HEAD, s["ops"], {1, 2, 3, 4, 5})
    lines += ["", "### Stragglers", "", f"Rule: {STRAGGLER_RULE}.", ""]
    lines += tab(STRAG_HEAD, s["stragglers"], {2, 3, 4, 5}) if s["stragglers"] else ["None found."]
    lines += ["", "### Communication", "",
              f"Link: {c.get('link') or 'unknown'} ({_bw(c.get('link_peak_bytes_per_s'))} per direction); "
              f"exposed = {c.get('exposed_rule', '')}.", ""]
    lines += tab(COMM_HEAD, s["comm"], {2, 3, 4, 5, 6, 7}) if s["comm"] else ["No NCCL kernels."]
    for n_ in c.get("notes", []):
        lines.append(f"- note: {cell(n_)}")
    for w in _warnings(res):
        lines.append(f"- warning: {cell(w)}")
    return "\n".join(lines) + "\n"


def to_table(res: MultiRankResult, console_width: int = 200, wide: bool = False) -> str:
    import io

    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from profkit.show.render import fit_columns
    s = _sections(res)
    buf = io.StringIO()
    con = Console(file=buf, width=console_width, force_terminal=False, color_system=None, soft_wrap=False)

    dropped: list[str] = []

    def tab(title, head, rows, right=(), drop=()):
        keep = fit_columns(head, _NEEDS, list(drop), console_width, wide)
        dropped.extend(head[i] for i in range(len(head)) if i not in keep and head[i] not in dropped)
        t = Table(box=box.SIMPLE_HEAVY, title=escape(title), expand=False)
        for i in keep:
            t.add_column(head[i], justify="right" if i in right else "left", overflow="fold")
        for r in rows:
            t.add_row(*(escape(str(r[i])) for i in keep))  # names are text, not rich markup
        con.print(t)

    tab(f"{_title(res)} - ranks", RANK_HEAD, s["ranks"], {3, 4, 5, 6, 7, 8, 9}, _DROP["ranks"])
    tab("ops across ranks (class and next step from the median rank)", OPS_HEAD, s["ops"], {1, 2, 3, 4, 5},
        _DROP["ops"])
    if s["stragglers"]:
        tab("stragglers", STRAG_HEAD, s["stragglers"], {2, 3, 4, 5}, _DROP["stragglers"])
    else:
        con.print("stragglers: none found")
    con.print(f"straggler rule: {STRAGGLER_RULE}", markup=False)
    c = res.communication or {}
    if s["comm"]:
        tab(f"communication - link {c.get('link') or 'unknown'} "
            f"({_bw(c.get('link_peak_bytes_per_s'))} per direction)", COMM_HEAD, s["comm"],
            {2, 3, 4, 5, 6, 7}, _DROP["comm"])
    if dropped:
        con.print(f"not shown at {console_width} columns: {', '.join(dropped)} (--wide shows them; "
                  "--format json has everything)", markup=False)
    for n_ in c.get("notes", []):
        con.print(f"note: {n_}", markup=False)
    for w in _warnings(res):
        con.print(f"warning: {w}", markup=False)
    return buf.getvalue()


def _warnings(res: MultiRankResult) -> list[str]:
    """Each distinct per-rank warning once, with the ranks it came from."""
    seen: dict[str, list[int]] = {}
    for r in res.good:
        for w in r.warnings:
            seen.setdefault(w, []).append(r.rank)
    return [f"{w} (ranks {', '.join(map(str, rs))})" if len(rs) < len(res.good) else w
            for w, rs in seen.items()]


def progress_printer(stream=None) -> tuple[ProgressFn, Callable[[], None]]:
    """A progress callback and its closer: a rich bar on a terminal, plain lines otherwise."""
    stream = stream or sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        prog = Progress(TextColumn("analysing ranks"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.description}"),
                        console=Console(file=stream), transient=True)
        task = None

        def cb(r: Optional[RankResult], i: int, n: int) -> None:
            nonlocal task
            if task is None:
                prog.start()
                task = prog.add_task("", total=n)
            if r is not None:
                prog.update(task, completed=i, description=f"rank {r.rank} {'ok' if r.ok else 'FAILED'}")

        return cb, prog.stop

    def plain(r: Optional[RankResult], i: int, n: int) -> None:
        if r is None:
            print(f"profkit: analysing {n} ranks", file=stream, flush=True)
            return
        state = f"done in {r.analysis_s:.1f} s" if r.ok else "FAILED"
        print(f"profkit: [{i}/{n}] rank {r.rank} ({Path(r.path).name}) {state}", file=stream, flush=True)

    return plain, lambda: None

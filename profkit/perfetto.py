"""Export a profile's timeline as Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing).

Tracks: one process per CPU process with a thread per CPU thread for its NVTX ranges and one for
the CUDA calls that launched GPU work; one process per GPU with a thread per stream. Every event
is an "X" (complete) event with ``ts``/``dur`` in microseconds; GPU events carry the op they belong
to, its bound class and the suggested next step in ``args``, and a flow arrow ties each launch
call to its kernel.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Optional

import numpy as np
import pandas as pd

from profkit.errors import ProfkitError

GPU_PID_BASE = 1_000_000_000   # GPU "processes" get pids that cannot clash with real ones
API_TID_OFFSET = 1 << 26        # a second track per CPU thread for its CUDA calls


def _us(ns: float) -> float:
    return round(float(ns) / 1000.0, 3)


def _op_info(profile, by: str, ops: Optional[pd.DataFrame]) -> tuple[pd.Series, dict, str]:
    """Op name per activity (innermost op of the level) and a dict op -> (class, rung, action, e2e)."""
    from profkit.ops import group_ops

    try:
        groups = group_ops(profile.trace, by=by, innermost=by != "kernel")
    except ProfkitError:
        if by == "kernel":
            raise
        by, ops = "kernel", None
        groups = group_ops(profile.trace, by="kernel")
    if ops is None or (len(ops) and ops["level"].iloc[0] != by):
        ops = profile.ops(by=by)
    m = groups.members.drop_duplicates("act_idx", keep="last")
    op_of = pd.Series(m["op"].to_numpy(), index=m["act_idx"].to_numpy())
    info = {str(name): {"op": str(name), "class": r["class"], "confidence": r["confidence"],
                        "next_step": f"{r['rung']}: {r['action']}",
                        "expected_end_to_end_speedup": round(float(r["expected_end_to_end_speedup"]), 4),
                        "share_of_gpu_time": round(float(r["share"]), 4)}
            for name, r in ops.iterrows()}
    return op_of, info, by


def events(profile, by: str = "range", ops: Optional[pd.DataFrame] = None):
    """Yield the trace events (dicts), metadata first."""
    trace = profile.trace
    acts = trace.activities
    rng = trace.ranges
    op_of, info, level = _op_info(profile, by, ops)
    t0 = int(acts["start"].min())
    if len(rng):
        t0 = min(t0, int(rng["start"].min()))
    if acts["api_start"].notna().any():
        t0 = min(t0, int(acts["api_start"].min()))

    def pid_of_gtid(g: int) -> int:
        return (int(g) >> 24) & 0xFFFFFF

    def tid_of_gtid(g: int) -> int:
        return int(g) & 0xFFFFFF

    tids = set(rng["globalTid"].dropna().astype(np.int64)) if len(rng) else set()
    api = acts[acts["api_start"].notna() & acts["globalTid"].notna()]
    tids |= set(api["globalTid"].astype(np.int64))
    pids = sorted({pid_of_gtid(g) for g in tids})
    for pid in pids:
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"CPU process {pid}"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
    for g in sorted(tids):
        pid, tid = pid_of_gtid(g), tid_of_gtid(g)
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"NVTX thread {tid}"}}
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid + API_TID_OFFSET,
               "args": {"name": f"CUDA API thread {tid}"}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": 2 * tid}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid + API_TID_OFFSET,
               "args": {"sort_index": 2 * tid + 1}}
    for dev in sorted(pd.unique(acts["deviceId"])):
        gpid = GPU_PID_BASE + int(dev)
        yield {"ph": "M", "name": "process_name", "pid": gpid, "tid": 0,
               "args": {"name": f"GPU {int(dev)} {profile.gpu.name}"}}
        yield {"ph": "M", "name": "process_sort_index", "pid": gpid, "tid": 0, "args": {"sort_index": gpid}}
        for s in sorted(pd.unique(acts.loc[acts["deviceId"] == dev, "streamId"])):
            yield {"ph": "M", "name": "thread_name", "pid": gpid, "tid": int(s), "args": {"name": f"stream {int(s)}"}}

    # NVTX ranges (push/pop ranges nest, so one track per thread works).
    if len(rng):
        for s, e, g, name, dom in zip(rng["start"].to_numpy(), rng["end"].to_numpy(), rng["globalTid"].to_numpy(),
                                      rng["name"].astype(str).to_numpy(), rng["domain"].astype(str).to_numpy()):
            if g is None or (isinstance(g, float) and math.isnan(g)):
                continue
            yield {"ph": "X", "cat": "nvtx", "name": name, "pid": pid_of_gtid(g), "tid": tid_of_gtid(g),
                   "ts": _us(s - t0), "dur": _us(e - s), "args": {"domain": dom} if dom else {}}
    # Launch calls, and a flow arrow from each to its GPU activity.
    ops_arr = op_of.reindex(acts.index).to_numpy()
    for i, (idx, a) in enumerate(zip(acts.index, acts.itertuples(index=False))):
        op = ops_arr[i]
        op = None if op is None or (isinstance(op, float) and math.isnan(op)) else str(op)
        gpid, stream = GPU_PID_BASE + int(a.deviceId), int(a.streamId)
        args = {"kernel": a.name, "kind": a.kind, "correlationId": int(a.correlationId)
                if a.correlationId == a.correlationId and a.correlationId is not None else None}
        if a.bytes is not None and a.bytes == a.bytes:
            args["bytes"] = int(a.bytes)
        if op is not None and op in info:
            args.update(info[op])
            args["level"] = level
        else:
            args["op"] = None
            args["class"] = "outside any op"
        ts = _us(a.start - t0)
        yield {"ph": "X", "cat": a.kind, "name": a.short_name or a.name, "pid": gpid, "tid": stream,
               "ts": ts, "dur": _us(a.end - a.start), "args": args}
        if a.api_start is not None and a.api_start == a.api_start and a.globalTid == a.globalTid:
            pid, tid = pid_of_gtid(a.globalTid), tid_of_gtid(a.globalTid) + API_TID_OFFSET
            ats = _us(a.api_start - t0)
            yield {"ph": "X", "cat": "cuda_api", "name": "launch " + (a.short_name or a.name), "pid": pid,
                   "tid": tid, "ts": ats, "dur": _us(a.api_end - a.api_start),
                   "args": {"correlationId": args["correlationId"]}}
            yield {"ph": "s", "cat": "launch", "name": "launch", "id": int(idx), "pid": pid, "tid": tid,
                   "ts": ats}
            yield {"ph": "f", "cat": "launch", "name": "launch", "id": int(idx), "pid": gpid, "tid": stream,
                   "ts": ts, "bp": "e"}


def write(profile, out: str | Path | IO[str], by: str = "range", ops: Optional[pd.DataFrame] = None) -> int:
    """Write the JSON (streamed, so a million kernels need no giant string). Returns the event count."""
    n = 0
    own = not hasattr(out, "write")
    if own:
        path = Path(out)
        if path.exists() and Path(profile.path).exists() and path.resolve() == Path(profile.path).resolve():
            raise ProfkitError(f"refusing to write over the input trace {profile.path}; choose another -o file")
        if not path.parent.exists():
            raise ProfkitError(f"directory {path.parent} does not exist; create it or choose another -o file")
        try:
            fh = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise ProfkitError(f"cannot write {path}: {exc.strerror}") from None
    else:
        fh = out  # type: ignore[assignment]
    try:
        meta = {"trace": Path(profile.path).name, "gpu": profile.gpu.name, "tool": "profkit export-perfetto"}
        fh.write('{"displayTimeUnit": "ns", "otherData": ' + json.dumps(meta) + ', "traceEvents": [\n')
        dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_default).encode
        first = True
        for ev in events(profile, by=by, ops=ops):
            fh.write(("" if first else ",\n") + dumps(ev))
            first = False
            n += 1
        fh.write("\n]}\n")
    finally:
        if own:
            fh.close()
    return n


def _default(o: object) -> object:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)

"""Export a profile's timeline as Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing).

Tracks: one process per CPU process with a thread per CPU thread for its NVTX ranges and one for
the CUDA calls that launched GPU work; one process per GPU with a thread per stream. Every event
is an "X" (complete) event with ``ts``/``dur`` in microseconds; GPU events carry the op they belong
to, its bound class and the suggested next step in ``args``, and a flow arrow ties each launch
call to its kernel.
"""
from __future__ import annotations

import json
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
    from profkit.run.ops import group_ops

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


def _j(x: object) -> str:
    return json.dumps(x, ensure_ascii=False, separators=(",", ":"))


def _lines(profile, by: str = "range", ops: Optional[pd.DataFrame] = None,
           window: Optional[tuple[int, int]] = None):
    """Yield each trace event as one JSON object (a string), metadata first.

    GPU events are assembled from pieces encoded once per kernel name and per op, so a million
    kernels take seconds, not minutes. ``window``: (start, end) in absolute ns; events outside it
    are left out.
    """
    from profkit.show.plots.timeline import trace_origin

    trace = profile.trace
    acts = trace.activities
    rng = trace.ranges
    op_of, info, level = _op_info(profile, by, ops)
    t0, _ = trace_origin(profile)
    w0, w1 = window if window is not None else (-(2 ** 62), 2 ** 62)

    def pid_of_gtid(g: int) -> int:
        return (int(g) >> 24) & 0xFFFFFF

    def tid_of_gtid(g: int) -> int:
        return int(g) & 0xFFFFFF

    tids = set(rng["globalTid"].dropna().astype(np.int64)) if len(rng) else set()
    api = acts[acts["api_start"].notna() & acts["globalTid"].notna()]
    tids |= set(api["globalTid"].astype(np.int64))
    pids = sorted({pid_of_gtid(g) for g in tids})
    meta = []
    for pid in pids:
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"CPU process {pid}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for g in sorted(tids):
        pid, tid = pid_of_gtid(g), tid_of_gtid(g)
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"NVTX thread {tid}"}})
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid + API_TID_OFFSET,
                     "args": {"name": f"CUDA API thread {tid}"}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": 2 * tid}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid + API_TID_OFFSET,
                     "args": {"sort_index": 2 * tid + 1}})
    for dev in sorted(pd.unique(acts["deviceId"])):
        gpid = GPU_PID_BASE + int(dev)
        meta.append({"ph": "M", "name": "process_name", "pid": gpid, "tid": 0,
                     "args": {"name": f"GPU {int(dev)} {profile.gpu.name}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": gpid, "tid": 0, "args": {"sort_index": gpid}})
        for st in sorted(pd.unique(acts.loc[acts["deviceId"] == dev, "streamId"])):
            meta.append({"ph": "M", "name": "thread_name", "pid": gpid, "tid": int(st),
                         "args": {"name": f"stream {int(st)}"}})
    for m in meta:
        yield _j(m)

    # NVTX ranges (push/pop ranges nest, so one track per thread works).
    if len(rng):
        k = rng["globalTid"].notna().to_numpy() & (rng["end"].to_numpy() >= w0) & (rng["start"].to_numpy() <= w1)
        sub = rng[k]
        names = {n: _j(n) for n in pd.unique(sub["name"].astype(str))}
        for s_, e_, g, name, dom in zip(sub["start"].tolist(), sub["end"].tolist(), sub["globalTid"].tolist(),
                                        sub["name"].astype(str).tolist(), sub["domain"].astype(str).tolist()):
            args = _j({"domain": dom}) if dom else "{}"
            yield (f'{{"ph":"X","cat":"nvtx","name":{names[name]},"pid":{pid_of_gtid(g)},'
                   f'"tid":{tid_of_gtid(g)},"ts":{_us(s_ - t0)},"dur":{_us(e_ - s_)},"args":{args}}}')

    # GPU work, the launch call of each, and a flow arrow from the call to the work.
    k = (acts["end"].to_numpy() >= w0) & (acts["start"].to_numpy() <= w1)
    sub = acts[k]
    op_arr = op_of.reindex(sub.index).tolist()
    op_piece = {op: "," + _j(dict(d, level=level))[1:-1] for op, d in info.items()}
    outside = ',"op":null,"class":"outside any op"'
    name_piece: dict[str, tuple[str, str, str]] = {}

    def nan(x) -> bool:
        return x is None or x != x

    cols = [sub.index.tolist()] + [sub[c].tolist() for c in (
        "start", "end", "deviceId", "streamId", "correlationId", "kind", "name", "short_name", "bytes",
        "api_start", "api_end", "globalTid")]
    for (idx, st, en, dev, stream, corr, kind, name, short, nbytes, a0, a1, g), op in zip(zip(*cols), op_arr):
        pieces = name_piece.get(name)
        if pieces is None:
            label = short or name
            pieces = name_piece[name] = (_j(label), _j(name), _j("launch " + str(label)))
        gpid, stream = GPU_PID_BASE + int(dev), int(stream)
        corr_s = "null" if nan(corr) else str(int(corr))
        extra = "" if nan(nbytes) else f',"bytes":{int(nbytes)}'
        opp = outside if nan(op) or str(op) not in op_piece else op_piece[str(op)]
        ts = _us(st - t0)
        yield (f'{{"ph":"X","cat":"{kind}","name":{pieces[0]},"pid":{gpid},"tid":{stream},"ts":{ts},'
               f'"dur":{_us(en - st)},"args":{{"kernel":{pieces[1]},"kind":"{kind}","correlationId":{corr_s}'
               f'{extra}{opp}}}}}')
        if not nan(a0) and not nan(g):
            pid, tid = pid_of_gtid(g), tid_of_gtid(g) + API_TID_OFFSET
            ats = _us(a0 - t0)
            yield (f'{{"ph":"X","cat":"cuda_api","name":{pieces[2]},"pid":{pid},"tid":{tid},"ts":{ats},'
                   f'"dur":{_us(a1 - a0)},"args":{{"correlationId":{corr_s}}}}}')
            yield f'{{"ph":"s","cat":"launch","name":"launch","id":{int(idx)},"pid":{pid},"tid":{tid},"ts":{ats}}}'
            yield (f'{{"ph":"f","cat":"launch","name":"launch","id":{int(idx)},"pid":{gpid},"tid":{stream},'
                   f'"ts":{ts},"bp":"e"}}')


def events(profile, by: str = "range", ops: Optional[pd.DataFrame] = None,
           window: Optional[tuple[int, int]] = None):
    """The trace events as dicts (for tests and notebooks; ``write`` streams the JSON)."""
    for line in _lines(profile, by=by, ops=ops, window=window):
        yield json.loads(line)


def write(profile, out: str | Path | IO[str], by: str = "range", ops: Optional[pd.DataFrame] = None,
          window: Optional[tuple[int, int]] = None) -> int:
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
        fh.write('{"displayTimeUnit":"ns","otherData":' + _j(meta) + ',"traceEvents":[\n')
        buf: list[str] = []
        for line in _lines(profile, by=by, ops=ops, window=window):
            buf.append(line)
            n += 1
            if len(buf) >= 20000:
                fh.write(("" if n == len(buf) else ",\n") + ",\n".join(buf))
                buf.clear()
        if buf:
            fh.write(("" if n == len(buf) else ",\n") + ",\n".join(buf))
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

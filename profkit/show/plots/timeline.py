"""The timeline picture: NVTX ranges and CUDA API calls per CPU thread, kernels and copies per GPU stream.

``timeline_data`` picks the window and gathers the lanes (numpy arrays, no matplotlib);
``timeline`` draws them. Lanes with more intervals than can be drawn one by one are binned per
pixel column with numpy (colour: the class with the most busy time in the column; opacity: busy
fraction), so a trace with millions of kernels draws in about the time of a small one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from profkit.errors import ProfkitError
from profkit.show.plots import style
from profkit.show.render import fmt_time, short_name

# Class codes of the intervals of a lane.
COMPUTE, MEMORY, LAUNCH, OTHER, API, UNKNOWN, LATENCY = 0, 1, 2, 3, 4, 5, 6
CODE_OF = {"compute": COMPUTE, "memory": MEMORY, "launch": LAUNCH, "unknown": UNKNOWN, "latency": LATENCY}
CODE_COLORS = {COMPUTE: style.CLASS_COLORS["compute"], MEMORY: style.CLASS_COLORS["memory"],
               LAUNCH: style.CLASS_COLORS["launch"], OTHER: style.OTHER_COLOR, API: style.API_COLOR,
               UNKNOWN: style.CLASS_COLORS["unknown"], LATENCY: style.CLASS_COLORS["latency"]}
EXACT_LIMIT = 3000         # intervals in a lane drawn one by one; more are binned per pixel column
MAX_NVTX_DEPTH = 6         # NVTX nesting levels drawn per thread
MAX_LABELS = 250           # range names written inside their bars
UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


def parse_time(text: str | float | int) -> float:
    """``1500``, ``1500ns``, ``1.5us``, ``1.5ms``, ``0.2s`` -> nanoseconds (a bare number is ns)."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(ns|us|µs|ms|s)?\s*", str(text))
    if not m:
        raise ProfkitError(f"cannot read the time {text!r}: give nanoseconds or a number with a unit "
                           "(ns, us, ms, s), e.g. 1.5ms")
    return float(m.group(1)) * UNITS[m.group(2) or "ns"]


@dataclass
class Lane:
    key: str                 # nvtx:TID:DEPTH, api:TID, gpu:DEV:STREAM
    label: str
    kind: str                # nvtx | api | gpu
    start: np.ndarray        # ns, absolute (int64)
    end: np.ndarray
    code: np.ndarray         # class code per interval (int8)
    names: Optional[np.ndarray] = None   # nvtx: the range names
    device: Optional[int] = None


@dataclass
class TimelineData:
    lanes: list[Lane]
    t0: int                                  # ns: the trace's first event, time zero on the axis
    window: tuple[int, int]                  # ns, absolute
    gaps: dict[int, np.ndarray]              # device -> (k, 2) idle gaps inside the window
    gpu: str
    trace: str
    level: str
    busy_ns: dict[int, int] = field(default_factory=dict)   # device -> busy ns in the window
    notes: list[str] = field(default_factory=list)
    window_label: str = ""
    focus: Optional[tuple] = None    # --range: (start, end, globalTid, activity index) of the instance
    focus_gpu: dict[str, np.ndarray] = field(default_factory=dict)  # lane key -> its GPU work (bool)

    def lane(self, key: str) -> Lane:
        return next(lane for lane in self.lanes if lane.key == key)


def _tid_label(gtid: int) -> str:
    return f"tid {int(gtid) & 0xFFFFFF}"


def _activity_classes(profile, by: str, ops: Optional[pd.DataFrame]) -> tuple[np.ndarray, str, pd.DataFrame]:
    """Class code per activity: that of the (innermost) op it belongs to; OTHER outside any op."""
    from profkit.run.ops import group_ops

    acts = profile.trace.activities
    codes = np.full(len(acts), OTHER, dtype=np.int8)
    try:
        groups = group_ops(profile.trace, by=by, innermost=by != "kernel")
    except ProfkitError:
        if by == "kernel":
            raise
        by = "kernel"
        groups = group_ops(profile.trace, by="kernel")
        ops = None
    if ops is None or (len(ops) and ops["level"].iloc[0] != by):
        ops = profile.ops(by=by)
    cls = {k: CODE_OF.get(v, OTHER) for k, v in ops["class"].items()}
    m = groups.members
    pos = acts.index.get_indexer(m["act_idx"].to_numpy())
    op_idx, op_uniq = pd.factorize(m["op"])
    op_code = np.array([cls.get(o, OTHER) for o in op_uniq] + [OTHER], dtype=np.int8)[op_idx]
    ok = pos >= 0
    codes[pos[ok]] = op_code[ok]
    return codes, by, ops


def _nvtx_depth(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each range of one thread (ranges sorted by start, then longest first):
    how many earlier ranges are still open when it starts. Exact for push/pop ranges, which nest."""
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    ended = np.searchsorted(np.sort(end), start, side="right")
    return np.maximum(np.arange(n) - ended, 0).astype(np.int32)


def _range_window(profile, name: str, instance: int) -> tuple[int, int, str, tuple]:
    from profkit.read.hints import parse_range_name

    r = profile.trace.ranges
    if r.empty:
        raise ProfkitError(f"{profile.path}: the trace has no NVTX ranges, so --range cannot be used")
    names = r["name"].astype(str)
    parsed = {n: parse_range_name(n)[0] for n in pd.unique(names)}
    op_names = names.map(parsed)
    sel = r[(names == name) | (op_names == name)].sort_values("start", kind="stable")
    if sel.empty:
        known = sorted(set(op_names[~names.str.startswith("aten::")]))[:12]
        raise ProfkitError(f"no NVTX range named {name!r} in {Path(profile.path).name}; ranges: "
                           + ", ".join(repr(k) for k in known))
    if instance < 1 or instance > len(sel):
        raise ProfkitError(f"range {name!r} has {len(sel)} instances; --instance must be 1..{len(sel)}")
    row = sel.iloc[instance - 1]
    lo, hi = int(row["start"]), int(row["end"])
    acts = profile.trace.activities
    launched = acts[(acts["api_start"] >= lo) & (acts["api_start"] <= hi) & (acts["globalTid"] == row["globalTid"])]
    if len(launched):
        hi = max(hi, int(launched["end"].max()))
        lo = min(lo, int(launched["start"].min()))
    return lo, hi, f"range {short_name(name, 40)!s} #{instance} of {len(sel)}", \
        (int(row["start"]), int(row["end"]), int(row["globalTid"]), launched.index.to_numpy())


def trace_origin(profile) -> tuple[int, int]:
    """Time zero (the trace's first NVTX, launch or GPU event) and the last event's end, in ns."""
    acts = profile.trace.activities
    rng = profile.trace.ranges
    firsts = [int(acts["start"].min())]
    lasts = [int(acts["end"].max())]
    if len(rng):
        firsts.append(int(rng["start"].min()))
        lasts.append(int(rng["end"].max()))
    api_ok = acts["api_start"].notna()
    if api_ok.any():
        firsts.append(int(acts.loc[api_ok, "api_start"].min()))
        lasts.append(int(acts.loc[api_ok, "api_end"].max()))
    return min(firsts), max(lasts)


def resolve_window(profile, start: Optional[str | float] = None, end: Optional[str | float] = None,
                   range_name: Optional[str] = None, instance: int = 1) -> tuple[int, int, str, Optional[tuple], int]:
    """(w0, w1, label, focus, t0): the absolute window in ns for --start/--end (ns from the trace's
    first event, or with units) or for instance ``instance`` of NVTX range ``range_name``."""
    t0, t_last = trace_origin(profile)
    focus = None
    if range_name is not None:
        if start is not None or end is not None:
            raise ProfkitError("give --range or --start/--end, not both")
        lo, hi, wlabel, focus = _range_window(profile, range_name, instance)
        pad = max((hi - lo) * 0.03, 1000)
        return int(lo - pad), int(hi + pad), wlabel, focus, t0
    s = parse_time(start) if start is not None else 0.0
    e = parse_time(end) if end is not None else float(t_last - t0)
    if s < 0 or e <= s:
        raise ProfkitError(f"empty or negative window: --start {start} --end {end} "
                           "(times are from the trace's first event; end must be after start)")
    if s >= t_last - t0:
        raise ProfkitError(f"--start {start} is after the end of the trace "
                           f"({fmt_time(t_last - t0)} from its first event)")
    wlabel = "whole trace" if start is None and end is None else "window"
    return int(t0 + s), int(t0 + min(e, t_last - t0)), wlabel, focus, t0


def run_caption(run: dict) -> str:
    """One line: the run's verdict and where its steady-state wall time goes."""
    wall = max(run["wall_time_ns"], 1)
    b = run["breakdown"]
    idle = ", ".join(f"{label} {b[k] / wall:.0%}" for k, label in
                     (("idle_host", "CPU"), ("idle_sync", "sync"), ("idle_memcpy_wait", "copies"),
                      ("idle_other", "GPU-side")) if b.get(k, 0) / wall >= 0.005)
    return (f"steady state ({run['window']['source']}): {run['verdict']['class']}, GPU busy "
            f"{run['gpu_busy_ns'] / wall:.0%} of {fmt_time(wall)}" + (f"; idle waiting on {idle}" if idle else ""))


def timeline_data(profile, by: str = "range", start: Optional[str | float] = None,
                  end: Optional[str | float] = None, range_name: Optional[str] = None,
                  instance: int = 1, ops: Optional[pd.DataFrame] = None) -> TimelineData:
    """Lanes, idle gaps and colours for the window [start, end] (ns from the trace's first event)
    or for instance ``instance`` (1-based) of NVTX range ``range_name``."""
    trace = profile.trace
    acts = trace.activities
    rng = trace.ranges
    api_ok = acts["api_start"].notna()
    w0, w1, wlabel, focus, t0 = resolve_window(profile, start, end, range_name, instance)

    codes, level, ops = _activity_classes(profile, by, ops)
    notes: list[str] = []
    if level != by:
        notes.append("no NVTX ranges to colour by: GPU work coloured by kernel class")
    lanes: list[Lane] = []
    a_start = acts["start"].to_numpy(np.int64)
    a_end = acts["end"].to_numpy(np.int64)
    inwin = (a_end >= w0) & (a_start <= w1)

    # CPU threads: NVTX ranges (one row per nesting level), then the CUDA calls that launched GPU work.
    tids = sorted(set(rng["globalTid"].dropna().astype(np.int64)) | set(
        acts.loc[api_ok, "globalTid"].dropna().astype(np.int64)))
    range_code = _range_codes(rng, level, profile, ops) if len(rng) else np.zeros(0, np.int8)
    for tid in tids:
        if len(rng):
            sel = (rng["globalTid"].to_numpy() == tid) & (rng["end"].to_numpy() >= w0) & \
                  (rng["start"].to_numpy() <= w1)
            sub = rng[sel]
            if len(sub):
                order = np.lexsort((-sub["end"].to_numpy(np.int64), sub["start"].to_numpy(np.int64)))
                s_ = sub["start"].to_numpy(np.int64)[order]
                e_ = sub["end"].to_numpy(np.int64)[order]
                names = sub["name"].astype(str).to_numpy()[order]
                c_ = range_code[np.flatnonzero(sel)[order]]
                depth = _nvtx_depth(s_, e_)
                deeper = int((depth >= MAX_NVTX_DEPTH).sum())
                if deeper:
                    notes.append(f"{deeper} NVTX ranges nested deeper than {MAX_NVTX_DEPTH} levels "
                                 f"on {_tid_label(tid)} not drawn")
                for d in range(min(int(depth.max()) + 1, MAX_NVTX_DEPTH)):
                    k = depth == d
                    lanes.append(Lane(f"nvtx:{tid}:{d}", f"NVTX {_tid_label(tid)}" if d == 0 else "",
                                      "nvtx", s_[k], e_[k], c_[k], names[k]))
        k = api_ok.to_numpy() & (acts["globalTid"].to_numpy() == tid)
        if k.any():
            s_ = acts["api_start"].to_numpy()[k].astype(np.int64)
            e_ = acts["api_end"].to_numpy()[k].astype(np.int64)
            w = (e_ >= w0) & (s_ <= w1)
            lanes.append(Lane(f"api:{tid}", f"CUDA API {_tid_label(tid)}", "api", s_[w], e_[w],
                              np.full(int(w.sum()), API, np.int8)))

    gaps: dict[int, np.ndarray] = {}
    busy: dict[int, int] = {}
    focus_gpu: dict[str, np.ndarray] = {}
    dev_arr = acts["deviceId"].to_numpy()
    stream_arr = acts["streamId"].to_numpy()
    for dev in sorted(pd.unique(dev_arr)):
        on_dev = dev_arr == dev
        for stream in sorted(pd.unique(stream_arr[on_dev])):
            k = on_dev & (stream_arr == stream) & inwin
            key = f"gpu:{int(dev)}:{int(stream)}"
            lanes.append(Lane(key, f"GPU {int(dev)} stream {int(stream)}", "gpu",
                              a_start[k], a_end[k], codes[k], device=int(dev)))
            if focus is not None:
                focus_gpu[key] = np.isin(acts.index.to_numpy()[k], focus[3])
        gaps[int(dev)], busy[int(dev)] = _idle_gaps(a_start[on_dev & inwin], a_end[on_dev & inwin], w0, w1)
    return TimelineData(lanes=lanes, t0=t0, window=(w0, w1), gaps=gaps, gpu=profile.gpu.name,
                        trace=Path(profile.path).name, level=level, busy_ns=busy, notes=notes,
                        window_label=wlabel, focus=focus, focus_gpu=focus_gpu)


def _range_codes(rng: pd.DataFrame, level: str, profile, ops: Optional[pd.DataFrame]) -> np.ndarray:
    """Class code per NVTX range: the class of the op of that name (OTHER for other ranges)."""
    from profkit.run import attribution
    from profkit.read.hints import parse_range_name

    if level == "kernel":
        return np.full(len(rng), OTHER, np.int8)
    if ops is None or (len(ops) and ops["level"].iloc[0] != level):
        ops = profile.ops(by=level)
    cls = {k: CODE_OF.get(v, OTHER) for k, v in ops["class"].items()}  # communication: OTHER
    idx, uniq = pd.factorize(rng["name"].astype(str))
    key = [attribution.aten_key(n) if level == "aten" else parse_range_name(n)[0] for n in uniq]
    per_name = np.array([cls.get(k, OTHER) for k in key] + [OTHER], dtype=np.int8)
    return per_name[idx]  # idx -1 (no name) picks the trailing OTHER


def _idle_gaps(start: np.ndarray, end: np.ndarray, w0: int, w1: int) -> tuple[np.ndarray, int]:
    """Gaps between GPU activities of one device (all streams) inside the window, and busy ns."""
    if len(start) == 0:
        return np.array([[w0, w1]], dtype=np.int64), 0
    o = np.argsort(start, kind="stable")
    s = np.clip(start[o], w0, w1)
    e = np.clip(end[o], w0, w1)
    cummax = np.maximum.accumulate(e)
    new_block = np.empty(len(s), bool)
    new_block[0] = True
    new_block[1:] = s[1:] > cummax[:-1]
    bs = s[new_block]
    be = np.append(cummax[np.flatnonzero(new_block)[1:] - 1], cummax[-1])
    busy = int((be - bs).sum())
    gaps = np.stack([be[:-1], bs[1:]], axis=1) if len(bs) > 1 else np.zeros((0, 2), np.int64)
    edges = []
    if bs[0] > w0:
        edges.append([w0, bs[0]])
    if be[-1] < w1:
        edges.append([be[-1], w1])
    if edges:
        gaps = np.concatenate([gaps, np.array(edges, dtype=np.int64)])
    return gaps.astype(np.int64), busy


def _coverage(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Busy time of the intervals in each bin [edges[i], edges[i+1]) (exact, O(n log n))."""
    s = np.sort(start)
    e = np.sort(end)
    cs = np.concatenate([[0.0], np.cumsum(s)])
    ce = np.concatenate([[0.0], np.cumsum(e)])
    ks = np.searchsorted(s, edges, side="right")
    ke = np.searchsorted(e, edges, side="right")
    c = edges * ks - cs[ks] - (edges * ke - ce[ke])
    return np.diff(c)


def _unit(span_ns: float) -> tuple[str, float]:
    for name, div in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if span_ns >= 2 * div:
            return name, div
    return "ns", 1.0


def timeline(profile=None, by: str = "range", start: Optional[str | float] = None,
             end: Optional[str | float] = None, range_name: Optional[str] = None, instance: int = 1, *,
             data: Optional[TimelineData] = None, ops: Optional[pd.DataFrame] = None,
             width_in: float = 16.0, annotate_gaps: int = 3):
    """Draw the timeline of ``profile`` (or of ready ``data``) and return the matplotlib Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    import matplotlib

    if data is None:
        data = timeline_data(profile, by=by, start=start, end=end, range_name=range_name,
                             instance=instance, ops=ops)
    w0, w1 = data.window
    span = float(w1 - w0)
    unit, div = _unit(span)
    lanes = data.lanes
    n_rows = len(lanes)
    row_h = 0.34
    top_in, bottom_in = 0.95, 1.05
    height = top_in + bottom_in + row_h * max(n_rows, 3)
    with matplotlib.rc_context(style.RC):
        fig = Figure(figsize=(width_in, height))
        FigureCanvasAgg(fig)
        left = 0.115
        ax = fig.add_axes((left, bottom_in / height, 0.985 - left, (height - top_in - bottom_in) / height))
        # Times from the trace's first event, or from the window's start when that would need
        # long tick labels (a short window deep into a long trace).
        origin = data.t0 if (w0 - data.t0) <= 50 * span else w0
        x0 = (w0 - origin) / div
        x1 = (w1 - origin) / div
        ax.set_xlim(x0, x1)
        ax.set_ylim(n_rows, 0)
        ax.set_xlabel(f"time since the trace's first event ({unit})" if origin == data.t0 else
                      f"time since {fmt_time(w0 - data.t0)} into the trace ({unit})")
        ax.set_yticks(np.arange(n_rows) + 0.5)
        ax.set_yticklabels([lane.label for lane in lanes])
        ax.tick_params(axis="y", length=0)
        ax.spines["left"].set_visible(False)
        ax.grid(True, axis="x", color="#EEEEEE", linewidth=0.8)
        ax.set_axisbelow(True)
        px = ax.get_window_extent(fig.canvas.get_renderer()).width
        n_bins = max(int(px), 50)
        px_ns = span / n_bins
        edges = np.linspace(w0, w1, n_bins + 1)
        binned_lanes = []
        labels_left = MAX_LABELS
        renderer = fig.canvas.get_renderer()

        # Lane backgrounds and group separators.
        for i, lane in enumerate(lanes):
            if i and lane.kind != lanes[i - 1].kind or (i and lane.kind == "gpu" and lane.label):
                ax.axhline(i, color="#CCCCCC", linewidth=0.7, zorder=0.5)
        for i, lane in enumerate(lanes):
            n = len(lane.start)
            if n == 0:
                continue
            pad = 0.12
            y0, y1 = i + pad, i + 1 - pad
            s = np.clip(lane.start, w0, w1).astype(np.float64)
            e = np.clip(lane.end, w0, w1).astype(np.float64)
            if n <= EXACT_LIMIT:
                # One rectangle per interval; at least 0.6 px wide so short kernels stay visible.
                e = np.maximum(e, s + 0.6 * px_ns)
                xs, xe = (s - origin) / div, (e - origin) / div
                verts = np.stack([np.stack([xs, np.full(n, y0)], 1), np.stack([xs, np.full(n, y1)], 1),
                                  np.stack([xe, np.full(n, y1)], 1), np.stack([xe, np.full(n, y0)], 1)], 1)
                colors = np.array([to_rgba(CODE_COLORS[int(c)]) for c in range(len(CODE_COLORS))])[lane.code]
                ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="none",
                                                 gid=f"lane-{lane.key}", zorder=2))
                if lane.kind == "nvtx" and lane.names is not None and labels_left > 0:
                    labels_left = _label_ranges(ax, lane, xs, xe, i, renderer, labels_left)
            else:
                binned_lanes.append(lane.key)
                cov = np.zeros((len(CODE_COLORS), n_bins))
                for c in np.unique(lane.code):
                    k = lane.code == c
                    cov[int(c)] = _coverage(s[k] - w0, e[k] - w0, edges - w0)
                total = cov.sum(0)
                has = total > 0
                dom = cov.argmax(0)
                frac = np.clip(total / px_ns, 0, 1)
                alpha = 0.3 + 0.7 * frac
                idx = np.flatnonzero(has)
                xs = (edges[idx] - origin) / div
                xe = (edges[idx + 1] - origin) / div
                m = len(idx)
                verts = np.stack([np.stack([xs, np.full(m, y0)], 1), np.stack([xs, np.full(m, y1)], 1),
                                  np.stack([xe, np.full(m, y1)], 1), np.stack([xe, np.full(m, y0)], 1)], 1)
                base = np.array([to_rgba(CODE_COLORS[int(c)]) for c in range(len(CODE_COLORS))])[dom[idx]]
                base[:, 3] = alpha[idx]
                ax.add_collection(PolyCollection(verts, facecolors=base, edgecolors="none",
                                                 gid=f"lane-{lane.key}", zorder=2))

        if data.focus is not None:
            fs, fe, ftid = data.focus[:3]
            from matplotlib.patches import Rectangle
            for i, lane in enumerate(lanes):
                sel = data.focus_gpu.get(lane.key)
                if sel is not None and sel.any() and sel.sum() <= EXACT_LIMIT:
                    fx0 = (np.clip(lane.start[sel], w0, w1) - origin) / div
                    fx1 = (np.clip(lane.end[sel], w0, w1) - origin) / div
                    for a, b in zip(fx0, fx1):
                        ax.add_patch(Rectangle((a, i + 0.05), b - a, 0.9, fill=False, edgecolor="#111111",
                                               linewidth=1.2, zorder=4, gid="focus-gpu"))
            for i, lane in enumerate(lanes):
                if lane.kind == "nvtx" and lane.key.startswith(f"nvtx:{ftid}:") and \
                        np.any((lane.start == fs) & (lane.end == fe)):
                    ax.add_patch(Rectangle(((max(fs, w0) - origin) / div, i + 0.05),
                                           (min(fe, w1) - max(fs, w0)) / div, 0.9, fill=False,
                                           edgecolor="#111111", linewidth=1.6, zorder=4, gid="focus"))
                    break

        # Idle GPU gaps: shaded over the device's lanes; the largest labelled.
        gap_texts = []
        for dev, gaps in data.gaps.items():
            rows = [i for i, lane in enumerate(lanes) if lane.kind == "gpu" and lane.device == dev]
            if not rows or len(gaps) == 0:
                continue
            g = gaps[(gaps[:, 1] - gaps[:, 0]) >= px_ns]
            ys0, ys1 = min(rows), max(rows) + 1
            if len(g):
                xs, xe = (g[:, 0] - origin) / div, (g[:, 1] - origin) / div
                m = len(g)
                verts = np.stack([np.stack([xs, np.full(m, ys0)], 1), np.stack([xs, np.full(m, ys1)], 1),
                                  np.stack([xe, np.full(m, ys1)], 1), np.stack([xe, np.full(m, ys0)], 1)], 1)
                ax.add_collection(PolyCollection(verts, facecolors=to_rgba(style.IDLE_COLOR, 0.16),
                                                 edgecolors="none", hatch=None, gid=f"idle-gpu{dev}",
                                                 zorder=1))
            dur = gaps[:, 1] - gaps[:, 0]
            ym = (ys0 + ys1) / 2
            for j in np.argsort(-dur, kind="stable")[:annotate_gaps]:
                if dur[j] < 2 * px_ns:
                    break
                xm = ((max(gaps[j, 0], w0) + min(gaps[j, 1], w1)) / 2 - origin) / div
                t = ax.text(xm, ym, f"idle {fmt_time(float(dur[j]))}", ha="center", va="center",
                            fontsize=8.5, color="#AA2233", zorder=7, gid="idle-label",
                            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="#EE6677", lw=0.7))
                b = t.get_window_extent(renderer)
                gx0, gx1 = (ax.transData.transform([[(gaps[j, 0] - origin) / div, ym],
                                                     [(gaps[j, 1] - origin) / div, ym]])[:, 0])
                if b.width > (gx1 - gx0) or any(_overlap(b, o) for o in gap_texts):
                    t.remove()
                    continue
                gap_texts.append(b)

        title = (f"Timeline: {data.trace} on {data.gpu}  ·  {data.window_label}: "
                 f"{fmt_time(w1 - w0)} from {fmt_time(w0 - data.t0)}")
        if profile is not None and hasattr(profile, "run"):
            title += "\n" + run_caption(profile.run().as_dict())
        ax.set_title(title, loc="left", pad=26 + 14 * title.count("\n"))
        handles = [Patch(color=style.CLASS_COLORS[c], label=style.CLASS_LABELS[c]) for c in style.CLASSES]
        handles += [Patch(color=style.OTHER_COLOR, label="outside any op"),
                    Patch(color=style.API_COLOR, label="CUDA API call (launch)"),
                    Patch(facecolor=to_rgba(style.IDLE_COLOR, 0.16), edgecolor="#EE6677", label="GPU idle")]
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=6, frameon=False,
                  borderaxespad=0.2, handlelength=1.4, columnspacing=1.4)
        busy_txt = "; ".join(f"GPU {d} busy {data.busy_ns.get(d, 0) / span:.1%} of the window"
                             for d in data.gaps)
        lvl = {"range": "the innermost NVTX range", "aten": "the aten op", "kernel": "the kernel name"}[data.level]
        caption = (f"Colour: bound class of the op ({lvl}) each kernel or copy belongs to; NVTX ranges "
                   f"coloured by their op's class. {busy_txt}. Shaded: no kernel or copy on any stream of "
                   "the device" + ("; the largest gaps are labelled." if gap_texts else "."))
        if binned_lanes:
            caption += (f" {len(binned_lanes)} dense lane(s) drawn per pixel column ({fmt_time(px_ns)} "
                        "each): colour = class with most busy time, opacity = busy fraction.")
        if data.focus is not None:
            caption += " Outlined: the selected range instance and the GPU work it launched."
        for note in data.notes:
            caption += f" {note}."
        import textwrap
        fig.text(0.01, (bottom_in - 0.55) / height, "\n".join(textwrap.wrap(caption, 235)), fontsize=8,
                 color="#444444", va="top", ha="left", gid="caption")
    fig.profkit_data = data
    return fig


def _overlap(a, b) -> bool:
    return not (a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0)


def _label_ranges(ax, lane: Lane, xs: np.ndarray, xe: np.ndarray, row: int, renderer, left: int) -> int:
    """Write range names inside bars wide enough to hold them (clipped to the bar)."""
    to_px = ax.transData.transform
    px0 = to_px(np.stack([xs, np.full(len(xs), row)], 1))[:, 0]
    px1 = to_px(np.stack([xe, np.full(len(xe), row)], 1))[:, 0]
    width = px1 - px0
    axb = ax.get_window_extent(renderer)
    for j in np.argsort(-width, kind="stable"):
        if left <= 0 or width[j] < 40:
            break
        full = str(lane.names[j])
        chars = int((min(px1[j], axb.x1) - max(px0[j], axb.x0)) / 6.2)
        if chars < 4:
            continue
        base = full.split(",")[0] if full.startswith("aten::") else re.sub(r"\s*\{.*\}\s*$", "", full)
        text = base if len(base) <= chars else short_name(base, max(chars, 4))
        xm = (max(xs[j], ax.get_xlim()[0]) + min(xe[j], ax.get_xlim()[1])) / 2
        dark = int(lane.code[j]) in (COMPUTE, MEMORY)
        ax.text(xm, row + 0.5, text, ha="center", va="center", fontsize=7.5,
                color="white" if dark else "#222222",
                clip_on=True, zorder=3, gid="range-label", fontweight="bold")
        left -= 1
    return left

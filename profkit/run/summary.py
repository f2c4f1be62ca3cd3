"""The run before the ops: where a window's wall-clock time goes, and one verdict for the program.

The window's wall time splits into GPU busy (the union of GPU activity on the busiest device,
shared out by kernel family: compute, memory, launch, communication) and GPU idle, each idle
gap given one cause from what the CPU was doing when the GPU ran dry:

- ``idle_other``: the next work was already launched — the GPU waited on itself (launch
  latency between kernels, a wait on another stream or event);
- ``idle_sync``: the gap began while the CPU was blocked in a synchronising call
  (device/stream/event synchronize, a synchronous memcpy, ``.item()``): the sync drained the
  queue, so the CPU work after it ran with the GPU empty; and, once the step model has priced
  the syncs (``charge_refill_to_syncs``), as much of the host idle that follows, while the CPU
  refills the queue, as a replay without the syncs' waits saves;
- ``idle_memcpy_wait``: the CPU was inside a memcpy call (a pageable copy is staged by the CPU);
- ``idle_host``: the CPU was elsewhere — Python, launch calls, data preparation.

The parts add up to the wall time exactly. The verdict follows the largest part; the actions
(profkit.judge.rules, attached with ``apply_actions``) carry an expected end-to-end speedup on wall time
with its basis.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd

from profkit.read.intervals import in_intervals, merge_intervals
from profkit.read.nsys import match_names
from profkit.run.window import Window, user_main_threads, user_top_level

GPU_BOUND_IDLE = 0.20     # below this idle share of the wall time, the GPU sets the pace
COMM_BOUND_SHARE = 0.30   # communication kernels over this share of the wall time
LAUNCH_BLOCKED = 10.0     # a launch call this many times its median waited on a full queue
MIN_ACTION_GAIN = 1.02    # below this expected gain on wall time, a finding is not an action
DATA_SHARE = 0.50         # share of host idle inside data-loading ranges for a data-bound verdict

SYNC_RE = re.compile(r"^cu(da)?(Device|Ctx|Stream|Event)Synchronize|^cudaMemcpy(2D|3D)?(_v\d+)?$|"
                     r"^cuMemcpy(DtoH|HtoD|DtoD|2D|3D)?(_v\d+)?$|^cudaMemcpy(To|From)Symbol(_v\d+)?$")
MEMCPY_RE = re.compile(r"^cu(da)?Memcpy")
# One read of the API table serves both (a trace can hold millions of other calls).
SYNC_OR_COPY_RE = re.compile(f"(?:{SYNC_RE.pattern})|(?:{MEMCPY_RE.pattern})")
DATA_RE = re.compile(r"data|load|batch|fetch|input|prefetch|collate|dataset", re.I)
# Inductor's fused pointwise/reduction kernels (matmul templates are GEMMs, these are not).
INDUCTOR_FUSED_RE = re.compile(r"^triton_(poi|per|red|for)_")
NCCL_RE = re.compile(r".*nccl", re.I)
GEMM_RE = re.compile(r".*(gemm|nvjet|xmma|cutlass|wgmma|cublas|matmul|conv|cudnn|flash|fmha|attention|"
                     r"sdpa|implicit_convolve)", re.I)


class RunClass(str, Enum):
    """What sets the pace of the whole program in the window."""
    GPU = "gpu-bound"
    HOST = "host-bound"
    DATA = "data-bound"
    SYNC = "sync-bound"
    COMMUNICATION = "communication-bound"


@dataclass
class RunSummary:
    window: Window
    wall_time_ns: int
    gpu_busy_ns: int
    breakdown: dict[str, int]
    idle_host_by_range: dict[str, int]
    sync_blocked_ns: int
    launch_calls_ns: int
    device: Optional[int]
    verdict: RunClass
    reason: str
    actions: list = field(default_factory=list)  # profkit.judge.rules Findings, best first
    # Time the CPU sat waiting for the GPU outside synchronising calls: launch calls blocked on
    # a full queue (their time beyond the median launch), and the tail after its last call.
    cpu_wait_other_ns: int = 0
    # Host idle after a sync drained the queue, before work was queued again (in idle_host until
    # charge_refill_to_syncs moves the sync's share of it to idle_sync).
    refill_ns: int = 0
    refill_by_range: dict[str, int] = field(default_factory=dict)
    refill_charged_ns: int = 0

    @property
    def host_floor_ns(self) -> float:
        """The CPU's own time in the window: wall minus every wait for the GPU (syncs, blocked
        launches, the tail after its last call). No GPU saving takes the run below it."""
        return float(max(self.wall_time_ns - self.sync_blocked_ns - self.cpu_wait_other_ns, 0))

    def top_actions(self, n: int = 3) -> list:
        """The findings that pay (at least MIN_ACTION_GAIN on wall time), best first."""
        return [a for a in self.actions if a.expected_end_to_end_speedup >= MIN_ACTION_GAIN][:n]

    @property
    def gpu_idle_fraction(self) -> float:
        return 1.0 - self.gpu_busy_ns / self.wall_time_ns if self.wall_time_ns else 0.0

    def as_dict(self) -> dict:
        w = self.window
        paying = self.top_actions()
        top = paying[0] if paying else None
        return {
            "window": w.as_dict(), "wall_time_ns": int(self.wall_time_ns),
            "iterations": int(w.iterations), "iteration_time_median_ns": w.iteration_median_ns,
            "gpu_busy_ns": int(self.gpu_busy_ns),
            "gpu_idle_fraction": round(self.gpu_idle_fraction, 4),
            "breakdown": {k: int(v) for k, v in self.breakdown.items()},
            "idle_host_by_range": {k: int(v) for k, v in self.idle_host_by_range.items()},
            "verdict": {"class": self.verdict.value, "reason": self.reason,
                        "action": top.action if top else None,
                        "expected_end_to_end_speedup":
                            round(float(top.expected_end_to_end_speedup), 3) if top else 1.0},
            "actions": [a.as_action() for a in paying],
        }


FAMILIES = ("compute", "memory", "launch", "communication")


def _kernel_family(codes: np.ndarray, uniq: np.ndarray, is_kernel: np.ndarray, dur: np.ndarray,
                   floor: float) -> np.ndarray:
    """Index into FAMILIES per activity, by kernel family (names and durations only);
    ``codes`` index the distinct names ``uniq`` (Trace.name_codes)."""
    nccl = np.array([bool(NCCL_RE.match(str(u))) for u in uniq] + [False])[codes]
    gemm = np.array([bool(GEMM_RE.match(str(u))) and not INDUCTOR_FUSED_RE.match(str(u)) for u in uniq]
                    + [False])[codes]
    out = np.where(gemm, 0, 1).astype(np.int8)
    out[(dur < 2.0 * floor) & is_kernel & ~gemm] = 2
    out[nccl] = 3
    return out


def summarize(trace, window: Window, launch_floor_ns: float) -> RunSummary:
    """Split the window's wall time into GPU busy by class and GPU idle by cause."""
    w0, w1 = int(window.start_ns), int(window.end_ns)
    wall = max(w1 - w0, 1)
    acts = trace.activities
    dev_time = (acts["end"] - acts["start"]).groupby(acts["deviceId"]).sum()
    device = int(dev_time.idxmax()) if len(dev_time) else None
    sel = ((acts["deviceId"] == device) & (acts["end"] > w0) & (acts["start"] < w1)).to_numpy()
    codes, uniq = trace.name_codes
    # Column arrays only, each gathered once in start order: a million-row trace is not copied
    # whole (and what is no longer needed is let go as it goes).
    start = acts["start"].to_numpy(np.int64)[sel]
    order = np.argsort(start, kind="stable")
    rows = np.flatnonzero(sel)[order]
    col = lambda c, dtype: acts[c].to_numpy()[rows].astype(dtype, copy=False)  # noqa: E731
    codes = codes[rows]
    s = np.clip(start[order], w0, w1)
    del start, order, sel
    e = np.clip(col("end", np.int64), w0, w1)
    ms, me, first = merge_intervals(s, e)
    busy = int((me - ms).sum())

    # The kind compared on the categorical's codes, not as a million strings.
    is_kernel = (acts["kind"] == "kernel").to_numpy()[rows]
    fam = _kernel_family(codes, uniq, is_kernel, e - s, launch_floor_ns)
    by_fam = np.bincount(fam, weights=(e - s).astype("float64"), minlength=len(FAMILIES))
    del fam, is_kernel, codes, s, e
    total_dur = float(by_fam.sum())
    breakdown: dict[str, int] = {}
    for i, c in enumerate(FAMILIES):
        breakdown[c] = int(round(busy * float(by_fam[i]) / total_dur)) if total_dur else 0
    fix = busy - sum(breakdown.values())  # rounding: the busy classes add up to busy exactly
    if fix:
        big = max(breakdown, key=breakdown.__getitem__)
        breakdown[big] += fix

    # Idle gaps: before the first busy stretch, between stretches, after the last.
    gap_a = np.concatenate([[w0], me])
    gap_b = np.concatenate([ms, [w1]])
    nxt = np.concatenate([first, [-1]])  # the activity that ends each gap (none for the last)
    keep = gap_b > gap_a
    gap_a, gap_b, nxt = gap_a[keep], gap_b[keep], nxt[keep]
    del ms, me, first, keep
    api_end = col("api_end", "float64")
    launched = np.where(nxt >= 0, api_end[np.maximum(nxt, 0)], np.nan)
    del api_end, nxt
    # The part of a gap after the next work was launched is the GPU waiting on itself.
    host_end = np.where(np.isnan(launched), gap_b, np.clip(launched, gap_a, gap_b)).astype(np.int64)
    del launched
    other = gap_b - host_end
    host_part = host_end - gap_a
    del gap_b, host_end

    tids = col("globalTid", "float64")
    del rows
    # The processes by hashing (pd.unique) rather than sorting a million thread ids.
    tids = tids[~np.isnan(tids)].astype(np.int64)
    pids = {int(p) for p in pd.unique(np.right_shift(tids, 24))}
    del tids

    def of_process(df: pd.DataFrame) -> pd.DataFrame:
        keep = np.isin(np.right_shift(df["globalTid"].to_numpy(np.int64), 24), list(pids))
        df = df if keep.all() else df[keep]  # (all kept: the frame itself, not a copy of it)
        # Calls come sorted by start (Trace.launch_calls): a stable sort would change nothing.
        return df if df["start"].is_monotonic_increasing else df.sort_values("start", kind="stable")

    sync_or_copy = trace.api_calls_matching(SYNC_OR_COPY_RE)
    sync = of_process(sync_or_copy[match_names(sync_or_copy["name"], SYNC_RE)])
    copy = of_process(sync_or_copy[match_names(sync_or_copy["name"], MEMCPY_RE)])
    ss, se, _ = merge_intervals(sync["start"].to_numpy(np.int64), sync["end"].to_numpy(np.int64))
    cs, ce, _ = merge_intervals(copy["start"].to_numpy(np.int64), copy["end"].to_numpy(np.int64))
    is_sync = in_intervals(gap_a, ss, se) & (host_part > 0)
    is_copy = ~is_sync & in_intervals(gap_a + host_part // 2, cs, ce) & (host_part > 0)
    is_host = ~is_sync & ~is_copy
    breakdown["idle_host"] = int(host_part[is_host].sum())
    breakdown["idle_sync"] = int(host_part[is_sync].sum())
    breakdown["idle_memcpy_wait"] = int(host_part[is_copy].sum())
    breakdown["idle_other"] = int(other.sum())
    # Anything left (rounding at the window's edges) is idle time of no known cause.
    breakdown["idle_other"] += wall - sum(breakdown.values())

    tops = _top_ranges(trace)
    by_range = _host_idle_by_range(tops, gap_a[is_host] + host_part[is_host] // 2, host_part[is_host])
    # Host idle after a sync drained the queue, up to the next sync or copy: the CPU refilling the
    # queue, at most. How much of it is the sync's cost and how much the CPU's own pace only the
    # step model can say (charge_refill_to_syncs), so it is kept apart here.
    last = np.maximum.accumulate(np.where(is_host, -1, np.arange(len(gap_a)))) if len(gap_a) else gap_a
    refill = is_host & (host_part > 0) & (last >= 0) & is_sync[np.maximum(last, 0)]
    refill_by_range = _host_idle_by_range(tops, gap_a[refill] + host_part[refill] // 2, host_part[refill])
    sw = sync[(sync["end"] > w0) & (sync["start"] < w1)]
    sync_blocked = int((np.minimum(sw["end"], w1) - np.maximum(sw["start"], w0)).sum())
    launches = trace.launch_calls
    inside = ((launches["end"] > w0) & (launches["start"] < w1)).to_numpy()
    launches = of_process(launches if inside.all() else launches[inside])
    launch_ns = int((launches["end"] - launches["start"]).sum())
    # The CPU's last call in the window: a launch, a sync or a copy (what a step's CPU side ends
    # with), from the calls already read rather than another scan of the API table.
    ends = [df.loc[(df["start"] >= w0) & (df["start"] <= w1), "end"]
            for df in (launches, sync, copy) if len(df)]
    ends = [e for e in ends if len(e)]
    last_call = int(max(e.max() for e in ends)) if ends else None
    cpu_wait = _cpu_wait_other(launches, last_call, w1)
    summary = RunSummary(window, wall, busy, breakdown, by_range, sync_blocked, launch_ns, device,
                         RunClass.GPU, "", cpu_wait_other_ns=cpu_wait,
                         refill_ns=int(host_part[refill].sum()), refill_by_range=refill_by_range)
    # Actions come from the rule catalogue (profkit.judge.rules), which reads this summary; the facade
    # attaches them with apply_actions, so this module never imports the rules.
    summary.verdict, summary.reason = _verdict(summary)
    return summary


def _cpu_wait_other(launches: pd.DataFrame, last_call_end: Optional[int], w1: int) -> int:
    """CPU time spent waiting for the GPU outside synchronising calls: launch calls that blocked
    (a full launch queue: their time beyond LAUNCH_BLOCKED x the median launch), and the stretch
    from the CPU's last call in the window (``last_call_end``) to the window's end (the GPU
    finishing queued work)."""
    if last_call_end is None:
        return 0
    blocked = 0
    if len(launches):
        d = (launches["end"] - launches["start"]).to_numpy(np.int64)
        med = float(np.median(d))
        blocked = int(np.clip(d - med, 0, None)[d > LAUNCH_BLOCKED * med].sum())
    tail = max(int(w1) - int(min(last_call_end, w1)), 0)
    return blocked + tail


def _top_ranges(trace) -> Optional[tuple]:
    """The main threads' top-level user ranges in start order: (starts, ends, name code of each,
    names), the codes numbered in order of appearance; None without any."""
    if trace.user_ranges.empty:
        return None
    mains = user_main_threads(trace)
    top = user_top_level(trace)
    top = top[top["globalTid"].isin(list(mains.values()))].sort_values("start", kind="stable")
    if top.empty:
        return None
    trace_code, trace_names = trace.range_codes_of(top)
    name_code, present = pd.factorize(trace_code)
    return (top["start"].to_numpy(np.int64), top["end"].to_numpy(np.int64), name_code,
            trace_names[present])


def _host_idle_by_range(tops: Optional[tuple], at: np.ndarray, length: np.ndarray) -> dict[str, int]:
    """Host-idle time by the top-level user range (``_top_ranges``) open at each gap's middle."""
    if tops is None or len(at) == 0:
        return {}
    st, en, name_code, names = tops
    idx = np.searchsorted(st, at, side="right") - 1
    ok = (idx >= 0)
    ok[ok] = en[idx[ok]] >= at[ok]
    # Sum by range name through integer codes: one slot per name plus one for "outside".
    slot = np.where(ok, name_code[np.maximum(idx, 0)], len(names))
    sums = np.bincount(slot, weights=length.astype("float64"), minlength=len(names) + 1)
    labels = [str(n) for n in names] + ["(outside any range)"]
    pairs = sorted(((labels[i], int(v)) for i, v in enumerate(sums) if v > 0), key=lambda x: -x[1])
    out: dict[str, int] = {}
    for k, v in pairs:
        out[k] = out.get(k, 0) + v
    return out


def _verdict(r: RunSummary) -> tuple[RunClass, str]:
    wall = r.wall_time_ns
    b = r.breakdown
    idle = wall - r.gpu_busy_ns
    if b["communication"] / wall >= COMM_BOUND_SHARE:
        return RunClass.COMMUNICATION, (f"NCCL kernels run {b['communication'] / wall:.0%} of the "
                                        "wall time")
    if idle / wall < GPU_BOUND_IDLE:
        return RunClass.GPU, f"the GPU is busy {r.gpu_busy_ns / wall:.0%} of the wall time"
    causes = {"idle_host": b["idle_host"], "idle_sync": b["idle_sync"],
              "idle_memcpy_wait": b["idle_memcpy_wait"], "idle_other": b["idle_other"]}
    top = max(causes, key=causes.__getitem__)
    share = f"the GPU is idle {idle / wall:.0%} of the wall time"
    gain = {a.rule: a.expected_end_to_end_speedup for a in r.actions}
    if top == "idle_sync":
        sync_gain = gain.get("per-step-sync", 1.0)
        sync_bound = next((getattr(a, "bound", a.expected_end_to_end_speedup) for a in r.actions
                           if a.rule == "per-step-sync"), 1.0)
        if sync_gain > 1.0 and sync_gain >= max(gain.values(), default=1.0):
            return RunClass.SYNC, (f"{share}, {b['idle_sync'] / wall:.0%} after a synchronising "
                                   "call drained its queue")
        return RunClass.HOST, (f"{share}, {b['idle_sync'] / wall:.0%} after a synchronising call "
                               f"drained its queue; but the CPU's own work per step sets the pace, "
                               f"so removing the syncs gains at most {sync_bound:.2f}x")
    if top == "idle_memcpy_wait":
        return RunClass.DATA, f"{share}, {b['idle_memcpy_wait'] / wall:.0%} while the CPU copies data"
    if top == "idle_host":
        data = sum(v for k, v in r.idle_host_by_range.items() if DATA_RE.search(k))
        if b["idle_host"] and data / b["idle_host"] >= DATA_SHARE:
            name = next(k for k in r.idle_host_by_range if DATA_RE.search(k))
            return RunClass.DATA, (f"{share}, {data / wall:.0%} while the CPU is in `{name}` "
                                   "(data loading)")
        loose = ("; with no loop in the window that is the script's set-up and the Python between "
                 "one-shot calls, not a step to speed up (--window NAME judges one range)"
                 if not r.window.iterations else "")
        return RunClass.HOST, (f"{share}, {b['idle_host'] / wall:.0%} waiting for the CPU to "
                               f"launch the next work{loose}")
    return RunClass.GPU, (f"{share}, mostly with the next work already queued "
                          "(launch latency between short kernels, waits on other streams)")


# Two actions whose gains are within this factor count as equal: the cheaper change goes first
# (a setting or a one-line change before torch.compile, before a kernel), as an expert works.
NEAR_GAIN = 1.05


def rank_actions(items: list, gain: Callable[[Any], float], rung: Callable[[Any], str]) -> list:
    """``items`` best expected gain first, except that an action on a cheaper rung of the ladder
    goes before a costlier one whose gain is within NEAR_GAIN of its own. ``rung``: a Rung's value
    (an unknown one ranks as the costliest)."""
    from profkit.model import Rung
    ladder = [r.value for r in Rung]
    step = lambda a: ladder.index(rung(a)) if rung(a) in ladder else len(ladder)  # noqa: E731
    out = sorted(items, key=lambda a: -gain(a))
    for i in range(1, len(out)):
        j = i
        while j > 0 and step(out[j]) < step(out[j - 1]) and gain(out[j]) * NEAR_GAIN >= gain(out[j - 1]):
            out[j - 1], out[j] = out[j], out[j - 1]
            j -= 1
    return out


def charge_refill_to_syncs(summary: RunSummary, sync_cost_ns: float) -> RunSummary:
    """Move the refill after the syncs from "waiting for the CPU" to "after a sync", as much of it
    as ``sync_cost_ns`` (what the step model's replay without the syncs' waits saves over the
    window, profiled): a queue drained by a sync leaves the GPU idle while the CPU launches the
    next work, which would otherwise have been queued while the GPU ran; where the CPU is slower
    than the GPU anyway, the replay saves little and the idle stays the CPU's. The parts still add
    up to the wall time."""
    moved = int(min(max(sync_cost_ns, 0.0), summary.refill_ns, summary.breakdown["idle_host"]))
    if moved <= 0:
        return summary
    b = summary.breakdown
    b["idle_host"] -= moved
    b["idle_sync"] += moved
    summary.refill_charged_ns = moved
    frac = moved / summary.refill_ns
    by = dict(summary.idle_host_by_range)
    for k, v in summary.refill_by_range.items():
        if k in by:
            by[k] = max(by[k] - int(round(v * frac)), 0)
    summary.idle_host_by_range = {k: v for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v > 0}
    return summary


def apply_actions(summary: RunSummary, actions: list) -> RunSummary:
    """Attach the program findings (profkit.judge.rules), ranked (rank_actions: by gain, the
    cheaper of two within NEAR_GAIN first); and decide the verdict with them."""
    summary.actions = rank_actions(actions, lambda a: a.expected_end_to_end_speedup,
                                   lambda a: a.rung.value)
    summary.verdict, summary.reason = _verdict(summary)
    return summary


def sync_intervals(trace) -> tuple[np.ndarray, np.ndarray]:
    """Merged intervals during which some thread was blocked in a synchronising CUDA call."""
    cached = trace.__dict__.get("_sync_intervals")
    if cached is not None:
        return cached
    calls = trace.api_calls_matching(SYNC_OR_COPY_RE)
    sync = calls[match_names(calls["name"], SYNC_RE)].sort_values("start", kind="stable")
    ss, se, _ = merge_intervals(sync["start"].to_numpy(np.int64), sync["end"].to_numpy(np.int64))
    trace.__dict__["_sync_intervals"] = (ss, se)
    return ss, se


def critical_fraction(acts: pd.DataFrame, sync: tuple[np.ndarray, np.ndarray]) -> pd.Series:
    """Per activity: 1 where finishing it sooner would shorten the run, else 0.

    It would when something waited for its end: the next activity on the device was already
    launched (the GPU was behind the CPU), or the CPU was blocked in a synchronising call
    (``sync``, from sync_intervals). Otherwise the GPU went idle after it until the host issued
    more work, and a faster kernel only makes the GPU wait longer.
    """
    dev = acts["deviceId"].to_numpy(np.int64)
    end = acts["end"].to_numpy(np.int64)
    api_end = acts["api_end"].to_numpy("float64")
    order = _by_device_and_start(dev, acts["start"].to_numpy(np.int64))
    d, e, nxt_api = dev[order], end[order], np.append(api_end[order][1:], np.nan)
    same_dev = np.append(d[1:] == d[:-1], False)
    queued = same_dev & (np.isnan(nxt_api) | (nxt_api <= e))
    waited = in_intervals(e, *sync)
    crit = np.empty(len(order), dtype=float)
    crit[order] = (queued | waited).astype(float)
    return pd.Series(crit, index=acts.index)


def _by_device_and_start(dev: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``np.lexsort((start, dev))``, as one stable sort of a (device, start) key where it fits:
    activities come in start order, which that sort exploits."""
    if not len(dev):
        return np.empty(0, dtype=np.int64)
    code, devices = pd.factorize(dev, sort=True)
    lo, span = int(start.min()), int(start.max()) - int(start.min()) + 1
    if len(devices) * span >= 2 ** 62:
        return np.lexsort((start, dev))
    return np.argsort(code.astype(np.int64) * span + (start - lo), kind="stable")

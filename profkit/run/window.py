"""The steady-state window: which stretch of a run to judge, and what was left out of it.

A profile of a real program starts with one-off work — the model upload, each op's first-call
set-up (cuBLAS/cuDNN handles, algorithm search), compilation and autotuning — that can dwarf
the steady state the user wants to speed up. The window keeps the iterations after the first:

- iterations come from a repeated top-level NVTX range on the busiest thread (``train_step``,
  ``step``, …; step-like names win over other repeated ranges, then the longest in total);
- with no such range, from the repeating kernel sequence: the kernel that recurs at the most
  regular and longest period in launch order marks one iteration (a decode step, a batch);
- ``--window`` overrides: ``all``, ``RANGE``, ``RANGE[i:j]`` (instances i..j-1, Python slice
  rules) or ``T0:T1`` (seconds on the capture's timeline, as Nsight Systems shows it).

Everything left out is listed with its duration, never hidden.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from profkit.errors import ProfkitError
from profkit.read.intervals import in_intervals, sorted_union
from profkit.read.nsys import match_names, per_name

MIN_ITERATIONS = 3        # a range or kernel must recur this often to mark iterations
REGULAR_FRACTION = 0.6    # share of kernel-sequence periods that must be equal
MIN_ITERATION_SHARE = 0.5  # the iterations must launch at least this share of the kernel time
WARM_UP_FACTOR = 2.0      # a warm-up regime runs its iterations this much slower than the end
WARM_UP_SHARE = 0.6       # ... and ends within this share of the run
STEP_NAME_RE = re.compile(r"step|iter|batch|train|epoch|infer|decode|forward_backward", re.I)
COMPILE_RANGE_RE = re.compile(r"^(Torch-Compiled Region|CompiledFunction|TorchDynamo|inductor|"
                              r"torch\.compile|compile_fx|.*autotun|.*benchmark_fusion)", re.I)
# Ranges that libraries open on their own (CUB/CCCL, cuBLAS, cuDNN, NCCL): never the user's loop.
LIBRARY_RANGE_RE = re.compile(r"^(CCCL:|cub::|cublas|cuBLAS|cudnn|cuDNN|NCCL|nccl)")
_SLICE_RE = re.compile(r"^(?P<name>.+?)\[(?P<i>-?\d*):(?P<j>-?\d*)\]$")
_TIME_RE = re.compile(r"^(?P<t0>\d+(\.\d*)?|\.\d+):(?P<t1>\d+(\.\d*)?|\.\d+)$")


@dataclass
class Window:
    """The stretch of the capture that is judged, on the trace's ns timeline."""
    start_ns: int
    end_ns: int
    source: str                       # how it was chosen, e.g. "nvtx train_step[1:12]"
    iterations: int = 0               # iterations inside the window (0: none found)
    iteration_ns: list[int] = field(default_factory=list)  # each iteration's wall time
    delimiter: Optional[str] = None   # the range or kernel name that marks iterations
    excluded: list[dict] = field(default_factory=list)     # [{"what", "ns"}]
    is_all: bool = False
    # Each iteration's period on the GPU: from the start of its first GPU activity to the next
    # iteration's. When the CPU runs ahead of the GPU (CUDA graphs, a GPU-bound loop with no sync),
    # the CPU-side periods above only say how fast the CPU queued the work.
    gpu_period_ns: list[int] = field(default_factory=list)
    # Kernel-sequence windows: the periods of the iterations left out before the window (first-call
    # set-up, a warm-up regime), so `left out` can name them.
    setup_iteration_ns: list[int] = field(default_factory=list)
    # The trace's end lost GPU work: kernel launches of the last iterations with no kernel record
    # (the program ended without waiting for the GPU, or the trace was cut by the GPU's clock).
    # ``lost_iterations`` of them were left out of the window, ``lost_launches`` launches in all.
    lost_launches: int = 0
    lost_iterations: int = 0
    lost_kept: bool = False           # too few whole iterations: the window keeps the incomplete ones

    @property
    def wall_ns(self) -> int:
        return int(self.end_ns - self.start_ns)

    @property
    def periods_ns(self) -> list[int]:
        """Each iteration's wall time: the GPU-side period where every iteration has GPU work
        (the queue's throughput, also when the CPU runs ahead), else the CPU-side one."""
        return self.gpu_period_ns if len(self.gpu_period_ns) == len(self.iteration_ns) else self.iteration_ns

    @property
    def iteration_bounds_ns(self) -> np.ndarray:
        """Where each iteration starts, then where the last one ends (host clock, ns)."""
        return self.start_ns + np.concatenate([[0], np.cumsum(self.iteration_ns)])

    @property
    def iteration_median_ns(self) -> Optional[int]:
        return int(np.median(self.periods_ns)) if self.iteration_ns else None

    def as_dict(self) -> dict:
        return {"start_ns": int(self.start_ns), "end_ns": int(self.end_ns), "source": self.source,
                "delimiter": self.delimiter, "excluded": list(self.excluded)}


def _bounds(trace) -> tuple[int, int]:
    """First and last timestamp of the busiest process's CUDA work (API calls, GPU activity).

    Other processes (compile workers, loader workers) only touch CUDA at start-up or exit."""
    acts = trace.activities
    lo = [int(acts["start"].min())]
    hi = [int(acts["end"].max())]
    api = acts["api_start"].dropna()
    if len(api):
        lo.append(int(api.min()))
    span = trace.api_span(_primary_pid(trace))
    if span is not None:
        lo.append(span[0])
        hi.append(span[1])
    return min(lo), max(hi)


def main_threads(ranges: pd.DataFrame) -> dict[int, int]:
    """Per process (globalTid >> 24), the thread whose user ranges cover the most time.

    That is the thread that drives the program (opens `train_step`, waits in `backward`); helper
    threads (PyTorch's autograd engine, loaders) open few or short ranges of their own.
    """
    if ranges.empty:
        return {}
    dur = (ranges["end"] - ranges["start"]).groupby(ranges["globalTid"]).sum()
    out: dict[int, int] = {}
    for tid, d in dur.sort_values(ascending=False).items():
        out.setdefault(int(tid) >> 24, int(tid))
    return out


def top_level(ranges: pd.DataFrame) -> pd.DataFrame:
    """Ranges not nested inside another range of the same thread."""
    if ranges.empty:
        return ranges
    r = ranges.sort_values(["globalTid", "start", "end"], ascending=[True, True, False], kind="stable")
    end = r["end"].to_numpy()
    tid = r["globalTid"].to_numpy()
    prev_max = pd.Series(end).groupby(tid).cummax().shift(1).to_numpy()
    new_tid = np.ones(len(r), dtype=bool)
    new_tid[1:] = tid[1:] != tid[:-1]
    keep = new_tid | (r["start"].to_numpy() >= np.nan_to_num(prev_max, nan=-1))
    return r[keep]


def user_main_threads(trace) -> dict[int, int]:
    """main_threads of the trace's user ranges, computed once per trace (the window, the run
    summary and the step graph all ask)."""
    if "_user_main_threads" not in trace.__dict__:
        trace.__dict__["_user_main_threads"] = main_threads(trace.user_ranges)
    return trace.__dict__["_user_main_threads"]


def user_top_level(trace) -> pd.DataFrame:
    """top_level of the trace's user ranges, computed once per trace; shared, so read-only."""
    if "_user_top_level" not in trace.__dict__:
        trace.__dict__["_user_top_level"] = top_level(trace.user_ranges)
    return trace.__dict__["_user_top_level"]


def _primary_pid(trace) -> Optional[int]:
    """The process that ran the most GPU time, computed once per trace (the window search asks
    five times, the step graph once more)."""
    if "_primary_pid" not in trace.__dict__:
        acts = trace.activities
        if acts.empty:
            return None
        dur = (acts["end"] - acts["start"]).groupby(np.right_shift(acts["globalPid"].to_numpy(np.int64), 24)).sum()
        trace.__dict__["_primary_pid"] = int(dur.idxmax())
    return trace.__dict__["_primary_pid"]


def _instances(trace, name: str) -> pd.DataFrame:
    """Instances of one user range on the main thread of the busiest process, in time order."""
    r = trace.ranges
    r = r[trace.ranges_named(name)]
    if r.empty:
        raise ProfkitError(f"--window {name}: no NVTX range of that name in {trace.path}; "
                           "see the range names with `profkit classify --window all --by range`")
    mains = user_main_threads(trace)
    pid = _primary_pid(trace)
    main = mains.get(pid) if pid is not None else None
    if main is not None and (r["globalTid"] == main).any():
        r = r[r["globalTid"] == main]
    return r.sort_values("start", kind="stable")


def _kernel_share(trace, inst: pd.DataFrame) -> float:
    """Share of the kernel time that counts for the loop which is launched inside the span of
    ``inst`` (first to last).

    What counts: everything launched from the first instance on, and before it only what was
    launched inside other user ranges (earlier phases of a script of phases). Unannotated set-up
    before the loop (model upload, torch.compile's autotuning and CUDA-graph recording, inside
    compile ranges or none) does not count against it.
    """
    acts = trace.activities
    is_kernel = (acts["kind"] == "kernel").to_numpy()  # (columns picked, not the frame copied)
    if not is_kernel.any() or inst.empty:
        return 0.0
    t = acts["api_start"].to_numpy(dtype="float64")[is_kernel]
    dur = (acts["end"] - acts["start"]).to_numpy(dtype="float64")[is_kernel]
    first = float(inst["start"].min())
    counts = t >= first
    user = trace.user_ranges
    user = user[loop_range_mask(trace.range_codes_of(user)) & (user["start"] < first).to_numpy()]
    if not user.empty:
        counts |= in_intervals(t, *sorted_union(user["start"].to_numpy(np.int64),
                                                 user["end"].to_numpy(np.int64)))
    total = float(dur[counts].sum())
    if total <= 0:
        return 0.0
    span = (t >= first) & (t <= float(inst["end"].max()))
    return float(dur[span].sum()) / total


def loop_range_mask(names: "pd.Series | tuple[np.ndarray, np.ndarray]") -> np.ndarray:
    """Which user NVTX ranges can mark or hold a loop's work: not torch.compile's own, not the
    ones libraries open (CCCL, NCCL, cuBLAS, cuDNN). ``names``: a column, or (codes, distinct
    names) as Trace.range_codes_of gives them."""
    # Both patterns in one pass over the distinct names (a trace holds 10^5 ranges and more).
    return ~per_name(names, lambda n: bool(COMPILE_RANGE_RE.match(n) or LIBRARY_RANGE_RE.match(n)), bool)


LAUNCH_RE = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchCooperativeKernel|cuLaunchCooperativeKernel)")


def _whole_instances(trace, inst: pd.DataFrame, first: int) -> tuple[int, int]:
    """How many of the instances, from the first, are whole, and how many kernel launches of
    the others have no kernel in the trace. The trace loses the GPU work at its end when the
    program exits without waiting for the GPU (or a tool cuts the trace by the GPU's clock): a
    GPU-bound loop with no sync runs many iterations behind its CPU, so the last iterations on the
    CPU side hold launches whose kernels never made it into the trace. Walks back from the last
    instance and stops at the first whole one: a whole trace costs one small read."""
    acts = trace.activities
    kern = (acts["kind"] == "kernel").to_numpy() & acts["api_start"].notna().to_numpy()
    api = acts["api_start"].to_numpy(dtype="float64")[kern]
    corr = acts["correlationId"].to_numpy(np.int64)[kern]
    starts, ends = inst["start"].to_numpy(np.int64), inst["end"].to_numpy(np.int64)
    lost = 0
    for k in range(len(inst) - 1, first - 1, -1):
        calls = trace.api_calls_between(int(starts[k]), int(ends[k]))
        names = calls["name"].astype(str)
        is_launch = names.str.match(LAUNCH_RE).to_numpy(bool)
        # Launches recorded into a CUDA graph (between a stream's begin and end of capture) run
        # nothing and leave no kernel: not lost work.
        begin = calls["start"][names.str.startswith("cudaStreamBeginCapture")].to_numpy(np.int64)
        end = calls["start"][names.str.startswith("cudaStreamEndCapture")].to_numpy(np.int64)
        if len(begin):
            t = calls["start"].to_numpy(np.int64)
            if len(end) < len(begin):  # still capturing when the range ended
                end = np.append(end, np.int64(ends[k]))
            is_launch &= ~in_intervals(t, *sorted_union(begin, end[:len(begin)]))
        launches = calls["correlationId"].to_numpy(np.int64)[is_launch]
        have = corr[(api >= starts[k]) & (api <= ends[k])]
        missing = int(np.count_nonzero(~np.isin(launches, have)))
        if missing == 0:
            return k + 1, lost
        lost += missing
    return first, lost


def _gpu_end_of(trace, t0: int, t1: int) -> int:
    """The end of the last GPU activity launched in [t0, t1] (the CPU runs ahead of the GPU)."""
    acts = trace.activities
    api = acts["api_start"]
    sel = (api >= t0) & (api <= t1)
    return int(acts.loc[sel, "end"].max()) if sel.any() else t1


def _from_instances(trace, inst: pd.DataFrame, i: Optional[int], j: Optional[int],
                    label: str) -> Window:
    n = len(inst)
    sel = inst.iloc[slice(i, j)]
    if sel.empty:
        raise ProfkitError(f"--window {label}[{'' if i is None else i}:{'' if j is None else j}]: "
                           f"selects no instance (there are {n}); use indices in 0..{n}")
    starts = sel["start"].to_numpy(np.int64)
    last = sel.iloc[-1]
    start = int(starts[0])
    end = max(int(last["end"]), _gpu_end_of(trace, int(last["start"]), int(last["end"])))
    periods = np.diff(starts).tolist() + [int(end - starts[-1])]
    lo = 0 if i is None else (i if i >= 0 else n + i)
    hi = n if j is None else (j if j >= 0 else n + j)
    return Window(start, end, f"nvtx {label}[{lo}:{hi}] of {n}", iterations=len(sel),
                  iteration_ns=[int(p) for p in periods], delimiter=str(inst["name"].iat[0]),
                  gpu_period_ns=_gpu_periods(trace, sel, end))


def _gpu_periods(trace, sel: pd.DataFrame, end: int) -> list[int]:
    """GPU-side period of each instance in ``sel``: first GPU activity launched in it to the next
    instance's (the last: to ``end``); empty when an instance launched no GPU work."""
    acts = trace.activities
    api = acts["api_start"].to_numpy(dtype="float64")
    gstart = acts["start"].to_numpy(dtype="float64")
    order = np.argsort(api, kind="stable")
    api_s, g_s = api[order], gstart[order]
    lo = np.searchsorted(api_s, sel["start"].to_numpy(dtype="float64"), side="left")
    hi = np.searchsorted(api_s, sel["end"].to_numpy(dtype="float64"), side="right")
    if (hi <= lo).any() or (np.diff(lo) <= 0).any():
        return []
    # Minimum GPU start per instance: launches between instances are masked out, then one
    # reduceat over the instances' first positions (vectorised: a loop of 10^5 steps stays cheap).
    inside = np.zeros(len(g_s) + 1, dtype=np.int64)
    np.add.at(inside, lo, 1)
    np.add.at(inside, hi, -1)
    masked = np.where(np.cumsum(inside)[:-1] > 0, g_s, np.inf)
    first = np.minimum.reduceat(masked, lo)
    periods = np.diff(first).tolist() + [float(end) - first[-1]]
    return [] if min(periods) <= 0 else [int(p) for p in periods]


def _nvtx_delimiter(trace) -> Optional[str]:
    user = trace.user_ranges
    if user.empty:
        return None
    mains = user_main_threads(trace)
    pid = _primary_pid(trace)
    main = mains.get(pid) if pid is not None else None
    top = user_top_level(trace)
    if main is not None:
        top = top[top["globalTid"] == main]
    codes, uniq = trace.range_codes_of(top)
    loop = loop_range_mask((codes, uniq)) & (codes >= 0)
    top, codes = top[loop], codes[loop]
    if top.empty:
        return None
    # Count and total per name through the codes, then in name order (as a groupby by name
    # gives them): the sort below breaks ties by that order.
    stats = (top["end"] - top["start"]).groupby(codes).agg(["size", "sum"])
    stats.index = pd.Index(uniq[stats.index.to_numpy()], name="name")
    stats = stats.sort_index()
    stats = stats[stats["size"] >= MIN_ITERATIONS]
    if stats.empty:
        return None
    stats["steplike"] = [bool(STEP_NAME_RE.search(n)) for n in stats.index]
    return str(stats.sort_values(["steplike", "sum"], ascending=False).index[0])


def iteration_instances(trace) -> Optional[tuple[str, pd.DataFrame]]:
    """The range that marks iterations (as ``auto`` picks it) and its instances, or None."""
    name = _nvtx_delimiter(trace)
    return None if name is None else (name, _instances(trace, name))


def kernel_period(trace) -> Optional[tuple[str, np.ndarray, np.ndarray]]:
    """The kernel that marks iterations in an unannotated trace, its launch times and its start
    times on the GPU.

    In launch order, a kernel that runs once per iteration recurs at a fixed distance (the
    number of kernels in one iteration). Among kernels recurring at least MIN_ITERATIONS + 1
    times with mostly equal distances, the longest distance is one whole iteration.
    """
    acts = trace.activities
    sel = ((acts["kind"] == "kernel") & acts["api_start"].notna()).to_numpy()
    pid = _primary_pid(trace)
    if pid is not None:
        sel = sel & (np.right_shift(acts["globalPid"].to_numpy(np.int64), 24) == pid)
    if sel.sum() < 2 * (MIN_ITERATIONS + 1):
        return None
    all_codes, all_uniq = trace.name_codes
    k = acts[sel]
    order = np.argsort(k["api_start"].to_numpy(), kind="stable")
    k = k.iloc[order]
    # Renumber to the names present, so bincount and the code list stay small and dense.
    codes, present = pd.factorize(all_codes[sel][order])
    uniq = all_uniq[present]
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes)
    splits = np.split(order, np.cumsum(counts)[:-1])
    candidates: dict[int, int] = {}  # period -> the most frequent kernel recurring at it
    for code, pos in enumerate(splits):
        if len(pos) < MIN_ITERATIONS + 1:
            continue
        gaps = np.diff(pos)
        vals, cnt = np.unique(gaps, return_counts=True)
        mode, share = int(vals[cnt.argmax()]), cnt.max() / len(gaps)
        if share < REGULAR_FRACTION or mode < 2:
            continue
        if mode not in candidates or len(pos) > len(splits[candidates[mode]]):
            candidates[mode] = code
    if not candidates:
        return None
    # The iteration is the shortest period at which the whole sequence repeats about as well as
    # at any candidate period: a per-layer kernel recurs at a shorter distance, but the sequence
    # does not repeat there across the end of a step.
    fit = {p: float(np.mean(codes[:-p] == codes[p:])) for p in candidates if p < len(codes)}
    if not fit:
        return None
    best_fit = max(fit.values())
    period = min(p for p, f in fit.items() if f >= 0.95 * best_fit)
    pos = splits[candidates[period]]
    return (str(uniq[candidates[period]]), k["api_start"].to_numpy(np.int64)[pos],
            k["start"].to_numpy(np.int64)[pos])


def leading_setup(starts: np.ndarray, factor: float = 10.0) -> int:
    """Index of the first steady iteration: after the first, and after the set-up outliers (a
    period over ``factor`` times the median: compilation, autotuning, CUDA-graph recording, the
    gap before a second generate() call) when they all fall in the first half of the run. Slow
    iterations that recur later (an evaluation or a checkpoint every N steps) are part of the
    run: then only those that follow the first iteration directly are skipped."""
    periods = np.diff(starts)
    if len(periods) <= MIN_ITERATIONS:
        return 1
    med = float(np.median(periods))
    slow = np.nonzero(periods[: len(periods) - MIN_ITERATIONS + 1] > factor * med)[0]
    slow = slow[slow >= 1]  # the first iteration is always left out
    if not len(slow):
        first = 1
    elif slow[-1] < len(periods) / 2:
        first = int(slow[-1]) + 1
    else:
        first = 1
        while first < len(periods) - MIN_ITERATIONS and periods[first] > factor * med:
            first += 1
    return max(first, warm_up_regime(periods))


def warm_up_regime(periods: np.ndarray, factor: float = WARM_UP_FACTOR) -> int:
    """Index of the first iteration after a slow warm-up regime: the last run of MIN_ITERATIONS
    or more consecutive iterations over ``factor`` times the median of the run's second half, when
    it ends in the first WARM_UP_SHARE of the run (a warm-up generate() call before the measured
    one runs every token several times slower: no single outlier marks it).  0 when there is
    none.  Single slow iterations later in the run (an evaluation every N steps) are part of it."""
    n = len(periods)
    if n < 2 * MIN_ITERATIONS:
        return 0
    slow = periods[:int(n * WARM_UP_SHARE)] > factor * float(np.median(periods[n // 2:]))
    # The length of the slow run ending at each iteration (0 where it is not slow), vectorised:
    # a loop of 10^5 iterations in Python cost more than the rest of the window search.
    k = np.arange(len(slow))
    run = k - np.maximum.accumulate(np.where(slow, -1, k))
    ends = np.flatnonzero(run >= MIN_ITERATIONS)
    return int(ends[-1]) + 1 if len(ends) else 0


def _excluded(trace, w: Window, lo: int, hi: int) -> list[dict]:
    """What the window leaves out, with durations: set-up before it, the tail after it."""
    out: list[dict] = []
    before = w.start_ns - lo
    if before > 0:
        acts = trace.activities
        h2d = acts[(acts["kind"] == "memcpy") & (acts["start"] < w.start_ns)]
        h2d = h2d[h2d["name"].str.contains("Host-to-Device", regex=False)]
        what = "set-up before the window"
        parts = []
        if len(h2d):
            mb = float(h2d["bytes"].fillna(0).sum()) / 1e6
            parts.append(f"host-to-device copies (model upload) {mb:.0f} MB in "
                         f"{_ms(int((h2d['end'] - h2d['start']).sum()))}")
        comp = trace.user_ranges
        comp = comp[match_names(trace.range_codes_of(comp), COMPILE_RANGE_RE)
                    & (comp["start"] < w.start_ns).to_numpy()]
        if len(comp):
            parts.append(f"torch.compile/autotuning ranges {_ms(int((comp['end'] - comp['start']).sum()))}")
        if w.delimiter and not w.source.startswith("time"):
            first = trace.ranges
            first = first[trace.ranges_named(w.delimiter) & (first["start"] < w.start_ns).to_numpy()]
            if len(first):
                parts.append(f"first {len(first)} iteration(s) with first-call set-up "
                             f"{_ms(int((first['end'] - first['start']).sum()))}")
        if w.setup_iteration_ns and w.iteration_ns:
            med = int(np.median(w.setup_iteration_ns))
            parts.append(f"first {len(w.setup_iteration_ns)} iteration(s), {_ms(med)} each (median; "
                         f"{_ms(int(np.median(w.iteration_ns)))} in the window)")
        cut = (trace.meta or {}).get("trimmed_before_ns")
        if cut and str(cut).lstrip("-").isdigit():
            # a committed trace whose set-up was cut (scripts/tools/trim_setup.py): what is left
            # out is what the file kept, not what the run spent
            parts.append("the file keeps only its last "
                         f"{_ms(max(0, w.start_ns - int(cut)))} (earlier rows were cut from it)")
        out.append({"what": what + (": " + "; ".join(parts) if parts else ""), "ns": int(before)})
    after = hi - w.end_ns
    if after > 0:
        out.append({"what": "after the window (last partial iteration, shutdown)", "ns": int(after)})
    return out


def _ms(ns: int) -> str:
    return f"{ns / 1e9:.2f} s" if ns >= 1e9 else f"{ns / 1e6:.1f} ms"


def find_window(trace, spec: str = "auto") -> Window:
    """The window ``spec`` names (see the module docstring); ``auto`` finds the steady state."""
    lo, hi = _bounds(trace)
    spec = (spec or "auto").strip()
    if spec == "all":
        return Window(lo, hi, "all", is_all=True)
    m = _TIME_RE.match(spec)
    if m:
        t0, t1 = int(float(m.group("t0")) * 1e9), int(float(m.group("t1")) * 1e9)
        if t1 <= t0:
            raise ProfkitError(f"--window {spec}: the end must be after the start")
        if t0 >= hi or t1 <= lo:
            raise ProfkitError(f"--window {spec}: outside the capture, whose CUDA work runs from "
                               f"{lo / 1e9:.3f} s to {hi / 1e9:.3f} s")
        w = Window(max(t0, lo), min(t1, hi), f"time {spec} s")
    elif spec == "auto":
        name = _nvtx_delimiter(trace)
        share = _kernel_share(trace, _instances(trace, name)) if name is not None else 0.0
        if name is not None and share < MIN_ITERATION_SHARE:
            # A script of several phases (benchmarks one op after another), not a loop: the
            # repeated range is one phase, and judging it alone would hide the others.
            return Window(lo, hi, f"all (the repeated range {name} holds only {share:.0%} of the "
                                  "kernel time: no loop to take iterations from; --window NAME "
                                  "picks one)", is_all=True)
        if name is not None:
            inst = _instances(trace, name)
            # After the first instance and any later set-up outlier (CUDA-graph recording in the
            # second step of a torch.compile(mode="reduce-overhead") loop).
            first = leading_setup(inst["start"].to_numpy(np.int64))
            whole, lost = _whole_instances(trace, inst, first)
            w = _from_instances(trace, inst.iloc[:whole] if lost and whole - first > MIN_ITERATIONS else inst,
                                first, None, name)
            if lost:
                w.lost_launches, w.lost_iterations = lost, len(inst) - whole
                w.lost_kept = not whole - first > MIN_ITERATIONS
        else:
            found = kernel_period(trace)
            if found is None:
                return Window(lo, hi, "all (no repeated NVTX range or kernel sequence found)",
                              is_all=True)
            kname, starts, gpu_starts = found
            if len(starts) < MIN_ITERATIONS + 1:
                return Window(lo, hi, "all", is_all=True)
            # Whole iterations after the first (and after any later set-up outlier), to the last.
            first = leading_setup(starts)
            gp = np.diff(gpu_starts[first:])
            w = Window(int(starts[first]), int(starts[-1]), f"kernel sequence: iterations "
                       f"{first}..{len(starts) - 1} of {len(starts)} repeats of one kernel",
                       iterations=len(starts) - 1 - first,
                       iteration_ns=[int(x) for x in np.diff(starts[first:])], delimiter=kname,
                       gpu_period_ns=[int(x) for x in gp] if (gp > 0).all() else [],
                       setup_iteration_ns=[int(x) for x in np.diff(starts[:first + 1])])
    else:
        sm = _SLICE_RE.match(spec)
        name = sm.group("name") if sm else spec
        inst = _instances(trace, name)
        if sm:
            i = int(sm.group("i")) if sm.group("i") else None
            j = int(sm.group("j")) if sm.group("j") else None
        else:
            i, j = (1 if len(inst) > 1 else None), None
        w = _from_instances(trace, inst, i, j, name)
    w.excluded = _excluded(trace, w, lo, hi)
    return w

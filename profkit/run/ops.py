"""Group op instances into ops: one row per NVTX range name, kernel name or aten op.

Levels:
- ``range``: every non-aten NVTX range name; an activity counts for every range around its
  launch (nested ranges included, as nsys does), or only the innermost one (``innermost=True``).
- ``kernel``: every kernel (memcpy, memset) name; one instance per activity.
- ``aten``: the ``aten::`` ranges of ``emit_nvtx(record_shapes=True)``, grouped by op and input
  sizes; each activity goes to its innermost aten range, so wrappers (aten::linear around
  aten::addmm) do not count the same kernel twice.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.run import attribution
from profkit.errors import ProfkitError
from profkit.read.assemble import text_column
from profkit.read.hints import Hint, check_range_name, parse_range_name
from profkit.read.trace import Trace
from profkit.run.window import COMPILE_RANGE_RE

LEVELS = ("range", "kernel", "aten")
# emit_nvtx decorates every range it writes ("MmBackward0, seq = 12, op_id = 345, sizes = ...");
# the decorations differ per call, so they are cut before ranges are grouped by name.
_DECORATION_RE = re.compile(r",\s*(seq|op_id|stashed seq|sizes|input_op_ids|scope)\s*=.*$")
COMPILE_ROW = "torch.compile (one-off)"


def clean_range_name(name: str) -> str:
    """The name a range is grouped under: emit_nvtx decorations cut, compiler internals as one."""
    if COMPILE_RANGE_RE.match(name):
        return COMPILE_ROW
    return _DECORATION_RE.sub("", name)


@dataclass
class OpGroups:
    """Ops of one level: ``ops`` (one row per op), ``instances`` and ``members`` behind them."""
    level: str
    ops: pd.DataFrame        # indexed by op name
    instances: pd.DataFrame  # one row per op instance (range instance or activity), column `op`
    members: pd.DataFrame    # (op, instance, act_idx): which activities each instance ran
    hints: dict[str, Hint]
    # members' op as an integer code into an array of the op names: a million-row members
    # table is grouped by op through these rather than by hashing its strings again.
    member_codes: tuple[np.ndarray, np.ndarray]

    def members_by_op(self) -> dict[str, np.ndarray]:
        """Per op name, the act_idx of its members, in members order."""
        code, names = self.member_codes
        act = self.members["act_idx"].to_numpy()
        return {names[c]: act[ix] for c, ix in pd.Series(code).groupby(code, sort=False).indices.items()}


def group_ops(trace: Trace, by: str = "range", innermost: bool = False) -> OpGroups:
    if by not in LEVELS:
        raise ProfkitError(f"unknown level {by!r}: use one of {', '.join(LEVELS)}")
    acts = trace.activities
    hints: dict[str, Hint] = {}
    if by == "kernel":
        inst = attribution.kernel_instances(acts)
        inst["op"] = inst["name"]
        members = pd.DataFrame({"op": inst["op"].to_numpy(), "instance": inst["range_idx"].to_numpy(),
                                "act_idx": acts.index.to_numpy()})
        codes, names = trace.name_codes  # one member per activity, in activity order
        member_codes = (codes, names)
    else:
        if trace.ranges.empty:
            raise ProfkitError(f"{trace.path}: no NVTX ranges, so nothing to group --by {by}; "
                               "use --by kernel, or add NVTX ranges (profkit.annotate) and capture again")
        if trace.linked_fraction == 0:
            raise ProfkitError(f"{trace.path}: no CUDA runtime calls in the trace, so GPU work cannot "
                               "be tied to NVTX ranges; capture with `-t cuda,nvtx` or use --by kernel")
        pairs = attribution.activity_pairs(trace, by, innermost=innermost or by == "aten")
        ranges = trace.ranges_of_level(by)
        if ranges.empty:
            msg = ("no aten:: ranges: capture with `profkit capture --aten` (emit_nvtx with record_shapes)"
                   if by == "aten" else "only aten:: ranges: use --by aten")
            raise ProfkitError(f"{trace.path}: {msg}")
        inst = attribution.range_instances(trace.ranges, acts, pairs, trace.one_activity_per_call)
        if by == "aten":
            inst["op"] = inst["name"].map(attribution.aten_key)
        else:
            for n in inst["name"].unique():
                check_range_name(n)  # an impossible hint is an error, not silently dropped
            parsed = {n: parse_range_name(clean_range_name(n)) for n in inst["name"].unique()}
            inst["op"] = inst["name"].map({n: v[0] for n, v in parsed.items()})
            hints = _mean_hints(inst, parsed)
        # Each member's op through its instance (inst is sorted by range_idx), as integer codes.
        inst_code, names = pd.factorize(inst["op"])
        names = np.asarray(names, dtype=object)
        instance = pairs["range_idx"].to_numpy()
        at = np.searchsorted(inst["range_idx"].to_numpy(), instance)
        code = inst_code[at] if len(inst) else np.full(len(instance), -1, dtype=np.int64)
        keep = code >= 0  # an instance without an op is no op's member
        every = bool(keep.all())  # (then the pairs' own arrays, not copies of millions of rows)
        pick = (lambda v: v) if every else (lambda v: v[keep])
        # The op column taken from the few op names (not a million strings checked one by one).
        members = pd.DataFrame({"instance": pick(instance), "act_idx": pick(pairs["act_idx"].to_numpy()),
                                "op": text_column(names, pick(code))},
                               index=None if every else np.flatnonzero(keep), copy=False)
        member_codes = (pick(code), names)
    if inst.empty:
        raise ProfkitError(f"{trace.path}: no GPU work was launched inside any NVTX range; "
                           "use --by kernel")
    ops = _aggregate(inst, members, member_codes, acts, trace.total_gpu_time_ns)
    ops["level"] = by
    return OpGroups(level=by, ops=ops, instances=inst, members=members, hints=hints,
                    member_codes=member_codes)


def _mean_hints(inst: pd.DataFrame, parsed: dict[str, tuple[str, Hint | None]]) -> dict[str, Hint]:
    """One hint per op: the mean over its calls, since calls may carry different sizes
    (e.g. gradient buckets of one all-reduce range)."""
    hinted = {n: v for n, v in parsed.items() if v[1] is not None}
    names = inst["name"][inst["name"].isin(list(hinted))]
    if names.empty:
        return {}
    df = pd.DataFrame([(hinted[n][0], hinted[n][1].flops, hinted[n][1].bytes, hinted[n][1].precision)
                       for n in names], columns=["op", "flops", "bytes", "precision"])
    out = {}
    for op, g in df.groupby("op", sort=False):
        prec = g["precision"].dropna()
        out[op] = Hint(flops=g["flops"].mean() if g["flops"].notna().any() else None,
                       bytes=g["bytes"].mean() if g["bytes"].notna().any() else None,
                       precision=prec.mode().iat[0] if len(prec) else None)
    return out


def _aggregate(inst: pd.DataFrame, members: pd.DataFrame, member_codes: tuple[np.ndarray, np.ndarray],
               acts: pd.DataFrame, total_gpu_ns: int) -> pd.DataFrame:
    inst = inst.assign(frac=np.where(inst["span_ns"] > 0, inst["busy_ns"] / inst["span_ns"].where(
        inst["span_ns"] > 0, 1), 1.0))
    g = inst.sort_values("gpu_start", kind="stable").groupby("op", sort=False)
    ops = pd.DataFrame({
        "count": g.size(),
        "gpu_time_ns": g["span_ns"].sum(),
        "gpu_time_median_ns": g["span_ns"].median(),
        "first_call_ns": g["span_ns"].first(),
        "busy_ns": g["busy_ns"].sum(),
        "busy_median_ns": g["busy_ns"].median(),
        "cpu_time_ns": g["cpu_time_ns"].sum(),
        "kernels": g["n_acts"].sum(),
        # each call's longest kernel (median over calls): no fusion of a call's kernels is shorter
        "kernel_longest_ns": g["longest_ns"].median(),
    })
    # An activity counts once per op for its share, however many instances of the op hold it
    # (nested or never-closed ranges of one name): the share then cannot pass 100%. Without such
    # overlaps the busy time (union per instance) is already at most the distinct-activity sum.
    dur_all = (acts["end"] - acts["start"]).to_numpy()
    code, names = member_codes
    act_idx = members["act_idx"].to_numpy(np.int64)
    # (op, activity) pairs as one integer key: the distinct ones (each key's first row, found by
    # a stable sort rather than a hash of millions of keys), then their durations per op. None
    # repeats where each op's instances ran at separate times (the usual case: no sort at all).
    dur = dur_all[act_idx]
    if _apart(inst):
        distinct_ns = _sum_by_code(code, dur)
    else:
        first = _first_of_each(code.astype(np.int64) * max(len(acts), 1) + act_idx)
        distinct_ns = _sum_by_code(code[first], dur[first])
    distinct_ns.index = names[distinct_ns.index.to_numpy()]
    share_ns = np.minimum(ops["busy_ns"], distinct_ns.reindex(ops.index).fillna(0))
    ops["share"] = share_ns / total_gpu_ns if total_gpu_ns else 0.0
    ops["kernels_per_call"] = ops["kernels"] / ops["count"]
    # Median over calls, so a first call that waited on set-up does not decide the verdict.
    ops["busy_fraction"] = g["frac"].median()
    median = _median_by_code(code, dur)
    ops["kernel_median_ns"] = pd.Series(median.to_numpy(), index=names[median.index.to_numpy()])
    ops.index.name = "name"
    # Most GPU work first: busy time (the union of the op's activities), not the projected span,
    # which also counts the gaps while the GPU waited (a range whose kernels ran 9 ms can span a
    # second); the span breaks ties.
    return ops.sort_values(["busy_ns", "gpu_time_ns"], ascending=False, kind="stable")


def _first_of_each(key: np.ndarray) -> np.ndarray:
    """Mask of the first row of each distinct value of ``key`` (``~Series.duplicated()``)."""
    order = np.argsort(key, kind="stable")
    k = key[order]
    first = np.zeros(len(key), dtype=bool)
    first[order[np.r_[True, k[1:] != k[:-1]]] if len(k) else order] = True
    return first


def _apart(inst: pd.DataFrame) -> bool:
    """Whether each op's instances ran at separate times on the CPU (their [cpu_start, cpu_start
    + cpu_time_ns] intervals apart): then no activity is a member of two instances of one op, as
    an instance's members were launched inside it (a kernel-level instance is its one activity)."""
    start = inst["cpu_start"].to_numpy(np.float64)
    end = start + inst["cpu_time_ns"].to_numpy(np.float64)
    if not len(start) or np.isnan(end).any() or (end < start).any():
        return False
    code = pd.factorize(inst["op"])[0]
    order = np.lexsort((start, code))
    c, s, e = code[order], start[order], end[order]
    # Sorted by start within an op, intervals that each end before the next starts are all apart.
    return bool(((s[1:] > e[:-1]) | (c[1:] != c[:-1])).all())


def _grouped(code: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``values`` by op code (codes ascending, each op's values in their order): (codes, values,
    each code's first position). A million members hold a few dozen ops: their codes are sorted
    as 16-bit integers where they fit (a radix sort), and no frame is made for them."""
    if not len(code):
        return code[:0], values[:0], np.empty(0, dtype=np.int64)
    small = code.astype(np.int16) if 0 <= code.min() and code.max() < 2 ** 15 else None
    if small is None:  # (codes are an op table's: never this many, but kept right if they were)
        order = np.argsort(code, kind="stable")
        c = code[order]
        first = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        return c[first], values[order], first
    counts = np.bincount(small)
    codes = np.flatnonzero(counts)
    first = (np.cumsum(counts) - counts)[codes]
    return codes.astype(code.dtype), values[np.argsort(small, kind="stable")], first


def _sum_by_code(code: np.ndarray, values: np.ndarray) -> pd.Series:
    """``pd.Series(values).groupby(code).sum()`` of integer values."""
    codes, v, first = _grouped(code, values)
    return pd.Series(np.add.reduceat(v, first) if len(v) else v[:0], index=codes)


def _median_by_code(code: np.ndarray, values: np.ndarray) -> pd.Series:
    """``pd.Series(values).groupby(code).median()``."""
    codes, v, first = _grouped(code, values)
    bounds = np.append(first, len(v))
    return pd.Series([float(np.median(v[a:b])) for a, b in zip(bounds[:-1], bounds[1:])],
                     index=codes, dtype=np.float64)
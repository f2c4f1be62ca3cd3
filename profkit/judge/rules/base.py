"""What a rule is, what it sees, and what it returns.

A rule is a module with a ``RULE`` (its metadata: a stable code like ``PK101``, a kebab-case name,
a one-line description, the tables it needs, its parameters with defaults, an example trace) and
a stateless ``detect(ctx) -> list[Finding]``. The module docstring is the rule's explanation
(What / Why / Evidence / Fix / Expected gain / References), printed by ``profkit rules --explain``.

Every Finding carries its gain on the window's wall time with the formula it rests on, and the
largest gain that formula allows (``bound``): the consistency checks hold each finding to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import ast
import re
from enum import Enum
from functools import cached_property, wraps
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import numpy as np
import pandas as pd

from profkit.judge.grid import grids_of
from profkit.model import Rung
from profkit.read.nsys import per_name

if TYPE_CHECKING:
    from pathlib import Path

    from profkit.read.peaks import Peaks
    from profkit.read.trace import Trace
    from profkit.run.ops import OpGroups
    from profkit.run.replacements import Replacement, Replacements
    from profkit.run.step.model import StepModel
    from profkit.run.summary import RunSummary


_SIZES_RE = re.compile(r"sizes = (\[.*?\]\])")

# What a replacement rule says of its price: timed at capture (profkit capture's replacement
# timings, PROFKIT_META ``replacements``), or estimated from the trace and the roofs.
ESTIMATED = "estimated: no replacement timed at capture"


def timed_text(entries: "list[Replacement]", what: str = "") -> str:
    """``replacement timed at the program's shapes: X us vs Y us`` (per call of the heaviest
    shape, the replacement first; ``what`` names the two sides)."""
    e = max(entries, key=lambda e: e.original_ns * e.count)
    more = f" (the heaviest of {len(entries)} shapes)" if len(entries) > 1 else ""
    return f"replacement timed at the program's shapes: {what}{e.text()}{more}"


class Scope(str, Enum):
    """What a finding is about: the whole program's pace, or a set of kernels."""
    PROGRAM = "program"
    OPS = "ops"


class Table(str, Enum):
    """Tables of an Nsight Systems export that a rule reads."""
    KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
    MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
    RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
    NVTX = "NVTX_EVENTS"


@dataclass(frozen=True)
class Param:
    name: str
    default: float
    help: str


@dataclass(frozen=True)
class TrialOf:
    """A trial of ``profkit capture --try`` (a switch, or several joined by ``+``) that measures
    one of a rule's prices: the finding's own (``evidence`` empty, when the finding names it as
    its ``switch``), or a variant the rule priced in its evidence under that key."""
    switch: str
    evidence: str = ""


@dataclass(frozen=True)
class RuleMeta:
    code: str                       # stable: PK1xx program pace, PK2xx training step, PK3xx kernels
    name: str                       # kebab-case
    summary: str                    # one line
    tables: tuple[Table, ...]
    example: str                    # a committed trace that fires it
    params: tuple[Param, ...] = ()
    quiet_on: str = ""              # a committed trace that must not fire it
    # What `profkit capture --try auto` runs when the rule fires; the first measures the
    # finding's price unless the finding names another (Finding.switch)
    trials: tuple[TrialOf, ...] = ()

    def param(self, name: str) -> float:
        return next(p.default for p in self.params if p.name == name)


@dataclass
class Finding:
    """One piece of advice, with the numbers it rests on."""
    code: str
    rule: str                        # the rule's kebab name (the `run.actions[].rule` field)
    action: str
    rung: Rung
    evidence: dict[str, Any]
    expected_end_to_end_speedup: float   # on the window's wall time
    basis: str                           # the formula, with its numbers
    bound: float                         # the most that basis allows (>= the expected gain)
    expected_op_speedup: Optional[float] = None  # on the kernels it touches (ops scope)
    scope: Scope = Scope.PROGRAM
    kernels: frozenset[str] = field(default_factory=frozenset)  # kernel names it claims
    # The step-graph edit that priced expected_end_to_end_speedup (StepGraph -> edited copy), so
    # that findings can be priced together (profkit.judge.combine); None when not priced so.
    edit: Optional[Callable] = field(default=None, repr=False, compare=False)
    # The edits of the variants the rule priced in its evidence, by evidence key (PK305's
    # channels_last alone and with bf16), so that a change that is one of them is priced as it is.
    alternatives: dict[str, Callable] = field(default_factory=dict, repr=False, compare=False)
    # The trial (profkit capture --try) that measures this finding's price: a switch, or several
    # joined by "+"; None for a rule no switch can try (set from RULE.trials by evaluate)
    switch: Optional[str] = None

    def __post_init__(self) -> None:
        # Plain floats: numpy scalars would leak into the JSON and the reprs.
        self.expected_end_to_end_speedup = float(self.expected_end_to_end_speedup)
        self.bound = float(self.bound)
        if self.expected_op_speedup is not None:
            self.expected_op_speedup = float(self.expected_op_speedup)

    def as_action(self) -> dict:
        return {"rule": self.rule, "code": self.code, "action": self.action,
                "expected_end_to_end_speedup": round(float(self.expected_end_to_end_speedup), 3),
                "basis": self.basis, "rung": self.rung.value}


def speedup(wall: float, new_wall: float) -> float:
    return max(1.0, wall / max(new_wall, 1.0))


class ProfileView(Protocol):
    """What the rules read of a profile, and nothing more: the facade's Profile (profkit.api)
    has all of it and is passed as it is. Declared here, below the facade, so that the rules
    never import the facade that runs them (tests/test_layers.py checks both that the rules
    read nothing else and that Profile has every member)."""

    @property
    def trace(self) -> Trace:
        """The judged window's view of the trace."""

    @property
    def full_trace(self) -> Trace:
        """The whole capture."""

    @property
    def peaks(self) -> Peaks:
        """The GPU's roofs."""

    @property
    def gains(self) -> str:
        """``wall`` or ``gpu``: the frame end-to-end gains are judged on."""

    @property
    def critical(self) -> np.ndarray:
        """Per activity of the window: 1 where finishing it sooner shortens the run."""

    @property
    def pricing_host(self) -> float:
        """The CPU scale fixes are priced at."""

    @property
    def aten_groups(self) -> Optional[OpGroups]:
        """The window's ops at the aten level; None without aten ranges."""

    @property
    def borrowed_shapes(self) -> dict:
        """Per kernel signature, the aten op of the ``shapes_from`` capture that launched it."""

    @property
    def shapes_from(self) -> Optional[str | Path]:
        """The ``--aten`` capture the shapes are borrowed from, if any."""

    def step_model(self) -> Optional[StepModel]:
        """The window's step model; None when it cannot be modelled."""

    def replacements(self) -> Replacements:
        """The capture's op record and replacement timings (PROFKIT_META ``replacements``)."""

    def ops(self, by: str = "range", innermost: bool = False, top: Optional[int] = None) -> pd.DataFrame:
        """The op table at level ``by``, with each op's class, evidence and precision."""

    def warn(self, message: str) -> None:
        """Add a warning to the profile's report (once)."""


# The columns of RuleContext.kernels_in_stream_order.
STREAM_ORDER_COLUMNS = ("kind", "name", "start", "end", "dur", "critical", "streamId", "deviceId",
                        "correlationId", "globalPid", "globalTid", "api_start", "api_end")


def _shared_table(fn):
    """A read-only table of the rules' context made once per profile and run summary (kept in
    the profile), whatever the CPU scale the rules price at."""
    @wraps(fn)
    def get(self):
        tables = self._tables
        if fn.__name__ not in tables:
            tables[fn.__name__] = fn(self)
        return tables[fn.__name__]
    return property(get)


class RuleContext:
    """What the rules read: the profile (full trace, windowed trace, peaks, step model, op
    table; ``ProfileView``) and the run summary, and tables derived once from them (window
    activities by kernel name, window API calls)."""

    def __init__(self, prof: ProfileView, run: RunSummary) -> None:
        self.prof = prof
        self.run = run
        self.priced: list[tuple[float, Callable]] = []  # (gain, edit) of every price() call
        # Each rule's findings once evaluated here (a rule that quotes another's price reads it
        # instead of judging it again at the same CPU scale).
        self.found: dict[str, list] = {}
        # The tables below do not depend on the CPU scale the rules price at: a profile judged
        # again at another scale (Profile.findings_at) makes them once, not once per judgement.
        shared = getattr(prof, "__dict__", {}).get("_rule_tables")
        if shared is None or shared.get("run") is not run:
            shared = {"run": run}
            if hasattr(prof, "__dict__"):
                prof.__dict__["_rule_tables"] = shared
        self._tables = shared

    @property
    def wall_ns(self) -> float:
        return float(self.run.wall_time_ns)

    @property
    def iterations(self) -> int:
        return int(self.run.window.iterations or 0)

    @_shared_table
    def acts(self) -> pd.DataFrame:
        """The window's GPU activities (launched inside it), with duration and critical share."""
        # A shallow copy: the columns added below are new arrays, the trace's frame stays as it is.
        a = self.prof.trace.activities.copy(deep=False)
        # Names as a categorical over the trace's one factorisation: the rules match and group
        # by name many times, once per distinct name rather than once per kernel.
        codes, uniq = self.prof.trace.name_codes
        a["name"] = pd.Categorical.from_codes(codes, categories=pd.Index(uniq))
        a["dur"] = (a["end"] - a["start"]).astype("int64")
        a["critical"] = self.prof.critical
        return a

    @property
    def replacements(self) -> Replacements:
        """What ``profkit capture`` timed at the program's shapes (PROFKIT_META ``replacements``,
        profkit.run.replacements): the op record and the replacements' times; empty without.
        Parsed once, by the profile."""
        return self.prof.replacements()

    @_shared_table
    def kernels(self) -> pd.DataFrame:
        """Per kernel name: count, total and median ns, critical ns (GPU time something waited on)."""
        # Only the columns used below are filtered (not all of a million-row frame's).
        a = self.acts.loc[(self.acts["kind"] == "kernel").to_numpy(), ["name", "dur", "critical"]]
        if a.empty:
            return pd.DataFrame(columns=["count", "total_ns", "median_ns", "critical_ns"])
        g = a.groupby("name", sort=False, observed=True)
        out = pd.DataFrame({"count": g.size(), "total_ns": g["dur"].sum(),
                            "median_ns": g["dur"].median(),
                            "critical_ns": (a["dur"] * a["critical"]).groupby(
                                a["name"], observed=True).sum()})
        out.index = out.index.astype(object)
        return out.sort_values("total_ns", ascending=False)

    @_shared_table
    def kernels_in_stream_order(self) -> pd.DataFrame:
        """The window's kernels, each stream's in launch order (the rules that look at what runs
        next to what); shared, so read-only."""
        a = self.acts
        # The order found on the two columns and the rows taken once (not filtered, then sorted),
        # of the columns these rules read alone: a million kernels' 16 columns took 0.2 s.
        k = np.flatnonzero((a["kind"] == "kernel").to_numpy())
        order = np.lexsort((a["start"].to_numpy()[k], a["streamId"].to_numpy()[k]))
        return a[list(STREAM_ORDER_COLUMNS)].take(k[order])

    @_shared_table
    def launches(self) -> pd.DataFrame:
        """The window's calls that issued GPU work (Trace.launch_calls): start, end, globalTid."""
        return self._in_window(self.prof.full_trace.launch_calls)

    def _in_window(self, c: pd.DataFrame) -> pd.DataFrame:
        w = self.run.window
        return c[(c["start"] >= w.start_ns) & (c["start"] <= w.end_ns)]

    @property
    def host_floor_ns(self) -> float:
        """The CPU's own time for the window (RunSummary.host_floor_ns): a GPU-side saving cannot
        take the run below it, the host still has to issue every launch."""
        return self.run.host_floor_ns

    # -- pricing through the step model ------------------------------------------------------
    @cached_property
    def model(self):
        """The step model (profkit.run.step), or None when the window has none."""
        return self.prof.step_model()

    @property
    def host(self) -> float:
        """The CPU scale the fixes are priced at: the program without a profiler (calibrated), or
        no CPU at all when gains are judged on GPU time (``gains="gpu"``: kernel benchmarks)."""
        return self.prof.pricing_host

    @cached_property
    def baseline(self):
        """The unmodified replay the fixes are priced against."""
        m = self.model
        if m is None:
            return None
        return m.baseline if self.host == m.host else m.simulate(host=self.host)

    @property
    def baseline_ns(self) -> float:
        return self.baseline.mean_iteration_ns if self.baseline is not None else 0.0

    def price(self, edit, what: str, cap: Optional[float] = None,
              slower: bool = False) -> tuple[float, str]:
        """(gain, basis) of the graph edit ``edit`` (StepGraph -> edited copy): the model's
        iteration before over after, replayed at the calibrated CPU scale. ``cap``: the most the
        change can give (the op's own gain): a model that says more is wrong there, and the cap
        is used with a warning. A change the model finds slower is priced 1.0 (no gain), or, with
        ``slower``, at its gain below 1, for a rule that warns against it."""
        m = self.model
        if m is None:
            return 1.0, "no step model for this window: not priced"
        base = self.baseline_ns
        new = m.simulate(edit(m.graph), host=self.host).mean_iteration_ns
        gain = base / new if new > 0 else 1.0
        frame = "GPU time alone" if self.prof.gains == "gpu" else "without the profiler"
        basis = (f"step model: {what}: iteration {base / 1e6:.2f} -> {new / 1e6:.2f} ms {frame} "
                 "(mean over the window)")
        if cap is not None and gain > cap:
            if gain > cap * 1.001:  # beyond rounding: the model is wrong there, say so
                self.prof.warn(f"{what}: the step model priced {gain:.2f}x, above the change's own "
                               f"{cap:.2f}x, which cannot be: {cap:.2f}x is used")
                basis += f" (capped at the change's own {cap:.2f}x)"
            gain = cap
        self.priced.append((max(gain, 1.0), edit))
        return (gain if slower else max(gain, 1.0)), basis

    def acts_named(self, names) -> pd.DataFrame:
        """The window's activities whose kernel name is one of ``names``."""
        a = self.acts
        # Matched on the categorical's few names, then picked by code (not a million strings).
        wanted = {str(n) for n in names}
        name = a["name"]
        hit = np.append([str(c) in wanted for c in name.cat.categories], False)
        return a[hit[name.cat.codes.to_numpy()]]

    def launch_grids(self, ops: np.ndarray) -> np.ndarray:
        """Blocks launched by each of the step graph's operations ``ops`` (gridX x gridY x gridZ of
        the trace's kernel table, read for the stretch they start in); -1 where the export has no
        launch dimensions, or the operation is no kernel of that table."""
        ops = np.asarray(ops, dtype=np.int64)
        out = np.full(len(ops), -1, dtype=np.int64)
        if self.model is None or not len(ops):
            return out
        g = self.model.graph
        shapes = self.prof.full_trace.kernel_shapes(int(g.g_start[ops].min()), int(g.g_start[ops].max()))
        if shapes.empty:
            return out
        return grids_of(shapes, g.g_start[ops], g.g_corr[ops])

    def graph_ops(self, rows: pd.DataFrame, aligned: bool = False) -> np.ndarray:
        """The step graph's operations for rows of the window's activities (``acts``); with
        ``aligned``, one entry per row (-1 where the graph does not hold it)."""
        if self.model is None:
            return np.full(len(rows), -1, dtype=np.int64) if aligned else np.empty(0, dtype=np.int64)
        return self.model.ops_of(rows["start"].to_numpy(np.int64),
                                 rows["correlationId"].to_numpy(np.int64), aligned)

    def price_ops(self, rows: pd.DataFrame, factor: float, what: str, drop_launches: bool = False,
                  cap: Optional[float] = None) -> tuple[float, str]:
        """Price the kernels in ``rows`` running ``factor`` times faster (inf: gone), with their
        launches gone too when ``drop_launches``."""
        from profkit.run.step.transform import scale_ops
        ops = self.graph_ops(rows)
        return self.price(lambda g: scale_ops(g, ops, factor, drop_launches), what, cap)

    def price_fusion(self, rows: pd.DataFrame, group: np.ndarray, new_ns, what: str,
                     cap: Optional[float] = None) -> tuple[float, str]:
        """Price the kernels of ``rows`` fused by ``group`` (a group id per row, 0..n-1): each
        group becomes one kernel of ``new_ns[id]``, its other launches gone with their dispatch."""
        from profkit.run.step.transform import replace_ops
        ops = self.graph_ops(rows, aligned=True)
        group = np.asarray(group, dtype=np.int64)
        ok = ops >= 0
        order = np.argsort(group[ok], kind="stable")
        g_sorted, o_sorted = group[ok][order], ops[ok][order]
        cuts = np.searchsorted(g_sorted, np.arange(len(new_ns) + 1))
        # Groups the graph holds none of change nothing (replace_ops skips them): left out.
        held = np.flatnonzero(cuts[1:] > cuts[:-1])
        groups = [o_sorted[cuts[i]:cuts[i + 1]] for i in held]
        ns = np.asarray(new_ns, dtype=np.float64)[held]
        return self.price(lambda g: replace_ops(g, groups, ns), what, cap)

    def aten_sizes(self, op: str) -> list[list]:
        """Input sizes of each call of aten op ``op`` in the window (emit_nvtx record_shapes);
        empty when the trace has no aten ranges."""
        trace = self.prof.trace
        if trace.ranges.empty:
            return []
        # Matched and parsed once per distinct range name (a window holds 10^5 ranges and more).
        codes, uniq = trace.range_name_codes
        prefix = op + ","
        parsed: list = []
        for n in uniq:
            m = _SIZES_RE.search(n) if isinstance(n, str) and n.startswith(prefix) else None
            try:
                parsed.append(ast.literal_eval(m.group(1)) if m else None)
            except (ValueError, SyntaxError):
                parsed.append(None)
        if not any(p is not None for p in parsed):
            return []
        return [parsed[c] for c in codes.tolist() if c >= 0 and parsed[c] is not None]

    @_shared_table
    def aten_acts(self) -> dict[str, np.ndarray]:
        """Per aten op (its name and input sizes, as at ``--by aten``), the index labels in
        ``acts`` of the GPU work its calls launched; for a capture without ``--aten``, the kernels
        matched to the ops of the profile's ``shapes_from`` capture; else empty."""
        groups = self.prof.aten_groups
        if groups is None:
            if not self.prof.borrowed_shapes:
                return {}
            from profkit.run.shapes import borrowed_aten_acts
            got = borrowed_aten_acts(self.prof.full_trace, self.acts, self.prof.borrowed_shapes)
            if not got:
                self.prof.warn(f"no kernel of this window has a name and launch shape that one aten "
                               f"op launched in {self.prof.shapes_from}: no shapes taken from it "
                               "(a capture of another program, or of other inputs?)")
            return got
        return groups.members_by_op()

    def window_kernel_names(self) -> list[str]:
        return self.kernels.index.tolist()

    def per_iteration(self, ns: float) -> str:
        it = self.iterations
        return f"{ns / it / 1e6:.2f} ms per iteration" if it else f"{ns / 1e6:.2f} ms in the window"


# Library GEMM kernels by name (cuBLAS/cuBLASLt nvjet, CUTLASS, xmma, wgmma): what the GEMM rules
# look for in the timeline.
GEMM_KERNEL_RE = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma", re.I)
# cuSOLVER's and MAGMA's factorisation kernels by the LAPACK routine their names carry (PK306
# adds the triangular solves, PK208 the inner kernels of an eigendecomposition)
FACTORISATION = r"getrf|potrf|potrs|getrs|trtri|geqrf|orgqr|ormqr|syevd|heevd|gesvd|lauum|cusolver|magma_"


def removed_launch_cost(kernels: pd.DataFrame, removed: np.ndarray, dispatch_gap_ns: float) -> float:
    """CPU ns the launches of ``removed`` kernels (a mask over ``kernels``, which carry each
    launch's ``api_start``/``api_end``) cost: each launch call, plus the host gap before it when
    shorter than ``dispatch_gap_ns`` (the per-op dispatch a fused or graphed step no longer pays;
    longer gaps are Python between calls and stay)."""
    api_s = kernels["api_start"].to_numpy("float64")
    api_e = kernels["api_end"].to_numpy("float64")
    order = np.argsort(api_s, kind="stable")
    s_o, e_o = api_s[order], api_e[order]
    gap = np.concatenate([[0.0], np.maximum(s_o[1:] - e_o[:-1], 0.0)])
    gap = np.where(np.isnan(gap) | (gap >= dispatch_gap_ns), 0.0, gap)
    cost = np.nan_to_num(e_o - s_o) + gap
    return float(cost[np.asarray(removed, dtype=bool)[order]].sum())


def covered_per_interval(starts: np.ndarray, ends: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Per consecutive pair of ``bounds``: the length of the union of the intervals
    ``starts..ends`` inside it. Linear in the inputs (prefix sums over the merged intervals), so a
    window of many iterations and a million activities stays cheap."""
    n = len(bounds) - 1
    if not len(starts) or n <= 0:
        return np.zeros(max(n, 0))
    from profkit.read.intervals import sorted_union
    us, ue = sorted_union(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
    cum = np.concatenate([[0], np.cumsum(ue - us)])
    t = np.asarray(bounds, np.int64)
    k = np.searchsorted(us, t, side="right") - 1
    kk = np.maximum(k, 0)
    before = np.where(k >= 0, cum[kk] + np.clip(t - us[kk], 0, ue[kk] - us[kk]), 0)
    return np.diff(before).astype(float)


def iteration_bounds(run: RunSummary) -> np.ndarray:
    """Start of each iteration and the window's end (iterations are contiguous from its start)."""
    w = run.window
    if not w.iteration_ns:
        return np.array([w.start_ns, w.end_ns], dtype=np.int64)
    return np.concatenate([[w.start_ns], w.start_ns + np.cumsum(w.iteration_ns)]).astype(np.int64)


def matches(names, rx: "re.Pattern[str]") -> np.ndarray:
    """Which of ``names`` the compiled regex finds a match in (a boolean array), searched once
    per distinct name (profkit.read.nsys.per_name)."""
    return per_name(names, lambda n: bool(rx.search(n)), bool)


def kernel_share(ctx: "RuleContext", rx: "re.Pattern[str]") -> float:
    """The share of the window's kernel time in the kernels whose names ``rx`` matches."""
    k = ctx.kernels
    total = float(k["total_ns"].sum()) if len(k) else 0.0
    if total <= 0:
        return 0.0
    return float(k.loc[matches(k.index.to_series(), rx), "total_ns"].sum()) / total


def bare_kernel_name(name: str) -> str:
    """A kernel's name without its template arguments and parameters."""
    s = re.sub(r"^void\s+", "", name)
    depth, out = 0, []
    for ch in s:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()[:80] or name[:80]

"""Compare two profiles op by op: GPU-time change, verdict, and profkit's prediction vs the measurement.

    >>> import profkit
    >>> from profkit.compare.diff import diff
    >>> d = diff(profkit.load("before.sqlite"), profkit.load("after.sqlite"), by="range")
    >>> d.to_json()["total"]["verdict"]

Ops are matched by name at the chosen level (``rename`` maps a BEFORE name to a different AFTER
name). At ``--by range`` the NVTX range name is the key, so kernels renamed by fusion are still
compared through the range around them, and each matched range lists the kernels that were
removed, added or changed inside it.

Definitions (also in docs/diff.md; the JSON contract is ``DIFF_SCHEMA_VERSION``):

- per-op change: of the median GPU span per call (``gpu_time_median_ns``), in percent; totals
  (``gpu_time_ns``) are reported beside it.
- noise threshold per op: ``max(3%, 2 x spread)``, spread = the larger of BEFORE's and AFTER's
  IQR/median of the op's per-call spans. A change within it is "no change".
- measured op speedup: BEFORE median / AFTER median (the same span the advisor's
  ``expected_op_speedup`` is a bound on).
- measured end-to-end speedup of an op: the advisor's Amdahl frame, with the measured saving:
  T / (T - n x (busy median before - busy median after)), T = BEFORE's total GPU time, n =
  BEFORE's call count (steady-state calls, as the advisor counts them).
- total verdict: over the matched ops (outermost only, so nested ranges count once), the
  steady-state time sum(calls_before x median) before vs sum(calls_before x AFTER's median),
  against max(3%, the ops' thresholds weighted by their steady-state time). Raw span totals
  and both traces' raw total GPU time are reported beside it.
- measured end-to-end speedup (total): T_before / (T_before - K_before + K_after), K = the kernel
  time (sum of activity durations) of the matched ops (outermost only), AFTER's scaled to BEFORE's
  call count: BEFORE's total with the matched work replaced by its AFTER kernel time, unmatched
  work held at BEFORE's time. This is the frame the advisor's ``expected_end_to_end_speedup`` is
  computed in (a trace's GPU time = the sum of its activity durations), so idle launch gaps that
  a change removes are not in it.
- predicted end-to-end speedup (total): the matched ops that changed (outermost only), their
  predicted savings T x (1 - 1/e2e) added up.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from profkit.api import Profile
from profkit.show.fields import num as _num
from profkit.errors import ProfkitError
from profkit.run.ops import LEVELS, group_ops
from profkit.show.render import fmt_time, short_name

DIFF_SCHEMA_VERSION = 1
NOISE_MIN_PCT = 3.0        # changes below this are never called a change
NOISE_SPREAD_FACTOR = 2.0  # ... nor below this many times the op's relative spread (IQR/median)
NOISE_RULE = ("a change is 'no change' when |change| <= max(3%, 2 x spread), spread = the larger of "
              "BEFORE's and AFTER's IQR/median of the op's per-call GPU spans; the total's threshold is "
              "max(3%, the matched ops' thresholds weighted by their steady-state time)")

IMPROVEMENT, REGRESSION, NO_CHANGE = "improvement", "regression", "no change"


def _verdict(change_pct: Optional[float], threshold_pct: float) -> str:
    if change_pct is None or abs(change_pct) <= threshold_pct:
        return NO_CHANGE
    return REGRESSION if change_pct > 0 else IMPROVEMENT


def _median_ci(values: list) -> tuple[float, float]:
    """The 95% confidence interval of the median of ``values`` (order statistics,
    distribution-free); the whole range with fewer than 6 values."""
    v = np.sort(np.asarray(values, dtype="float64"))
    n = len(v)
    if n == 0:
        return (0.0, float("inf"))
    half = 1.96 * np.sqrt(n) / 2.0
    lo = int(max(np.floor(n / 2.0 - half), 0))
    hi = int(min(np.ceil(n / 2.0 + half), n - 1))
    return float(v[lo]), float(v[hi])


def _run_verdict(change_pct: Optional[float], ci: dict, between: Optional[float]) -> str:
    if change_pct is None or abs(change_pct) < NOISE_MIN_PCT:
        return NO_CHANGE
    if between is not None and abs(change_pct) <= 100.0 * between:
        return NO_CHANGE
    (b_lo, b_hi), (a_lo, a_hi) = ci["before"], ci["after"]
    if a_hi < b_lo:
        return IMPROVEMENT
    if a_lo > b_hi:
        return REGRESSION
    return NO_CHANGE


def _range_spread(values: list) -> float:
    """(max - min) / median of ``values``: how far captures of one program lie apart."""
    med = float(np.median(values))
    return float((max(values) - min(values)) / med) if med else 0.0


def _pct(after: float, before: float) -> Optional[float]:
    return None if before == 0 else (after / before - 1.0) * 100.0


def _ratio(a: float, b: float) -> Optional[float]:
    return None if b == 0 else a / b


def _disagreement(measured: Optional[float], predicted: Optional[float]) -> Optional[float]:
    """How far the measurement is from the prediction, in percent of the prediction."""
    if measured is None or predicted is None or predicted == 0:
        return None
    return (measured / predicted - 1.0) * 100.0


@dataclass
class _Side:
    """What one trace says about its ops at one level."""
    prof: Profile
    ops: pd.DataFrame           # Profile.ops(by)
    spread: pd.Series           # op -> IQR/median of per-call spans
    acts_of: dict               # op -> np.ndarray of activity indices
    kernels_of: dict            # op -> {kernel name: activities}

    @classmethod
    def of(cls, prof: Profile, by: str) -> "_Side":
        # diff compares projected spans per call, so its rows come in order of span (classify's
        # table lists ops by busy time).
        ops = prof.ops(by=by).sort_values("gpu_time_ns", ascending=False, kind="stable")
        groups = group_ops(prof.trace, by=by)
        span = groups.instances.groupby("op")["span_ns"]
        q1, q3, med = span.quantile(0.25), span.quantile(0.75), span.median()
        spread = ((q3 - q1) / med.where(med > 0)).fillna(0.0)
        names = prof.trace.activities["name"]
        members = groups.members.drop_duplicates(["op", "act_idx"])
        acts_of = {op: g["act_idx"].to_numpy() for op, g in members.groupby("op")}
        kernels_of = {op: names.loc[idx].value_counts().to_dict() for op, idx in acts_of.items()}
        return cls(prof, ops, spread, acts_of, kernels_of)

    def kernel_time(self, acts: np.ndarray) -> int:
        a = self.prof.trace.activities
        return int((a["end"] - a["start"]).to_numpy()[a.index.get_indexer(acts)].sum()) if len(acts) else 0


@dataclass
class DiffResult:
    """The comparison of two profiles; ``to_json()`` is the documented contract."""
    level: str
    before: dict
    after: dict
    same_trace: bool
    renames: dict
    total: dict
    ops: list = field(default_factory=list)
    only_before: list = field(default_factory=list)
    only_after: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    run: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return self.total["verdict"]

    def to_json(self) -> dict:
        """The JSON contract (docs/diff.md), as a fresh dict."""
        return copy.deepcopy({
            "schema_version": DIFF_SCHEMA_VERSION,
            "level": self.level,
            "before": self.before,
            "after": self.after,
            "same_trace": self.same_trace,
            "renames": dict(self.renames),
            "noise": {"min_pct": NOISE_MIN_PCT, "spread_factor": NOISE_SPREAD_FACTOR, "rule": NOISE_RULE},
            "verdict": self.verdict,
            "total": self.total,
            "run": self.run,
            "ops": self.ops,
            "only_before": self.only_before,
            "only_after": self.only_after,
            "warnings": list(self.warnings),
        })

    def regressions(self, gate_pct: float) -> list[str]:
        """What regressed by more than ``gate_pct`` percent (and beyond its noise threshold)."""
        out = []
        for op in self.ops:
            ch = op["median_change_pct"]
            if op["verdict"] == REGRESSION and ch is not None and ch > gate_pct:
                out.append(f"{op['name']}: median per call +{ch:.1f}% (gate {gate_pct:g}%, "
                           f"noise {op['threshold_pct']:.1f}%)")
        t = self.total
        if t["verdict"] == REGRESSION and t["change_pct"] > gate_pct:
            out.append(f"total (matched ops, steady state): +{t['change_pct']:.1f}% (gate {gate_pct:g}%)")
        if t["trace_change_pct"] is not None and t["trace_change_pct"] > max(gate_pct, NOISE_MIN_PCT):
            out.append(f"total (trace GPU time): +{t['trace_change_pct']:.1f}% (gate {gate_pct:g}%)")
        return out


def _side_json(side: _Side, name: str) -> dict:
    row = side.ops.loc[name]
    return {
        "count": int(row["count"]),
        "gpu_time_ns": _num(row["gpu_time_ns"]),
        "gpu_time_median_ns": _num(row["gpu_time_median_ns"]),
        "busy_ns": _num(row["busy_ns"]),
        "busy_median_ns": _num(row["busy_median_ns"]),
        "kernel_time_ns": side.kernel_time(side.acts_of.get(name, np.array([], dtype=int))),
        "kernels_per_call": _num(row["kernels_per_call"]),
        "spread": round(float(side.spread.get(name, 0.0)), 4),
        "class": row["class"],
        "confidence": row["confidence"],
    }


def _kernel_changes(b: dict, nb: int, a: dict, na: int) -> tuple[list, list, list]:
    removed = [{"name": k, "per_call": _num(round(v / nb, 3))} for k, v in sorted(b.items()) if k not in a]
    added = [{"name": k, "per_call": _num(round(v / na, 3))} for k, v in sorted(a.items()) if k not in b]
    changed = [{"name": k, "before_per_call": _num(round(b[k] / nb, 3)),
                "after_per_call": _num(round(a[k] / na, 3))}
               for k in sorted(b) if k in a and round(b[k] / nb, 3) != round(a[k] / na, 3)]
    return removed, added, changed


def _r(x: Optional[float], nd: int) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def diff(before: Profile, after: Profile, by: str = "range",
         rename: Optional[dict] = None, before_also: Sequence[Profile] = (),
         after_also: Sequence[Profile] = ()) -> DiffResult:
    """Match the ops of two profiles at level ``by`` and compare them (stateless).

    ``rename`` maps a BEFORE op name to the AFTER op name it should be compared with (for one
    trace holding both variants under different ranges, e.g. ``{"eager_chain": "graph_replay"}``).
    ``before_also``/``after_also``: more captures of the same two programs; they enter the run's
    wall time per iteration and its verdict (run_change), not the op table.
    """
    if by not in LEVELS:
        raise ProfkitError(f"unknown level {by!r}: use one of {', '.join(LEVELS)}")
    rename = dict(rename or {})
    b, a = _Side.of(before, by), _Side.of(after, by)
    for old, new in rename.items():
        if old not in b.ops.index:
            raise ProfkitError(f"{before.path}: no op {old!r} at --by {by} to rename")
        if new not in a.ops.index:
            raise ProfkitError(f"{after.path}: no op {new!r} at --by {by} to match {old!r} with")
    same = _same_file(before.path, after.path)
    warnings: list[str] = []
    T_b, T_a = before.trace.total_gpu_time_ns, after.trace.total_gpu_time_ns

    # BEFORE name -> AFTER name; a renamed target is not also matched under its own name.
    targets = set(rename.values())
    pairs = []
    for name in b.ops.index:
        if name in rename:
            pairs.append((name, rename[name]))
        elif name in a.ops.index and name not in targets and not (same and rename):
            pairs.append((name, name))
    if same and not rename:
        warnings.append("BEFORE and AFTER are the same trace: every op is unchanged; "
                        "give renames to compare two ranges of one trace")
    matched_b = {x for x, _ in pairs}
    matched_a = {y for _, y in pairs}

    ops, recount = [], []
    for nb, na in pairs:
        rb, ra = b.ops.loc[nb], a.ops.loc[na]
        sb, sa = _side_json(b, nb), _side_json(a, na)
        med_b, med_a = float(rb["gpu_time_median_ns"]), float(ra["gpu_time_median_ns"])
        ch = _pct(med_a, med_b)
        spread = max(float(b.spread.get(nb, 0.0)), float(a.spread.get(na, 0.0)))
        thr = max(NOISE_MIN_PCT, NOISE_SPREAD_FACTOR * 100.0 * spread)
        if sb["count"] != sa["count"]:
            recount.append(f"{short_name(nb, 60)}: {sb['count']} → {sa['count']}")
        removed, added, changed = _kernel_changes(b.kernels_of.get(nb, {}), sb["count"],
                                                  a.kernels_of.get(na, {}), sa["count"])
        pred_op = float(rb["expected_op_speedup"])
        # diff measures GPU time, so it checks the advisor's GPU-time figure; the wall-time side
        # is compared run against run (``run`` in the result).
        pred_e2e = float(rb.get("expected_gpu_time_speedup", rb["expected_end_to_end_speedup"]))
        meas_op = _ratio(med_b, med_a)
        saved = sb["count"] * (float(rb["busy_median_ns"]) - float(ra["busy_median_ns"]))
        meas_e2e = _ratio(T_b, T_b - saved) if T_b - saved > 0 else None
        ops.append({
            "name": nb, "after_name": na,
            "before": sb, "after": sa,
            "median_change_pct": _r(ch, 2),
            "total_change_pct": _r(_pct(float(ra["gpu_time_ns"]), float(rb["gpu_time_ns"])), 2),
            "threshold_pct": round(thr, 2),
            "verdict": _verdict(ch, thr),
            "class_changed": sb["class"] != sa["class"],
            "kernels_per_call_change": _num(round(sa["kernels_per_call"] - sb["kernels_per_call"], 3)),
            "kernels_removed": removed, "kernels_added": added, "kernels_changed": changed,
            "suggestion": {"rung": rb["rung"], "action": rb["action"], "basis": rb["basis"],
                           "worth_it": bool(rb["worth_it"])},
            "predicted_op_speedup": round(pred_op, 3),
            "measured_op_speedup": _r(meas_op, 3),
            "op_disagreement_pct": _r(_disagreement(meas_op, pred_op), 1),
            "predicted_end_to_end_speedup": round(pred_e2e, 4),
            "measured_end_to_end_speedup": _r(meas_e2e, 4),
            "end_to_end_disagreement_pct": _r(_disagreement(meas_e2e, pred_e2e), 1),
        })

    if recount:
        warnings.append(f"{len(recount)} matched op(s) ran a different number of calls ({recount[0]}"
                        f"{', ...' if len(recount) > 1 else ''}): per-call numbers compare; AFTER's kernel "
                        "time is scaled to BEFORE's call count for the end-to-end figures; raw totals do not compare")

    def unmatched(side: _Side, names) -> list:
        return [{"name": n, "count": int(side.ops.loc[n, "count"]),
                 "gpu_time_ns": _num(side.ops.loc[n, "gpu_time_ns"]),
                 "gpu_time_median_ns": _num(side.ops.loc[n, "gpu_time_median_ns"]),
                 "kernel_time_ns": side.kernel_time(side.acts_of.get(n, np.array([], dtype=int))),
                 "class": side.ops.loc[n, "class"]}
                for n in side.ops.index if n not in names]

    only_before = [] if same else unmatched(b, matched_b)
    only_after = [] if same else unmatched(a, matched_a)

    top = _outermost(b, ops)
    K_b = sum(op["before"]["kernel_time_ns"] for op in top)
    K_a = sum(op["after"]["kernel_time_ns"] * op["before"]["count"] / op["after"]["count"] for op in top)
    after_equiv = T_b - K_b + K_a
    span_b = sum(op["before"]["gpu_time_ns"] for op in top)
    span_a = sum(op["after"]["gpu_time_ns"] for op in top)
    steady_b = sum(op["before"]["count"] * op["before"]["gpu_time_median_ns"] for op in top)
    steady_a = sum(op["before"]["count"] * op["after"]["gpu_time_median_ns"] for op in top)
    change = _pct(steady_a, steady_b)
    # The total is as noisy as the ops it is made of: their thresholds, weighted by steady time.
    weights = [op["before"]["count"] * op["before"]["gpu_time_median_ns"] for op in top]
    total_thr = max([NOISE_MIN_PCT] + ([sum(w * op["threshold_pct"] for w, op in zip(weights, top))
                                        / sum(weights)] if sum(weights) > 0 else []))
    if not pairs:
        warnings.append(f"no op of BEFORE matched an op of AFTER at --by {by}: try another level "
                        "or --match BEFORE_OP=AFTER_OP")
    total = {
        "before_gpu_time_ns": T_b, "after_gpu_time_ns": T_a,
        "trace_change_pct": None if same else _r(_pct(T_a, T_b), 2),
        "matched_ops": [op["name"] for op in top],
        "matched_before_gpu_time_ns": _num(span_b), "matched_after_gpu_time_ns": _num(span_a),
        "steady_before_ns": _num(steady_b), "steady_after_ns": _num(steady_a),
        "change_pct": _r(change, 2),
        "threshold_pct": round(total_thr, 2),
        "verdict": _verdict(change, total_thr),
        "matched_before_kernel_time_ns": _num(K_b), "matched_after_kernel_time_ns": _num(round(K_a, 1)),
        "kernel_time_change_pct": _r(_pct(K_a, K_b), 2),
        "measured_end_to_end_speedup": _r(_ratio(T_b, after_equiv), 4),
        **_predicted_total(b, ops, T_b),
    }
    return DiffResult(level=by, before=_trace_json(before), after=_trace_json(after), same_trace=same,
                      renames=rename, total=total, ops=ops, only_before=only_before,
                      only_after=only_after, warnings=warnings,
                      run=run_change(before, after, before_also, after_also))


def run_change(before: Profile, after: Profile, before_also: Sequence[Profile] = (),
               after_also: Sequence[Profile] = ()) -> dict:
    """Wall time per iteration before and after, beside what BEFORE's run summary predicted.

    The measured speedup is the ratio of median iteration times (wall time of the windows when
    either run has no iterations); the prediction is each of BEFORE's actions, so the user can
    read the one they applied. With several captures of a side (``*_also``), its time is the
    median of the captures' medians, and the noise threshold also covers how far the captures'
    medians lie apart (run-to-run spread, which one capture cannot show).
    """
    rb, ra = before.run(), after.run()
    sides = {"before": [before, *before_also], "after": [after, *after_also]}
    per = ("iteration" if all(p.run().window.iteration_median_ns for ps in sides.values() for p in ps)
           else "window")

    def side_time(ps: list) -> float:
        return float(np.median([p.run().window.iteration_median_ns if per == "iteration"
                                else p.run().wall_time_ns for p in ps]))
    tb, ta = side_time(sides["before"]), side_time(sides["after"])
    # Is the median iteration time different? Each side's median has a 95% confidence interval
    # from the order statistics of its iteration times (all its captures pooled): a few
    # iterations give a wide one; many give a narrow one, even with a second mode such as a
    # periodic prefill. The change counts when the intervals do not overlap, it is at least 3%,
    # and with several captures of a side, more than their medians lie apart.
    ci, between = {}, None
    if per == "iteration":
        ci = {k: _median_ci([x for p in ps for x in p.run().window.periods_ns])
              for k, ps in sides.items()}
        spreads = [_range_spread([p.run().window.iteration_median_ns for p in ps])
                   for ps in sides.values() if len(ps) > 1]
        between = max(spreads) if spreads else None
    change = _pct(ta, tb)
    return {
        "per": per, "before_ns": int(tb), "after_ns": int(ta),
        "measured_speedup": _r(_ratio(tb, ta), 3),
        "change_pct": _r(change, 2),
        "before_median_ci_ns": [int(x) for x in ci["before"]] if ci else None,
        "after_median_ci_ns": [int(x) for x in ci["after"]] if ci else None,
        "verdict": _run_verdict(change, ci, between) if ci else None,
        "captures": {"before": len(sides["before"]), "after": len(sides["after"])},
        "between_captures_pct": _r(100.0 * between, 2) if between is not None else None,
        "before_verdict": rb.verdict.value, "after_verdict": ra.verdict.value,
        "before_gpu_idle_fraction": round(rb.gpu_idle_fraction, 4),
        "after_gpu_idle_fraction": round(ra.gpu_idle_fraction, 4),
        "predicted": [a.as_action() for a in rb.top_actions()],
        # Every rule that fired on BEFORE, paying or not, so the change that was applied can be
        # read against its own prediction (e.g. fused=True on a host-bound step: 1.01x).
        "findings": [{"code": f.code, "rule": f.rule,
                      "expected_end_to_end_speedup": round(float(f.expected_end_to_end_speedup), 3),
                      "bound": round(float(f.bound), 3)} for f in before.findings()],
    }


def _outermost(b: _Side, ops: list) -> list:
    """Matched ops whose BEFORE activities do not overlap a larger one's (nested ranges count once)."""
    taken: set = set()
    out = []
    for op in sorted(ops, key=lambda o: -len(b.acts_of.get(o["name"], ()))):
        acts = set(b.acts_of.get(op["name"], np.array([], dtype=int)).tolist())
        if acts & taken:
            continue
        taken |= acts
        out.append(op)
    return out


def _predicted_total(b: _Side, ops: list, T_b: int) -> dict:
    """Combine the advisor's end-to-end predictions of the matched ops that changed (outermost
    only): their predicted savings T x (1 - 1/e2e) add up."""
    changed = _outermost(b, [op for op in ops if op["verdict"] != NO_CHANGE])
    saved = sum(T_b * (1.0 - 1.0 / op["predicted_end_to_end_speedup"]) for op in changed)
    pred = 1.0 if not changed else (_ratio(T_b, T_b - saved) if T_b - saved > 0 else None)
    return {"predicted_end_to_end_speedup": _r(pred, 4), "predicted_from": [op["name"] for op in changed]}


def _trace_json(prof: Profile) -> dict:
    return {"trace": prof.path, "gpu": prof.gpu.name, "total_gpu_time_ns": prof.trace.total_gpu_time_ns}


def _same_file(p: str, q: str) -> bool:
    try:
        return os.path.samefile(p, q)
    except OSError:
        return os.path.abspath(p) == os.path.abspath(q)


# ---------------------------------------------------------------- rendering (text, markdown)

def _x(v: Optional[float], nd: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}x"


def _signed(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def _kpc(v: float) -> str:
    return f"{v:g}"


def _arrow(a: str, b: str) -> str:
    return a if a == b else f"{a} → {b}"


def _op_cells(op: dict) -> list[str]:
    from profkit.show.render import fmt_time, short_name
    b, a = op["before"], op["after"]
    name = short_name(op["name"], 48)
    if op["after_name"] != op["name"]:
        name += f" → {short_name(op['after_name'], 48)}"
    return [name, _arrow(str(b["count"]), str(a["count"])),
            f"{fmt_time(b['gpu_time_median_ns'])} → {fmt_time(a['gpu_time_median_ns'])}",
            _signed(op["median_change_pct"]), f"±{op['threshold_pct']:.1f}%", op["verdict"],
            _arrow(b["class"], a["class"]),
            _arrow(_kpc(b["kernels_per_call"]), _kpc(a["kernels_per_call"])),
            _x(op["predicted_op_speedup"]), _x(op["measured_op_speedup"]),
            _x(op["predicted_end_to_end_speedup"], 3), _x(op["measured_end_to_end_speedup"], 3)]


OP_HEADERS = ["op", "calls", "median per call", "change", "noise", "verdict", "class", "kern/call",
              "pred op x", "meas op x", "pred e2e", "meas e2e"]


def _detail_lines(res: DiffResult) -> list[str]:
    """Kernel changes inside each op, totals, unmatched ops, the noise rule and warnings."""
    from profkit.show.render import fmt_time, short_name
    lines = []
    for op in res.ops:
        parts = ([f"removed {short_name(k['name'], 60)} ({k['per_call']:g}/call)" for k in op["kernels_removed"]]
                 + [f"added {short_name(k['name'], 60)} ({k['per_call']:g}/call)" for k in op["kernels_added"]]
                 + [f"{short_name(k['name'], 60)} {k['before_per_call']:g} → {k['after_per_call']:g}/call"
                    for k in op["kernels_changed"]])
        if parts:
            lines.append(f"kernels in {op['name']}: " + "; ".join(parts))
    t = res.total
    lines.append(
        f"total over {_matched_label(t['matched_ops'])}, steady state "
        f"(calls x median): {fmt_time(t['steady_before_ns'])} → {fmt_time(t['steady_after_ns'])} "
        f"({_signed(t['change_pct'])}, noise ±{t['threshold_pct']:.1f}%): {t['verdict']}")
    lines.append(
        f"kernel time of matched ops: {fmt_time(t['matched_before_kernel_time_ns'])} → "
        f"{fmt_time(t['matched_after_kernel_time_ns'])} ({_signed(t['kernel_time_change_pct'])}); "
        f"trace GPU time: {fmt_time(t['before_gpu_time_ns'])} → {fmt_time(t['after_gpu_time_ns'])}"
        + ("" if t["trace_change_pct"] is None else f" ({_signed(t['trace_change_pct'])})"))
    lines.append(
        f"end to end (BEFORE's GPU time, matched kernel time replaced by AFTER's): predicted "
        f"{_x(t['predicted_end_to_end_speedup'], 3)}"
        + (f" (from {_matched_label(t['predicted_from'])[len('matched '):]})" if t["predicted_from"] else "")
        + f", measured {_x(t['measured_end_to_end_speedup'], 3)}")
    for label, items in (("only in BEFORE", res.only_before), ("only in AFTER", res.only_after)):
        if items:
            lines.append(f"{label}: " + "; ".join(
                f"{short_name(o['name'], 60)} ({o['count']} calls, {fmt_time(o['gpu_time_ns'])})" for o in items))
    lines.append(f"noise: {NOISE_RULE}")
    lines += [f"warning: {w}" for w in res.warnings]
    return lines


def _matched_label(names: list) -> str:
    from profkit.show.render import short_name
    if not names:
        return "no matched ops"
    if len(names) <= 3:
        return "matched ops " + ", ".join(short_name(n, 40) for n in names)
    return f"{len(names)} matched ops"


def _title(res: DiffResult) -> str:
    from pathlib import Path
    b, a = Path(res.before["trace"]).name, Path(res.after["trace"]).name
    return (f"{b} → {a} - {res.before['gpu']} - by {res.level} - verdict: {res.verdict} "
            f"({_signed(res.total['change_pct'])} over matched ops)")


# Columns left out first when the terminal is narrow (``--wide`` keeps them all), and the width
# each needs to read well; op, the medians and the two end-to-end figures always stay.
DIFF_DROP_ORDER = ["kern/call", "noise", "class", "calls", "pred op x", "meas op x", "verdict"]
_DIFF_NEEDS = {"op": 20, "calls": 7, "median per call": 19, "change": 7, "noise": 7, "verdict": 11,
               "class": 8, "kern/call": 9, "pred op x": 6, "meas op x": 6, "pred e2e": 7, "meas e2e": 7}


def to_table(res: DiffResult, console_width: int = 200, wide: bool = False) -> str:
    import io
    import textwrap
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape
    from profkit.show.render import fit_columns
    keep = fit_columns(OP_HEADERS, _DIFF_NEEDS, DIFF_DROP_ORDER, console_width, wide)
    cols = [OP_HEADERS[i] for i in keep]
    t = Table(box=box.SIMPLE_HEAVY, expand=False, title=escape(_title(res)))
    for h in cols:
        t.add_column(h, justify="left" if h in ("op", "verdict", "class") else "right", overflow="fold")
    for op in res.ops:
        cells = _op_cells(op)
        t.add_row(*(escape(cells[i]) for i in keep))  # names are text, not rich markup
    buf = io.StringIO()
    console = Console(file=buf, width=console_width, force_terminal=False, color_system=None, soft_wrap=False)

    def say(line: str, indent: int) -> None:
        console.print(textwrap.fill(line, width=max(console_width - 1, 40), subsequent_indent=" " * indent,
                                    break_long_words=False, break_on_hyphens=False),
                      markup=False, highlight=False, overflow="fold")
    for line in run_lines(res.run):
        say(line, 2)
    console.print(t)
    dropped = [c for c in OP_HEADERS if c not in cols]
    if dropped:
        say(f"not shown at {console_width} columns: {', '.join(dropped)} (--wide shows them; "
            "--format json has everything)", 2)
    for line in _detail_lines(res):
        say(line, 2)
    return buf.getvalue()


def run_lines(run: dict) -> list[str]:
    """Wall time per iteration, measured, beside BEFORE's predicted actions."""
    if not run:
        return []
    caps = run.get("captures") or {}
    many = (f"; {caps['before']} and {caps['after']} captures, medians "
            f"{run['between_captures_pct']:.1f}% apart" if caps and max(caps.values()) > 1
            and run.get("between_captures_pct") is not None else "")
    noise = ""
    if run.get("before_median_ci_ns"):
        (b0, b1), (a0, a1) = run["before_median_ci_ns"], run["after_median_ci_ns"]
        noise = (f" (95% CI of the median {fmt_time(b0)}-{fmt_time(b1)} -> {fmt_time(a0)}-"
                 f"{fmt_time(a1)}{many}): {run['verdict']}")
    out = [f"wall time per {run['per']}: {fmt_time(run['before_ns'])} -> {fmt_time(run['after_ns'])}, "
           f"measured {_x(run['measured_speedup'], 3)}{noise} ({run['before_verdict']} -> "
           f"{run['after_verdict']}; GPU idle {run['before_gpu_idle_fraction']:.0%} -> "
           f"{run['after_gpu_idle_fraction']:.0%})"]
    for a in run["predicted"]:
        out.append(f"  BEFORE predicted {_x(a['expected_end_to_end_speedup'], 3)} for {a['rule']}: "
                   f"{a['action']}")
    shown = {a.get("code") for a in run["predicted"]}
    rest = [f for f in run.get("findings", []) if f["code"] not in shown]
    if rest:
        out.append("  other rules on BEFORE: " + ", ".join(
            f"{f['code']} {f['rule']} {_x(f['expected_end_to_end_speedup'], 3)}" for f in rest))
    return out


def _cell(x: object) -> str:
    from profkit.show.render import markdown_cell
    return markdown_cell(x)


def to_markdown(res: DiffResult) -> str:
    lines = [f"**{_cell(_title(res))}**", "",
             "| " + " | ".join(OP_HEADERS) + " |",
             "|" + "|".join("---" if h in ("op", "verdict", "class") else "---:" for h in OP_HEADERS) + "|"]
    for op in res.ops:
        lines.append("| " + " | ".join(_cell(c) for c in _op_cells(op)) + " |")
    lines.append("")
    lines += [f"- {_cell(line)}" for line in run_lines(res.run) + _detail_lines(res)]
    return "\n".join(lines) + "\n"

"""Fixes priced together: the step-graph edits of the top findings applied one after the other to
one copy of the graph and replayed once, the way the model prices any single fix.

Gains do not multiply: two fixes that remove the same idle time share it (dropping a sync and
capturing the step in a CUDA graph both shorten the CPU's critical stretch), and a fix whose
bottleneck is hidden by another's pays only once the other is done (a fused optimizer on a step
that CUDA graphs make GPU-paced). Only the replay of the combined graph says which.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import combinations as subsets
from typing import Optional

from profkit.judge.rules.base import Finding
from profkit.run.summary import MIN_ACTION_GAIN

MAX_FIXES = 3      # the top findings combined: pairs and the triple, four replays at most


def combined(model, host: float, findings: list[Finding], max_fixes: int = MAX_FIXES) -> list[dict]:
    """Every pair (and the triple) of the best ``max_fixes`` findings of distinct rules that the
    model priced, replayed together at CPU scale ``host``; best first. Empty without a model."""
    if model is None:
        return []
    pool: list[Finding] = []
    for f in sorted(findings, key=lambda f: -f.expected_end_to_end_speedup):
        if (f.edit is not None and f.expected_end_to_end_speedup >= MIN_ACTION_GAIN
                and f.code not in {p.code for p in pool}):
            pool.append(f)
        if len(pool) == max_fixes:
            break
    if len(pool) < 2:
        return []
    base = model.simulate(host=host).mean_iteration_ns
    out = []
    for k in range(2, len(pool) + 1):
        for group in subsets(pool, k):
            if any(a.kernels & b.kernels for a, b in subsets(group, 2)):
                # Two changes of the same kernels (TF32 or bf16 for one fp32 GEMM) are
                # alternatives: replayed one after the other they would compound.
                continue
            gain = _replay(model, host, base, group)
            if gain is None:
                continue
            alone = [round(f.expected_end_to_end_speedup, 3) for f in group]
            # Below the best of them alone: the edits change the same work (two fusions of the
            # same kernels), the later one's estimate replacing the earlier's; not a plan.
            out.append({"codes": [f.code for f in group], "rules": [f.rule for f in group],
                        "expected_end_to_end_speedup": round(gain, 3), "alone": alone,
                        "overlap": gain < max(alone) * 0.999})
    return sorted(out, key=lambda c: -c["expected_end_to_end_speedup"])


def together(model, host: float, group: list[Finding]) -> Optional[float]:
    """The gain of ``group``'s edits replayed at once at CPU scale ``host`` (None where they do not
    compose): for one change that does what several rules propose (compiling the model and the
    optimizer step is PK103's edit and PK201's)."""
    if model is None or any(f.edit is None for f in group):
        return None
    return _replay(model, host, model.simulate(host=host).mean_iteration_ns, group)


def _replay(model, host: float, base: float, group) -> Optional[float]:
    g = model.graph
    try:
        for f in group:
            g = f.edit(g)
        new = model.simulate(g, host=host).mean_iteration_ns
    except (IndexError, ValueError):  # edits that do not compose on this graph: not priced
        return None
    return max(base / new, 1.0) if new > 0 else None


# How far a fix's edit is scaled at most to reach a trial's measured gain (2: twice the change the
# model made; beyond that the model's edit is not the mechanism, and the scale stops there)
MAX_SCALE = 2.0
SCALE_STEPS = 12


def scaled_edit(edit, alpha: float):
    """``edit`` taken ``alpha`` of the way (profkit.run.step.transform.blend)."""
    from profkit.run.step.transform import blend
    return lambda g: blend(g, edit(g), alpha)


def fit_scale(model, host: float, finding: Finding, measured: float) -> Optional[float]:
    """The scale of ``finding``'s edit at which the model's replay of it alone gives the
    ``measured`` gain: bisection on [0, MAX_SCALE] (the replay's gain grows with the scale). None
    where the finding has no edit, the replay fails, or MAX_SCALE of the edit gains less than
    measured."""
    if model is None or finding.edit is None:
        return None
    base = model.simulate(host=host).mean_iteration_ns

    def gain(alpha: float) -> Optional[float]:
        try:
            new = model.simulate(scaled_edit(finding.edit, alpha)(model.graph), host=host).mean_iteration_ns
        except (IndexError, ValueError):
            return None
        return base / new if new > 0 else None
    if measured <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    top = gain(hi)
    if top is None:
        return None
    if top < measured:  # the trial gained more than the model's whole edit: scale it up
        lo, hi = 1.0, MAX_SCALE
        top = gain(hi)
        if top is None or top < measured:
            # twice the model's change still gains less than measured: the edit is not what the
            # fix did to the program, and no scale of it stands for the measurement
            return None
    for _ in range(SCALE_STEPS):
        mid = 0.5 * (lo + hi)
        g = gain(mid)
        if g is None:
            return None
        lo, hi = (mid, hi) if g < measured else (lo, mid)
    return 0.5 * (lo + hi)


def with_trials(model, host: float, findings: list[Finding], combos: list[dict],
                tried: dict) -> list[dict]:
    """``combos`` (``combined``'s) with, for each that holds a fix a trial measured
    (``tried``: code -> profkit.run.trials.TrialResult), ``with_trials``: the combination replayed
    with that fix's edit scaled so that alone it gives the measured gain (``fit_scale``), the
    others' edits as the model made them: ``{expected_end_to_end_speedup, scaled: {code: [measured
    gain, scale]}}``. What the trial teaches the model is how much of its edit of that fix the
    program shows; how the fixes share the step stays the model's."""
    by_code = {f.code: f for f in findings}
    scales: dict[str, Optional[float]] = {}
    for code, t in tried.items():
        # (a trial that left part of the program as it was measured part of the fix: it
        # teaches the edit of the whole nothing)
        if t.measured and code in by_code and not t.left_out:
            scales[code] = fit_scale(model, host, by_code[code], float(t.speedup))
    if not any(v is not None for v in scales.values()):
        return combos
    base = model.simulate(host=host).mean_iteration_ns
    out = []
    for c in combos:
        hit = {code: scales[code] for code in c["codes"] if scales.get(code) is not None}
        if not hit:
            out.append(c)
            continue
        group = [replace(by_code[code], edit=scaled_edit(by_code[code].edit, hit[code]))
                 if code in hit else by_code[code] for code in c["codes"]]
        gain = _replay(model, host, base, group)
        if gain is None or gain < max(float(tried[code].speedup) for code in hit):
            # (a combination priced under a fix of it that was measured alone is a model that
            # does not compose these edits: the model's own price stays, unscaled)
            out.append(c)
            continue
        out.append({**c, "with_trials": {
            "expected_end_to_end_speedup": round(gain, 3),
            "scaled": {code: [round(float(tried[code].speedup), 3), round(a, 3)] for code, a in hit.items()}}})
    return out


"""Fixes priced together: the step-graph edits of the top findings applied one after the other to
one copy of the graph and replayed once, the way the model prices any single fix.

Gains do not multiply: two fixes that remove the same idle time share it (dropping a sync and
capturing the step in a CUDA graph both shorten the CPU's critical stretch), and a fix whose
bottleneck is hidden by another's pays only once the other is done (a fused optimizer on a step
that CUDA graphs make GPU-paced). Only the replay of the combined graph says which.
"""
from __future__ import annotations

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

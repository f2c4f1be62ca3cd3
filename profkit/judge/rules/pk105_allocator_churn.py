"""PK105 allocator-churn: device memory is freed and allocated again inside every step.

What
    ``cudaFree``/``cudaMalloc`` (and the driver's ``cuMemUnmap``/``cuMemCreate``...) calls inside
    the steady-state iterations: the caching allocator gives memory back and asks for it again
    each step, usually because the loop calls ``torch.cuda.empty_cache()``, or because tensor
    shapes vary so much that cached blocks never fit.
Why
    ``cudaFree`` waits for every outstanding kernel of the device before it returns (it drains
    the queue, like a sync), and the next step's ``cudaMalloc`` calls cost milliseconds of CPU
    again. A warm caching allocator does neither.
Evidence
    The step model's allocation and free calls per iteration, their CPU time and the time they
    waited for the GPU.
Fix
    No ``torch.cuda.empty_cache()`` in the loop; for shapes that vary, pad to a few sizes (or
    ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``); preallocate buffers that are reused.
Expected gain
    Graph edit: the allocation and free calls of the iterations take no CPU time and wait for
    nothing (the caching allocator serves the memory). The step model replays the edited graph
    at the calibrated CPU scale.
Trial
    ``profkit capture --try no_empty_cache`` measures the finding's price:
    ``torch.cuda.empty_cache()`` made a no-op. ``--try expandable_segments``
    (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) is the fix for shapes that vary; the
    model does not price it, the trial shows what it gives. ``--try auto`` runs both.
References
    PyTorch "CUDA semantics: memory management" (caching allocator, empty_cache,
    expandable_segments); CUDA Runtime API, "API synchronization behavior" (cudaFree).
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, TrialOf
from profkit.run.step.graph import CallKind
from profkit.run.step.transform import remove_calls

RULE = RuleMeta(
    code="PK105", name="allocator-churn",
    summary="device memory freed and allocated again every step: no empty_cache() in the loop",
    tables=(Table.RUNTIME,), example="traces/corpus/gpt2_empty_cache.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    trials=(TrialOf("no_empty_cache"), TrialOf("expandable_segments")),
    params=(Param("min_per_iteration", 1.0, "allocation and free calls per iteration (on average)"),
            Param("min_share", 0.02, "their CPU time, waits included, as a share of the iteration")))


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None:
        return []
    g = m.graph
    calls = np.flatnonzero(np.isin(g.c_kind, [int(CallKind.ALLOC), int(CallKind.FREE)]))
    its = max(len(g.iter_call) - 1, 1)
    if len(calls) < RULE.param("min_per_iteration") * its:
        return []
    spent = float((g.c_end - g.c_start)[calls].sum()) / its
    if spent < RULE.param("min_share") * m.iteration_ns:
        return []
    frees = int((g.c_kind[calls] == int(CallKind.FREE)).sum())
    gain, basis = ctx.price(lambda gr: remove_calls(gr, calls),
                            f"{len(calls) / its:.0f} allocation/free calls per iteration served by the "
                            "caching allocator")
    return [Finding(RULE.code, RULE.name,
                    f"keep the caching allocator warm: {len(calls) / its:.0f} allocation/free calls per "
                    f"iteration ({frees / its:.0f} frees, which wait for the GPU); remove "
                    "torch.cuda.empty_cache() from the loop, pad varying shapes to a few sizes",
                    Rung.LIBRARY, {"calls_per_iteration": round(len(calls) / its, 1),
                                   "frees_per_iteration": round(frees / its, 1),
                                   "ns_in_calls_per_iteration_profiled": int(spent)}, gain, basis, gain)]

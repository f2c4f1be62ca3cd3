"""PK501 nccl-exposed: per-step collectives run with no compute beside them.

What
    NCCL collectives of the steady-state step (all-reduce of DDP gradient buckets, FSDP
    all-gather / reduce-scatter) whose time is not overlapped by compute on the same GPU.
Why
    Exposed communication adds to the step; hidden communication is free. DDP overlaps bucket
    all-reduces with the backward; a sync point in the backward, ``find_unused_parameters``, or
    one huge bucket at the end defeats it. Set-up collectives (communicator init, the initial
    parameter broadcast) run once before the window and are never advised: one-off.
Evidence
    profkit.judge.comm: each collective's exposed time (no non-NCCL kernel running beside it) inside
    the window; only collectives that recur at least once per iteration.
Fix
    Let DDP overlap (no sync in backward, ``gradient_as_bucket_view=True``), tune
    ``bucket_cap_mb``; FSDP: forward/backward prefetch; bf16 gradient compression hook.
Expected gain
    Graph edit: the per-step collectives' kernels keep only their overlapped time (the exposed
    part hidden under compute). The step model replays the edited graph at the calibrated CPU
    scale; the wait on the other ranks inside each collective stays as measured.
References
    PyTorch DDP design notes (gradient bucketing); NCCL docs; ``nsys analyze`` rule
    ``nccl_gpu_overlap``.
"""
from __future__ import annotations

from profkit.judge import comm
from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table

RULE = RuleMeta(
    code="PK501", name="nccl-exposed",
    summary="per-step NCCL collectives with no compute beside them: overlap, bucket sizes",
    tables=(Table.KERNEL,), example="traces/ddp2/rank0.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_exposed_share", 0.03, "exposed collective time, as a share of the wall time"),))


def detect(ctx: RuleContext) -> list[Finding]:
    names = ctx.kernels.index
    if not any(comm.is_nccl_kernel(n) for n in names):
        return []
    s = comm.analyze(ctx.prof.trace)
    per_step = s.collectives[s.collectives["count"] >= max(ctx.iterations, 1)]
    exposed = float(per_step["exposed_ns"].sum())
    wall = ctx.wall_ns
    if exposed <= RULE.param("min_exposed_share") * wall:
        return []
    total = float(per_step["total_ns"].sum()) if "total_ns" in per_step else 0.0
    rows = ctx.acts_named(per_step.index)
    total = total or float(rows["dur"].sum())
    factor = total / max(total - exposed, 1.0) if total > exposed else float("inf")
    # Graph edit: the collectives' exposed part hidden under compute, as if they took only the
    # part that overlapped (an approximation: the model keeps each collective on its stream).
    g, basis = ctx.price_ops(rows, factor, f"exposed collective time {ctx.per_iteration(exposed)} "
                                           "overlapped with compute")
    top = per_step.sort_values("exposed_ns", ascending=False).iloc[0]
    return [Finding(RULE.code, RULE.name,
                    f"overlap the per-step collectives with compute ({top['collective']}: "
                    f"{top['exposed_share']:.0%} exposed): no sync points in the backward, tune DDP "
                    "bucket_cap_mb, FSDP prefetch", Rung.LIBRARY,
                    {"exposed_ns": int(exposed), "collectives": per_step.index.tolist()[:3]}, g,
                    basis, g, None, Scope.OPS, frozenset(per_step.index))]

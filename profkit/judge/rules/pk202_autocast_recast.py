"""PK202 autocast-recast: autocast casts every fp32 weight to bf16 again on every step.

What
    A training step keeps fp32 weights (its optimizer updates fp32 tensors) and runs its GEMMs in
    bf16/fp16 under ``torch.autocast``: each forward launches a cast kernel per weight (and the
    backward reads the casts), every step.
Why
    Autocast caches a weight's cast only inside one autocast region; the next step casts again.
    Each cast reads 4 bytes and writes 2 per weight element: weight-sized traffic and a launch
    per weight, every step.
Evidence
    Kernel names: fp32 -> bf16/fp16 cast kernels (``bfloat16_copy_kernel_cuda ... lambda(float)``),
    bf16/fp16 GEMMs (kernel dtype), and optimizer kernels on fp32 tensors (foreach or fused).
    The kernel names do not tell weight casts from activation casts: the bound counts all of them.
    With aten shapes (``capture --aten``), the ``aten::_to_copy`` calls of tensors shaped like an
    ``aten::linear`` weight are counted as the weight casts (train_llama_aten: 30 per step,
    [1024, 1024] x 16, [2816, 1024] x 8, [1024, 2816] x 4, [32000, 1024] x 2: 0.70 GB of cast
    traffic per step).
Fix
    Keep bf16 weights for forward/backward and an fp32 master copy only in the optimizer (one cast
    per step after the update; e.g. FSDP ``MixedPrecision(param_dtype=torch.bfloat16)``), or
    train in bf16 throughout where accuracy allows.
Expected gain
    Upper bound: all fp32 -> 16-bit cast kernel time removed, times its critical share, never
    below the CPU's own time per step.
References
    PyTorch AMP docs ("autocast caches casts within a region"); PyTorch FSDP MixedPrecision.
"""
from __future__ import annotations

import re

from profkit.judge.dtypes import kernel_dtype
from profkit.model import Rung
from profkit.judge.rules.base import GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Scope, Table, matches

RULE = RuleMeta(
    code="PK202", name="autocast-recast",
    summary="autocast re-casts fp32 weights to bf16 every step: keep bf16 weights, cast once",
    tables=(Table.KERNEL,), example="traces/real/train_llama.sqlite.xz",
    quiet_on="traces/real/generate_llama.sqlite.xz",
    params=(Param("min_casts_per_iteration", 4, "fp32 -> 16-bit cast kernels per iteration"),))

CAST_RE = re.compile(r"(bfloat16|float16|half)_copy_kernel_cuda.*\[lambda\(float\)", re.I)
OPTIM_RE = re.compile(r"multi_tensor_apply_kernel.*(Functor<float|FusedAdam\w*Functor<float)", re.I)


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    names = k.index.to_series()
    casts = k[matches(names, CAST_RE)]
    if casts.empty or not matches(names, OPTIM_RE).any():
        return []  # no fp32 optimizer: weights are not fp32 masters (e.g. a bf16 model)
    low = [n for n in names[matches(names, GEMM_KERNEL_RE)]
           if kernel_dtype(n).precision in ("bf16", "fp16")]
    if not low:
        return []
    per_it = float(casts["count"].sum()) / max(ctx.iterations, 1)
    if per_it < RULE.param("min_casts_per_iteration"):
        return []
    total = float(casts["total_ns"].sum())
    crit = float(casts["critical_ns"].sum()) / total if total else 0.0
    ev = {"casts_per_iteration": round(per_it, 1), "cast_kernel_ns": int(total),
          "critical_share": round(crit, 3)}
    # With aten shapes (capture --aten), name the weight casts: casts of a tensor shaped like
    # the weight argument of an aten::linear call.
    shapes = {tuple(sz[1]) for sz in ctx.aten_sizes("aten::linear") if len(sz) > 1 and len(sz[1]) == 2}
    weights = [sz[0] for sz in ctx.aten_sizes("aten::_to_copy") if sz and tuple(sz[0]) in shapes]
    if weights:
        elems = sum(a * b for a, b in weights)
        ev["weight_casts_per_iteration"] = round(len(weights) / max(ctx.iterations, 1), 1)
        ev["weight_cast_bytes_per_iteration"] = int(6 * elems / max(ctx.iterations, 1))  # read 4, write 2
    g, basis = ctx.price_ops(ctx.acts_named(casts.index), float("inf"),
                             f"cast kernels {ctx.per_iteration(total)} and their launches removed",
                             drop_launches=True)
    return [Finding(RULE.code, RULE.name,
                    f"keep bf16 weights for the forward and backward and the fp32 master copy only in "
                    f"the optimizer (cast once per step), instead of autocast casting them again each "
                    f"step ({per_it:.0f} fp32 -> 16-bit cast kernels per iteration)", Rung.LIBRARY,
                    ev, g,
                    f"upper bound, all casts removed: {basis}",
                    g, None, Scope.OPS, frozenset(casts.index))]

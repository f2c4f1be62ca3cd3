"""PK203 fp32-logits-loss: the loss materialises fp32 logits over a large vocabulary.

What
    ``cross_entropy(logits.float(), ...)`` over a large vocabulary: a log-softmax forward and
    backward over a tokens x vocab fp32 tensor, each call hundreds of microseconds, every step.
Why
    The logits are the largest activation of a language model (8 x 512 tokens x 32000 x 4 bytes
    = 524 MB). Upcasting, normalising and differentiating them makes several full passes over
    HBM and holds the memory; a fused / chunked linear-cross-entropy computes the loss per chunk
    of tokens from the hidden states without writing the logits out.
Evidence
    Kernel names: ``cunn_SoftMaxForward<..., float, float, float, LogSoftMaxForwardEpilogue>`` and
    its backward, in fp32, with a median call of at least ``min_call_us``.
Fix
    A fused linear-cross-entropy (Liger-Kernel ``LigerFusedLinearCrossEntropyLoss``, or
    ``torch.compile`` of the lm-head + loss in chunks); at least compute the loss on the bf16
    logits in chunks of tokens.
Expected gain
    Bound: the fp32 log-softmax forward and backward make ~6 passes over fp32 logits, a chunked
    bf16 loss ~2 over bf16: their kernel time / 3 remains; times the critical share, never below
    the CPU's own time per step.
References
    Liger-Kernel (Hsu et al., 2024), "fused linear cross entropy"; Apple "Cut Your Losses in
    Large-Vocabulary Language Models" (Wijmans et al., 2024).
"""
from __future__ import annotations

import re

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table, matches

RULE = RuleMeta(
    code="PK203", name="fp32-logits-loss",
    summary="the loss materialises fp32 logits of a large vocabulary: fused/chunked linear-cross-entropy",
    tables=(Table.KERNEL,), example="traces/real/train_llama.sqlite.xz",
    quiet_on="traces/real/sync_loop.sqlite.xz",
    params=(Param("min_call_us", 100.0, "median log-softmax call at least this long"),))

LOGSOFTMAX_RE = re.compile(r"SoftMax(?:Forward|Backward)\w*<[^>]*?float, float, float, .*?LogSoftMax", re.I)
OP_GAIN = 3.0  # ~6 passes over fp32 logits -> ~2 over bf16 chunks (see the docstring)


def detect(ctx: RuleContext) -> list[Finding]:
    k = ctx.kernels
    rows = k[matches(k.index.to_series(), LOGSOFTMAX_RE)]
    if rows.empty or float(rows["median_ns"].max()) < RULE.param("min_call_us") * 1e3:
        return []
    total = float(rows["total_ns"].sum())
    crit = float(rows["critical_ns"].sum()) / total if total else 0.0
    ev = {"log_softmax_kernel_ns": int(total), "median_call_ns": int(rows["median_ns"].max()),
          "critical_share": round(crit, 3)}
    shapes = [sz[0] for sz in ctx.aten_sizes("aten::_log_softmax") if sz and len(sz[0]) == 2]
    if shapes:  # with aten shapes: tokens x vocab of the logits, and their fp32 bytes
        tokens, vocab = max(shapes, key=lambda s: s[0] * s[1])
        ev.update({"logits_shape": [tokens, vocab], "fp32_logits_bytes": int(4 * tokens * vocab)})
    g, basis = ctx.price_ops(ctx.acts_named(rows.index), OP_GAIN,
                             f"log-softmax fwd+bwd {ctx.per_iteration(total)} / {OP_GAIN:.0f}", cap=OP_GAIN)
    return [Finding(RULE.code, RULE.name,
                    "compute the loss without materialising fp32 logits: a fused linear-cross-entropy "
                    "(Liger-Kernel LigerFusedLinearCrossEntropyLoss) or a chunked bf16 loss",
                    Rung.LIBRARY, ev, g,
                    basis,
                    g, OP_GAIN, Scope.OPS, frozenset(rows.index))]

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
    Graph edit, in passes over the logits (one pass: a read or a write of the tokens x vocab tensor
    in float32), each pass timed by the log-softmax forward (a read and a write: its time / 2).
    Eager, the loss makes about nine: the upcast before the forward (a 16-bit read, a float32
    write), the forward's two, the zeroed gradient the backward starts from, the backward's three,
    and the downcast of the gradient after it. Those kernels are found on the log-softmax's stream
    next to it (copies and fills of at least a fifth and a tenth of its time; the negative
    log-likelihood's own small kernels between are left as they are). A fused loss over 16-bit
    logits makes one and a half: the forward reads them (half a pass), the backward reads them and
    writes their gradient (one). Over float32 logits (no upcast before the forward: a float32
    model) it makes three. Each iteration's forward and backward groups become one kernel each at
    those passes, their other launches gone. A fused linear-cross-entropy that recomputes the
    logits in chunks adds the head's GEMMs, which this leaves out. The same edit is what
    ``torch.compile`` does to a loss inside the compiled model (profkit.run.step.fusion). An HF
    Llama step with a 128k vocabulary (an H100, 2026-12-07): 1.33x (the earlier price, the
    log-softmax alone at a third, 1.14x); the loss computed on the bf16 logits without the
    upcast, not fused, measured 1.25x; ``torch.compile`` of the model, loss inside, 1.68x
    (priced 1.53x with this edit in its fusion, 1.28x before).
References
    Liger-Kernel (Hsu et al., 2024), "fused linear cross entropy"; Apple "Cut Your Losses in
    Large-Vocabulary Language Models" (Wijmans et al., 2024).
"""
from __future__ import annotations

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table, matches
from profkit.run.step.fusion import LOGSOFTMAX_RE, loss_groups
from profkit.run.step.transform import replace_ops

RULE = RuleMeta(
    code="PK203", name="fp32-logits-loss",
    summary="the loss materialises fp32 logits of a large vocabulary: fused/chunked linear-cross-entropy",
    tables=(Table.KERNEL,), example="traces/real/train_llama.sqlite.xz",
    quiet_on="traces/real/sync_loop.sqlite.xz",
    params=(Param("min_call_us", 100.0, "median log-softmax call at least this long"),))

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
    m = ctx.model
    if m is None:
        return []
    grp, new, op_gain = loss_groups(m.graph)
    if not grp:
        return []
    its = max(len(m.graph.iter_call) - 1, 1)
    eager_ns = float(sum(m.graph.g_dur[x].sum() for x in grp)) / its
    fused_ns, n_kernels = float(new.sum()) / its, sum(len(x) for x in grp)
    ev.update(loss_kernel_ns_per_iteration=int(eager_ns), fused_ns_per_iteration=int(fused_ns),
              loss_kernels=n_kernels)
    g, basis = ctx.price(lambda gr: replace_ops(gr, grp, new),
                         f"the loss's logits-sized kernels ({eager_ns / 1e6:.2f} ms an iteration: "
                         f"{n_kernels / its:.0f} of them, the log-softmax and the casts and fill beside it) "
                         f"fused at the passes a fused loss makes ({fused_ns / 1e6:.2f} ms)", cap=op_gain)
    return [Finding(RULE.code, RULE.name,
                    "compute the loss without materialising fp32 logits: a fused linear-cross-entropy "
                    "(Liger-Kernel LigerFusedLinearCrossEntropyLoss) or a chunked bf16 loss",
                    Rung.LIBRARY, ev, g,
                    basis,
                    g, op_gain, Scope.OPS, frozenset(rows.index))]

"""PK206 unstepped-backward: parameters get gradients that no optimizer steps, and their backward
runs every step for nothing.

What
    The capture's op record found, at the iteration's first optimizer step, parameters that
    require gradients and hold one but belong to no optimizer (``unstepped``, per root module:
    a distillation's teacher put in eval mode but never frozen nor run under
    ``torch.no_grad()``), and the optimizers' own parameters (``optimizer``: their element
    counts); the unstepped ones are ``min_share`` or more of all the parameters with gradients.
Why
    A parameter that requires a gradient gets one in every backward that reaches it. The
    teacher's logits carry their autograd history into the loss, so ``loss.backward()`` computes
    the teacher's activation and weight gradients too (about twice its forward's work), keeps its
    activations for that, and accumulates into ``.grad`` tensors nothing reads.
Evidence
    The record's ``unstepped`` and ``optimizer`` entries, and the step graph: PyTorch runs a CUDA
    backward on its autograd device thread, so the kernels launched from threads other than the
    one that opens the iterations are the backward's.
Fix
    ``teacher.requires_grad_(False)`` (or ``torch.no_grad()`` / ``torch.inference_mode()`` around
    the teacher's forward); for layers meant to stay fixed while others train, freeze them.
Expected gain
    Graph edit, replayed at the calibrated CPU scale: the backward's kernels and its thread's CPU
    time shrink by the unstepped parameters' share of all the parameters with gradients
    (``scale_ops``, ``scale_cpu``). A layer's backward work, activation and weight gradients alike,
    grows with its parameters times the tokens it sees; two models fed the same batch (a teacher
    and its student) split the backward by their parameters. Embedding tables count as much as
    layers though their backward is a scatter (both models have one in a distillation); a frozen
    model fed other inputs than the trained one (another resolution) would break the proportion.
    The forward's autograd bookkeeping for the frozen model is not priced.
Trial
    ``profkit capture --try freeze_unstepped`` measures the finding's price: at the second step of
    any optimizer, the parameters holding gradients that no optimizer steps are set
    ``requires_grad_(False)`` and their ``.grad`` dropped (``--try auto`` runs it).
References
    PyTorch autograd mechanics, "Excluding subgraphs from backward" (``requires_grad``,
    ``torch.no_grad``); Hinton et al., "Distilling the Knowledge in a Neural Network" (the
    teacher is fixed).
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung

from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, TrialOf
from profkit.run.step.transform import scale_cpu, scale_ops

RULE = RuleMeta(
    code="PK206", name="unstepped-backward",
    summary="parameters get gradients no optimizer steps: freeze them or run their forward under no_grad",
    tables=(Table.KERNEL, Table.RUNTIME), example="traces/corpus/distill_teacher_train.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    trials=(TrialOf("freeze_unstepped"),),
    params=(Param("min_share", 0.05, "the unstepped parameters' share of all the parameters with gradients"),))


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    loose = [u for u in ctx.replacements.recorded("unstepped")
             if isinstance(u.get("elements"), int) and u["elements"] > 0]
    stepped = sum(o["numel"] for o in ctx.replacements.recorded("optimizer") if isinstance(o.get("numel"), int))
    if m is None or not loose or stepped <= 0:
        return []
    unstepped = sum(u["elements"] for u in loose)
    share = unstepped / (unstepped + stepped)
    if share < RULE.param("min_share"):
        return []
    g = m.graph
    if len(g.iter_call) < 2:
        return []
    main = g.c_tid[g.iter_call[0]]
    ops = np.flatnonzero((g.g_kind == 0) & (g.g_call >= 0))
    ops = ops[g.c_tid[g.g_call[ops]] != main]
    if not len(ops):
        return []      # no backward on a thread of its own: nothing to tell it by
    calls = np.flatnonzero(np.isin(g.c_tid, np.unique(g.c_tid[g.g_call[ops]])))
    its = max(len(g.iter_call) - 1, 1)
    bw_ns = float(g.g_dur[ops].sum()) / its
    gain, basis = ctx.price(lambda gr: scale_cpu(scale_ops(gr, ops, 1.0 / (1.0 - share)), calls, 1.0 - share),
                            f"the backward's kernels ({bw_ns / 1e6:.2f} ms per iteration) and its thread's CPU "
                            f"time {1 - share:.0%} as long: the unstepped parameters' share of the parameters "
                            f"with gradients, {unstepped / 1e6:.1f}M of {(unstepped + stepped) / 1e6:.1f}M, gone")
    top = loose[0]
    others = f" and {len(loose) - 1} more module(s)" if len(loose) > 1 else ""
    ev = {"unstepped_elements": int(unstepped), "stepped_elements": int(stepped), "share": round(share, 3),
          "modules": [u.get("module") for u in loose][:3], "backward_kernel_ns_per_iteration": int(bw_ns)}
    return [Finding(RULE.code, RULE.name,
                    f"{unstepped / 1e6:.1f}M parameters of {top.get('module')}{others} get gradients that no "
                    f"optimizer steps ({share:.0%} of the parameters with gradients): their backward runs "
                    "every step for nothing; freeze them (requires_grad_(False)) or run their forward "
                    "under torch.no_grad() (a distillation's teacher)",
                    Rung.LIBRARY, ev, gain, basis, gain)]

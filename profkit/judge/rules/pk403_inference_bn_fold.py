"""PK403 inference-bn-fold: eager BatchNorm and activation passes between convolutions at inference.

What
    An inference run (no backward, no optimizer, no BatchNorm statistics) of a convolutional
    network in eager mode: after every convolution, BatchNorm in inference mode runs as its own
    pass over the activation (``batch_norm_transform_input``, ``bn_fw_inf``), then the ReLU
    (``clamp``/``threshold``), and on residual blocks an ``add`` and another ReLU: three to four
    extra round trips of each activation through HBM per convolution, each a separate launch.
Why
    At inference BatchNorm is an affine map with constants: folded into the convolution's
    weights and bias it costs nothing. What remains after each convolution (bias, ReLU, the
    residual add) is one pointwise pass that reads its inputs once and writes once.
    ``torch.compile`` with Inductor freezing does both: it treats the parameters as constants,
    folds BatchNorm into the convolutions, and fuses the rest into one Triton kernel per
    convolution; its layout optimisation runs the convolutions channels_last where they are
    most of the graph. This is not PK402 (runs of adjacent elementwise kernels): here every
    short chain sits between two convolutions, and much of the saving is the BatchNorm pass
    deleted outright, not fused.
Evidence
    Kernel names of the window: BatchNorm inference kernels (with their per-call ``calc_invstd``
    and the copy launched just before them), activation kernels, residual adds; and none of the
    kernels of training (``backward``, ``wgrad``/``dgrad``, BatchNorm statistics,
    ``multi_tensor_apply``). Kernel order per stream says which ReLU reads an add's output.
Fix
    Config and libraries: ``torch.fx``/``torch.ao.quantization.fuse_modules`` fold conv+bn (the
    BatchNorm pass only). torch.compile (first choice): ``torch._inductor.config.freezing =
    True``, ``model = torch.compile(model.eval())``, run under ``torch.no_grad()``; warm up once.
Expected gain
    Graph edit of what ``torch.compile`` with freezing does to an eval CNN (``frozen_compile``),
    replayed by the step model at the calibrated CPU scale: the BatchNorm kernels go, folded
    into the weights, with their launches; every run of the kernels between two library kernels
    (activations, residual adds, pooling, squeeze-and-excitation's gating, hardswish) becomes one
    kernel at its bytes, as in every compile price (``profkit.run.step.fusion``: its longest
    kernel), the folded BatchNorm no longer breaking a run; and Inductor's layout optimisation
    runs the convolutions channels_last, so cuDNN's layout transposes go and PyTorch's NCHW
    depthwise kernels take an NHWC pass's time (PK305's channels_last edit; where the capture
    timed the program's convolutions on channels_last tensors, ``conv_cl``, their ratio for all
    of it, as PK305 does); each compiled graph's call at its host cost. Convolution kernels
    otherwise keep their time. Never above the op gain (the changed kernels' time before over
    after).

    Until 2026-12-08 the edit held the folding and each add's ReLU alone. On MobileNetV3-Large
    and RegNetY-800MF inference in fp32 at batch 128 (an H100, 2026-12-07, two processes each,
    timed beside their other fixes) ``torch.compile`` with freezing measured 1.88-1.90x and
    2.09x, the best fix of each, where it priced 1.35x and 1.36x at capture (1.29x and 1.18x at
    those runs' baselines): they led to the layout and the fusion of every run (1.56x and 1.65x
    at capture, where the what-if page prices them: a run on another GPU than the capture's is
    not calibrated to, its GPU's speed would read as the host's): no test of it. Still low there:
    what else freezing's compile changes in the convolutions (channels_last alone measured 1.31x
    on RegNetY's grouped convolutions on an H200, where PK305's edit prices 1.16x) is not in it.
Trial
    ``profkit capture --try compile_frozen`` measures the finding's price: the outermost module
    compiled with Inductor's freezing, its calls alternating with eager ones in one run. Freezing
    changes only graphs run without autograd: a program that runs its model with gradients on
    gets the trial recorded as not applied (``torch.no_grad()`` first is the fix's other half).
References
    PyTorch ``torch._inductor.config.freezing``; ``torch.fx`` conv-bn fusion tutorial
    ("(beta) Building a Convolution/Batch Norm fuser in FX").
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np
import pandas as pd

from profkit.model import Rung
from profkit.judge.rules.base import (Finding, Param, RuleContext, RuleMeta, Scope, Table, TrialOf, matches,
                                removed_launch_cost)
from profkit.judge.rules.pk305_fp32_conv import (TRAINING_RE, TRANSPOSE_RE, layout_family, nhwc_passes,
                                                 timed_conv_ratio, timed_layout, without_transposes)
from profkit.judge.rules.pk401_eager_norm_fusion import ADD_RE, COPY_RE  # copy_kernel also finds direct_copy_kernel
from profkit.run.step.fusion import compile_host, fusible_runs
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import ops_named, replace_ops, scale_ops

RULE = RuleMeta(
    code="PK403", name="inference-bn-fold",
    summary="eager BatchNorm/ReLU/add passes between convolutions at inference: fold and fuse "
            "with torch.compile + freezing",
    tables=(Table.KERNEL, Table.RUNTIME), example="traces/real/cnn_infer.sqlite.xz",
    quiet_on="traces/real/loader_cnn.sqlite.xz", trials=(TrialOf("compile_frozen"),),
    params=(Param("min_gpu_share", 0.05, "BatchNorm inference kernels' share of the window's GPU time"),
            Param("dispatch_gap_us", 50.0, "host gaps before a removed launch shorter than this "
                                           "go with it")))

BN_INF_RE = re.compile(r"batch_norm_transform_input|batch_norm_elementwise|batch_norm_calc_invstd"
                       r"|bn_fw_inf|BatchNormInference", re.I)
ACT_RE = re.compile(r"launch_clamp_scalar|clamp_min|threshold_kernel|relu|silu|hardswish|"
                    r"hardsigmoid|GeluCUDAKernel|gelu_kernel", re.I)


def detect(ctx: RuleContext) -> list[Finding]:
    a = ctx.kernels_in_stream_order
    if len(a) < 3:
        return []
    names = a["name"]
    if matches(names, TRAINING_RE).any():
        return []
    bn = matches(names, BN_INF_RE)
    dur = a["dur"].to_numpy(np.float64)
    total_gpu = float(dur.sum())
    if not bn.any() or float(dur[bn].sum()) < RULE.param("min_gpu_share") * total_gpu:
        return []
    stream = a["streamId"].to_numpy()
    same = np.zeros(len(a), dtype=bool)
    same[1:] = stream[1:] == stream[:-1]
    act, add = matches(names, ACT_RE) & ~bn, matches(names, ADD_RE) & ~bn
    # The copy BatchNorm launches just before its own kernels (the per-call statistics).
    nxt_bn = np.zeros(len(a), dtype=bool)
    nxt_bn[:-1] = bn[1:] & same[1:]
    bn_own = bn | (matches(names, COPY_RE) & nxt_bn)
    # An activation that reads a residual add's output fuses into it.
    prev_add = np.zeros(len(a), dtype=bool)
    prev_add[1:] = add[:-1] & same[1:]
    act_fused = act & prev_add
    removed = bn_own | act_fused
    epilogue = bn_own | act | add
    t_epi = float(dur[epilogue].sum())
    saved = float(dur[removed].sum())
    if saved <= 0 or t_epi <= saved:
        return []
    crit = a["critical"].to_numpy(np.float64)
    share = float((dur * crit)[removed].sum() / saved)
    # The CPU's side: each removed kernel's launch call and the short gap before it.
    cpu_removed = removed_launch_cost(a, removed, RULE.param("dispatch_gap_us") * 1e3)
    ev = {"bn_kernel_ns": int(dur[bn_own].sum()), "fused_relu_ns": int(dur[act_fused].sum()),
          "epilogue_kernel_ns": int(t_epi), "removed_launches": int(removed.sum()),
          "cpu_removed_ns": int(cpu_removed), "critical_share": round(share, 3)}
    g, basis, op_gain = 1.0, "no step model for this window: not priced", t_epi / (t_epi - saved)
    if ctx.model is not None:
        edit, before, after, what = frozen_compile(ctx, a[bn_own], sorted({str(n) for n in names.unique()}))
        op_gain = before / max(after, 1.0)
        g, basis = ctx.price(edit, what, cap=op_gain)
        ev.update(frozen_kernel_ns=int(before), frozen_kernel_after_ns=int(after))
    bound = g
    n_bn = int(matches(names, re.compile(r"batch_norm_transform_input|batch_norm_elementwise|bn_fw_inf"
                                          r"|BatchNormInference", re.I)).sum())
    per = max(ctx.iterations, 1)
    members = {str(n) for n in names[removed | act | add].unique()}
    return [Finding(RULE.code, RULE.name,
                    f"fold BatchNorm into the convolutions and fuse the activations and the residual adds: "
                    f"torch._inductor.config.freezing = True; model = torch.compile(model) on the "
                    f"eval model under torch.no_grad() ({n_bn / per:.0f} BatchNorm passes and "
                    f"{int(act_fused.sum()) / per:.0f} add->activation pairs per iteration)",
                    Rung.TORCH_COMPILE, ev, g, basis, bound, op_gain, Scope.OPS, frozenset(members),
                    switch="compile_frozen")]


def frozen_compile(ctx: RuleContext, bn_rows: pd.DataFrame,
                   names: list[str]) -> tuple[Callable[[StepGraph], StepGraph], float, float, str]:
    """The graph edit of ``torch.compile`` with freezing on an eval CNN, (edit, the changed
    kernels' time before, after, what the edit does): BatchNorm (``bn_rows``) folded into the
    convolutions (its kernels and launches gone); every run of the kernels between two library
    kernels (activations, adds, pooling, squeeze-and-excitation's gating) one kernel at its
    bytes, as every compile price fuses (profkit.run.step.fusion), the folded BatchNorm no
    longer breaking a run; and Inductor's layout optimisation, which runs the convolutions
    channels_last: cuDNN's transposes gone and PyTorch's NCHW depthwise kernels at an NHWC
    pass's pace (PK305's channels_last edit); each compiled graph's call at its host cost."""
    g: StepGraph = ctx.model.graph
    bn_ops = ctx.graph_ops(bn_rows)
    folded = np.zeros(g.n_ops, dtype=bool)
    folded[bn_ops] = True
    groups = [r[~folded[r]] for r in fusible_runs(g, also=folded)]
    groups = [r for r in groups if len(r) >= 2]
    new = np.array([float(g.g_dur[r].max()) for r in groups])
    tr_ops = ops_named(g, [n for n in names if TRANSPOSE_RE.search(n)])
    dw_ops, dw_new = nhwc_passes(g)   # at inference, PyTorch's NCHW depthwise kernels alone
    calls = np.unique(g.g_call[(g.g_kind == 0) & (g.g_call >= 0)])
    its = max(len(g.iter_call) - 1, 1)
    # the convolutions timed at capture on channels_last tensors in their own precision (conv_cl):
    # their ratio for every kernel the layout sets, in place of the estimate
    family = layout_family(g, names)
    timed_cl, _ = timed_conv_ratio(ctx, float(g.g_dur[family].sum()) / its, "conv_cl")

    def edit(gr: StepGraph) -> StepGraph:
        out = scale_ops(gr, bn_ops, np.inf, drop_launches=True)
        out = replace_ops(out, groups, new) if groups else out
        if timed_cl is not None:
            out = timed_layout(out, family, tr_ops, timed_cl)
        else:
            out = without_transposes(out, tr_ops)
            out = replace_ops(out, [np.array([o]) for o in dw_ops], dw_new) if len(dw_ops) else out
        return compile_host(out, calls, False, 0.0, ctx.host, ctx.replacements.module_calls())

    layout_ops = family if timed_cl is not None else np.union1d(tr_ops, dw_ops)
    touched = np.unique(np.concatenate([bn_ops, layout_ops] + groups).astype(np.int64))
    before = float(g.g_dur[touched].sum())
    after = float(new.sum() + (g.g_dur[family].sum() / timed_cl if timed_cl is not None else dw_new.sum()))
    if timed_cl is not None:
        layout = [f"the convolutions' kernels / {timed_cl:.2f}, timed at capture"]
    else:
        layout = [f"{len(tr_ops) / its:.0f} transposes gone"] if len(tr_ops) else []
        layout += [f"{len(dw_ops) / its:.0f} depthwise kernels at an NHWC pass's pace"] if len(dw_ops) else []
    what = (f"BatchNorm's {len(bn_ops) / its:.0f} kernels an iteration folded, the {len(groups) / its:.0f} runs of "
            "kernels between library calls fused into one each at its bytes"
            + (f", the convolutions channels_last ({', '.join(layout)})" if layout else "")
            + f": {before / its / 1e6:.2f} -> {after / its / 1e6:.2f} ms per iteration; each compiled "
            "graph's call at its host cost")
    return edit, before, after, what

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
    convolution. This is not PK402 (runs of adjacent elementwise kernels): here every short
    chain sits between two convolutions, and most of the saving is the BatchNorm pass deleted
    outright, not fused.
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
    Graph edit (``scale_ops`` with the launches dropped), a bytes model on measured kernel time:
    the BatchNorm kernels go (folded into the weights); an add followed by its ReLU becomes one
    kernel that moves what the add moved (read two, write one), so the ReLU's time goes; every
    other ReLU stays as it is (bias + ReLU, read one, write one); convolution time unchanged;
    Triton's kernels assumed no faster than eager's. The removed kernels' launch calls go with
    their short dispatch. The step model replays the edited graph at the calibrated CPU scale;
    never above the op gain (epilogue kernel time before / after).

    Noticed, not mended: the fix does more than this price holds. On MobileNetV3-Large and
    RegNetY-800MF inference in fp32 at batch 128 (an H100, 2026-12-07, two processes each, timed
    beside their other fixes), ``torch.compile`` with freezing measured 1.88-1.90x and 2.09x,
    the best fix of each, where this rule priced 1.29x and 1.18x at those runs' baselines. Inductor
    also lays the convolutions out channels_last where they dominate (its layout optimisation:
    the transposes cuDNN runs around every NCHW convolution go; channels_last alone measured
    1.28x and 1.31x on the same programs, PK305's channels_last edit), and it fuses what is not a
    BatchNorm, an activation or an add (squeeze-and-excitation's pooling, gating and scaling,
    hardswish); the price keeps both.
References
    PyTorch ``torch._inductor.config.freezing``; ``torch.fx`` conv-bn fusion tutorial
    ("(beta) Building a Convolution/Batch Norm fuser in FX").
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import (Finding, Param, RuleContext, RuleMeta, Scope, Table, matches,
                                removed_launch_cost)
from profkit.judge.rules.pk401_eager_norm_fusion import ADD_RE, COPY_RE  # copy_kernel also finds direct_copy_kernel

RULE = RuleMeta(
    code="PK403", name="inference-bn-fold",
    summary="eager BatchNorm/ReLU/add passes between convolutions at inference: fold and fuse "
            "with torch.compile + freezing",
    tables=(Table.KERNEL, Table.RUNTIME), example="traces/real/cnn_infer.sqlite.xz",
    quiet_on="traces/real/loader_cnn.sqlite.xz",
    params=(Param("min_gpu_share", 0.05, "BatchNorm inference kernels' share of the window's GPU time"),
            Param("dispatch_gap_us", 50.0, "host gaps before a removed launch shorter than this "
                                           "go with it")))

BN_INF_RE = re.compile(r"batch_norm_transform_input|batch_norm_elementwise|batch_norm_calc_invstd"
                       r"|bn_fw_inf|BatchNormInference", re.I)
# Kernels only a training step runs: any of them and the run is not inference.
TRAINING_RE = re.compile(r"backward|wgrad|dgrad|batch_norm_collect_statistics|batch_norm_reduce"
                         r"|batch_norm_backward|bn_fw_tr|bn_bw|welford|multi_tensor_apply", re.I)
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
    op_gain = t_epi / (t_epi - saved)
    g, basis = ctx.price_ops(a[removed], float("inf"),
                             f"BatchNorm/activation/add kernels {ctx.per_iteration(t_epi)} -> "
                             f"{ctx.per_iteration(t_epi - saved)} and their launches removed", True, cap=op_gain)
    # The most the change allows: every BatchNorm, activation and add pass gone.
    bound = max(ctx.price_ops(a[epilogue], float("inf"), "every epilogue kernel removed", True)[0], g)
    n_bn = int(matches(names, re.compile(r"batch_norm_transform_input|batch_norm_elementwise|bn_fw_inf"
                                          r"|BatchNormInference", re.I)).sum())
    per = max(ctx.iterations, 1)
    members = {str(n) for n in names[removed | act | add].unique()}
    return [Finding(RULE.code, RULE.name,
                    f"fold BatchNorm into the convolutions and fuse the activations and the residual adds: "
                    f"torch._inductor.config.freezing = True; model = torch.compile(model) on the "
                    f"eval model under torch.no_grad() ({n_bn / per:.0f} BatchNorm passes and "
                    f"{int(act_fused.sum()) / per:.0f} add->activation pairs per iteration)",
                    Rung.TORCH_COMPILE,
                    {"bn_kernel_ns": int(dur[bn_own].sum()), "fused_relu_ns": int(dur[act_fused].sum()),
                     "epilogue_kernel_ns": int(t_epi), "removed_launches": int(removed.sum()),
                     "cpu_removed_ns": int(cpu_removed), "critical_share": round(share, 3)}, g,
                    f"BatchNorm folded, add+activation one pass, other activations and convolutions unchanged, "
                    f"{int(removed.sum()) / per:.0f} launches per iteration removed; {basis}", bound,
                    op_gain, Scope.OPS, frozenset(members))]

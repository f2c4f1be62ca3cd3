"""PK305 fp32-conv: convolutions in fp32 (TF32) on NCHW tensors, with cuDNN's layout transposes.

What
    Convolution kernels (cuDNN / CUTLASS ``fprop``, ``dgrad``, ``wgrad``, implicit GEMMs) that
    read and write 32-bit floats, usually next to cuDNN's own ``nchwToNhwc`` / ``nhwcToNchw``
    kernels: an fp32 CNN in PyTorch's default NCHW layout.
Why
    cuDNN runs fp32 convolutions as TF32 on the tensor cores by default
    (``torch.backends.cudnn.allow_tf32``), so unlike fp32 GEMMs (PK302) they are not on the CUDA
    cores; but their tensor-core kernels want channels-last (NHWC) data, and on NCHW tensors
    cuDNN transposes activations (and gradients) in and out around them, extra passes through
    HBM. In bf16 the convolutions' tensor-core peak doubles and every activation pass between
    them (BatchNorm, ReLU, the residual add, pooling) moves half the bytes.
Evidence
    The 32-bit convolution kernels' time and the layout transposes' time in the window.
Fix
    ``model = model.to(memory_format=torch.channels_last)`` and ``x = x.to(memory_format=
    torch.channels_last)`` (the transposes go), then bf16: ``torch.autocast("cuda",
    dtype=torch.bfloat16)`` for training, or a bf16 model for inference.
Expected gain
    Graph edits, replayed by the step model. channels_last: the layout transpose kernels and
    their launches go, and cuDNN's NCHW BatchNorm kernels of training (per-channel reductions
    over strided data) take what their bytes take at the pace of the elementwise pass on the same
    tensor beside them (forward 12 bytes an element against the ReLU's 8 or an add's 12;
    backward 20 against the ReLU backward's 12); inference's BatchNorm, an affine map, stays (in
    the evidence as ``channels_last_speedup`` and ``nchw_batchnorm_saved_ns``). bf16 and channels_last
    (the finding's gain): the transposes go, the convolutions reach the same share of the bf16
    roof as of the TF32 one (their time / (bf16 peak / TF32 peak)), the other kernels that are
    not library calls (BatchNorm, activations, adds, pooling: memory-bound passes on the
    convolutions' outputs) take half their time, and in training autocast's cast of each
    convolution's weights costs the CPU ``cast_cpu_us`` a convolution kernel (PK302's figure,
    measured on GEMMs; an inference model is converted to bf16 once). The input's conversion
    pass is left out. A step that another limit sets (pageable
    copies, the CPU) gains nothing from it until that limit goes: priced together with PK104's
    pinned copies, both edits replay at once. Measured without a profiler on the H200:
    ResNet-50 fp32 inference channels_last 1.15x priced / 1.23x measured, with bf16 1.90x /
    2.02x; ResNet-18 fp32 training with bf16 1.84x / 2.03x, channels_last alone 1.69x / 1.66x
    (1.22x before the BatchNorm estimate, which this measurement led to: it is no test of it);
    ResNet-50 fp32 training, timed after: channels_last 1.40x / 1.42x, with bf16 1.56x / 2.04x
    (the model's bf16 step host-bound at the estimated CPU speed of a GPU-bound capture).
    Pooling's NCHW kernels (``max_pool_*_nchw``) are not priced.
References
    PyTorch "(beta) Channels Last Memory Format" tutorial; PyTorch docs "TensorFloat-32 (TF32)
    on Ampere (and later) devices" (``torch.backends.cudnn.allow_tf32`` defaults to True);
    NVIDIA "Deep Learning Performance: Convolutional Layers User's Guide" (tensor layouts).
"""
from __future__ import annotations

import re

import numpy as np

from profkit.judge.dtypes import kernel_dtype
from profkit.judge.rules import pk302_fp32_gemm
from profkit.judge.rules.pk403_inference_bn_fold import TRAINING_RE
from profkit.judge.patterns import FLASH_RE
from profkit.judge.rules.base import GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Table
from profkit.model import Rung
from profkit.run.summary import NCCL_RE
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import add_cpu, ops_named, replace_ops, scale_ops

CONV_RE = re.compile(r"fprop|dgrad|wgrad|implicit_gemm|convolve|conv2d", re.I)
TRANSPOSE_RE = re.compile(r"nchwToNhwc|nhwcToNchw", re.I)
HALF_RE = re.compile(r"bf16|f16|fp16|half|bfloat16|__nv_bfloat16", re.I)
# cuDNN's per-channel BatchNorm of training on NCHW tensors: statistics reduced over N x H x W of
# each channel, strided in NCHW; channels_last runs kernels that read each tensor at the pace of
# an elementwise pass. Bytes per element each moves: the forward reads x twice (statistics, then
# normalise) and writes y; the backward reads x and dy twice and writes dx. Inference's BatchNorm
# is an affine map with no reduction, about as fast in either layout (ResNet-50 inference:
# channels_last saved 1.1 ms of its 5.6 ms beyond the transposes), and is left as it is.
BN_TRAIN_NCHW = ((re.compile(r"bn_fw_tr_1C11_kernel_NCHW"), 12.0, +1),   # (kernel, bytes/element, neighbour)
                 (re.compile(r"bn_bw_1C11_kernel_new"), 20.0, -1))
# The elementwise pass on the same tensor next to it (the ReLU after the forward, the ReLU's
# backward or the residual add before the backward) and the bytes per element it moves.
ELEMENTWISE = ((re.compile(r"BinaryFunctor|CUDAFunctor_add<float>|threshold"), 12.0),
               (re.compile(r"clamp_scalar|clamp_min|relu", re.I), 8.0))

RULE = RuleMeta(
    code="PK305", name="fp32-conv",
    summary="fp32 (TF32) convolutions on NCHW tensors: channels_last and bf16",
    tables=(Table.KERNEL,), example="traces/corpus/resnet18_pageable.sqlite.xz",
    quiet_on="traces/corpus/resnet50_train.sqlite.xz",
    params=(Param("min_gpu_share", 0.05, "32-bit convolutions' share of the window's GPU time"),))


def conv32(name: str) -> bool:
    """Whether a kernel name is a convolution on 32-bit floats (fp32 data, fp32 or TF32 math)."""
    if not CONV_RE.search(name) or HALF_RE.search(name):
        return False
    p = kernel_dtype(name).precision
    return p in ("fp32", "tf32") or bool(re.search(r"tf32|f32", name))


def nhwc_batchnorm(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """cuDNN's NCHW BatchNorm kernels of training, and what each would take on channels_last
    tensors: its bytes at the pace of the elementwise pass on the same tensor next to it on the
    stream (the bandwidth cancels), never more than it took. Kernels with no such neighbour keep
    their time."""
    names = [str(n) for n in g.op_names]
    kind = np.zeros(len(names), dtype=np.int64)  # 1 + index into BN_TRAIN_NCHW, 0: not one
    ew = np.zeros(len(names))                    # bytes per element of an elementwise pass, 0: not one
    for i, n in enumerate(names):
        kind[i] = next((k + 1 for k, (rx, _, _) in enumerate(BN_TRAIN_NCHW) if rx.search(n)), 0)
        if "elementwise_kernel" in n:
            ew[i] = next((b for rx, b in ELEMENTWISE if rx.search(n)), 0.0)
    ops = np.flatnonzero(kind[g.g_name] > 0)
    new = g.g_dur[ops].copy()
    for j, op in enumerate(ops):
        _, nbytes, side = BN_TRAIN_NCHW[kind[g.g_name[op]] - 1]
        nb = op + side
        if 0 <= nb < g.n_ops and g.g_stream[nb] == g.g_stream[op] and ew[g.g_name[nb]] > 0:
            new[j] = min(new[j], g.g_dur[nb] * nbytes / ew[g.g_name[nb]])
    return ops, new


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    peaks = ctx.prof.peaks.flops
    if m is None or "bf16" not in peaks or "tf32" not in peaks:
        return []
    k = ctx.kernels
    names = [str(n) for n in k.index]
    convs = [n for n in names if conv32(n)]
    if not convs:
        return []
    total = float(k["total_ns"].sum())
    conv_ns = float(k.loc[convs, "total_ns"].sum())
    if conv_ns < RULE.param("min_gpu_share") * total:
        return []
    transposes = [n for n in names if TRANSPOSE_RE.search(n)]
    g = m.graph
    conv_ops = ops_named(g, convs)
    tr_ops = ops_named(g, transposes)
    # Library kernels keep their time; the passes between them (cuDNN's BatchNorm included) are
    # memory-bound and move half the bytes in bf16.
    lib = np.array([bool(GEMM_KERNEL_RE.search(str(n)) or NCCL_RE.match(str(n)) or CONV_RE.search(str(n))
                         or FLASH_RE.search(str(n)) or TRANSPOSE_RE.search(str(n)))
                    for n in g.op_names], dtype=bool)
    rest = np.flatnonzero(~lib[g.g_name] & (g.g_kind == 0) & (g.g_call >= 0))
    ratio = peaks["bf16"] / peaks["tf32"]
    # Training runs autocast, which casts each convolution's weights every step; inference runs
    # a bf16 model, cast once.
    training = any(TRAINING_RE.search(n) for n in names)
    cast_ns = pk302_fp32_gemm.cast_cpu_ns(ctx) if training else 0.0

    bn_ops, bn_new = nhwc_batchnorm(g)

    def channels_last(gr):
        out = scale_ops(gr, tr_ops, np.inf, drop_launches=True) if len(tr_ops) else gr
        return replace_ops(out, [np.array([o]) for o in bn_ops], bn_new) if len(bn_ops) else out

    def bf16(gr):
        return add_cpu(scale_ops(scale_ops(channels_last(gr), conv_ops, ratio), rest, 2.0), conv_ops, cast_ns)

    transpose_ns = float(k.loc[transposes, "total_ns"].sum()) if transposes else 0.0
    cl_gain, _ = ctx.price(channels_last, "the layout transposes gone")
    bn_saved = float((g.g_dur[bn_ops] - bn_new).sum())
    gain, basis = ctx.price(bf16, f"channels_last (the transposes, {ctx.per_iteration(transpose_ns)}, gone"
                                  + (f"; BatchNorm's NCHW kernels {ctx.per_iteration(bn_saved)} faster" if bn_saved > 0 else "")
                                  + ") "
                                  f"and bf16: convolutions {ctx.per_iteration(conv_ns)} / {ratio:.1f}, the "
                                  "passes between them at half their bytes"
                                  + (", autocast's weight casts on the CPU" if training else ""))
    ev = {"conv_ns": int(conv_ns), "transpose_ns": int(transpose_ns), "nchw_batchnorm_saved_ns": int(bn_saved),
          "channels_last_speedup": round(cl_gain, 3)}
    if gain < 1.02:
        # Another limit sets the step's pace (pageable copies, the CPU): the convolutions' time is
        # hidden behind it. Said, at no gain, so that it is priced with the fix of that limit.
        return [Finding(RULE.code, RULE.name,
                        "leave the fp32 (TF32) convolutions for now: channels_last and bf16 would "
                        "not shorten this step while another limit sets its pace; fix that first",
                        Rung.NONE, ev, 1.0, f"not the pace: {basis}", max(gain, 1.0))]
    return [Finding(RULE.code, RULE.name,
                    "convolutions in fp32 (TF32) on NCHW tensors: model and input to "
                    "memory_format=torch.channels_last, then bf16 (torch.autocast(\"cuda\", "
                    "dtype=torch.bfloat16), or a bf16 model for inference)", Rung.LIBRARY, ev, gain,
                    basis, gain)]

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
    their launches go (in the evidence as ``channels_last_speedup``). bf16 and channels_last
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
    2.02x; ResNet-18 fp32 training with bf16 1.86x / 2.03x, but channels_last alone 1.22x /
    1.66x: in NCHW, cuDNN's BatchNorm (``bn_bw_1C11``, ``bn_fw_tr_1C11_kernel_NCHW``) and
    pooling (``*_nchw``) run slower versions of their own, which channels_last replaces too;
    their bytes, which would price that, are not in the trace.
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
from profkit.run.step.transform import ops_named, scale_ops

CONV_RE = re.compile(r"fprop|dgrad|wgrad|implicit_gemm|convolve|conv2d", re.I)
TRANSPOSE_RE = re.compile(r"nchwToNhwc|nhwcToNchw", re.I)
HALF_RE = re.compile(r"bf16|f16|fp16|half|bfloat16|__nv_bfloat16", re.I)

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
    cast_ns = pk302_fp32_gemm.RULE.param("cast_cpu_us") * 1e3 / max(ctx.host, 1e-9) if training else 0.0

    def channels_last(gr):
        return scale_ops(gr, tr_ops, np.inf, drop_launches=True) if len(tr_ops) else gr

    def bf16(gr):
        out = scale_ops(scale_ops(channels_last(gr), conv_ops, ratio), rest, 2.0)
        calls = gr.g_call[conv_ops]
        np.add.at(out.c_own, calls[calls >= 0], cast_ns)
        return out

    transpose_ns = float(k.loc[transposes, "total_ns"].sum()) if transposes else 0.0
    cl_gain, _ = ctx.price(channels_last, "the layout transposes gone")
    gain, basis = ctx.price(bf16, f"channels_last (the transposes, {ctx.per_iteration(transpose_ns)}, gone) "
                                  f"and bf16: convolutions {ctx.per_iteration(conv_ns)} / {ratio:.1f}, the "
                                  "passes between them at half their bytes"
                                  + (", autocast's weight casts on the CPU" if training else ""))
    ev = {"conv_ns": int(conv_ns), "transpose_ns": int(transpose_ns), "channels_last_speedup": round(cl_gain, 3)}
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

"""PK305 fp32-conv: convolutions in fp32 (TF32) on NCHW tensors, with cuDNN's layout transposes.

What
    Convolution kernels (cuDNN / CUTLASS ``fprop``, ``dgrad``, ``wgrad``, implicit GEMMs) that
    read and write 32-bit floats, usually next to cuDNN's own ``nchwToNhwc`` / ``nhwcToNchw``
    kernels, or PyTorch's own NCHW depthwise kernels (``conv_depthwise2d_*``): an fp32 CNN in
    PyTorch's default NCHW layout. A 16-bit CNN left in NCHW (bf16 autocast, an fp16 model) gets
    cuDNN's transposes too: channels_last alone is offered for it (``half_nchw``), unless the
    network also runs attention.
Why
    cuDNN runs fp32 convolutions as TF32 on the tensor cores by default
    (``torch.backends.cudnn.allow_tf32``), so unlike fp32 GEMMs (PK302) they are not on the CUDA
    cores; but their tensor-core kernels want channels-last (NHWC) data, and on NCHW tensors
    cuDNN transposes activations (and gradients) in and out around them, extra passes through
    HBM. In bf16 the convolutions' tensor-core peak doubles and every activation pass between
    them (BatchNorm, ReLU, the residual add, pooling) moves half the bytes.
Evidence
    The 32-bit convolution kernels' time, PyTorch's NCHW depthwise kernels' time, cuDNN's
    depthwise kernels' (``c1_k1``, which name no element type: counted where the program's other
    convolutions are 32-bit) and the layout transposes' time in the window.
Fix
    ``model = model.to(memory_format=torch.channels_last)`` and ``x = x.to(memory_format=
    torch.channels_last)`` (the transposes go), then bf16: ``torch.autocast("cuda",
    dtype=torch.bfloat16)`` for training, or a bf16 model for inference.
Expected gain
    Graph edits, replayed by the step model. channels_last: the layout transpose kernels and
    their launches go, and cuDNN's NCHW BatchNorm kernels of training (per-channel reductions
    over strided data) and PyTorch's NCHW depthwise convolutions (memory-bound; cuDNN's NHWC
    kernels replace them) take what their bytes take at the pace of the nearest elementwise pass
    or device-to-device copy on their stream (BatchNorm forward 12 bytes an element against the
    ReLU's or SiLU's 8 or an add's 12; backward 20 against their backward's 12; a depthwise
    kernel 8); inference's BatchNorm, an affine map, stays (in the evidence as
    ``channels_last_speedup`` and ``nchw_batchnorm_saved_ns``). bf16 and channels_last
    (``bf16_channels_last_speedup``; the finding's gain, unless channels_last alone prices
    higher: then that is the action): the transposes go, the convolutions and the TF32 GEMMs
    beside them (cuDNN's 1x1 convolutions, the classifier) reach the same share of the bf16
    roof as of the TF32 one (their time / (bf16 peak / TF32 peak)), fp32 GEMMs on the CUDA cores
    (ConvNeXt's MLPs) gain what PK302 prices for their bf16, the other kernels that are
    not library calls (BatchNorm, activations, adds, pooling: memory-bound passes on the
    convolutions' outputs) take half their time, except PyTorch's generic elementwise kernel
    (broadcasts such as squeeze-and-excitation's channel scale: its offset arithmetic, not its
    bytes, sets its time: 56 us in fp32 and 51 in bf16 in EfficientNet-B0 inference, 44 and 44 in
    ConvNeXt-Tiny training) and the NHWC depthwise kernels that replace PyTorch's NCHW ones (k x k
    multiply-adds an element: EfficientNet-B0 inference's took 0.99 ms a step in bf16, the 0.96
    priced for them in fp32 channels_last; MobileNetV3's 4.05 ms in fp32 channels_last against
    3.35 priced), and in training autocast's cast of each
    convolution's weights costs the CPU ``cast_cpu_us`` a convolution kernel (PK302's figure,
    measured on GEMMs; an inference model is converted to bf16 once), while in inference a bf16
    model's BatchNorm runs PyTorch's kernels, three where cuDNN's 32-bit one ran one: two more
    launches a BatchNorm, each at the CPU cost of a launch of the trace's elementwise kernels
    (ResNet-50 at batch 4: 231 -> 289 launches an iteration, 3.66 -> 4.50 ms host-bound, 0.81x;
    priced 0.95x from its fp32 capture, 1.00x before: the batch-4 classifiers' bf16, measured
    0.86-0.94x, led to it, no test of it). cuDNN's weight gradients
    of depthwise convolutions, which it computes on 32-bit data with slow grouped kernels, take
    together what the depthwise forwards take in bf16 (``DEPTHWISE_CUDNN_FWD``; evidence
    ``depthwise_wgrad_ns``), when there is one for each depthwise forward; its depthwise forwards
    take half their time, as the convolutions do (ConvNeXt-Tiny training: 0.30 ms in fp32, 0.13
    in bf16), and their input gradients keep theirs (0.31 and 0.27). The input's conversion
    pass is left out. A step that another limit sets (pageable
    copies, the CPU) gains nothing from it until that limit goes: priced together with PK104's
    pinned copies, both edits replay at once. Measured without a profiler on the H200:
    ResNet-50 fp32 inference channels_last 1.15x priced / 1.23x measured, with bf16 2.25x /
    2.02x (1.90x before the GEMMs beside the convolutions were priced in bf16); ResNet-18 fp32
    training with bf16 1.81x / 2.03x, channels_last alone 1.69x / 1.66x (1.22x before the
    BatchNorm estimate, which this measurement led to: it is no test of it); ResNet-50 fp32
    training, timed after: channels_last 1.41x / 1.42x, with bf16 1.93x / 2.04x (1.56x until
    the step model read the launch queue's depth right: this miss led to it). Five more CNNs
    (fp32 training): DenseNet-121 channels_last 1.30x / 1.32x, with bf16 1.45x / 1.30x;
    EfficientNet-B0 1.80x / 1.84x and 1.65x / 1.71x (first 1.00x: the NCHW depthwise kernels
    were not priced; this led to it); ResNeXt-50 1.35x / 1.30x and 2.35x / 2.09x (first 1.22x
    and 1.43x: this led to the launch queue and latency beside cuDNN's side streams); then, as
    tests of those: MobileNetV3-Large 2.00x / 1.71x and 1.99x / 1.88x; ConvNeXt-Tiny 1.00x /
    1.00x and 3.68x / 3.93x (first 1.78x, before its fp32 GEMMs were priced as PK302 does; then
    2.37x, before cuDNN's depthwise weight gradients, 66 of its 184 ms, were priced from its
    bf16 capture: this pair led to it and is no test of it); EfficientNet-B0 inference 1.31x /
    1.34x and 2.14x / 1.88x (its bf16 timed at 11.5, 6.7, 6.5 and 6.6 ms in four runs on two
    machines; 2.31x until its bf16 capture led to the two exceptions to halving above: no test
    of them). Then, as tests of those: MobileNetV3-Large inference 1.14x / 1.12x and 1.16x /
    1.03x; ConvNeXt-Tiny inference 1.01x / 1.01x and 3.62x / 3.41x (first 1.00x: its cuDNN
    depthwise kernels did not count as 32-bit convolutions and the rule did not fire; this led to
    counting them: no test); after that, RegNetY-800MF inference (grouped convolutions,
    squeeze-and-excitation) 1.14x / 1.31x and 1.24x / 1.27x. Pooling's NCHW kernels
    (``max_pool_*_nchw``) are not priced.

    **Timed at capture** (``profkit capture`` records the program's fp32 2-D and 3-D convolutions in its
    calibration run and times each of the twelve heaviest shapes as the program ran them against
    bf16 on channels_last (channels_last_3d) tensors, forward and both gradients in training; PROFKIT_META
    ``replacements``, ``conv_bf16``): the timed shapes' ratio together replaces the halving, the
    depthwise rules above and the transposes' removal for every convolution kernel of the trace
    (depthwise and transposes included), where the timed shapes' original time per iteration is
    within 0.5-1.5x of those kernels' (else the timing did not run what the program ran: other
    algorithms, another layout; the estimate stands and says so). The rest (the passes between
    the convolutions at half their bytes, the GEMMs beside them, autocast's casts, BatchNorm)
    is priced as above. Evidence ``priced_from`` (``timed`` or ``estimate``) and
    ``conv_timed_ratio``. Why: a timm ConvNeXt-Atto trained in fp32 at batch 128 was priced 2.91x
    by the estimate (its depthwise weight gradients at their forwards' pace) where its own trial
    of channels_last and bf16 measured 1.92x and bf16 alone, by hand, 1.70x. First run on a GPU
    (an H100, 2026-12-05) for a video R3D-18 in fp32: 11 shapes of 3-D convolutions, 2.25x together
    (its 3-channel stem 0.85x); priced 2.50x from them, its trial 2.02x, by hand 2.01x: the
    timed convolutions leave the rest of the bf16 step too fast in the model (unresolved).
    channels_last alone likewise (``conv_cl``, the same shapes in their own precision on
    channels_last tensors): their ratio sets every kernel the layout sets (``timed_layout``: the
    transposes gone with their launches, the convolutions and depthwise kernels making up the
    timed time), in place of the transposes' removal and the NCHW depthwise estimate, with the
    same coverage check; evidence ``conv_channels_last_timed_ratio``. Why: RegNetY-800MF's
    grouped convolutions, channels_last measured 1.31x on an H200 where the estimate priced 1.14x
    (cuDNN runs other kernels for them on NHWC tensors). Not yet run on a GPU (2026-12-08).
Trial
    ``profkit capture --try channels_last+bf16`` measures the finding's price (both switches in
    one run: the outermost module and its 4-D inputs in channels_last, 5-D ones in channels_last_3d, its calls under bf16
    autocast); ``--try channels_last`` measures ``channels_last_speedup``, the price of the
    finding that says channels_last alone. An inference program that converts its model to bf16
    rather than autocasting it gains more than the autocast trial (no casts on the CPU).
    ``--try auto`` runs both, and ``cudnn_benchmark`` where convolutions take a large share.
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
from profkit.judge.patterns import FLASH_RE
from profkit.judge.rules.base import (ESTIMATED, GEMM_KERNEL_RE, Finding, Param, RuleContext, RuleMeta, Table,
                                      TrialOf, matches, timed_text)
from profkit.model import Rung
from profkit.run.summary import NCCL_RE
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import add_cpu, ops_named, replace_ops, scale_ops

CONV_RE = re.compile(r"fprop|dgrad|wgrad|implicit_gemm|convolve|conv2d", re.I)
# Kernels only a training step runs: any of them and the run is not inference.
TRAINING_RE = re.compile(r"backward|wgrad|dgrad|batch_norm_collect_statistics|batch_norm_reduce"
                         r"|batch_norm_backward|bn_fw_tr|bn_bw|welford|multi_tensor_apply", re.I)
TRANSPOSE_RE = re.compile(r"nchwToNhwc|nhwcToNchw", re.I)
HALF_RE = re.compile(r"bf16|f16|fp16|half|bfloat16|__nv_bfloat16", re.I)
SOFTMAX_RE = re.compile(r"softmax", re.I)
# cuDNN's per-channel BatchNorm of training on NCHW tensors: statistics reduced over N x H x W of
# each channel, strided in NCHW; channels_last runs kernels that read each tensor at the pace of
# an elementwise pass. Bytes per element each moves: the forward reads x twice (statistics, then
# normalise) and writes y; the backward reads x and dy twice and writes dx. Inference's BatchNorm
# is an affine map with no reduction, about as fast in either layout (ResNet-50 inference:
# channels_last saved 1.1 ms of its 5.6 ms beyond the transposes), and is left as it is.
BN_TRAIN_NCHW = ((re.compile(r"bn_fw_tr_1C11_kernel_NCHW"), 12.0, +1),   # (kernel, bytes/element, neighbour)
                 (re.compile(r"bn_bw_1C11_kernel_new"), 20.0, -1))
# PyTorch's own depthwise convolution kernels, which it runs on NCHW tensors (EfficientNet,
# MobileNet); on channels_last tensors it calls cuDNN's NHWC kernels. A depthwise convolution
# does a few multiply-adds per element: memory-bound, so on channels_last it takes what its bytes
# take at the pace of an elementwise pass. Each reads one tensor and writes one (the forward, the
# input gradient) or reads two and writes the small weight gradient: 8 bytes an element of its
# tensor (stride 1; a strided one reads more than it writes, and is priced as if it did not).
DEPTHWISE_NCHW = re.compile(r"conv_depthwise2d_(?:forward|backward|grad_weight)_kernel")
# What channels_last replaces by NHWC kernels that read each tensor at an elementwise pass's pace:
# (kernel, bytes/element, the side its own tensor's pass is on). A depthwise kernel's input is
# the pass before it (the forward) or its gradient's (the backward runs in reverse).
NHWC_REPLACED = BN_TRAIN_NCHW + ((DEPTHWISE_NCHW, 8.0, -1),)
# cuDNN's depthwise convolutions (one channel a group, ``c1_k1``): on 32-bit data it computes
# their weight gradients with its grouped kernels (``wgrad2d_grouped_direct``, implicit GEMMs of
# group tile ``_g16_``), 10-40x its forward's time (ConvNeXt-Tiny fp32 training: 3.7 ms against
# 0.3 ms); in bf16 it runs ``wgrad2d_c1_k1_nhwc``, which reads the same two tensors as the forward
# reads and writes and takes about its time (0.09 ms against the bf16 forward's 0.13 ms, measured
# on the H200). So in bf16 those weight gradients take what the depthwise forwards take in bf16,
# when there is one of them for each depthwise forward (no other grouped convolution shares
# those kernels).
DEPTHWISE_CUDNN_FWD = re.compile(r"^(?!.*(?:dgrad|wgrad)).*conv2d_c1_k1")
CUDNN_DEPTHWISE = re.compile(r"(?:conv|dgrad|wgrad)2d_c1_k1")
GROUPED_WGRAD = re.compile(r"wgrad2d_grouped|wgrad\w*_g(?:[2-9]|\d\d+)_")
# The elementwise pass on the same tensor next to it (the ReLU or SiLU after the forward, their
# backward or the residual add before the backward) and the bytes per element it moves. A
# device-to-device copy of a tensor reads and writes each element.
ELEMENTWISE = ((re.compile(r"BinaryFunctor|CUDAFunctor_add<float>|threshold|silu_backward_kernel"), 12.0),
               (re.compile(r"clamp_scalar|clamp_min|relu|silu_kernel", re.I), 8.0))
COPY = re.compile(r"memcpy Device-to-Device")
GENERIC_ELEMENTWISE = re.compile(r"(?:void )?at::native::elementwise_kernel<")
# cuDNN's BatchNorm of inference, one kernel a BatchNorm on 32-bit data. On a bf16 model PyTorch
# runs its own BatchNorm instead, three kernels (the inverse standard deviation, the scale and
# shift, the transform: measured on ResNet-50 inference at batch 4 on the H200, torch 2.11: 53
# ``bn_fw_inf_1C11_kernel_NCHW`` / ``_NHWC`` an iteration in fp32, in bf16 53
# ``batch_norm_transform_input_channels_last_kernel``, 53 ``unrolled_elementwise_kernel`` and 57
# more elementwise kernels, 231 -> 289 launches; without a profiler 3.66 -> 4.50 ms an
# iteration, host-bound). Each added launch costs the CPU what a launch of the trace's own
# elementwise kernels does.
BN_INFERENCE = re.compile(r"bn_fw_inf_")
BF16_BN_ADDED_LAUNCHES = 2
ELEMENTWISE_LAUNCH = re.compile(r"elementwise_kernel")
COPY_BYTES = 8.0
# Where to look for that pass: the side the kernel's own tensor is on first, then a few places
# either way (a scalar update or a copy of another size can sit in between).
NEAR = 3

RULE = RuleMeta(
    code="PK305", name="fp32-conv",
    summary="fp32 (TF32) convolutions on NCHW tensors: channels_last and bf16 (16-bit ones: "
            "channels_last)",
    tables=(Table.KERNEL,), example="traces/corpus/resnet18_pageable.sqlite.xz",
    quiet_on="traces/corpus/resnet50_train.sqlite.xz",
    trials=(TrialOf("channels_last+bf16", "bf16_channels_last_speedup"),
            TrialOf("channels_last", "channels_last_speedup")),
    params=(Param("min_gpu_share", 0.05, "32-bit convolutions' share of the window's GPU time"),))


def conv32(name: str) -> bool:
    """Whether a kernel name is a convolution on 32-bit floats (fp32 data, fp32 or TF32 math)."""
    if not CONV_RE.search(name) or HALF_RE.search(name):
        return False
    p = kernel_dtype(name).precision
    return p in ("fp32", "tf32") or bool(re.search(r"tf32|f32", name))


def _pass_bytes(g: StepGraph) -> np.ndarray:
    """Per operation name: the bytes per element of the elementwise pass (or device-to-device
    copy) it is, 0 for anything else."""
    out = np.zeros(len(g.op_names))
    for i, n in enumerate(str(x) for x in g.op_names):
        if "elementwise_kernel" in n:
            out[i] = next((b for rx, b in ELEMENTWISE if rx.search(n)), 0.0)
        elif COPY.search(n):
            out[i] = COPY_BYTES
    return out


def at_pass_pace(g: StepGraph, ops: np.ndarray, nbytes: np.ndarray, side: np.ndarray) -> np.ndarray:
    """What each of ``ops`` would take moving ``nbytes`` an element at the pace of the nearest
    elementwise pass (or copy) on its stream (``side`` first, then up to NEAR places either way):
    the bandwidth cancels, no shapes needed. Never more than it took; an operation with no such
    neighbour keeps its time."""
    per = _pass_bytes(g)[g.g_name]
    new = g.g_dur[ops].astype(np.float64).copy()
    for j, op in enumerate(ops):
        s = int(side[j])
        order = [s] + [d * k for k in range(1, NEAR + 1) for d in (s, -s) if d * k != s]
        for d in order:
            nb = op + d
            if 0 <= nb < g.n_ops and g.g_stream[nb] == g.g_stream[op] and per[nb] > 0:
                new[j] = min(new[j], g.g_dur[nb] * nbytes[j] / per[nb])
                break
    return new


def nhwc_passes(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """The kernels channels_last replaces (NHWC_REPLACED: cuDNN's NCHW BatchNorm of training,
    PyTorch's NCHW depthwise convolutions), and what each would take (at_pass_pace)."""
    kind = np.array([next((k for k, (rx, _, _) in enumerate(NHWC_REPLACED) if rx.search(str(n))), -1)
                     for n in g.op_names], dtype=np.int64)
    k_op = kind[g.g_name]
    ops = np.flatnonzero(k_op >= 0)
    nbytes = np.array([NHWC_REPLACED[k][1] for k in k_op[ops]])
    side = np.array([NHWC_REPLACED[k][2] for k in k_op[ops]])
    return ops, at_pass_pace(g, ops, nbytes, side)


def launch_cpu_ns(g: StepGraph) -> float:
    """The CPU time a launch of an elementwise kernel takes in the trace (the call and the
    dispatch before it; median over those calls), 0 when the trace launches none."""
    ops = np.flatnonzero(matches(g.op_names, ELEMENTWISE_LAUNCH)[g.g_name] & (g.g_call >= 0))
    calls = np.unique(g.g_call[ops])
    return float(np.median(g.c_gap[calls] + g.c_own[calls])) if len(calls) else 0.0


# The timed shapes' original time per iteration against the trace's convolution kernels (and
# transposes) per iteration: outside this range, the timing did not run what the program ran
# (other algorithms, another layout), and the estimate stands.
CONV_COVERAGE = (0.5, 1.5)


def timed_conv_ratio(ctx: RuleContext, family_ns_per_iteration: float,
                     kind: str = "conv_bf16") -> tuple[float | None, str]:
    """(the timed convolutions' time as the program ran them over their time in bf16 on
    channels_last tensors (``conv_bf16``), or in their own precision on channels_last tensors
    (``conv_cl``), the words that say so), or (None, why the estimate stands)."""
    timed = ctx.replacements.measured(kind)
    if not timed:
        return None, ESTIMATED
    orig = sum(float(e.original_ns) * e.count for e in timed)
    repl = sum(float(e.replacement_ns) * e.count for e in timed)
    cover = orig / family_ns_per_iteration if family_ns_per_iteration > 0 else 0.0
    said = timed_text(timed, ("bf16 channels_last" if kind == "conv_bf16" else "channels_last")
                      + " vs as the program ran them, ")
    if not CONV_COVERAGE[0] <= cover <= CONV_COVERAGE[1]:
        return None, (f"estimated: the convolutions timed at capture do not account for the trace's "
                      f"({len(timed)} shapes: {orig / 1e6:.2f} ms an iteration as the program ran them, "
                      f"its convolution kernels {family_ns_per_iteration / 1e6:.2f} ms)")
    return orig / repl, f"{said}; {len(timed)} shapes, {orig / repl:.2f}x together"


def layout_family(g: StepGraph, names: list[str]) -> np.ndarray:
    """The operations whose time the layout sets: the 32-bit convolutions, cuDNN's depthwise ones
    beside them, cuDNN's transposes and PyTorch's NCHW depthwise kernels (what ``conv_cl``'s
    timed ratio scales)."""
    convs = [n for n in names if conv32(n)]
    cudnn_dw = [n for n in names if convs and CUDNN_DEPTHWISE.search(n) and not HALF_RE.search(n)
                and not conv32(n)]
    fam = np.union1d(ops_named(g, convs + cudnn_dw), ops_named(g, [n for n in names if TRANSPOSE_RE.search(n)]))
    return np.union1d(fam, np.flatnonzero(matches(g.op_names, DEPTHWISE_NCHW)[g.g_name] & (g.g_kind == 0)))


def timed_layout(gr: StepGraph, family: np.ndarray, tr_ops: np.ndarray, ratio: float) -> StepGraph:
    """``gr`` with the layout's kernels (``family``) taking 1/``ratio`` of their time together,
    the ratio timed at capture on channels_last tensors (``conv_cl``): cuDNN's transposes gone
    with their launches (none runs on channels_last tensors; the timing of the NCHW original ran
    them), the rest scaled to make up the family's timed time."""
    rest = np.setdiff1d(family, tr_ops)
    total, kept = float(gr.g_dur[family].sum()), float(gr.g_dur[rest].sum())
    if kept <= 0:
        return without_transposes(gr, tr_ops)
    return scale_ops(without_transposes(gr, tr_ops), rest, kept / (total / ratio))


def without_transposes(gr: StepGraph, tr_ops: np.ndarray) -> StepGraph:
    """``gr`` without cuDNN's layout transposes ``tr_ops`` and their launches (cuDNN launches them
    inside the convolution's call, which stays with its dispatch)."""
    return scale_ops(gr, tr_ops, np.inf, drop_launches=True, own_dispatch=False) if len(tr_ops) else gr


def half_nchw(ctx: RuleContext, names: list[str]) -> list[Finding]:
    """16-bit convolutions on NCHW tensors (a bf16 or fp16 model, or autocast, in PyTorch's default
    layout): cuDNN transposes around them as it does around 32-bit ones, so channels_last alone
    is the fix, priced by the transposes' edit (their kernels and launches gone). A lower bound:
    the NCHW kernels of PyTorch's own 16-bit BatchNorm and pooling, which channels_last also
    replaces, keep their time (a linear probe's ResNet-18 in bf16 at 128 x 128, batch 256, an
    H100: transposes 2.74 ms of a 16.6 ms step; channels_last measured 1.30x). Not offered where
    the network also runs attention (flash / SDPA kernels, or softmax kernels more than a loss's
    forward and backward an iteration): there channels_last adds a copy at each boundary between
    the convolutions' NHWC maps and the attention's sequences, which the trace cannot count (an
    fp16 diffusion UNet with its attention written out: 0.90x measured)."""
    k = ctx.kernels
    half = [n for n in names if CONV_RE.search(n) and HALF_RE.search(n)]
    transposes = [n for n in names if TRANSPOSE_RE.search(n)]
    if not half or not transposes or any(FLASH_RE.search(n) for n in names):
        return []
    g = ctx.model.graph
    softmax = ops_named(g, [n for n in names if SOFTMAX_RE.search(n)])
    if len(softmax) > 2 * max(len(g.iter_call) - 1, 1):
        return []
    total = float(k["total_ns"].sum())
    conv_ns = float(k.loc[half, "total_ns"].sum())
    transpose_ns = float(k.loc[transposes, "total_ns"].sum())
    if conv_ns + transpose_ns < RULE.param("min_gpu_share") * total:
        return []
    tr_ops = ops_named(g, transposes)

    def channels_last(gr):
        return without_transposes(gr, tr_ops)

    gain, basis = ctx.price(channels_last, f"channels_last: the transposes, {ctx.per_iteration(transpose_ns)}, "
                                           "gone (the NCHW BatchNorm and pooling kernels kept: a lower bound)")
    if gain < 1.02:
        return []
    ev = {"conv_ns": int(conv_ns), "transpose_ns": int(transpose_ns), "precision": "16-bit",
          "channels_last_speedup": round(gain, 3)}
    return [Finding(RULE.code, RULE.name,
                    "convolutions in 16-bit on NCHW tensors: cuDNN transposes the activations in and out "
                    "around them; model and input to memory_format=torch.channels_last", Rung.LIBRARY, ev,
                    gain, basis, gain, kernels=frozenset(transposes),
                    alternatives={"channels_last_speedup": channels_last}, switch="channels_last")]


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    peaks = ctx.prof.peaks.flops
    if m is None or "bf16" not in peaks or "tf32" not in peaks:
        return []
    k = ctx.kernels
    names = [str(n) for n in k.index]
    convs = [n for n in names if conv32(n)]
    depthwise = [n for n in names if DEPTHWISE_NCHW.search(n) and not HALF_RE.search(n)]
    # cuDNN's depthwise kernels name no element type: they run on the program's, 32-bit where
    # its other convolutions are (ConvNeXt's 7x7 depthwise convolutions, most of its convolution
    # time).
    cudnn_dw = [n for n in names if convs and CUDNN_DEPTHWISE.search(n) and not HALF_RE.search(n)
                and not conv32(n)]
    if not convs and not depthwise:
        return half_nchw(ctx, names)
    total = float(k["total_ns"].sum())
    conv_ns = float(k.loc[convs, "total_ns"].sum()) if convs else 0.0
    dw_ns = float(k.loc[depthwise, "total_ns"].sum()) if depthwise else 0.0
    cudnn_dw_ns = float(k.loc[cudnn_dw, "total_ns"].sum()) if cudnn_dw else 0.0
    if conv_ns + dw_ns + cudnn_dw_ns < RULE.param("min_gpu_share") * total:
        return []
    transposes = [n for n in names if TRANSPOSE_RE.search(n)]
    g = m.graph
    conv_ops = ops_named(g, convs)
    tr_ops = ops_named(g, transposes)
    # Autocast runs the 32-bit GEMMs beside the convolutions in bf16 too (cuDNN's 1x1
    # convolutions as GEMMs, the classifier, ConvNeXt's MLPs): a TF32 one at the same bf16 / TF32
    # ratio as the convolutions, an fp32 one (CUDA cores) as PK302 prices its bf16.
    gemms = [n for n in names if GEMM_KERNEL_RE.search(n) and not conv32(n) and not HALF_RE.search(n)
             and kernel_dtype(n).precision in ("fp32", "tf32")]
    fp32_gemms = [n for n in gemms if kernel_dtype(n).precision == "fp32"]
    gemm_ops = ops_named(g, [n for n in gemms if n not in fp32_gemms])
    fp32_ops = ops_named(g, fp32_gemms)
    fp32_gain = pk302_fp32_gemm.bf16_gemm_gain(peaks)
    # Library kernels keep their time; the passes between them (cuDNN's BatchNorm included) are
    # memory-bound and move half the bytes in bf16. PyTorch's generic elementwise kernel (a
    # broadcast, such as squeeze-and-excitation's scale of each channel, or strided operands)
    # computes each element's offsets dimension by dimension: that, not the bytes, sets its
    # time, and it keeps it (EfficientNet-B0 inference's channel scale: 56 us in fp32, 51 in bf16).
    lib = np.array([bool(GEMM_KERNEL_RE.search(str(n)) or NCCL_RE.match(str(n)) or CONV_RE.search(str(n))
                         or FLASH_RE.search(str(n)) or TRANSPOSE_RE.search(str(n))
                         or GENERIC_ELEMENTWISE.match(str(n)))
                    for n in g.op_names], dtype=bool)
    # PyTorch's NCHW depthwise kernels become cuDNN's NHWC ones (priced at a pass's pace by
    # channels_last), which do k x k multiply-adds an element: in bf16 they run no faster.
    dw_nchw = matches(g.op_names, DEPTHWISE_NCHW)
    rest = np.flatnonzero(~lib[g.g_name] & ~dw_nchw[g.g_name] & (g.g_kind == 0) & (g.g_call >= 0))
    ratio = peaks["bf16"] / peaks["tf32"]
    # Training runs autocast, which casts each convolution's weights every step; inference runs
    # a bf16 model, cast once.
    training = any(TRAINING_RE.search(n) for n in names)
    cast_ns = pk302_fp32_gemm.cast_cpu_ns(ctx) if training else 0.0
    # A bf16 model's BatchNorm (inference) launches more kernels than cuDNN's fp32 one did.
    bn_inf = np.empty(0, dtype=np.int64) if training else \
        ops_named(g, [n for n in names if BN_INFERENCE.search(n)])
    bn_cpu_ns = BF16_BN_ADDED_LAUNCHES * launch_cpu_ns(g) if len(bn_inf) else 0.0

    bn_ops, bn_new = nhwc_passes(g)
    mm_ops = np.union1d(conv_ops, gemm_ops)
    dw_fwd = ops_named(g, [n for n in cudnn_dw if DEPTHWISE_CUDNN_FWD.search(n)])
    dw_wgrad = ops_named(g, [n for n in convs if GROUPED_WGRAD.search(n)])
    if len(dw_fwd) != len(dw_wgrad) or not len(dw_fwd):
        dw_wgrad = np.empty(0, dtype=np.int64)
    else:
        # In bf16 the weight gradients take, together, what the depthwise forwards take in bf16,
        # shared in proportion to their fp32 times (a GPU-paced step needs only the total).
        dw_new = g.g_dur[dw_wgrad] * (g.g_dur[dw_fwd].sum() / ratio) / max(g.g_dur[dw_wgrad].sum(), 1.0)
        dw_new = np.minimum(dw_new, g.g_dur[dw_wgrad] / ratio)

    def nhwc_bn(gr, keep=None):
        """BatchNorm's NCHW kernels at their NHWC pace (only those ``keep`` marks)."""
        ops, new = (bn_ops, bn_new) if keep is None else (bn_ops[keep], bn_new[keep])
        return replace_ops(gr, [np.array([o]) for o in ops], new) if len(ops) else gr

    # The program's convolutions timed at capture in bf16 on channels_last tensors against the
    # way it ran them (profkit.capture.replacements, conv_bf16): their ratio replaces the
    # estimate for every convolution kernel, depthwise and transposes included, where the timed
    # shapes account for the trace's convolution time (coverage within CONV_COVERAGE); likewise
    # in their own precision on channels_last tensors (conv_cl) for channels_last alone.
    family = layout_family(g, names)
    family_ns = float(g.g_dur[family].sum()) / max(len(g.iter_call) - 1, 1)   # per iteration
    timed_conv, conv_said = timed_conv_ratio(ctx, family_ns)
    timed_cl, cl_said = timed_conv_ratio(ctx, family_ns, "conv_cl")
    # BatchNorm's kernels among those channels_last replaces (the depthwise ones the timed ratio scales)
    not_dw = ~dw_nchw[g.g_name[bn_ops]]

    def channels_last(gr):
        if timed_cl is not None:
            # the transposes and the depthwise kernels are in the timed family
            return timed_layout(nhwc_bn(gr, not_dw), family, tr_ops, timed_cl)
        return nhwc_bn(without_transposes(gr, tr_ops))

    def bf16(gr):
        if timed_conv is not None:
            # the transposes are in the timed family: only the BatchNorm of channels_last's edit
            out = scale_ops(scale_ops(nhwc_bn(gr, not_dw), family, timed_conv), gemm_ops, ratio)
            out = scale_ops(out, rest, 2.0)
        else:
            out = scale_ops(scale_ops(channels_last(gr), np.union1d(mm_ops, dw_fwd), ratio), rest, 2.0)
        out = scale_ops(out, fp32_ops, fp32_gain) if len(fp32_ops) else out
        if len(dw_wgrad) and timed_conv is None:
            out = replace_ops(out, [np.array([o]) for o in dw_wgrad], dw_new)
        out = add_cpu(out, bn_inf, bn_cpu_ns) if len(bn_inf) else out
        return add_cpu(out, np.union1d(conv_ops, fp32_ops), cast_ns)

    transpose_ns = float(k.loc[transposes, "total_ns"].sum()) if transposes else 0.0
    gemm_ns = float(k.loc[gemms, "total_ns"].sum()) if gemms else 0.0
    fp32_ns = float(k.loc[fp32_gemms, "total_ns"].sum()) if fp32_gemms else 0.0
    bn_saved = float((g.g_dur[bn_ops] - bn_new).sum())
    dw_wgrad_ns = float(g.g_dur[dw_wgrad].sum())
    nhwc = (f"the transposes, {ctx.per_iteration(transpose_ns)}, gone"
            + (f"; BatchNorm's{' and depthwise convolutions' if dw_ns else ''} NCHW kernels "
               f"{ctx.per_iteration(bn_saved)} faster" if bn_saved > 0 else ""))
    cl_what = (f"channels_last: the convolutions and their transposes {family_ns / 1e6:.2f} ms per iteration / "
               f"{timed_cl:.2f} (timed)" if timed_cl is not None else f"channels_last: {nhwc}")
    cl_gain, cl_basis = ctx.price(channels_last, cl_what)
    if timed_cl is not None:
        cl_basis = f"{cl_said}; {cl_basis}"
    convs_said = (f"convolutions{', depthwise' if len(dw_wgrad) or dw_ns or cudnn_dw_ns else ''} and "
                  f"their transposes {family_ns / 1e6:.2f} ms per iteration / {timed_conv:.2f} (timed), "
                  f"TF32 GEMMs / {ratio:.1f}"
                  if timed_conv is not None else
                  f"convolutions{' and TF32 GEMMs' if len(gemm_ops) else ''} "
                  f"{ctx.per_iteration(conv_ns + gemm_ns - fp32_ns)} / {ratio:.1f}")
    gain, basis = ctx.price(bf16, f"channels_last ({nhwc}) and bf16: {convs_said}"
                                  + (f", fp32 GEMMs {ctx.per_iteration(fp32_ns)} / {fp32_gain:.1f}"
                                     if fp32_ns else "")
                                  + (f", cuDNN's depthwise weight gradients {ctx.per_iteration(dw_wgrad_ns)} "
                                     "at their forwards' pace" if len(dw_wgrad) and timed_conv is None else "")
                                  + ", the passes between them at half their bytes"
                                  + (", autocast's weight casts on the CPU" if training else "")
                                  + (f", {BF16_BN_ADDED_LAUNCHES} more launches a BatchNorm "
                                     f"({len(bn_inf) / max(len(g.iter_call) - 1, 1):.0f} an iteration: PyTorch's "
                                     "bf16 BatchNorm, not cuDNN's)" if len(bn_inf) else ""), slower=True)
    basis = f"{conv_said}; {basis}"
    ev = {"conv_ns": int(conv_ns), "depthwise_nchw_ns": int(dw_ns), "depthwise_cudnn_ns": int(cudnn_dw_ns),
          "priced_from": "timed" if timed_conv is not None else "estimate",
          **({"conv_timed_ratio": round(timed_conv, 3)} if timed_conv is not None else {}),
          **({"conv_channels_last_timed_ratio": round(timed_cl, 3)} if timed_cl is not None else {}),
          "transpose_ns": int(transpose_ns),
          "nchw_batchnorm_saved_ns": int(bn_saved), "depthwise_wgrad_ns": int(dw_wgrad_ns),
          "channels_last_speedup": round(cl_gain, 3), "bf16_channels_last_speedup": round(gain, 3)}
    alternatives = {"channels_last_speedup": channels_last, "bf16_channels_last_speedup": bf16}
    if cl_gain >= 1.02 and cl_gain > gain:
        # bf16 on top costs more than it saves here (autocast's casts: the CPU or the passes
        # around many small convolutions): channels_last alone is the action.
        return [Finding(RULE.code, RULE.name,
                        "convolutions in fp32 (TF32) on NCHW tensors: model and input to "
                        "memory_format=torch.channels_last; bf16 on top would not pay here "
                        f"({gain:.2f}x with it, {cl_gain:.2f}x without)", Rung.LIBRARY, ev, cl_gain,
                        cl_basis, cl_gain, alternatives=alternatives, switch="channels_last")]
    if gain < 1.02:
        # Another limit sets the step's pace (pageable copies, the CPU): the convolutions' time is
        # hidden behind it. Said, at no gain, so that it is priced with the fix of that limit.
        return [Finding(RULE.code, RULE.name,
                        "leave the fp32 (TF32) convolutions for now: channels_last and bf16 would "
                        "not shorten this step while another limit sets its pace; fix that first",
                        Rung.NONE, ev, 1.0, f"not the pace: {basis}", max(gain, 1.0),
                        alternatives=alternatives)]
    # The kernels whose precision the bf16 edit changes: another rule's change of the same
    # kernels (PK302's TF32 of the fp32 GEMMs) is an alternative to this one, not an addition.
    return [Finding(RULE.code, RULE.name,
                    "convolutions in fp32 (TF32) on NCHW tensors: model and input to "
                    "memory_format=torch.channels_last, then bf16 (torch.autocast(\"cuda\", "
                    "dtype=torch.bfloat16), or a bf16 model for inference)", Rung.LIBRARY, ev, gain,
                    basis, gain, kernels=frozenset(convs) | frozenset(gemms) | frozenset(cudnn_dw),
                    alternatives=alternatives)]

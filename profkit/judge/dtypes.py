"""Element types of an op, read from its own kernels' names.

An op's precision decides both its bytes (2 or 4 per element) and which compute roof it is held
against, so it must come from the op itself: a trace-wide vote lets fp32 helper kernels
(optimizer, RNG, fills) out-vote the bf16 GEMMs of an autocast step, and cuBLAS/cuDNN names carry
no C++ template argument at all. Sources, most specific first:

* cuBLAS nvjet names: ``nvjet_sm90_tst_128x256_...``: three type letters (A/B, compute,
  C/D); the first is the input type: ``h`` fp16, ``t`` bf16, ``s`` fp32, ``d`` fp64, ``q``/``e``
  fp8, ``i`` int8.
* cuBLAS/CUTLASS xmma and tensorop names: ``sm90_xmma_gemm_bf16bf16_bf16f32_f32_...``,
  ``sm80_xmma_gemm_f32f32_..._ffma``, ``cutlass_80_tensorop_bf16_s16816gemm``, ``ampere_sgemm``,
  ``..._hgemm``, ``s1688gemm`` (tf32).
* cuDNN generated names (``..._sdpa_sm90_flash_fprop_wgmma_f16_knob...``): ``f16`` there means a
  16-bit type, fp16 or bf16 (both 2 bytes; the op's other kernels may tell which).
* C++ template arguments: ``c10::BFloat16``, ``__nv_bfloat16``, ``cutlass::bfloat16_t``,
  ``c10::Half``, ``__half``, ``float``, ``double``, ``c10::Float8_e4m3fn``, ``long``, ``int``.
  A 16-bit type next to ``float`` means 16-bit data with fp32 math (``MulFunctor<float>``), so a
  narrower floating type wins over ``float``.

Triton/Inductor names (``triton_poi_fused_add_0``) carry no type: those ops stay unknown.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional, Sequence


class Precision(str, Enum):
    """Element types profkit tells apart (values match the keys of ``Peaks.flops``)."""
    FP8 = "fp8"
    BF16 = "bf16"
    FP16 = "fp16"
    TF32 = "tf32"
    FP32 = "fp32"
    FP64 = "fp64"
    INT64 = "int64"
    INT32 = "int32"
    INT8 = "int8"
    BOOL = "bool"


ELEM_BYTES: dict[str, int] = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4, "fp64": 8,
                              "int64": 8, "int32": 4, "int8": 1, "bool": 1}
FLOATING = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")
# When the element type is unknown, a shape model gives bytes at these two sizes: the common
# training/inference types (16-bit activations and weights, fp32 master weights).
UNKNOWN_ELEM_BYTES = (2, 4)


@dataclass(frozen=True)
class KernelDtype:
    """What one kernel name says about its element types."""
    precision: Optional[str]            # the data type the kernel computes on, None: unknown
    basis: str = ""                     # which naming rule decided it
    candidates: tuple[str, ...] = ()    # when ambiguous (cuDNN ``f16``): the possible types
    src: Optional[str] = None           # casts: the type read ...
    dst: Optional[str] = None           # ... and the type written, where the name shows them


_NVJET = re.compile(r"nvjet_(?:sm\d+_)?([a-z])([a-z])([a-z])_")
_NVJET_LETTER = {"h": "fp16", "t": "bf16", "s": "fp32", "d": "fp64", "q": "fp8", "e": "fp8",
                 "i": "int8"}
_XMMA = re.compile(r"(?:xmma|cutlass)\w*?_gemm_(bf16|f16|tf32|f32|f64|e4m3|e5m2|s8|i8)", re.I)
_XMMA_TF32_MATH = re.compile(r"_gemm_f32(?:f32)?_tf32", re.I)  # xmma's second type pair is the math
_XMMA_TYPE = {"bf16": "bf16", "f16": "fp16", "tf32": "tf32", "f32": "fp32", "f64": "fp64",
              "e4m3": "fp8", "e5m2": "fp8", "s8": "int8", "i8": "int8"}
_TENSOROP = re.compile(r"tensorop_(bf16|f16|h|s|d|i8|e4m3)?_?[shd]?(\d{4,5})gemm", re.I)
_CLASSIC = [  # older cuBLAS kernel families: (pattern, precision, label)
    (re.compile(r"_bf16_s\d+gemm|bf16gemm", re.I), "bf16", "bf16 gemm"),
    (re.compile(r"s1688gemm|s16816gemm_tf32|tf32gemm|_tf32_", re.I), "tf32", "tf32 gemm"),
    (re.compile(r"(?:^|_)hgemm|h\d{4,5}gemm|_f16_s\d+gemm", re.I), "fp16", "hgemm"),
    (re.compile(r"(?:^|_)sgemm|gemmSN_NN|gemv2?T_kernel_val<float|gemv.*<float", re.I), "fp32",
     "sgemm/gemv float"),
    # CUTLASS's DMMA kernels name their 8x8x4 instruction: tensorop_d884gemm
    (re.compile(r"(?:^|_)dgemm|tensorop_d\d{3}gemm", re.I), "fp64", "dgemm"),
]
_CUDNN = re.compile(r"cudnn\w*?_(bf16|f16|fp16|f32|fp32|tf32)(?:_|$)", re.I)
_TEMPLATE = [  # (pattern, precision), narrow floating types first
    (re.compile(r"Float8_e[45]m[23]\w*|__nv_fp8\w*|cutlass::float_e[45]m[23]", re.I), "fp8"),
    (re.compile(r"c10::BFloat16|__nv_bfloat16|cutlass::bfloat16_t|\bbfloat16\b"), "bf16"),
    (re.compile(r"c10::Half|\b__half\b|cutlass::half_t"), "fp16"),
    (re.compile(r"cutlass::tfloat32_t"), "tf32"),
    (re.compile(r"\bfloat\b"), "fp32"),
    (re.compile(r"\bdouble\b"), "fp64"),
]
_INT_TEMPLATE = [  # integer data, only where no floating type shows (index math uses ints too)
    (re.compile(r"FillFunctor<long>|<long,|\(long\)|Functor<long>"), "int64"),
    (re.compile(r"FillFunctor<int>|Functor<int>"), "int32"),
    (re.compile(r"Functor<bool>|ReduceOp<bool"), "bool"),
]
# PyTorch's float -> bf16/half cast fast paths name the destination and take a float lambda.
_CAST_FAST = re.compile(r"(bfloat16|float16|half)_copy_kernel_cuda", re.I)


@functools.lru_cache(maxsize=65536)
def kernel_dtype(name: str) -> KernelDtype:
    """The element type one kernel name shows (see the module doc for the rules)."""
    n = str(name or "")
    if n.startswith("nccl") or n.startswith("[CUDA"):
        return KernelDtype(None)
    m = _NVJET.search(n)
    if m and m.group(1) in _NVJET_LETTER:
        return KernelDtype(_NVJET_LETTER[m.group(1)], f"cuBLAS nvjet type letters '{m.group(1)}"
                           f"{m.group(2)}{m.group(3)}'")
    m = _XMMA.search(n)
    if m:
        prec = _XMMA_TYPE[m.group(1).lower()]
        if prec == "fp32" and _XMMA_TF32_MATH.search(n):
            # fp32 operands, TF32 math (cuBLAS with TF32 allowed, cuDNN's 1x1 convolutions):
            # already on the tensor cores.
            return KernelDtype("tf32", "cuBLAS/CUTLASS gemm types 'f32f32_tf32f32': fp32 data, TF32 math")
        return KernelDtype(prec, f"cuBLAS/CUTLASS gemm type '{m.group(1)}'")
    m = _TENSOROP.search(n)
    if m and m.group(1):
        g = m.group(1).lower()
        prec = {"bf16": "bf16", "f16": "fp16", "h": "fp16", "s": "tf32", "d": "fp64",
                "i8": "int8", "e4m3": "fp8"}[g]
        return KernelDtype(prec, f"CUTLASS tensorop type '{g}'")
    for pat, prec, label in _CLASSIC:
        if pat.search(n):
            return KernelDtype(prec, f"cuBLAS kernel family ({label})")
    m = _CUDNN.search(n)
    if m:
        g = m.group(1).lower()
        if g in ("f16", "fp16"):
            # cuDNN's generated kernels write f16 for either 16-bit type.
            return KernelDtype(None, "cuDNN 'f16': fp16 or bf16", candidates=("bf16", "fp16"))
        return KernelDtype({"bf16": "bf16", "f32": "fp32", "fp32": "fp32", "tf32": "tf32"}[g],
                           f"cuDNN type '{g}'")
    m = _CAST_FAST.search(n)
    if m:
        dst = "bf16" if m.group(1).lower() == "bfloat16" else "fp16"
        return KernelDtype(dst, f"cast kernel {m.group(0)}", src="fp32", dst=dst)
    for pat, prec in _TEMPLATE:
        if pat.search(n):
            return KernelDtype(prec, "template argument")
    for pat, prec in _INT_TEMPLATE:
        if pat.search(n):
            return KernelDtype(prec, "template argument")
    return KernelDtype(None)


@dataclass(frozen=True)
class OpDtype:
    """An op's element type, decided from its own kernels, and how sure that is."""
    precision: Optional[str]             # None: unknown (no kernel of the op names a type)
    basis: str                           # why, for the evidence column
    candidates: tuple[str, ...] = ()     # possible types when ambiguous or unknown
    src: Optional[str] = None            # casts: type read, where a kernel name shows it
    dst: Optional[str] = None            # casts: type written

    @property
    def known(self) -> bool:
        return self.precision is not None

    @property
    def elem_bytes(self) -> Optional[int]:
        """Bytes per element when known, or when every candidate has the same size."""
        if self.precision is not None:
            return ELEM_BYTES.get(self.precision)
        sizes = {ELEM_BYTES[c] for c in self.candidates if c in ELEM_BYTES}
        return sizes.pop() if len(sizes) == 1 else None


_GEMM_NAME = re.compile(r"gemm|nvjet|xmma|cutlass|wgmma|cudnn|flash|fmha|sdpa|conv", re.I)


def op_dtype(kernel_names: Sequence[str], durations: Optional[Iterable[float]] = None) -> OpDtype:
    """The element type of an op from its kernels, weighted by their GPU time.

    GEMM/attention/convolution kernels decide when present (they carry the FLOPs and set the
    roof); otherwise the floating type with the most GPU time among the kernels that name one.
    Integer kernels (index fills, masks) decide only when no kernel names a floating type.
    """
    names = list(kernel_names)
    weights = list(durations) if durations is not None else [1.0] * len(names)
    if len(weights) != len(names):
        weights = [1.0] * len(names)
    parsed = [(kernel_dtype(n), float(w or 0.0) or 1e-9, n) for n, w in zip(names, weights)]
    srcs = {d.src for d, _, _ in parsed if d.src}
    dsts = {d.dst for d, _, _ in parsed if d.dst}
    src = srcs.pop() if len(srcs) == 1 else None
    dst = dsts.pop() if len(dsts) == 1 else None

    def vote(items):
        tally: dict[str, float] = {}
        for d, w, _ in items:
            if d.precision is not None:
                tally[d.precision] = tally.get(d.precision, 0.0) + w
        return max(tally, key=tally.__getitem__) if tally else None

    heavy = [p for p in parsed if _GEMM_NAME.search(p[2])]
    floating = [p for p in parsed if p[0].precision in FLOATING]
    rest = parsed
    if heavy:
        # The heavy kernel with the most GPU time decides; when its own name is ambiguous
        # (cuDNN attention 'f16'), helpers with fp32 scratch buffers must not decide for it:
        # only a sibling naming one of its candidate types does.
        top = max(heavy, key=lambda p: p[1])[0]
        if top.precision is None and top.candidates:
            heavy = [p for p in heavy if p[0].precision in top.candidates]
            floating = [p for p in floating if p[0].precision in top.candidates]
            rest = floating
    for group, what in ((heavy, "GEMM/attention kernel"), (floating, "kernel"),
                        (rest, "kernel")):
        prec = vote(group)
        if prec is not None:
            basis = next(d.basis for d, _, _ in group if d.precision == prec)
            return OpDtype(prec, f"{what} names: {basis}", src=src, dst=dst)
    # Ambiguous 16-bit (cuDNN f16): a sibling kernel naming bf16 or fp16 settles it.
    cands = tuple(dict.fromkeys(c for d, _, _ in parsed for c in d.candidates))
    if cands:
        return OpDtype(None, "kernel names: " + next(d.basis for d, _, _ in parsed if d.candidates),
                       candidates=cands)
    return OpDtype(None, "no kernel of the op names its element type",
                   candidates=("bf16", "fp32"))


# Recorded element types (profkit.read.aten_record names) -> precisions; the rest have no roof.
_RECORDED = {"fp64": "fp64", "fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16",
             "fp8": "fp8", "fp8e4m3": "fp8", "fp8e5m2": "fp8", "int64": "int64",
             "int32": "int32", "int8": "int8", "uint8": "int8", "bool": "bool"}
_CASTS = {"_to_copy", "to", "copy", "copy_", "clone", "contiguous"}


def recorded_dtype(record) -> Optional[OpDtype]:
    """The op's element type from profkit's aten record (:class:`profkit.read.aten_record.AtenRecord`),
    which outranks kernel names: the floating input with the most elements decides (integer
    inputs only when none is floating; outputs or ``dtype=`` for ops without tensor inputs).
    Casts get their source and destination types; other ops their output type as ``dst`` where it
    differs (comparisons write bool). None when the record names no type profkit models."""
    from profkit.judge.flops import numel

    ins = [(d, numel(s)) for d, s in zip(record.in_dtypes, record.sizes) if d is not None]
    outs = record.out_dtypes
    weights: dict[str, int] = {}
    floating = [(d, n) for d, n in ins if _RECORDED.get(d) in FLOATING]
    for d, n in (floating or ins):
        weights[d] = weights.get(d, 0) + max(n, 1)
    chosen = max(weights, key=weights.__getitem__) if weights else (
        outs[0] if outs else record.dtype)
    prec = _RECORDED.get(chosen or "")
    if prec is None:
        return None
    name = record.op.split("::", 1)[-1].split(".", 1)[0]
    src = dst = None
    if name in _CASTS:
        tensors = [d for d in record.in_dtypes if d is not None]
        if name in ("copy", "copy_") and len(tensors) >= 2:
            src, dst = tensors[1], tensors[0]
        elif tensors:
            src = tensors[0]
            dst = record.dtype or (outs[0] if outs else None) or src
        src, dst = _RECORDED.get(src or ""), _RECORDED.get(dst or "")
        if src and dst:
            prec = src if ELEM_BYTES[src] >= ELEM_BYTES[dst] else dst
    elif outs and _RECORDED.get(outs[0]) and _RECORDED.get(outs[0]) != prec:
        dst = _RECORDED[outs[0]]
    what = f"recorded by profkit's aten recorder: inputs {','.join(dict.fromkeys(record.tensor_dtypes)) or 'none'}"
    if outs:
        what += f", outputs {','.join(dict.fromkeys(outs))}"
    return OpDtype(prec, what, src=src, dst=dst)

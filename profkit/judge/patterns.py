"""Fusable producer -> consumer pairs among aten ops, from emit_nvtx's ``input_op_ids``.

``emit_nvtx(record_shapes=True)`` names each range ``aten::op, op_id = N, sizes = [...],
input_op_ids = [(M, k), ...]``: input ``i`` of op N is output ``k`` of op M. So an
``aten::_fused_rms_norm`` whose first input came from an ``aten::add`` is the residual-add +
RMSNorm pattern that one bundled kernel replaces.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Optional

import pandas as pd

from profkit.read.aten_record import FUSABLE_PAIRS

_OP_ID = re.compile(r"op_id = (\d+)")
_INPUTS = re.compile(r"input_op_ids = \[(.*)\]")
_PAIR = re.compile(r"\((\d+),\s*(-?\d+)\)")

# (consumer op prefixes, producer op prefixes, bundled kernel): kept with the record format,
# since the recorder marks exactly these ops with their op ids.
RULES = FUSABLE_PAIRS


@dataclass(frozen=True)
class Pair:
    producer: str   # op key (aten_key) of the producer
    consumer: str   # op key of the consumer
    kernel: str     # bundled kernel that fuses them
    count: int      # how many consumer calls read a producer of that key


def first_input_producer(name: str) -> tuple[int | None, int | None]:
    """(op_id, producer op_id of the first tensor input) of an emit_nvtx range name."""
    m = _OP_ID.search(name)
    ins = _INPUTS.search(name)
    first = _PAIR.search(ins.group(1)) if ins else None
    producer = int(first.group(1)) if first and int(first.group(1)) > 0 else None
    return (int(m.group(1)) if m else None), producer


def fusable_pairs(aten_names: pd.Series, key_of) -> list[Pair]:
    """Pairs (producer key, consumer key) that a bundled kernel fuses, most frequent first.

    ``aten_names``: every aten range name in the trace; ``key_of``: name -> op key.
    """
    ids: dict[int, str] = {}
    consumers: list[tuple[str, int]] = []
    for name in aten_names.drop_duplicates():
        op_id, producer = first_input_producer(name)
        if op_id is None:
            continue
        key = key_of(name)
        ids[op_id] = key
        if producer is not None and any(key.startswith(c) for rule in RULES for c in rule[0]):
            consumers.append((key, producer))
    counts: dict[tuple[str, str, str], int] = {}
    for key, producer in consumers:
        pkey = ids.get(producer)
        if pkey is None:
            continue
        for cons, prods, kernel in RULES:
            if any(key.startswith(c) for c in cons) and any(pkey.startswith(p) for p in prods):
                counts[(pkey, key, kernel)] = counts.get((pkey, key, kernel), 0) + 1
                break
    pairs = [Pair(p, c, k, n) for (p, c, k), n in counts.items()]
    return sorted(pairs, key=lambda x: -x.count)


class NormKind(str, Enum):
    """Which normalisation a kernel or range runs: it picks the bundled kernel that fuses it."""
    RMS = "rmsnorm"
    LAYER = "layernorm"


# PyTorch runs nn.RMSNorm through its layer-norm kernel with the template flag rms_norm=true
# (`vectorized_layer_norm_kernel<T, float, (bool)1>`); HF Llama's RMSNorm is composed of
# pow/mean/rsqrt kernels; and HF names its RMSNorm modules `input_layernorm`. So the kernel
# names decide, and a range's name only when no kernel says.
_LN_KERNEL_RE = re.compile(r"layer_?norm\w*<[^>]*\(bool\)(?P<rms>[01])>", re.I)
_RMS_RE = re.compile(r"rms_?norm|rsqrt", re.I)
_LAYER_RE = re.compile(r"layer_?norm", re.I)


def norm_kind(kernel_names: list[str], op_name: str = "") -> Optional[NormKind]:
    """RMSNorm or LayerNorm, from the kernels first (see above), then the op name."""
    for k in kernel_names:
        m = _LN_KERNEL_RE.search(k)
        if m:
            return NormKind.RMS if m.group("rms") == "1" else NormKind.LAYER
    if any(_RMS_RE.search(k) for k in kernel_names):
        return NormKind.RMS
    if any(_LAYER_RE.search(k) for k in kernel_names):
        return NormKind.LAYER
    if _RMS_RE.search(op_name):
        return NormKind.RMS
    if _LAYER_RE.search(op_name):
        return NormKind.LAYER
    return None


# Work that torch.compile already produced (Inductor's Triton kernels, compiled regions,
# autotuning): advice to "use torch.compile" there contradicts the evidence.
COMPILED_RE = re.compile(r"^triton_(poi|red|per|tem|for|spl)_|Torch-Compiled Region|CompiledFunction|"
                         r"inductor|TorchDynamo|torch\.compile|/compile/|compile_fx|autotun|"
                         r"benchmark_fusion", re.I)


def is_compiled(op_name: str, kernel_names: list[str]) -> bool:
    """Whether an op's range or kernels come from torch.compile / Inductor."""
    return bool(COMPILED_RE.search(op_name)) or (
        bool(kernel_names) and all(COMPILED_RE.search(k) for k in kernel_names))


# Attention that already runs on a flash / memory-efficient / cuDNN fused kernel.
FLASH_RE = re.compile(r"flash|fmha|cudnn\w*sdpa|sdpa\w*flash|_cudnn_attention|efficient_attention|"
                      r"_scaled_dot_product_(flash|cudnn|efficient)", re.I)


def on_flash_path(op_name: str, kernel_names: list[str]) -> bool:
    return bool(FLASH_RE.search(op_name)) or any(FLASH_RE.search(k) for k in kernel_names)

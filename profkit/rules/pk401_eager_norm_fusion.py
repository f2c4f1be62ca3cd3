"""PK401 eager-norm-fusion: add + RMSNorm / add + LayerNorm / bias + GELU / scale + softmax in eager.

What
    A residual add (or bias add, or a scale) immediately followed on the same stream by the norm
    (or GELU, or softmax) that reads its output: two kernels and an extra round trip of the
    activation through HBM.
Why
    The bundled kernels fuse each pair into one pass: ``kernels.add_rmsnorm`` (RMSNorm),
    ``kernels.add_layernorm`` (LayerNorm), ``kernels.bias_gelu``, ``kernels.softmax``. Which norm
    runs is read from the kernels, not the module name: PyTorch runs nn.RMSNorm through its layer
    norm kernel with the flag rms_norm=true (``vectorized_layer_norm_kernel<..., (bool)1>``), and
    HF names its RMSNorm modules ``input_layernorm``.
Evidence
    Kernel order per stream: the producer kernel (add / mul / div) directly before the consumer
    (layer-norm kernel, GELU, softmax), forward kernels only.
Fix
    The named bundled kernel (``from kernels import add_rmsnorm``); or ``torch.compile`` the block.
Expected gain
    Passes over the activation, eager vs fused (add+norm 5 -> 4, bias+GELU and softmax 4 -> 2):
    the pairs' kernel time x (1 - fused / eager), times the critical share, never below the CPU's
    own time.
References
    profkit ``kernels/`` and analyses/fused_add_rmsnorm.md, fused_add_layernorm.md.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.advisor import FUSED_PASSES
from profkit.model import Rung
from profkit.patterns import NormKind, norm_kind
from profkit.reader import per_name
from profkit.rules.base import Finding, Param, RuleContext, RuleMeta, Scope, Table, matches

RULE = RuleMeta(
    code="PK401", name="eager-norm-fusion",
    summary="add+RMSNorm / add+LayerNorm / bias+GELU / softmax in eager: the bundled fused kernels",
    tables=(Table.KERNEL,), example="traces/model_tiny_llama.sqlite",
    quiet_on="traces/fused_add_rmsnorm_cuda.sqlite",
    params=(Param("min_pairs_per_iteration", 1, "pairs per iteration"),))

NORM_RE = re.compile(r"layer_norm_kernel|LayerNormForward|rms_?norm\w*kernel", re.I)
GELU_RE = re.compile(r"GeluCUDAKernel|gelu_kernel", re.I)
SOFTMAX_RE = re.compile(r"SoftMaxForward(?!.*LogSoftMax)|softmax_warp_forward", re.I)
ADD_RE = re.compile(r"CUDAFunctor_add|AddFunctor|add_kernel|CUDAFunctorOnSelf_add", re.I)
SCALE_RE = re.compile(r"MulFunctor|DivFunctor|div_true", re.I)
BACKWARD_RE = re.compile(r"backward|grad", re.I)


def _consumer(name: str) -> str | None:
    if BACKWARD_RE.search(name):
        return None
    if NORM_RE.search(name):
        return "add_layernorm" if norm_kind([name]) is NormKind.LAYER else "add_rmsnorm"
    if GELU_RE.search(name):
        return "bias_gelu"
    if SOFTMAX_RE.search(name):
        return "softmax"
    return None


def detect(ctx: RuleContext) -> list[Finding]:
    a = ctx.kernels_in_stream_order
    names = a["name"]
    dur = a["dur"].to_numpy(np.float64)
    crit = a["critical"].to_numpy(np.float64)
    stream = a["streamId"].to_numpy()
    found: dict[str, list] = {}
    if len(a) > 1:
        # Names are classified once each; pairs are then found with array comparisons.
        consumer = per_name(names, _consumer)
        is_add, is_scale = matches(names, ADD_RE), matches(names, SCALE_RE)
        same = np.zeros(len(a), dtype=bool)
        same[1:] = stream[1:] == stream[:-1]
        prev_add = np.zeros(len(a), dtype=bool)
        prev_add[1:] = is_add[:-1]
        prev_scale = np.zeros(len(a), dtype=bool)
        prev_scale[1:] = is_scale[:-1]
        for kern in ("add_layernorm", "add_rmsnorm", "bias_gelu", "softmax"):
            prod = prev_scale if kern == "softmax" else prev_add
            idx = np.flatnonzero((consumer == kern) & same & prod)
            if len(idx):
                found[kern] = idx.tolist()
    out = []
    for kern, idx in found.items():
        per_it = len(idx) / max(ctx.iterations, 1)
        if per_it < RULE.param("min_pairs_per_iteration"):
            continue
        both = np.concatenate([np.array(idx), np.array(idx) - 1])
        total = float(dur[both].sum())
        eager, fused = FUSED_PASSES[kern]
        op_gain = eager / fused
        saved = total * (1.0 - fused / eager)
        share = float((dur[both] * crit[both]).sum() / total) if total else 0.0
        g, _, basis = ctx.gpu_saving_gain(saved, share)
        g = min(g, op_gain)
        out.append(Finding(RULE.code, RULE.name,
                           f"fuse the {len(idx)} producer -> consumer pairs into the bundled kernel "
                           f"kernels.{kern} ({eager} passes over HBM become {fused})", Rung.TRITON,
                           {"kernel": kern, "pairs": len(idx), "pair_kernel_ns": int(total),
                            "critical_share": round(share, 3)}, g,
                           f"pairs {ctx.per_iteration(total)} x (1 - {fused}/{eager}); {basis}", g,
                           op_gain, Scope.OPS, frozenset(names.iloc[both].astype(str).tolist())))
    return out

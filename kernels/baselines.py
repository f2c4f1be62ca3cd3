"""The PyTorch a user would write for each fused op: the eager baseline (also compiled by the benchmark).

Byte counts are in "tensor passes": one pass = reading or writing one (tokens, hidden) tensor once.
Vectors of size hidden (weight, bias) are negligible and not counted.  The fused kernels move the
minimum; eager PyTorch launches one kernel per op and re-reads/re-writes the intermediates.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6):
    # eager: add (read x, r; write h) = 3 passes, rms_norm (read h; write out) = 2 -> 5 passes
    # (torch >= 2.9 has a fused rms_norm kernel; older versions take more).  Fused: 4 passes.
    h = x + residual
    out = F.rms_norm(h, (h.shape[-1],), weight, eps)
    return out, h


def add_rmsnorm_(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    # eager: add_ (read x, r; write r) = 3 passes, rms_norm (read r; write out) = 2 -> 5 passes.
    # Fused: 4 passes (read x, r; write r, out).
    residual.add_(x)
    return F.rms_norm(residual, (residual.shape[-1],), weight, eps)


def add_layernorm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5):
    # eager: add = 3 passes, layer_norm (read h; write out) = 2 -> 5 passes.  Fused: 4 passes.
    h = x + residual
    out = F.layer_norm(h, (h.shape[-1],), weight, bias, eps)
    return out, h


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    # eager: add (read x; write u) = 2 passes, gelu (read u; write out) = 2 -> 4 passes.
    # Fused: 2 passes (read x, write out).
    return F.gelu(x + bias, approximate=approximate)


def softmax(x: Tensor, scale: float = 1.0) -> Tensor:
    # eager: mul (read x; write s) = 2 passes, softmax (read s; write out) = 2 -> 4 passes
    # (scale == 1.0 skips the mul: 2 passes).  Fused: 2 passes (read x, write out).
    if scale != 1.0:
        x = x * scale
    return torch.softmax(x, dim=-1)


# Passes each implementation must move (see the comments above): used by the benchmark.
PASSES = {
    "add_rmsnorm": {"fused": 4, "eager": 5},
    "add_rmsnorm_": {"fused": 4, "eager": 5},
    "add_layernorm": {"fused": 4, "eager": 5},
    "bias_gelu": {"fused": 2, "eager": 4},
    "softmax": {"fused": 2, "eager": 4},
}

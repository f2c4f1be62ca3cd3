"""Typed public wrappers: host-side checks, then the custom op of the chosen backend.

    out, residual_out = add_rmsnorm(x, residual, weight, eps, backend="triton")
    out = add_rmsnorm_(x, residual, weight, eps)          # residual <- x + residual, in place
    out, residual_out = add_layernorm(x, residual, weight, bias, eps)
    y = bias_gelu(x, bias, approximate="none" | "tanh")
    y = softmax(x, scale=1.0)                             # over the last dim

backend: "triton" (default), "cuda" (CUDA C++ extension, built on first use) or "torch" (the eager
baseline in kernels/baselines.py).  CPU tensors run the float reference for "triton"/"cuda".
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kernels import _library, baselines

Backend = Literal["triton", "cuda", "torch"]
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


def _check_backend(backend: str) -> None:
    if backend not in ("triton", "cuda", "torch"):
        raise ValueError(f'backend must be "triton", "cuda" or "torch", got {backend!r}.')


def _check_tensor(name: str, t: object) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")


def _check_common(backend: str, x: Tensor, named: dict[str, Tensor], vectors: dict[str, Tensor]):
    """Device, dtype and shape agreement for x, same-shape tensors `named` and (hidden,) `vectors`."""
    _check_tensor("x", x)
    for name, t in {**named, **vectors}.items():
        _check_tensor(name, t)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (the hidden dimension).")
    allowed = _SUPPORTED + ((torch.float64,) if x.device.type == "cpu" else ())
    if x.dtype not in allowed:
        raise TypeError(
            f"x has dtype {x.dtype}; the kernels support float32, float16 and bfloat16"
            + (" (and float64 on CPU)." if x.device.type == "cpu" else ".")
        )
    for name, t in {**named, **vectors}.items():
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; put them on one device.")
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; they must match.")
    for name, t in named.items():
        if t.shape != x.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but x has {tuple(x.shape)}.")
    for name, t in vectors.items():
        if t.shape != x.shape[-1:]:
            raise ValueError(
                f"{name} must have shape ({x.shape[-1]},) (the hidden size of x), got {tuple(t.shape)}."
            )
    if backend == "cuda" and x.is_cuda:
        from kernels import _build

        _build.ensure_loaded()


def _op(name: str, backend: str):
    return getattr(torch.ops.profkit_kernels, f"{name}_{backend}")


def add_rmsnorm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, *, backend: Backend = "triton"
) -> tuple[Tensor, Tensor]:
    """Return (rms_norm(x + residual) * weight, x + residual), one pass over the data."""
    _check_backend(backend)
    _check_common(backend, x, {"residual": residual}, {"weight": weight})
    if backend == "torch":
        return baselines.add_rmsnorm(x, residual, weight, eps)
    return _op("add_rmsnorm", backend)(x.contiguous(), residual.contiguous(), weight.contiguous(), float(eps))


def add_rmsnorm_(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, *, backend: Backend = "triton"
) -> Tensor:
    """In place: residual <- x + residual; return rms_norm(residual) * weight (inference engines)."""
    _check_backend(backend)
    _check_common(backend, x, {"residual": residual}, {"weight": weight})
    if not residual.is_contiguous():
        raise ValueError("residual must be contiguous for the in-place add_rmsnorm_ (it is written in place).")
    if backend == "torch":
        return baselines.add_rmsnorm_(x, residual, weight, eps)
    return _op("add_rmsnorm_inplace", backend)(x.contiguous(), residual, weight.contiguous(), float(eps))


def add_layernorm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float = 1e-5,
    *,
    backend: Backend = "triton",
) -> tuple[Tensor, Tensor]:
    """Return (layer_norm(x + residual) * weight + bias, x + residual), one pass over the data."""
    _check_backend(backend)
    _check_common(backend, x, {"residual": residual}, {"weight": weight, "bias": bias})
    if backend == "torch":
        return baselines.add_layernorm(x, residual, weight, bias, eps)
    return _op("add_layernorm", backend)(
        x.contiguous(), residual.contiguous(), weight.contiguous(), bias.contiguous(), float(eps)
    )


def bias_gelu(
    x: Tensor, bias: Tensor, approximate: Literal["none", "tanh"] = "none", *, backend: Backend = "triton"
) -> Tensor:
    """Return gelu(x + bias) with the erf ("none") or tanh form, bias broadcast over the last dim."""
    _check_backend(backend)
    _library._check_approximate(approximate)
    _check_common(backend, x, {}, {"bias": bias})
    if backend == "torch":
        return baselines.bias_gelu(x, bias, approximate)
    return _op("bias_gelu", backend)(x.contiguous(), bias.contiguous(), approximate)


def softmax(x: Tensor, scale: float = 1.0, *, backend: Backend = "triton") -> Tensor:
    """Return softmax(x * scale) over the last dimension."""
    _check_backend(backend)
    _check_common(backend, x, {}, {})
    if backend == "torch":
        return baselines.softmax(x, scale)
    return _op("softmax", backend)(x.contiguous(), float(scale))

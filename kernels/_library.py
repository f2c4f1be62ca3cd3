"""torch.library registrations for the profkit_kernels namespace.

Every op exists once per compiled backend (``<op>_triton`` and ``<op>_cuda``) with the same schema,
so that both implementations can be registered for the CUDA dispatch key side by side:

* the schema is defined here, once (the CUDA C++ files only add a CUDA kernel to it),
* a CPU kernel: the float reference (also the path CPU-only CI exercises),
* a CUDA kernel: Triton launchers registered here; the C++ ones via TORCH_LIBRARY_IMPL in csrc/,
* a fake (meta) kernel so torch.compile/fullgraph traces through without a graph break,
* autograd (backward written with differentiable torch ops, computed in fp32 or fp64).
"""
from __future__ import annotations

import torch
from torch import Tensor

NS = "profkit_kernels"
COMPILED_BACKENDS = ("triton", "cuda")

# One schema per op; `Tensor(a!)` marks the buffer the in-place variant writes.
SCHEMAS = {
    "add_rmsnorm": "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    "add_rmsnorm_inplace": "(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor",
    "add_layernorm": (
        "(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor)"
    ),
    "bias_gelu": "(Tensor x, Tensor bias, str approximate) -> Tensor",
    "softmax": "(Tensor x, float scale) -> Tensor",
}

# The library object owns the definitions; it must stay alive for the ops to exist.
_LIB = torch.library.Library(NS, "DEF")


def qualname(op: str, backend: str) -> str:
    return f"{NS}::{op}_{backend}"


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of the references: fp64 stays fp64 (gradcheck), everything else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------------------------------------
# CPU float references (also the semantics every backend must match)
# ----------------------------------------------------------------------------------------------
def ref_add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float):
    acc = _acc(x.dtype)
    # residual_out is rounded to the input dtype first and the norm is taken of the rounded value,
    # exactly like eager `h = x + r; rms_norm(h)` and like both compiled kernels.
    h = (x.to(acc) + residual.to(acc)).to(x.dtype)
    hf = h.to(acc)
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    out = (hf * rstd * weight.to(acc)).to(x.dtype)
    return out, h


def ref_add_layernorm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float):
    acc = _acc(x.dtype)
    h = (x.to(acc) + residual.to(acc)).to(x.dtype)
    hf = h.to(acc)
    mean = hf.mean(-1, keepdim=True)
    d = hf - mean
    rstd = torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    out = (d * rstd * weight.to(acc) + bias.to(acc)).to(x.dtype)
    return out, h


def ref_bias_gelu(x: Tensor, bias: Tensor, approximate: str):
    acc = _acc(x.dtype)
    u = x.to(acc) + bias.to(acc)
    return torch.nn.functional.gelu(u, approximate=approximate).to(x.dtype)


def ref_softmax(x: Tensor, scale: float):
    acc = _acc(x.dtype)
    return torch.softmax(x.to(acc) * scale, dim=-1).to(x.dtype)


def _cpu_add_rmsnorm(x, residual, weight, eps):
    return ref_add_rmsnorm(x, residual, weight, eps)


def _cpu_add_rmsnorm_inplace(x, residual, weight, eps):
    out, h = ref_add_rmsnorm(x, residual, weight, eps)
    residual.copy_(h)
    return out


def _cpu_add_layernorm(x, residual, weight, bias, eps):
    return ref_add_layernorm(x, residual, weight, bias, eps)


def _cpu_bias_gelu(x, bias, approximate):
    _check_approximate(approximate)
    return ref_bias_gelu(x, bias, approximate)


def _cpu_softmax(x, scale):
    return ref_softmax(x, scale)


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f'approximate must be "none" or "tanh", got {approximate!r}.')


# ----------------------------------------------------------------------------------------------
# Fake (meta) kernels: shapes/dtypes only, same checks as the real ones
# ----------------------------------------------------------------------------------------------
def _fake_norm(x, residual, weight, *rest):
    torch._check(residual.shape == x.shape, lambda: "residual must have the shape of x.")
    torch._check(weight.shape == x.shape[-1:], lambda: "weight must have shape (hidden,).")
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        x, memory_format=torch.contiguous_format
    )


def _fake_add_rmsnorm(x, residual, weight, eps):
    return _fake_norm(x, residual, weight)


def _fake_add_rmsnorm_inplace(x, residual, weight, eps):
    return _fake_norm(x, residual, weight)[0]


def _fake_add_layernorm(x, residual, weight, bias, eps):
    return _fake_norm(x, residual, weight)


def _fake_bias_gelu(x, bias, approximate):
    _check_approximate(approximate)
    torch._check(bias.shape == x.shape[-1:], lambda: "bias must have shape (hidden,).")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_softmax(x, scale):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ----------------------------------------------------------------------------------------------
# Autograd: setup_context saves what backward needs; backward uses differentiable torch ops
# ----------------------------------------------------------------------------------------------
def _rows(t: Tensor, n: int) -> Tensor:
    return t.reshape(-1, n)


def _setup_norm(ctx, inputs, output):
    x, residual, weight = inputs[:3]
    ctx.eps = inputs[-1]
    ctx.x_dtype = x.dtype
    # residual_out (h) is the only activation needed: the backward recomputes mean/rstd from it.
    ctx.save_for_backward(output[1], weight)


def _bwd_add_rmsnorm(ctx, grad_out, grad_res):
    h, weight = ctx.saved_tensors
    acc = _acc(h.dtype)
    n = h.shape[-1]
    hf = h.to(acc)
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gy = grad_out.to(acc)
    dn = gy * weight.to(acc)
    dh = rstd * (dn - hf * rstd.pow(2) * (dn * hf).mean(-1, keepdim=True))
    if grad_res is not None:
        dh = dh + grad_res.to(acc)
    dh = dh.to(ctx.x_dtype)
    gw = _rows(gy * hf * rstd, n).sum(0).to(weight.dtype)
    return dh, dh.clone(), gw, None


def _bwd_add_layernorm(ctx, grad_out, grad_res):
    h, weight = ctx.saved_tensors
    acc = _acc(h.dtype)
    n = h.shape[-1]
    hf = h.to(acc)
    d = hf - hf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + ctx.eps)
    xhat = d * rstd
    gy = grad_out.to(acc)
    dxhat = gy * weight.to(acc)
    dh = rstd * (
        dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True)
    )
    if grad_res is not None:
        dh = dh + grad_res.to(acc)
    dh = dh.to(ctx.x_dtype)
    gw = _rows(gy * xhat, n).sum(0).to(weight.dtype)
    gb = _rows(gy, n).sum(0).to(weight.dtype)
    return dh, dh.clone(), gw, gb, None


def _setup_bias_gelu(ctx, inputs, output):
    x, bias, approximate = inputs
    ctx.approximate = approximate
    ctx.save_for_backward(x, bias)


def _bwd_bias_gelu(ctx, grad):
    x, bias = ctx.saved_tensors
    acc = _acc(x.dtype)
    u = x.to(acc) + bias.to(acc)
    dx = torch.ops.aten.gelu_backward(grad.to(acc), u, approximate=ctx.approximate)
    db = _rows(dx, x.shape[-1]).sum(0).to(bias.dtype)
    return dx.to(x.dtype), db, None


def _setup_softmax(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _bwd_softmax(ctx, grad):
    (y,) = ctx.saved_tensors
    acc = _acc(y.dtype)
    yf, gf = y.to(acc), grad.to(acc)
    dx = ctx.scale * yf * (gf - (gf * yf).sum(-1, keepdim=True))
    return dx.to(y.dtype), None


# ----------------------------------------------------------------------------------------------
# Triton CUDA kernels (imported lazily: triton is only needed when a CUDA tensor reaches them)
# ----------------------------------------------------------------------------------------------
def _triton_add_rmsnorm(x, residual, weight, eps):
    from kernels import triton_kernels as tk

    return tk.add_rmsnorm(x, residual, weight, eps)


def _triton_add_rmsnorm_inplace(x, residual, weight, eps):
    from kernels import triton_kernels as tk

    return tk.add_rmsnorm_inplace(x, residual, weight, eps)


def _triton_add_layernorm(x, residual, weight, bias, eps):
    from kernels import triton_kernels as tk

    return tk.add_layernorm(x, residual, weight, bias, eps)


def _triton_bias_gelu(x, bias, approximate):
    from kernels import triton_kernels as tk

    return tk.bias_gelu(x, bias, approximate)


def _triton_softmax(x, scale):
    from kernels import triton_kernels as tk

    return tk.softmax(x, scale)


_CPU = {
    "add_rmsnorm": _cpu_add_rmsnorm,
    "add_rmsnorm_inplace": _cpu_add_rmsnorm_inplace,
    "add_layernorm": _cpu_add_layernorm,
    "bias_gelu": _cpu_bias_gelu,
    "softmax": _cpu_softmax,
}
_FAKE = {
    "add_rmsnorm": _fake_add_rmsnorm,
    "add_rmsnorm_inplace": _fake_add_rmsnorm_inplace,
    "add_layernorm": _fake_add_layernorm,
    "bias_gelu": _fake_bias_gelu,
    "softmax": _fake_softmax,
}
_TRITON = {
    "add_rmsnorm": _triton_add_rmsnorm,
    "add_rmsnorm_inplace": _triton_add_rmsnorm_inplace,
    "add_layernorm": _triton_add_layernorm,
    "bias_gelu": _triton_bias_gelu,
    "softmax": _triton_softmax,
}
_AUTOGRAD = {
    "add_rmsnorm": (_bwd_add_rmsnorm, _setup_norm),
    "add_layernorm": (_bwd_add_layernorm, _setup_norm),
    "bias_gelu": (_bwd_bias_gelu, _setup_bias_gelu),
    "softmax": (_bwd_softmax, _setup_softmax),
    # add_rmsnorm_inplace is the inference-engine variant: it mutates its input, no autograd.
}


def _register() -> None:
    for op, schema in SCHEMAS.items():
        for backend in COMPILED_BACKENDS:
            name = f"{op}_{backend}"
            q = qualname(op, backend)
            # The schema, defined once for both the Python and the C++ CUDA implementation.
            _LIB.define(name + schema)
            # CPU kernel = the float reference, so CPU-only CI and opcheck on CPU run the op.
            torch.library.impl(q, "CPU", _CPU[op], lib=_LIB)
            # Fake kernel: lets torch.compile(fullgraph=True) and FakeTensor trace without running.
            torch.library.register_fake(q, _FAKE[op], lib=_LIB)
            if backend == "triton":
                # CUDA kernel of the Triton backend (the C++ backend registers its own from csrc/).
                torch.library.impl(q, "CUDA", _TRITON[op], lib=_LIB)
            if op in _AUTOGRAD:
                bwd, setup = _AUTOGRAD[op]
                # Autograd: backward in differentiable torch ops, so it also traces under compile.
                torch.library.register_autograd(q, bwd, setup_context=setup, lib=_LIB)


_register()

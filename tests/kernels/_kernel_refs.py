"""Float64 references and input makers shared by the kernel tests (independent of kernels/_library.py)."""
from __future__ import annotations

import math

import torch

# ||out - ref|| / ||ref|| allowed per dtype: a few units of the dtype's rounding (bf16 2^-8, fp16 2^-11).
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2, torch.float64: 1e-12}

OPS = ("add_rmsnorm", "add_rmsnorm_", "add_layernorm", "bias_gelu", "softmax")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error in float64; any NaN/inf where the reference is finite gives inf."""
    out64, ref64 = out.double(), ref.double()
    finite = torch.isfinite(ref64)
    if not bool(torch.isfinite(out64[finite]).all()):
        return math.inf
    den = ref64[finite].norm().item()
    num = (out64[finite] - ref64[finite]).norm().item()
    return num / den if den > 0 else num


def make_inputs(op: str, rows: int, hidden: int, dtype, device="cpu", gen=None):
    """Fresh random inputs (never zeros); weights away from 0, residual of the same scale as x."""
    def rnd(*shape, scale=1.0, shift=0.0):
        t = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale + shift
        return t.to(dtype)

    x = rnd(rows, hidden)
    if op in ("add_rmsnorm", "add_rmsnorm_"):
        return dict(x=x, residual=rnd(rows, hidden), weight=rnd(hidden, scale=0.5, shift=1.0), eps=1e-6)
    if op == "add_layernorm":
        return dict(x=x, residual=rnd(rows, hidden, shift=0.5), weight=rnd(hidden, scale=0.5, shift=1.0),
                    bias=rnd(hidden, scale=0.1), eps=1e-5)
    if op == "bias_gelu":
        return dict(x=x, bias=rnd(hidden, scale=0.5))
    if op == "softmax":
        return dict(x=rnd(rows, hidden, scale=3.0), scale=0.7)
    raise KeyError(op)


def ref64(op: str, inp: dict, approximate: str = "none"):
    """float64 reference of the op; returns a tuple of outputs (out[, residual_out])."""
    d = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    if op in ("add_rmsnorm", "add_rmsnorm_"):
        h = d["x"] + d["residual"]
        out = h / torch.sqrt((h * h).mean(-1, keepdim=True) + d["eps"]) * d["weight"]
        return out, h
    if op == "add_layernorm":
        h = d["x"] + d["residual"]
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) / torch.sqrt(var + d["eps"]) * d["weight"] + d["bias"], h
    if op == "bias_gelu":
        u = d["x"] + d["bias"]
        if approximate == "tanh":
            return (0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))),
        return (0.5 * u * (1 + torch.erf(u / math.sqrt(2)))),
    if op == "softmax":
        z = d["x"] * d["scale"]
        e = torch.exp(z - z.max(-1, keepdim=True).values)
        return (e / e.sum(-1, keepdim=True)),
    raise KeyError(op)


def call(op: str, inp: dict, backend: str, approximate: str = "none"):
    """Run the public wrapper; returns (outputs tuple, residual tensor after the call)."""
    import kernels

    if op == "add_rmsnorm":
        return kernels.add_rmsnorm(inp["x"], inp["residual"], inp["weight"], inp["eps"], backend=backend)
    if op == "add_rmsnorm_":
        res = inp["residual"].clone()
        out = kernels.add_rmsnorm_(inp["x"], res, inp["weight"], inp["eps"], backend=backend)
        return out, res
    if op == "add_layernorm":
        return kernels.add_layernorm(inp["x"], inp["residual"], inp["weight"], inp["bias"], inp["eps"],
                                     backend=backend)
    if op == "bias_gelu":
        return (kernels.bias_gelu(inp["x"], inp["bias"], approximate, backend=backend),)
    if op == "softmax":
        return (kernels.softmax(inp["x"], inp["scale"], backend=backend),)
    raise KeyError(op)


def op_args(op: str, inp: dict, approximate: str = "none"):
    """Positional args of the torch.ops.profkit_kernels op for `op`."""
    if op in ("add_rmsnorm", "add_rmsnorm_"):
        return (inp["x"], inp["residual"], inp["weight"], inp["eps"])
    if op == "add_layernorm":
        return (inp["x"], inp["residual"], inp["weight"], inp["bias"], inp["eps"])
    if op == "bias_gelu":
        return (inp["x"], inp["bias"], approximate)
    return (inp["x"], inp["scale"])


def op_name(op: str) -> str:
    return "add_rmsnorm_inplace" if op == "add_rmsnorm_" else op

"""profkit bundled fused kernels: residual add + RMSNorm / LayerNorm, bias + GELU, row softmax.

Each op has backends picked by ``backend=``: ``"auto"`` (default: the CUDA extension when it builds, Triton where it is faster or the extension is unavailable), ``"triton"``, ``"cuda"`` (a CUDA C++ extension
built on first use) and ``"torch"`` (the plain PyTorch baseline).  The ops are registered as real
custom ops in the ``profkit_kernels`` torch.library namespace (see ``kernels/_library.py``).

Importing this package needs nothing: torch is imported only when an op is first used, so the
analyzer (``profkit``) never depends on torch.  Using an op without torch raises an ImportError
that says how to install it.
"""
from __future__ import annotations

from kernels._build import KernelBuildError

__all__ = [
    "add_rmsnorm",
    "add_rmsnorm_",
    "add_layernorm",
    "bias_gelu",
    "softmax",
    "KernelBuildError",
    "BACKENDS",
]

BACKENDS = ("auto", "triton", "cuda", "torch")
_OPS = {"add_rmsnorm", "add_rmsnorm_", "add_layernorm", "bias_gelu", "softmax"}


def __getattr__(name: str):
    if name in _OPS:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError(
                'profkit kernels need PyTorch (and Triton for backend="triton"): '
                'pip install -e ".[kernels]"'
            ) from None
        from kernels import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")

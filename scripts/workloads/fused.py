"""One bundled op at a prefill shape, with one backend, inside an NVTX range named after the op.

The range name is the same for every backend, so two traces of the same case (say `torch` and
`triton`) diff op by op: `profkit diff fused_add_rmsnorm_torch.sqlite.xz fused_add_rmsnorm_triton.sqlite.xz`.

    python scripts/workloads/fused.py add_rmsnorm|add_layernorm|bias_gelu|softmax torch|triton|cuda
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import kernels  # noqa: E402

TOKENS, HIDDEN, REPS = 16384, 4096, 20


def _range(name: str):
    return torch.cuda.nvtx.range(name)


def main(case: str, backend: str) -> None:
    torch.manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=dt)
    r = torch.randn_like(x)
    w = torch.randn(HIDDEN, device="cuda", dtype=dt)
    b = torch.randn(HIDDEN, device="cuda", dtype=dt)
    calls = {
        "add_rmsnorm": lambda: kernels.add_rmsnorm(x, r, w, 1e-6, backend=backend),
        "add_layernorm": lambda: kernels.add_layernorm(x, r, w, b, 1e-5, backend=backend),
        "bias_gelu": lambda: kernels.bias_gelu(x, b, "tanh", backend=backend),
        "softmax": lambda: kernels.softmax(x, 0.125, backend=backend),
    }
    fn = calls[case]
    fn()  # build / compile outside the measured ranges
    torch.cuda.synchronize()
    for _ in range(REPS):
        with _range(case):
            fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

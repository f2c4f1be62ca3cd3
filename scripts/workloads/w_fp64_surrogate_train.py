"""Training a surrogate model in float64, as scientific codes ported from NumPy do (the model
``.double()``, the data float64): an MLP of 6 hidden layers of width 1024 (SiLU) from 16 inputs
to 8 outputs, fitted by MSE to a smooth function of its inputs, batches of 16,384 points, Adam
(foreach, the default).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: every GEMM is a float64 GEMM (~0.5 TFLOP a step on FP64 tensor cores, ~67 TFLOP/s on an
H100), every activation twice the bytes of float32; neither TF32 nor bf16 autocast applies to
float64 tensors, so the usual switches change nothing.

    python w_fp64_surrogate_train.py [--steps 40] [--fix fp32|fp32_tf32|fp32_bf16] [--fix tf32]

Fixes:
  fp32       model and data in float32 (full-precision float32 GEMMs).
  fp32_tf32  model and data in float32, ``torch.set_float32_matmul_precision("high")`` (TF32 GEMMs).
  fp32_bf16  model and data in float32, bf16 autocast around the forward.
  tf32       ``torch.set_float32_matmul_precision("high")`` on the float64 model: a control, TF32
             does not reach float64 GEMMs.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, set_precision, train_step  # noqa: E402

FIXES = ("fp32", "fp32_tf32", "fp32_bf16", "tf32")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("fp32", "fp32_tf32"), ("fp32", "fp32_bf16"), ("fp32_tf32", "fp32_bf16"))


class Surrogate(nn.Module):
    def __init__(self, inputs: int = 16, width: int = 1024, depth: int = 6, outputs: int = 8) -> None:
        super().__init__()
        dims = [inputs] + [width] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.hidden:
            x = F.silu(lin(x))
        return self.head(x)


def target(x: torch.Tensor, outputs: int) -> torch.Tensor:
    """The function fitted: smooth in every input, one output per frequency."""
    k = torch.arange(1, outputs + 1, device=x.device, dtype=x.dtype)
    return torch.sin(x.sum(-1, keepdim=True) * k / x.shape[-1]) + 0.1 * (x ** 2).mean(-1, keepdim=True)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The training step with ``fixes`` applied; returns the step's loss."""
    set_precision(fixes)
    inputs, width, depth, outputs, batch = 16, 1024, 6, 8, 16384
    if args.small:
        inputs, width, depth, outputs, batch = 4, 16, 2, 3, 32
    dtype = torch.float32 if fixes & {"fp32", "fp32_tf32", "fp32_bf16"} else torch.float64
    torch.manual_seed(0)
    model = Surrogate(inputs, width, depth, outputs).to(dev, dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    amp = bf16_autocast(dev, "fp32_bf16" in fixes)
    gen = torch.Generator(device=dev).manual_seed(1)
    data = []
    for _ in range(4):
        x = torch.rand(batch, inputs, device=dev, generator=gen, dtype=torch.float64) * 4 - 2
        data.append((x.to(dtype), target(x, outputs).to(dtype)))  # the data is float64 as it comes
    state = {"i": 0}

    def forward() -> torch.Tensor:
        x, y = data[state["i"] % len(data)]
        state["i"] += 1
        return F.mse_loss(model(x).to(y.dtype), y)
    return lambda: train_step(forward, opt, amp)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_fp64_surrogate_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.5f}")


if __name__ == "__main__":
    main()

"""ResNet-50 training (torchvision, random weights), bf16 autocast, channels_last, batch 128 of
224 x 224 images, SGD with momentum (PyTorch's default foreach implementation): GPU-bound.

Each step (fresh random images and labels, made on the GPU) is an NVTX range ``train_step``
holding ``forward``, ``backward`` and ``optimizer``. About 3 TFLOP of convolutions a step,
plus BatchNorm/ReLU passes, against ~1,000 launches: the CPU stays ahead of the GPU.

    python w_resnet50_train.py [--steps 40]
        [--fix fused_sgd | --fix cudnn_benchmark | --fix compile | --fix compile_graphs]

Fixes (the first two are not expected to pay much):
  fused_sgd        ``SGD(fused=True)``: the update of 25.6M parameters in one fused kernel instead
                   of a few foreach passes: a fraction of a ms of a ~30 ms step. Expected ~1.01x.
  cudnn_benchmark  ``torch.backends.cudnn.benchmark = True``: cuDNN times its algorithms for each
                   convolution shape (in the first steps) and keeps the fastest. cuDNN's
                   heuristics are usually right for bf16 channels_last on Hopper. Expected
                   1.00-1.05x.
  compile          ``torch.compile(model)`` (default mode): Inductor fuses each BatchNorm's
                   normalisation with the ReLU and residual add after it (its statistics stay a
                   reduction pass of their own, in the forward and in the backward); the
                   convolutions stay cuDNN's.
  compile_graphs   ``torch.compile(model, mode="reduce-overhead")``: the same fusion, and the
                   forward and backward replayed as CUDA graphs, so that the compiled step's
                   many kernel launches no longer cost host time.
"""
from __future__ import annotations

from typing import Callable

import torch
import torchvision

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("fused_sgd", "cudnn_benchmark", "compile", "compile_graphs")
CUDA_ONLY: tuple[str, ...] = ()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied (``cudnn_benchmark`` is process-wide: never
    interleaved); returns one training step (fresh images and labels; its loss)."""
    if "cudnn_benchmark" in fixes:
        torch.backends.cudnn.benchmark = True
    batch, size = (2, 64) if args.small else (128, 224)
    model = torchvision.models.resnet50(num_classes=1000).to(dev, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5,
                          fused=True if "fused_sgd" in fixes else None)
    fwd = model
    if "compile" in fixes:
        fwd = torch.compile(model)
    elif "compile_graphs" in fixes:
        fwd = torch.compile(model, mode="reduce-overhead")

    def step() -> torch.Tensor:
        x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device=dev)
        return train_step(lambda: torch.nn.functional.cross_entropy(fwd(x), y), opt, bf16_autocast(dev))
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("compile", "compile_graphs")],
                                    small_help="tiny batch and images, for a CPU smoke run")
    ran = run(build, args, fixes, dev, not_interleaved={"cudnn_benchmark": "is process-wide"})
    if ran:
        print(f"w_resnet50_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

"""Video classification training: torchvision's R3D-18 (3-D ResNet-18, random weights, 400
classes as Kinetics-400) on clips of 16 frames of 112 x 112, batch 24, fp32, SGD with momentum
and weight decay (PyTorch's default foreach implementation), fresh random clips and labels made
on the GPU each step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.
About 5.9 TFLOP of 3-D convolutions a step (cuDNN runs fp32 convolutions as TF32 by default),
plus BatchNorm3d and ReLU passes over large activations in NCDHW.

    python w_video_r3d_train.py [--steps 30] [--fix channels_last_3d | --fix bf16_channels_last_3d]
        [--fix cudnn_benchmark] [--fix tf32]

Fixes:
  channels_last_3d       model and clips in ``torch.channels_last_3d`` (NDHWC), fp32: cuDNN's
                         channels-last 3-D kernels; whether they beat NCDHW in fp32 is unsure.
  bf16_channels_last_3d  the same layout and the forward under ``torch.autocast(bfloat16)``: bf16
                         tensor-core convolutions and half the activation bytes.
  cudnn_benchmark        ``torch.backends.cudnn.benchmark = True``: cuDNN times its algorithms for
                         each 3-D convolution shape in the first steps and keeps the fastest; its
                         heuristics are less tuned for 3-D than for 2-D. Process-wide: never
                         interleaved.
  tf32                   ``torch.set_float32_matmul_precision("high")``: reaches only the final
                         512 x 400 Linear (the convolutions are TF32 already): a control.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
import torchvision

from _corpus import bf16_autocast, program_args, run, set_precision, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("channels_last_3d", "bf16_channels_last_3d", "cudnn_benchmark", "tf32")
CUDA_ONLY: tuple[str, ...] = ()
CLASSES = 400


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied (``cudnn_benchmark`` is process-wide);
    returns one training step (fresh clips and labels; its loss)."""
    set_precision(fixes)
    if "cudnn_benchmark" in fixes:
        torch.backends.cudnn.benchmark = True
    batch, frames, size = (2, 4, 32) if args.small else (24, 16, 112)
    fmt = torch.contiguous_format
    if fixes & {"channels_last_3d", "bf16_channels_last_3d"}:
        fmt = torch.channels_last_3d
    model = torchvision.models.video.r3d_18(weights=None, num_classes=CLASSES)
    model = model.to(dev, memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    amp = bf16_autocast(dev, "bf16_channels_last_3d" in fixes)

    def step() -> torch.Tensor:
        clips = torch.randn(batch, 3, frames, size, size, device=dev).contiguous(memory_format=fmt)
        labels = torch.randint(0, CLASSES, (batch,), device=dev)
        return train_step(lambda: F.cross_entropy(model(clips), labels), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("channels_last_3d", "bf16_channels_last_3d")],
                                    small_help="tiny clips and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev, not_interleaved={"cudnn_benchmark": "is process-wide"})
    if ran:
        print(f"w_video_r3d_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

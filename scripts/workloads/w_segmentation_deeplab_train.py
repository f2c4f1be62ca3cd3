"""Semantic segmentation training as torchvision's reference recipe writes it: DeepLabV3 with a
MobileNetV3-Large backbone (``deeplabv3_mobilenet_v3_large``, random weights, 21 classes as
Pascal VOC, no auxiliary head; the backbone dilated to output stride 16, the ASPP head's 3x3
convolutions at dilations 12, 24 and 36), batch 8 of 512 x 512 images in fp32 NCHW, SGD with
momentum 0.9 and weight decay 1e-4 (PyTorch's default foreach implementation); fresh random
images and labels made on the GPU each step, about a tenth of the pixels labelled 255 (void,
as VOC marks object borders), the per-pixel cross entropy with ``ignore_index=255`` on the
model's full-resolution output (``model(x)["out"]``: the head's 32 x 32 logits bilinearly
upsampled to 512 x 512 inside the model).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): an fp32 NCHW convolution network at a segmentation resolution: the backbone's
depthwise convolutions, BatchNorm and hardswish passes over large NCHW activations
(memory-bound), the ASPP's dense 3x3 convolutions in TF32 (cuDNN's default), and the loss over
2.1M pixels x 21 classes at full resolution, whose upsampling's backward accumulates into the
32 x 32 logits by atomic adds.

    python w_segmentation_deeplab_train.py [--steps 30] [--fix bf16 | --fix channels_last_bf16]
        [--fix compile] [--fix tf32]

Fixes:
  bf16                bf16 autocast over the forward and the loss (NCHW kept).
  channels_last_bf16  model and images in ``torch.channels_last`` and bf16 autocast (cuDNN's
                      NHWC tensor-core kernels, no layout transposes, half the activation bytes).
  compile             ``torch.compile(model)`` (default mode).
  tf32                ``torch.set_float32_matmul_precision("high")``: a control (cuDNN runs the
                      convolutions as TF32 already, and the model has no Linear layer).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
import torchvision

from _corpus import bf16_autocast, program_args, run, set_precision, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16", "channels_last_bf16", "compile", "tf32")
CUDA_ONLY: tuple[str, ...] = ()
CLASSES = 21
IGNORE = 255        # VOC's void label
VOID_SHARE = 0.1    # the share of pixels labelled void


def pixel_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross entropy over the pixels whose label is not ``IGNORE`` (logits N x C x H x W,
    labels N x H x W), as the reference recipe's criterion computes it."""
    return F.cross_entropy(logits, labels, ignore_index=IGNORE)


def random_labels(batch: int, size: int, dev: torch.device) -> torch.Tensor:
    """Labels in [0, CLASSES), about ``VOID_SHARE`` of them ``IGNORE``: masked on the GPU
    (``masked_fill_``, no boolean indexing, which would wait for the GPU to count the pixels)."""
    labels = torch.randint(0, CLASSES, (batch, size, size), device=dev)
    return labels.masked_fill_(torch.rand(batch, size, size, device=dev) < VOID_SHARE, IGNORE)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh images and
    labels; the step's loss)."""
    set_precision(fixes)
    batch, size = (2, 32) if args.small else (8, 512)
    fmt = torch.channels_last if "channels_last_bf16" in fixes else torch.contiguous_format
    torch.manual_seed(0)
    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=CLASSES, aux_loss=False)
    model = model.to(dev, memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev, bool(fixes & {"bf16", "channels_last_bf16"}))

    def step() -> torch.Tensor:
        images = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=fmt)
        labels = random_labels(batch, size, dev)
        return train_step(lambda: pixel_loss(fwd(images)["out"], labels), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("bf16", "channels_last_bf16")],
                                    small_help="tiny images and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_segmentation_deeplab_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

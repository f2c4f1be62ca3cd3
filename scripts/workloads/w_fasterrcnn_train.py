"""Training torchvision's Faster R-CNN (``fasterrcnn_mobilenet_v3_large_fpn``: a MobileNetV3-Large
FPN backbone, random weights, 21 classes) as its reference script does, in float32: batches of 8
random 512 x 512 images (the model's transform keeps them at 512: min_size=max_size=512), each
with 2-8 random boxes and labels; the sum of the RPN's and the box head's four losses; SGD with
momentum 0.9 and weight decay 1e-4.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): torchvision's detection code works image by image in Python (anchor matching,
the sampling of positives and negatives with ``nonzero`` and ``randperm``, box decoding and
batched NMS per image and level), with small kernels and reads back to the host between them;
and the box head's two fully connected layers (256 x 7 x 7 -> 1024 -> 1024 over 8 x 512 sampled
proposals, about 110 GFLOP a step with their gradients) run as float32 GEMMs.

    python w_fasterrcnn_train.py [--steps 30] [--fix tf32] [--fix bf16] [--fix fewer_proposals]

Fixes:
  tf32             TF32 for float32 matmuls (the box head's GEMMs; cuDNN's convolutions are TF32
                   already).
  bf16             bf16 autocast over the forward and the losses (torchvision's detection models
                   run their box coding and losses in float32 under autocast).
  fewer_proposals  the model's own sizes cut: 600 proposals kept per image before and after the
                   RPN's NMS in training (default 2000) and 128 sampled per image for the box head
                   (default 512): less work per image, a change of the training recipe.
"""
from __future__ import annotations

from typing import Callable

import torch

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16", "fewer_proposals")
CUDA_ONLY: tuple[str, ...] = ()
CLASSES = 21


def random_targets(batch: int, size: int, dev: torch.device, gen: torch.Generator) -> list[dict]:
    """Each image's 2-8 boxes (x1 < x2, y1 < y2, 16 to half the image wide) and labels 1..20."""
    out = []
    for _ in range(batch):
        n = int(torch.randint(2, 9, (), generator=gen))
        wh = torch.randint(16, size // 2 + 1, (n, 2), generator=gen).float()
        xy = torch.rand(n, 2, generator=gen) * (size - wh)
        boxes = torch.cat([xy, xy + wh], 1)
        labels = torch.randint(1, CLASSES, (n,), generator=gen)
        out.append({"boxes": boxes.to(dev), "labels": labels.to(dev)})
    return out


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The detector and SGD with ``fixes`` applied (``tf32`` is set by program_args); returns one
    training step (fresh images and boxes; the summed loss)."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_fpn
    batch, size = (2, 128) if args.small else (8, 512)
    sizes = ({"rpn_pre_nms_top_n_train": 600, "rpn_post_nms_top_n_train": 600, "box_batch_size_per_image": 128}
             if "fewer_proposals" in fixes else {})
    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None, num_classes=CLASSES,
                                              min_size=size, max_size=size, **sizes).to(dev).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    amp = bf16_autocast(dev, "bf16" in fixes)
    gen = torch.Generator().manual_seed(0)

    def step() -> torch.Tensor:
        images = list(torch.rand(batch, 3, size, size, device=dev).unbind(0))
        targets = random_targets(batch, size, dev, gen)
        return train_step(lambda: sum(model(images, targets).values()), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_fasterrcnn_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

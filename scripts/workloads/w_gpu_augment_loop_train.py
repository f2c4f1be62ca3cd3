"""Training a small image classifier whose data augmentation runs on the GPU one image at a
time: 4,096 uint8 images of 3 x 160 x 160 kept on the GPU; each step draws a batch of 128 and,
per image in a Python loop, takes a random square crop (side 128-160), resizes it to 128 x 128
(bilinear), flips it half the time, scales its brightness and normalises it, writing it into the
batch. The model: a ResNet-style network of four stages (64-512 channels, one basic block
each) and 100 classes, bf16 autocast over fp32 weights, SGD with momentum (foreach on CUDA).
The crops, flips and brightness come from a seeded Python generator (the same in every variant).

Each step is an NVTX range ``train_step`` holding ``augment``, ``forward``, ``backward`` and
``optimizer``.

Defect: about seven launches of tiny kernels per image (a slice converted to float, the
resize, the flip, the brightness, the normalisation, the copy into the batch), 900 a step,
issued from Python, while the network's own work is a few dozen convolutions over the batch.

    python w_gpu_augment_loop_train.py [--steps 40] [--fix batched_augment] [--fix compile]
                                       [--fix channels_last]

Fixes:
  batched_augment  the whole batch augmented at once: each image's crop, resize and flip as one
                   affine sampling grid (``F.affine_grid`` + ``F.grid_sample``, the same bilinear
                   samples), brightness and normalisation as batched products: about ten launches.
  compile          ``torch.compile(model)`` (default mode), the augmentation loop unchanged.
  channels_last    model and batch in channels-last memory format.
"""
from __future__ import annotations

import random
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("batched_augment", "compile", "channels_last")
CUDA_ONLY: tuple[str, ...] = ()
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.down(x))


def net(width: int, classes: int) -> nn.Module:
    w = [width, 2 * width, 4 * width, 8 * width]
    return nn.Sequential(nn.Conv2d(3, w[0], 3, 2, 1, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU(),
                         Basic(w[0], w[0], 1), Basic(w[0], w[1], 2), Basic(w[1], w[2], 2), Basic(w[2], w[3], 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w[3], classes))


def draws(rng: random.Random, n: int, side: int, out: int) -> list[tuple[int, int, int, bool, float]]:
    """Each image's crop (side, left, top), flip and brightness factor."""
    got = []
    for _ in range(n):
        s = rng.randint(out, side)
        got.append((s, rng.randint(0, side - s), rng.randint(0, side - s), rng.random() < 0.5, rng.uniform(0.8, 1.2)))
    return got


def augment_loop(imgs: torch.Tensor, params, out: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The batch augmented one image at a time (uint8 [B, 3, H, W] in, float [B, 3, out, out])."""
    batch = torch.empty(imgs.shape[0], 3, out, out, device=imgs.device)
    for i, (s, x0, y0, flip, bright) in enumerate(params):
        crop = imgs[i, :, y0:y0 + s, x0:x0 + s].float()[None] / 255
        crop = F.interpolate(crop, size=(out, out), mode="bilinear", align_corners=False)
        if flip:
            crop = crop.flip(-1)
        batch[i] = ((crop * bright - mean) / std)[0]
    return batch


def augment_batched(imgs: torch.Tensor, params, out: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """The same samples for the whole batch at once: a crop of side s at (x0, y0) resized with
    bilinear sampling (align_corners=False) is the affine grid x -> s/W x + (2 x0 + s)/W - 1
    (negated scale for a flip), no sample falling outside the crop since s >= out."""
    W = imgs.shape[-1]
    theta = torch.tensor([[[(-s if flip else s) / W, 0.0, (2 * x0 + s) / W - 1], [0.0, s / W, (2 * y0 + s) / W - 1]]
                          for s, x0, y0, flip, _ in params])
    bright = torch.tensor([p[4] for p in params]).view(-1, 1, 1, 1)
    theta, bright = theta.to(imgs.device, non_blocking=True), bright.to(imgs.device, non_blocking=True)
    grid = F.affine_grid(theta, [imgs.shape[0], 3, out, out], align_corners=False)
    x = F.grid_sample(imgs.float() / 255, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return (x * bright - mean) / std


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The image store, model and optimizer with ``fixes`` applied; returns one training step
    (a fresh batch drawn and augmented; the step's loss, kept on the GPU)."""
    n_images, side, out, batch, width, classes = 4096, 160, 128, 128, 64, 100
    if args.small:
        n_images, side, out, batch, width, classes = 16, 24, 16, 4, 8, 5
    torch.manual_seed(0)
    images = torch.randint(0, 256, (n_images, 3, side, side), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, classes, (n_images,), device=dev)
    mean, std = (torch.tensor(v, device=dev).view(1, 3, 1, 1) for v in (MEAN, STD))
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    model = net(width, classes).to(dev, memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    fwd = torch.compile(model) if "compile" in fixes else model
    augment = augment_batched if "batched_augment" in fixes else augment_loop
    amp = bf16_autocast(dev)
    rng, pick = random.Random(1), torch.Generator(device=dev).manual_seed(1)
    x = {}

    def prepare() -> None:
        idx = torch.randint(0, n_images, (batch,), device=dev, generator=pick)
        with nvtx("augment"):
            x["in"] = augment(images[idx], draws(rng, batch, side, out), out, mean, std).contiguous(memory_format=fmt)
            x["y"] = labels[idx]

    def step() -> torch.Tensor:
        return train_step(lambda: F.cross_entropy(fwd(x["in"]), x["y"]), opt, amp, before=prepare).detach()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    small_help="tiny images, network and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_gpu_augment_loop_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

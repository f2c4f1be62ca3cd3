"""ResNet-18 training (torchvision, random weights, bf16 autocast, channels_last, SGD) on 128 x 128
crops whose augmentation is plain numpy inside the training loop: no DataLoader, no workers.

The data set is 512 uint8 images of 144 x 144 x 3 in host memory. Each sample is cropped at a
random offset, flipped half the time, converted to float and normalised per channel, then the
batch of 128 is stacked into NCHW and copied to the GPU. The data preparation sits between the
NVTX ranges (as in many loops, nobody annotated it); each step's GPU work is an NVTX range
``train_step`` holding ``copy_in``, ``forward``, ``backward`` and ``optimizer``.

Defect: the numpy work takes tens of ms a batch on one core, while the GPU needs a few ms for
the step: the GPU waits for the CPU most of the time.

    python w_numpy_aug_train.py [--steps 40] [--fix workers | --fix gpu_aug]

Fixes:
  workers  the same per-sample augmentation in a ``Dataset``, read through a ``DataLoader`` with
           8 worker processes, ``pin_memory=True`` and prefetching: samples are prepared in
           parallel, ahead of the step, and copied with ``non_blocking=True``.
  gpu_aug  only the uint8 crops' source images are gathered on the CPU (one numpy fancy-index)
           and copied as uint8; crop, flip, float conversion and normalisation run as a few
           batched GPU kernels.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch
import torchvision

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("workers", "gpu_aug")
CUDA_ONLY: tuple[str, ...] = ()
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


class Augmented(torch.utils.data.Dataset):
    """Sample k: a random crop of a random image, flipped half the time, normalised, CHW float32."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, crop: int, length: int) -> None:
        self.images, self.labels, self.crop, self.length = images, labels, crop, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k: int):
        rng = np.random.default_rng(k)
        i = int(rng.integers(len(self.images)))
        oy, ox = rng.integers(0, self.images.shape[1] - self.crop + 1, size=2)
        img = self.images[i, oy:oy + self.crop, ox:ox + self.crop]
        if rng.random() < 0.5:
            img = img[:, ::-1]
        x = (img.astype(np.float32) / 255.0 - MEAN) / STD
        return np.ascontiguousarray(x.transpose(2, 0, 1)), int(self.labels[i])


def gpu_batch(images: np.ndarray, labels: np.ndarray, crop: int, batch: int, rng: np.random.Generator,
              dev: torch.device):
    """The same augmentation with the per-pixel work on the GPU."""
    idx = rng.integers(len(images), size=batch)
    raw = torch.from_numpy(images[idx]).to(dev)  # uint8 N x H x W x C: a quarter of the float bytes
    pad = images.shape[1] - crop
    off = torch.randint(0, pad + 1, (batch, 2), device=dev)     # crop offsets and flips drawn on the GPU
    flip = torch.rand(batch, device=dev) < 0.5
    ar = torch.arange(crop, device=dev)
    rows = off[:, 0, None] + ar                                   # N x crop
    cols = off[:, 1, None] + torch.where(flip[:, None], crop - 1 - ar, ar)
    n = torch.arange(batch, device=dev)[:, None, None]
    x = raw[n, rows[:, :, None], cols[:, None, :]]                # N x crop x crop x C
    mean = torch.tensor(MEAN, device=dev)
    std = torch.tensor(STD, device=dev)
    x = (x.float() / 255.0 - mean) / std
    y = torch.from_numpy(labels[idx]).to(dev)
    return x.permute(0, 3, 1, 2), y  # NCHW view of NHWC memory: already channels_last


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The data, model and optimizer with ``fixes`` applied; returns one step of the loop (the
    data preparation, then the annotated training step; its loss)."""
    rng = np.random.default_rng(0)
    n_img, size, crop, batch, classes, workers = 512, 144, 128, 128, 100, 8
    if args.small:
        n_img, size, crop, batch, classes, workers = 16, 40, 32, 4, 10, 2
    images = rng.integers(0, 256, (n_img, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, classes, n_img)
    # (an interleaved run takes more steps than --steps: the samples wrap around the data set)
    data = Augmented(images, labels, crop, batch * args.steps)

    model = torchvision.models.resnet18(num_classes=classes).to(dev, memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)

    if "workers" in fixes:
        loader = torch.utils.data.DataLoader(
            data, batch_size=batch, num_workers=workers, pin_memory=dev.type == "cuda",
            persistent_workers=True, prefetch_factor=4)
        batches = iter(loader)
    count = itertools.count()

    def step() -> torch.Tensor:
        k = next(count) % args.steps
        # data preparation: outside the step range, as written by most users
        if "workers" in fixes:
            x, y = next(batches)
        elif "gpu_aug" not in fixes:
            samples = [data[k * batch + j] for j in range(batch)]
            x = torch.from_numpy(np.stack([s[0] for s in samples]))
            y = torch.tensor([s[1] for s in samples])
        with nvtx("train_step"):
            with nvtx("copy_in"):
                if "gpu_aug" in fixes:
                    x, y = gpu_batch(images, labels, crop, batch, rng, dev)
                else:
                    x = x.to(dev, non_blocking="workers" in fixes)
                    y = y.to(dev, non_blocking="workers" in fixes)
                x = x.contiguous(memory_format=torch.channels_last)
            with nvtx("forward"), torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with nvtx("backward"):
                loss.backward()
            with nvtx("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        return loss
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=({"workers", "gpu_aug"},),
                                    small_help="tiny images and batch, for a CPU smoke run")
    # (its workers would prepare batches while the other variants' blocks run)
    ran = run(build, args, fixes, dev, not_interleaved={"workers": "prefetches in the background"})
    if ran:
        print(f"w_numpy_aug_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

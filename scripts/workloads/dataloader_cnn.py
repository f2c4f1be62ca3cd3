"""A ResNet-18 training loop fed by a DataLoader whose samples are prepared on the CPU.

NVTX ranges `data` (waiting for the next batch) and `train_step` (copy in, forward, backward,
optimizer) are siblings, as most training loops annotate them.

    python dataloader_cnn.py [--steps 16] [--workers 0] [--pin]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torchvision


class Synthetic(torch.utils.data.Dataset):
    """Decode-and-augment stand-in: per-sample numpy work, as image pipelines do."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        img = rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8)
        x = img.astype(np.float32) / 255.0
        x = (x - x.mean(axis=(0, 1))) / (x.std(axis=(0, 1)) + 1e-6)
        if i % 2:
            x = x[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))), i % 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--pin", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = torch.utils.data.DataLoader(
        Synthetic(args.batch * args.steps, args.size), batch_size=args.batch,
        num_workers=args.workers, pin_memory=args.pin,
        persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers else None)
    nvtx = torch.cuda.nvtx
    it = iter(loader)
    for _ in range(args.steps):
        with nvtx.range("data"):
            x, y = next(it)
        with nvtx.range("train_step"):
            x = x.cuda(non_blocking=args.pin).to(memory_format=torch.channels_last)
            y = y.cuda(non_blocking=args.pin)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()

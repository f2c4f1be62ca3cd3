"""GPU-bound inference: ResNet-50, bf16, channels_last, batch 128, one NVTX range `infer` a batch.

    python cnn_infer.py [--iters 20]
"""
from __future__ import annotations

import argparse
import contextlib

import torch
import torchvision


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda().to(torch.bfloat16, memory_format=torch.channels_last).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last)
    with torch.no_grad():
        for i in range(args.iters):
            mark = torch.cuda.nvtx.range("ncu_iter") if i == args.iters // 2 else contextlib.nullcontext()
            with mark, torch.cuda.nvtx.range("infer"):
                y = model(x)
    torch.cuda.synchronize()
    print(f"out {tuple(y.shape)}")


if __name__ == "__main__":
    main()

"""GPU-bound inference: ResNet-50, bf16, channels_last, batch 128, one NVTX range `infer` a batch.

    python cnn_infer.py [--iters 20] [--compile]

``--compile`` is the fix for eager BatchNorm/ReLU/add passes between convolutions (profkit rule
PK403): Inductor freezing folds BatchNorm into the convolution weights and fuses ReLU and the
residual adds, ``torch.compile`` in its default mode. Compilation and two warm-up batches run
before the first ``infer`` range.
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
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile with Inductor freezing (BatchNorm folded into the convolutions)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda().to(torch.bfloat16, memory_format=torch.channels_last).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last)
    if args.compile:
        import torch._inductor.config as inductor_config
        inductor_config.freezing = True
        model = torch.compile(model)
        with torch.no_grad():
            for _ in range(2):
                model(x)
        torch.cuda.synchronize()
        print("compiled (freezing)", flush=True)
    with torch.no_grad():
        for i in range(args.iters):
            mark = torch.cuda.nvtx.range("ncu_iter") if i == args.iters // 2 else contextlib.nullcontext()
            with mark, torch.cuda.nvtx.range("infer"):
                y = model(x)
    torch.cuda.synchronize()
    print(f"out {tuple(y.shape)}")


if __name__ == "__main__":
    main()

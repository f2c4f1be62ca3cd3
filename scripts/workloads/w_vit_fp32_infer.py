"""torchvision ViT-B/16 image classification (random weights) in plain fp32, batch 64 at 224 x 224:
GPU-bound, the matrix products run on fp32 FMA units.

Each batch (fresh random images) is an NVTX range ``infer``; the predicted classes stay on the
GPU and are read once after the loop. Added to the corpus after the rules' fp32/bf16 pricing was
last changed, to judge it on a model it was not built on: torchvision's encoder runs
``nn.MultiheadAttention`` (its fused inference path where it can), not HF's attention.

    python w_vit_fp32_infer.py [--steps 40] [--fix tf32 | --fix bf16_autocast]

Fixes:
  tf32           ``torch.set_float32_matmul_precision("high")``: the fp32 GEMMs run on tensor
                 cores in TF32.
  bf16_autocast  the forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``.
"""
from __future__ import annotations

import contextlib

import torch
import torchvision

from _corpus import nvtx, program_args  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16_autocast")
CUDA_ONLY: tuple[str, ...] = ()


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, alternatives=({"tf32", "bf16_autocast"},),
                                    steps_help="batches (the first ones are warm-up)")
    if args.small:
        model = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2,
                                                     num_heads=2, hidden_dim=64, mlp_dim=128)
        batch, size = 2, 32
    else:
        model = torchvision.models.vit_b_16()  # 12 layers, hidden 768, 12 heads
        batch, size = 64, 224
    model = model.to(dev).eval()
    amp = (torch.autocast(dev.type, dtype=torch.bfloat16) if "bf16_autocast" in fixes
           else contextlib.nullcontext())
    preds = []
    with torch.no_grad():
        for _ in range(args.steps):
            x = torch.randn(batch, 3, size, size, device=dev)
            with nvtx("infer"), amp:
                preds.append(model(x).argmax(-1))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"w_vit_fp32_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
          f"last preds {preds[-1][:4].tolist()}")


if __name__ == "__main__":
    main()

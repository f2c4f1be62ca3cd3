"""ResNet-18 training (torchvision, random weights) in plain fp32 and PyTorch's default NCHW
layout, batch 128 of 224 x 224 images, SGD with momentum (foreach): GPU-bound. cuDNN runs the
convolutions (forward, data and weight gradients) as TF32, transposing to and from NHWC.

Each step (fresh random images and labels, made on the GPU) is an NVTX range ``train_step``
holding ``forward``, ``backward`` and ``optimizer``. A program the step model was not built on:
captured and timed in one allocation, after PK305 (fp32 convolutions) was written, to judge its
training path (autocast's weight casts, the backward's convolutions).

    python w_resnet18_fp32_train.py [--steps 40] [--arch resnet50]
                                    [--fix channels_last | --fix bf16_channels_last] [--fix fused_sgd]
                                    [--fix tf32] [--fix compile]

``--arch`` picks another torchvision classifier, trained the same way: ResNet-50 (bottleneck
blocks), DenseNet-121 (BatchNorm and concatenations between thin convolutions), EfficientNet-B0
(depthwise convolutions, SiLU, squeeze-and-excitation), ResNeXt-50 (grouped convolutions),
MobileNetV3-Large (depthwise convolutions, hardswish) and ConvNeXt-Tiny (7x7 depthwise
convolutions, LayerNorm, GELU MLPs): CNNs the step model was not built on, to test PK305; and
Swin-T (a vision transformer of shifted-window attention: its fp32 GEMMs, PK302's).

Fixes:
  channels_last       model and input in ``torch.channels_last``, still fp32.
  bf16_channels_last  channels_last, and the forward and loss under
                      ``torch.autocast("cuda", dtype=torch.bfloat16)``.
  fused_sgd           ``SGD(fused=True)``.
  tf32                ``torch.set_float32_matmul_precision("high")``: cuDNN already runs the
                      convolutions as TF32, so it reaches the GEMMs (Linear layers) only.
  compile             the model under ``torch.compile`` (default mode); the optimizer step
                      stays eager.
"""
from __future__ import annotations

import torch
import torchvision

from _corpus import bf16_autocast, finish, program_args, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("channels_last", "bf16_channels_last", "fused_sgd", "tf32", "compile")
CUDA_ONLY: tuple[str, ...] = ()
ARCHS = ("resnet18", "resnet50", "densenet121", "efficientnet_b0", "resnext50_32x4d",
         "mobilenet_v3_large", "convnext_tiny", "swin_t")


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=({"channels_last", "bf16_channels_last"},),
                                    small_help="tiny batch and images, for a CPU smoke run",
                                    more=lambda ap: ap.add_argument("--arch", default="resnet18",
                                                                    choices=ARCHS))
    batch, size = (2, 64) if args.small else (128, 224)
    layout = torch.channels_last if fixes & {"channels_last", "bf16_channels_last"} else torch.contiguous_format
    model = getattr(torchvision.models, args.arch)(num_classes=1000).to(dev, memory_format=layout).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5,
                          fused=True if "fused_sgd" in fixes else None)
    amp = bf16_autocast(dev, "bf16_channels_last" in fixes)
    net = torch.compile(model) if "compile" in fixes else model
    for _ in range(args.steps):
        x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=layout)
        y = torch.randint(0, 1000, (batch,), device=dev)
        loss = train_step(lambda: torch.nn.functional.cross_entropy(net(x), y), opt, amp)
    finish(dev)
    print(f"w_resnet18_fp32_train ({args.arch}): {args.steps} steps, fixes {sorted(fixes) or 'none'}, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()

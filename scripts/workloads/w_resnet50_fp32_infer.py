"""torchvision ResNet-50 image classification (random weights) in plain fp32 and PyTorch's default
NCHW layout, batch 128 at 224 x 224: GPU-bound. cuDNN runs the convolutions as TF32 on the tensor
cores (its default), transposing activations to and from NHWC around them.

Each batch (fresh random images made on the GPU) is an NVTX range ``infer``; the predicted
classes stay on the GPU and are read once after the loop. A program the step model was not built
on: captured and timed in one allocation after PK305 (fp32 convolutions) was written.

    python w_resnet50_fp32_infer.py [--steps 40] [--arch efficientnet_b0] [--batch 128]
                                    [--fix channels_last | --fix bf16_channels_last] [--fix tf32]
                                    [--fix cuda_graph] [--fix freeze_compile]
    python w_resnet50_fp32_infer.py --batch 4 --interleave OUT.json --variants baseline,tf32,cuda_graph

``--arch`` picks another torchvision classifier (EfficientNet-B0: PyTorch's own NCHW depthwise
kernels, a CNN PK305's depthwise estimate was not built on in inference; MobileNetV3-Large and
ConvNeXt-Tiny, depthwise convolutions with squeeze-and-excitation or LayerNorm, added after
PK305's bf16 exceptions as a test of them; RegNetY-800MF, grouped convolutions and
squeeze-and-excitation, added after that). ``--batch`` below 128 makes the CPU's launch path the
pace: ResNet-50 at batch 4 is about 170 launches of a few microseconds of GPU work each.

Fixes:
  channels_last       model and input in ``torch.channels_last``, still fp32.
  bf16_channels_last  model and input in bf16 and ``torch.channels_last``.
  tf32                ``torch.set_float32_matmul_precision("high")``: only the final Linear is a
                      matmul; the convolutions already run as TF32.
  cuda_graph          the forward captured once in a CUDA graph (``torch.cuda.graph``) on a static
                      input buffer; each batch is copied into it and the graph replayed: one
                      launch a batch instead of one a layer.
  freeze_compile      ``torch.compile`` with Inductor's freezing (``torch._inductor.config.freezing``):
                      the weights taken as constants, BatchNorm folded into the convolutions, the
                      activations and residual adds fused into their epilogues (PK403's fix).
"""
from __future__ import annotations

from typing import Callable

import torch
import torchvision

from _corpus import graphed, nvtx, program_args, run, set_precision  # noqa: E402 (the workloads' shared helpers)

FIXES = ("channels_last", "bf16_channels_last", "tf32", "cuda_graph", "freeze_compile")
CUDA_ONLY = ("cuda_graph",)


def _more(ap) -> None:
    ap.add_argument("--arch", default="resnet50", choices=("resnet50", "efficientnet_b0", "mobilenet_v3_large",
                                                           "convnext_tiny", "regnet_y_800mf"))
    ap.add_argument("--batch", type=int, default=128, help="images a batch (128; 2 with --small)")


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model with ``fixes`` applied; returns one batch's step (fresh images, the forward in
    an NVTX range ``infer``, the predicted classes)."""
    set_precision(fixes)
    batch, size = (2, 32) if args.small else (args.batch, 224)
    model = getattr(torchvision.models, args.arch)().to(dev).eval()
    dtype = torch.bfloat16 if "bf16_channels_last" in fixes else torch.float32
    layout = torch.channels_last if fixes & {"channels_last", "bf16_channels_last"} else torch.contiguous_format
    model = model.to(dtype=dtype, memory_format=layout)
    forward = model
    if "freeze_compile" in fixes:
        # freezing is Inductor's global switch; no other variant of this program compiles
        torch._inductor.config.freezing = True
        forward = torch.compile(model)
    if "cuda_graph" in fixes:
        forward = graphed(model, torch.randn(batch, 3, size, size, device=dev, dtype=dtype)
                          .contiguous(memory_format=layout))

    @torch.no_grad()
    def step() -> torch.Tensor:
        x = torch.randn(batch, 3, size, size, device=dev, dtype=dtype).contiguous(memory_format=layout)
        with nvtx("infer"):
            return forward(x).argmax(-1)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=({"channels_last", "bf16_channels_last"},),
                                    steps_help="batches (the first ones are warm-up)",
                                    more=_more)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_resnet50_fp32_infer ({args.arch}): {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"last preds {ran[1][-1][:4].tolist()}")


if __name__ == "__main__":
    main()

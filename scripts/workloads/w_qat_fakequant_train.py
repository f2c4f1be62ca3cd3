"""Quantization-aware training (QAT) of a small convolutional classifier with PyTorch's eager
QAT flow, as its tutorial-derived code often runs it: eight 3x3 conv-BN-ReLU layers (64 to 256
channels, stride 2 every other layer), global pooling and a linear head, prepared with
``torch.ao.quantization.prepare_qat`` and the x86 QAT config (per-channel int8 weights, uint8
activations, each observed by a moving-average min/max observer fused with its fake-quantize);
batch 128 of 64 x 64 images, fp32, SGD with momentum. The conv, BN and ReLU are not fused first,
and the observers stay on for the whole run.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): every layer's output and weights pass through a fake-quantize (a read and a
write of the activation, with its min/max reduction) on top of the BN and ReLU passes: the
elementwise work of a QAT step is several times its float twin's, while its convolutions are
the same.

    python w_qat_fakequant_train.py [--steps 30] [--fix fused_modules] [--fix freeze_observers] [--fix compile]

Fixes:
  fused_modules     conv, BN and ReLU fused for QAT first (``fuse_modules_qat``): one fake-quantize
                    per layer's output instead of one after the conv and one after the ReLU.
  freeze_observers  the observers disabled (``disable_observer``): the fake-quantize keeps its
                    scales, no min/max reduction a step (done once calibrated, as QAT recipes do
                    after the first epochs).
  compile           ``torch.compile(model)`` (default mode).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.ao.quantization as tq
import torch.nn as nn
import torch.nn.functional as F

from _corpus import program_args, run, train_step  # noqa: E402

FIXES = ("fused_modules", "freeze_observers", "compile")
CUDA_ONLY: tuple[str, ...] = ()


class Net(nn.Module):
    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        layers, c_in = [], 3
        for i, c in enumerate(widths):
            layers += [nn.Conv2d(c_in, c, 3, stride=2 if i % 2 else 1, padding=1, bias=False),
                       nn.BatchNorm2d(c), nn.ReLU()]
            c_in = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))

    def fuse(self) -> None:
        """conv, BN and ReLU of each layer as one QAT module (its names in ``features``)."""
        n = len(self.features) // 3
        tq.fuse_modules_qat(self, [[f"features.{3 * i}", f"features.{3 * i + 1}", f"features.{3 * i + 2}"]
                                   for i in range(n)], inplace=True)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The QAT model and optimizer with ``fixes`` applied; returns one training step (fresh
    random images and labels; the step's loss)."""
    widths, classes, batch, size = (64, 64, 128, 128, 256, 256, 256, 256), 100, 128, 64
    if args.small:
        widths, classes, batch, size = (4, 8), 5, 2, 8
    torch.manual_seed(0)
    model = Net(widths, classes).train()
    if "fused_modules" in fixes:
        model.fuse()
    model.qconfig = tq.get_default_qat_qconfig("x86")
    model = tq.prepare_qat(model).to(dev)
    # one step with the observers on: the scales they hold once frozen
    model(torch.randn(batch, 3, size, size, device=dev))
    if "freeze_observers" in fixes:
        model.apply(tq.disable_observer)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fwd = torch.compile(model) if "compile" in fixes else model

    def step() -> torch.Tensor:
        images = torch.randn(batch, 3, size, size, device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        return train_step(lambda: F.cross_entropy(fwd(images), labels), opt)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_qat_fakequant_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

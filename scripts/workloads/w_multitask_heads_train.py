"""Training a multi-label attribute classifier with one head per attribute, as multi-task code
often writes it: a small convolutional backbone (four stride-2 stages of conv-BN-ReLU, 32 to 256
channels, global pooling, a 512-d feature), 40 binary attributes (CelebA's count), each its own
``nn.Linear(512, 1)`` and its own ``binary_cross_entropy_with_logits``, summed in a Python loop
over the heads; batch 64 of 128 x 128 images (fresh random images and labels each step), bf16
autocast, AdamW.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: the 40 heads are 40 tiny GEMMs (64 x 512 x 1), 40 losses and their backward, each a few
kernels launched from Python: about as many launches as the backbone's, for a 40th of a GEMM's
work each, while the GPU waits.

    python w_multitask_heads_train.py [--steps 40] [--fix stacked_heads] [--fix compile] [--fix fused_adamw]

Fixes:
  stacked_heads  the 40 heads as one ``nn.Linear(512, 40)`` (the same weights, stacked) and one
                 loss over the [64, 40] logits: the same sum of the same 40 losses.
  compile        ``torch.compile(model)`` (default mode): the heads' loop is traced into the
                 graph and fused with the losses.
  fused_adamw    ``AdamW(fused=True)`` (a control: 81 small parameter tensors of the heads).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402

FIXES = ("stacked_heads", "compile", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class MultiTask(nn.Module):
    def __init__(self, widths: tuple[int, ...], feat: int, tasks: int, stacked: bool) -> None:
        super().__init__()
        layers, c_in = [], 3
        for w in widths:
            layers += [nn.Conv2d(c_in, w, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
                       nn.Conv2d(w, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            c_in = w
        self.backbone = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, feat), nn.ReLU())
        self.stacked = stacked
        if stacked:
            self.heads = nn.Linear(feat, tasks)
        else:
            self.heads = nn.ModuleList(nn.Linear(feat, 1) for _ in range(tasks))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        f = self.backbone(images)
        if self.stacked:
            return F.binary_cross_entropy_with_logits(self.heads(f), labels, reduction="none").mean(0).sum()
        loss = 0
        for t, head in enumerate(self.heads):
            loss = loss + F.binary_cross_entropy_with_logits(head(f)[:, 0], labels[:, t])
        return loss


def stack_heads(heads: nn.ModuleList) -> nn.Linear:
    """One ``nn.Linear`` holding the heads' weights and biases, row by row (its own initialisation,
    overwritten, draws nothing from the random stream the step's data come from)."""
    with torch.random.fork_rng(devices=[]):
        out = nn.Linear(heads[0].in_features, len(heads))
    with torch.no_grad():
        out.weight.copy_(torch.cat([h.weight for h in heads]))
        out.bias.copy_(torch.cat([h.bias for h in heads]))
    return out


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh images
    and attribute labels; the step's loss)."""
    widths, feat, tasks, batch, size = (32, 64, 128, 256), 512, 40, 64, 128
    if args.small:
        widths, feat, tasks, batch, size = (4, 8), 16, 5, 2, 16
    torch.manual_seed(0)
    model = MultiTask(widths, feat, tasks, stacked=False)
    if "stacked_heads" in fixes:  # the same initial weights as the loop's heads
        heads = stack_heads(model.heads)
        model.stacked, model.heads = True, heads
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                            fused=True if "fused_adamw" in fixes else None)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev)

    def step() -> torch.Tensor:
        images = torch.randn(batch, 3, size, size, device=dev)
        labels = torch.randint(0, 2, (batch, tasks), device=dev).float()
        return train_step(lambda: fwd(images, labels), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_multitask_heads_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

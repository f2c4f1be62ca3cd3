"""Metric learning with a batch-hard triplet loss (Hermans, Beyer and Leibe, 2017: "In Defense of
the Triplet Loss"), its mining written as a Python loop over the anchors, as many
reimplementations write it: an embedding network (a small ResNet for 64 x 64 images: a 3 x 3
stem of 32 channels, four basic blocks of 32, 64, 128 and 256 channels at 64, 32, 16 and 8
pixels, average pooling, a linear layer to a 128-d embedding, L2-normalised), a P x K batch of
32 identities x 4 images (128 images; the identities drawn on the host from 1,000, their labels
moved to the GPU each step), and for each anchor ``pos = (labels == labels[i]).nonzero()``
(itself dropped by a boolean mask), ``neg = (labels != labels[i]).nonzero()``, the hardest
positive (the farthest) and the hardest negative (the nearest) by Euclidean distance, and
``relu(d_ap - d_an + 0.2)`` summed over the anchors into the mean. Images: each identity's fixed
8 x 8 pattern upsampled, plus noise. AdamW (lr 3e-4, weight decay 5e-4, PyTorch's default foreach
implementation), fp32 NCHW (cuDNN's convolutions in TF32, its default).

Each training step is an NVTX range ``train_step`` (``forward``, holding ``mining``, then
``backward``, ``optimizer``).

Defect (if any): the mining loop's 128 anchors each run ~17 small kernels over at most 128 x 128
values and wait for the GPU three times (two ``nonzero`` and a boolean-mask index, whose output
sizes the host must know): ~2,200 launches and 384 waits forward, and a backward of ~5,100 more
tiny kernels (each anchor's norms, max and min, its gathers scattered back into a 128 x 128
gradient), beside an embedding network of ~0.5 GFLOP an image (~65 GFLOP forward at batch 128)
and ~125 launches.

    python w_metric_mining_train.py [--steps 30] [--fix vectorised_mining] [--fix compile]
        [--fix channels_last_bf16] [--fix fused_adamw]

Fixes:
  vectorised_mining   the batch-hard loss over the whole batch at once: ``torch.cdist`` of the
                      embeddings, the hardest positive and negative of every anchor by a masked
                      max and min (the same loss, no loop, no ``nonzero``, no wait).
  compile             ``torch.compile(model)`` (the embedding network; the mining loop stays eager).
  channels_last_bf16  model and images in ``torch.channels_last``, bf16 autocast over the forward
                      and the loss.
  fused_adamw         ``AdamW(fused=True)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("vectorised_mining", "compile", "channels_last_bf16", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
MARGIN = 0.2


def batch_hard_loop(emb: torch.Tensor, labels: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """The batch-hard triplet loss by a loop over the anchors: each anchor's positives and
    negatives found with ``nonzero`` (the host waits for each), its farthest positive and
    nearest negative by Euclidean distance, the hinge averaged over the anchors."""
    losses = []
    for i in range(emb.shape[0]):
        pos = torch.nonzero(labels == labels[i]).squeeze(1)
        pos = pos[pos != i]
        neg = torch.nonzero(labels != labels[i]).squeeze(1)
        hardest_pos = (emb[i] - emb[pos]).norm(dim=1).max()
        hardest_neg = (emb[i] - emb[neg]).norm(dim=1).min()
        losses.append(F.relu(hardest_pos - hardest_neg + margin))
    return torch.stack(losses).mean()


def batch_hard_vectorised(emb: torch.Tensor, labels: torch.Tensor, margin: float = MARGIN) -> torch.Tensor:
    """The same loss over the whole batch: all pairwise distances, the positives' max and the
    negatives' min per row by masks (an anchor is not its own positive)."""
    dist = torch.cdist(emb, emb)
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(emb.shape[0], dtype=torch.bool, device=emb.device)
    hardest_pos = dist.masked_fill(~same | eye, float("-inf")).amax(1)
    hardest_neg = dist.masked_fill(same, float("inf")).amin(1)
    return F.relu(hardest_pos - hardest_neg + margin).mean()


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class Embedder(nn.Module):
    """A small ResNet to an L2-normalised ``dim``-d embedding."""

    def __init__(self, widths: tuple[int, ...], dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()]
        cin = widths[0]
        for i, w in enumerate(widths):
            layers.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.body(x), 1).flatten(1)
        return F.normalize(self.head(x), dim=1)


class PKBatches:
    """P identities x K images a batch: the identities drawn on the host (a P x K sampler's
    labels), each image its identity's fixed pattern (8 x 8, upsampled) plus noise."""

    def __init__(self, identities: int, p: int, k: int, size: int, dev: torch.device) -> None:
        g = torch.Generator().manual_seed(1234)
        self.patterns = torch.randn(identities, 3, 8, 8, generator=g).to(dev)
        self.g = torch.Generator().manual_seed(99)
        self.identities, self.p, self.k, self.size, self.dev = identities, p, k, size, dev

    def next(self, fmt: torch.memory_format) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randperm(self.identities, generator=self.g)[:self.p]
        labels = ids.repeat_interleave(self.k).to(self.dev)
        x = F.interpolate(self.patterns[labels], size=self.size, mode="bilinear", align_corners=False)
        x = x + 0.5 * torch.randn_like(x)
        return x.contiguous(memory_format=fmt), labels


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The embedding network, the sampler and AdamW with ``fixes`` applied; returns one training
    step (a fresh P x K batch; its loss)."""
    widths, dim, identities, p, k, size = (32, 64, 128, 256), 128, 1000, 32, 4, 64
    if args.small:
        widths, dim, identities, p, k, size = (4, 8, 8, 16), 8, 20, 4, 3, 16
    fmt = torch.channels_last if "channels_last_bf16" in fixes else torch.contiguous_format
    torch.manual_seed(0)
    model = Embedder(widths, dim).to(dev, memory_format=fmt).train()
    fwd = torch.compile(model) if "compile" in fixes else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=5e-4,
                            fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "channels_last_bf16" in fixes)
    mine = batch_hard_vectorised if "vectorised_mining" in fixes else batch_hard_loop
    data = PKBatches(identities, p, k, size, dev)

    def forward(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        emb = fwd(x)
        with nvtx("mining"):
            return mine(emb, labels)

    def step() -> torch.Tensor:
        x, labels = data.next(fmt)
        return train_step(lambda: forward(x, labels), opt, amp)
    step.model, step.data, step.forward, step.opt = model, data, forward, opt
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network, images and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_metric_mining_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

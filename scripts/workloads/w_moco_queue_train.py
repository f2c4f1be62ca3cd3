"""MoCo v2 contrastive pre-training (He et al., 2020; Chen et al., 2020) as its reference code
writes it (moco/builder.py), on one GPU: a query encoder (a ResNet-18 written out for 64 x 64
images: a 3 x 3 stem and a max-pool, four stages of two basic blocks, 64 to 512 channels; MoCo
v2's MLP head to 128 dimensions) and a key encoder, its copy, moved towards it (m = 0.999) by a
Python loop over the 64 parameter tensors before each key forward; a queue of 65,536 keys x 128
(earlier batches' keys, unit length) whose write position is a GPU tensor read with ``int()``
at every enqueue; InfoNCE over 1 + 65,536 logits a query (temperature 0.2), the queue cloned
before its product with the queries as the reference does. Batch 256 of two views of random
images (the second flipped, fresh noise on each), SGD (lr 0.03, momentum 0.9, weight decay 1e-4,
PyTorch's default foreach implementation), fp32 NCHW (cuDNN's convolutions in TF32, its
default).

Each training step is an NVTX range ``train_step`` (``forward``, holding ``momentum`` and
``enqueue``, then ``backward``, ``optimizer``).

Defect (if any): about 1.2 TFLOP of convolutions a step (the query encoder forward and backward,
the key encoder forward) with BatchNorm and ReLU passes over fp32 NCHW activations; beside them
the moving average's 128 small launches, a wait for the GPU at each enqueue before the backward
can be launched, and 16.8M float32 logits.

    python w_moco_queue_train.py [--steps 40] [--fix foreach_momentum] [--fix host_pointer]
        [--fix channels_last_bf16] [--fix fused_sgd]

Fixes:
  foreach_momentum    the moving average as ``torch._foreach_mul_`` and ``torch._foreach_add_`` over
                      the two parameter lists: a few multi-tensor kernels instead of 128 launches.
  host_pointer        the queue's write position kept as a Python int: no read from the GPU.
  channels_last_bf16  both encoders and the images in ``torch.channels_last``, bf16 autocast over
                      the forward and the loss (the queue stays float32).
  fused_sgd           ``SGD(fused=True)``.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("foreach_momentum", "host_pointer", "channels_last_bf16", "fused_sgd")
CUDA_ONLY: tuple[str, ...] = ()
MOMENTUM, TEMPERATURE = 0.999, 0.2


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


def encoder(widths: tuple[int, ...], dim: int) -> nn.Sequential:
    """A ResNet-18 for small images and MoCo v2's head: its 128-d embedding (not normalised)."""
    layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    cin = widths[0]
    for i, w in enumerate(widths):
        layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, cin), nn.ReLU(), nn.Linear(cin, dim)]
    return nn.Sequential(*layers)


@torch.no_grad()
def momentum_update(key: list[torch.Tensor], query: list[torch.Tensor], m: float, foreach: bool) -> None:
    """key <- m key + (1 - m) query, tensor by tensor (as the reference) or as two foreach calls."""
    if foreach:
        torch._foreach_mul_(key, m)
        torch._foreach_add_(key, query, alpha=1 - m)
    else:
        for pk, pq in zip(key, query):
            pk.mul_(m).add_(pq, alpha=1 - m)


class KeyQueue:
    """The negatives: ``keys`` [dim, size], the oldest overwritten first; the write position a GPU
    tensor (the reference's ``queue_ptr`` buffer) or, with ``on_host``, a Python int. A batch that
    passes the end wraps around to the start."""

    def __init__(self, dim: int, size: int, dev: torch.device, on_host: bool) -> None:
        self.keys = F.normalize(torch.randn(dim, size, device=dev), dim=0)
        self.ptr = torch.zeros(1, dtype=torch.long, device=dev)
        self.on_host, self.at = on_host, 0

    @torch.no_grad()
    def push(self, k: torch.Tensor) -> None:
        n, size = k.shape[0], self.keys.shape[1]
        ptr = self.at if self.on_host else int(self.ptr)     # int(): a wait for the GPU
        head = min(n, size - ptr)
        self.keys[:, ptr:ptr + head] = k[:head].T
        if head < n:
            self.keys[:, :n - head] = k[head:].T
        ptr = (ptr + n) % size
        if self.on_host:
            self.at = ptr
        else:
            self.ptr[0] = ptr


def info_nce(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, t: float = TEMPERATURE) -> torch.Tensor:
    """The mean cross entropy of each query's positive key (column 0) against the queue's
    negatives, every logit a dot product of unit vectors over ``t``."""
    l_pos = torch.einsum("nc,nc->n", q, k)[:, None]
    l_neg = torch.einsum("nc,ck->nk", q, queue.clone().detach())
    logits = torch.cat([l_pos, l_neg], dim=1) / t
    return F.cross_entropy(logits, torch.zeros(q.shape[0], dtype=torch.long, device=q.device))


def two_views(batch: int, size: int, dev: torch.device, fmt: torch.memory_format) -> tuple[torch.Tensor, torch.Tensor]:
    """Two views of one batch of random images: fresh noise on each, the second flipped."""
    x = torch.rand(batch, 3, size, size, device=dev)
    im_q = x + 0.1 * torch.randn_like(x)
    im_k = x.flip(3) + 0.1 * torch.randn_like(x)
    return im_q.contiguous(memory_format=fmt), im_k.contiguous(memory_format=fmt)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The two encoders, the queue and SGD with ``fixes`` applied; returns one training step
    (fresh images; its loss)."""
    widths, dim, size, batch, queue_size = (64, 128, 256, 512), 128, 64, 256, 65536
    if args.small:
        widths, dim, size, batch, queue_size = (8, 16, 32, 64), 16, 16, 8, 36
    fmt = torch.channels_last if "channels_last_bf16" in fixes else torch.contiguous_format
    torch.manual_seed(0)
    enc_q = encoder(widths, dim).to(dev, memory_format=fmt).train()
    enc_k = copy.deepcopy(enc_q).requires_grad_(False)
    q_params, k_params = list(enc_q.parameters()), list(enc_k.parameters())
    queue = KeyQueue(dim, queue_size, dev, "host_pointer" in fixes)
    opt = torch.optim.SGD(enc_q.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4,
                          fused=True if "fused_sgd" in fixes else None)
    amp = bf16_autocast(dev, "channels_last_bf16" in fixes)
    foreach = "foreach_momentum" in fixes

    def forward(im_q: torch.Tensor, im_k: torch.Tensor) -> torch.Tensor:
        q = F.normalize(enc_q(im_q), dim=1)
        with torch.no_grad():
            with nvtx("momentum"):
                momentum_update(k_params, q_params, MOMENTUM, foreach)
            k = F.normalize(enc_k(im_k), dim=1)
        loss = info_nce(q, k, queue.keys)
        with nvtx("enqueue"):
            queue.push(k)
        return loss

    def step() -> torch.Tensor:
        im_q, im_k = two_views(batch, size, dev, fmt)
        return train_step(lambda: forward(im_q, im_k), opt, amp)
    step.queue, step.enc_q, step.enc_k = queue, enc_q, enc_k
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40,
                                    small_help="tiny encoders, images and queue, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_moco_queue_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

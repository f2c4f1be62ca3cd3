"""L2 regularisation written into the loss, as many training scripts do: ``loss + lam * sum(p.pow(2).sum()
for p in model.parameters())``, beside an optimizer built without weight decay. The model: a
ViT-Tiny for 32 x 32 images (patches of 4: 64 tokens, width 192, 12 blocks of 3 heads, SDPA, MLP
768: 5.4 M parameters in 151 tensors), a batch of 128 (random images made on the GPU), 10
classes, bf16 autocast, Adam (lr 1e-3, PyTorch's default foreach implementation), lam 5e-5.

Each training step is an NVTX range ``train_step`` (``forward``, holding the penalty, then
``backward``, ``optimizer``).

Defect (if any): the penalty is ~460 small kernels forward (a square, a sum and an add per
tensor, in float32 under autocast) and ~460 backward (each tensor's gradient of its square,
added into its .grad), beside the model's ~1,000 kernels a step: its launches and autograd's
nodes, for arithmetic Adam's ``weight_decay`` does inside its own multi-tensor kernels (the same
gradient: ``weight_decay = 2 * lam``).

    python w_explicit_l2_train.py [--steps 30] [--fix adam_weight_decay] [--fix compile]
        [--fix fused_adam]

Fixes:
  adam_weight_decay  no penalty in the loss; ``Adam(weight_decay=2 * lam)``, whose L2 term adds
                     ``2 * lam * p`` to each gradient, as the penalty's backward did.
  compile            ``torch.compile(model)`` (the penalty stays eager, outside the model).
  fused_adam         ``Adam(fused=True)``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("adam_weight_decay", "compile", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()
LAM = 5e-5


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, size: int, patch: int, d: int, depth: int, heads: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, stride=patch)
        self.pos = nn.Parameter(torch.randn((size // patch) ** 2, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(depth)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x).mean(1))


def l2_penalty(model: nn.Module) -> torch.Tensor:
    """lam times the sum of every parameter's squares, one tensor at a time."""
    return LAM * sum(p.pow(2).sum() for p in model.parameters())


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, the batch and Adam with ``fixes`` applied; returns one training step (its loss,
    the penalty included where the program adds it)."""
    size, patch, d, depth, heads, classes, batch = 32, 4, 192, 12, 3, 10, 128
    if args.small:
        size, patch, d, depth, heads, classes, batch = 8, 4, 8, 2, 2, 3, 4
    torch.manual_seed(0)
    model = ViT(size, patch, d, depth, heads, classes).to(dev).train()
    fwd = torch.compile(model) if "compile" in fixes else model
    decay = "adam_weight_decay" in fixes
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=2 * LAM if decay else 0.0,
                           fused=True if "fused_adam" in fixes else None)
    amp = bf16_autocast(dev, True)
    g = torch.Generator(device=dev).manual_seed(4)
    x = torch.randn(batch, 3, size, size, device=dev, generator=g)
    y = torch.randint(0, classes, (batch,), device=dev, generator=g)

    def forward() -> torch.Tensor:
        loss = F.cross_entropy(fwd(x), y)
        if decay:
            return loss
        with nvtx("l2_penalty"):
            return loss + l2_penalty(model)

    def step() -> torch.Tensor:
        return train_step(forward, opt, amp)
    step.model, step.opt, step.batch = model, opt, (x, y)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny network and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_explicit_l2_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()

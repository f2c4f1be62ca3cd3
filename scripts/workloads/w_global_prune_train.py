"""Training with global magnitude pruning whose mask is recomputed every step, as gradual-pruning
scripts often write it: after each optimizer step, the magnitudes of every prunable weight are
concatenated into one vector, ``torch.kthvalue`` finds the global threshold at the target
sparsity (50%), and each weight is multiplied by its mask ``|w| > threshold``. The model: a
GPT-style decoder (6 layers, width 512, 8 heads, SDPA, vocabulary 8,192 tied to the embedding: 23 M weights in
its 24 prunable matrices and the embedding), 16 sequences of 256 tokens, bf16 autocast, AdamW (lr 3e-4,
PyTorch's default foreach implementation).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``,
``prune``).

Defect (if any): ``kthvalue`` over one 23 M-element vector is one selection kernel whose grid is
one block per slice: a single block walks the whole vector in several radix passes, on one of
the GPU's SMs. The rest of ``prune`` (the concatenation, the masks, the multiplications) is ~75
kernels over the weights' bytes.

    python w_global_prune_train.py [--steps 30] [--fix sort_threshold] [--fix every_100]
        [--fix fused_adamw] [--fix compile]

Fixes:
  sort_threshold  the same threshold from ``torch.sort`` of the magnitudes (a device-wide radix
                  sort) instead of ``kthvalue``: the same mask every step.
  every_100       the threshold recomputed every 100 steps (the mask kept and applied in
                  between), as pruning schedules step their sparsity.
  fused_adamw     ``AdamW(fused=True)``.
  compile         ``torch.compile(model)`` (the pruning stays eager).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("sort_threshold", "every_100", "fused_adamw", "compile")
CUDA_ONLY: tuple[str, ...] = ()
SPARSITY = 0.5


class Layer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(seq, d) * 0.02)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.layers = nn.ModuleList([Layer(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos[:ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.ln(x) @ self.tok.weight.t()


def prunable(model: nn.Module) -> list[torch.Tensor]:
    """The weights pruned: every Linear's and the (tied) embedding's."""
    return [m.weight for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))]


def threshold(weights: list[torch.Tensor], by_sort: bool) -> torch.Tensor:
    """The global magnitude under which SPARSITY of the weights fall (the k-th smallest)."""
    mags = torch.cat([w.detach().abs().flatten() for w in weights])
    k = max(int(SPARSITY * mags.numel()), 1)
    if by_sort:
        return torch.sort(mags).values[k - 1]
    return torch.kthvalue(mags, k).values


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, AdamW and the pruning with ``fixes`` applied; returns one training step (a fresh
    batch; its loss)."""
    vocab, d, layers, heads, batch, seq = 8192, 512, 6, 8, 16, 256
    if args.small:
        vocab, d, layers, heads, batch, seq = 64, 16, 1, 2, 2, 8
    torch.manual_seed(0)
    model = GPT(vocab, d, layers, heads, seq).to(dev).train()
    fwd = torch.compile(model) if "compile" in fixes else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, True)
    weights = prunable(model)
    g = torch.Generator(device=dev).manual_seed(5)
    state = {"step": 0, "masks": None}
    every = 100 if "every_100" in fixes else 1

    @torch.no_grad()
    def prune() -> None:
        if state["masks"] is None or state["step"] % every == 0:
            thr = threshold(weights, "sort_threshold" in fixes)
            state["masks"] = [w.abs() > thr for w in weights]
        for w, m in zip(weights, state["masks"]):
            w.mul_(m)
        state["step"] += 1

    def step() -> torch.Tensor:
        ids = torch.randint(0, vocab, (batch, seq + 1), device=dev, generator=g)
        with nvtx("train_step"):
            with nvtx("forward"), amp():
                logits = fwd(ids[:, :-1])
                loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
            with nvtx("backward"):
                loss.backward()
            with nvtx("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            with nvtx("prune"):
                prune()
        return loss.detach()
    step.model, step.weights, step.state = model, weights, state
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    small_help="tiny model and batch, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_global_prune_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

"""A small GPT training step that is already ``torch.compile``d (default mode): plain-PyTorch
decoder, 4 layers, hidden 1024, 16 heads, vocabulary 8192 (tied head), batch 16 x 512 tokens,
bf16 autocast, SDPA attention, AdamW with PyTorch's default implementation (foreach on CUDA).

Each step (fresh random token ids) is an NVTX range ``train_step`` holding ``forward``,
``backward`` and ``optimizer``. Compilation happens during the first steps, which are warm-up:
allow tens of seconds the first time on a machine (Inductor's caches make later runs faster).

Inductor already fused the element-wise work; the step is mostly GEMMs and attention (~3 TFLOP)
launched from generated code, so the GPU, not the CPU, sets the pace.

    python w_compiled_gpt_train.py [--steps 40] [--fix reduce_overhead | --fix fused_adamw]

Fixes:
  reduce_overhead  ``torch.compile(model, mode="reduce-overhead")``: the compiled forward and
                   backward replayed as CUDA graphs (``cudagraph_mark_step_begin()`` each step).
                   Removes launch overhead the GPU-bound step mostly hides: expected <= 1.05x.
  fused_adamw      ``AdamW(fused=True)``: one pass over the 58M fp32 weights and states instead
                   of about ten foreach passes; about 1 ms of a ~7 ms step: expected ~1.1x.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, finish, program_args, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("reduce_overhead", "fused_adamw")
CUDA_ONLY = ("reduce_overhead",)


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2's init: the tied head starts near uniform
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln(x) @ self.tok.weight.t()  # tied head
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)

    vocab, d, heads, layers, batch, seq = 8192, 1024, 16, 4, 16, 512
    if args.small:
        vocab, d, heads, layers, batch, seq = 256, 64, 4, 2, 2, 32
    model = GPT(vocab, d, heads, layers, seq).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)
    graphs = "reduce_overhead" in fixes
    cmodel = torch.compile(model, mode="reduce-overhead" if graphs else None)

    for _ in range(args.steps):
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        # with graphs, a new iteration: the graphs may overwrite the previous step's outputs
        loss = train_step(lambda: cmodel(ids), opt, bf16_autocast(dev),
                          before=torch.compiler.cudagraph_mark_step_begin if graphs else None)
    finish(dev)
    print(f"w_compiled_gpt_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
          f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()

"""BERT-base masked-language-model pre-training on two GPUs with DistributedDataParallel and
``bucket_cap_mb=1``, as a configuration copied from a memory-starved setup leaves it: DDP then
puts every weight matrix in a bucket of its own and the small tensors (biases, LayerNorms) in 1
MB buckets, so each backward launches about 90 all-reduces of 1-94 MB, one after another on
NCCL's stream, each paying NCCL's launch and latency. The model, built from torch.nn: BERT-base
(12 ``nn.TransformerEncoderLayer`` of hidden 768, 12 heads, FFN 3,072, GELU, post-norm, dropout
0.1; vocabulary 30,522, 512 positions), an MLM head tied to the embedding: 110M parameters, 440
MB of fp32 gradients a step. Per rank a batch of 16 x 128 tokens (a short backward, which hides
less of the communication), forward under ``torch.autocast(bfloat16)``, AdamW (PyTorch's default,
foreach on CUDA). Losses stay on the GPU (read once, after the loop).

Launched with ``torchrun --standalone --nproc-per-node 2`` (``_ddp.py``); each step is an NVTX
range ``train_step`` holding ``forward``, ``backward`` and ``optimizer`` (``_corpus.train_step``).

    torchrun --standalone --nproc-per-node 2 w_ddp_small_buckets_train.py [--steps 40]
        [--fix default_buckets] [--fix gradient_as_bucket_view] [--fix static_graph] [--fix fused_adamw]

Fixes:
  default_buckets          ``bucket_cap_mb`` left at DDP's default (25 MB): about 20 all-reduces
                           a step instead of about 90.
  gradient_as_bucket_view  ``DDP(gradient_as_bucket_view=True)``: the gradients are views into
                           the buckets, no copy into and out of them.
  static_graph             ``DDP(static_graph=True)``: the buckets rebuilt once in the order the
                           gradients came, and the used parameters not searched for each step.
  fused_adamw              ``AdamW(fused=True)`` instead of the default foreach.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import _ddp
from _corpus import bf16_autocast, program_args, train_step

FIXES = ("default_buckets", "gradient_as_bucket_view", "static_graph", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class BertMLM(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos, self.typ = nn.Embedding(vocab, d), nn.Embedding(ctx, d), nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d)
        self.drop = nn.Dropout(0.1)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu", batch_first=True),
            layers, enable_nested_tensor=False)
        self.transform, self.ln_head = nn.Linear(d, d), nn.LayerNorm(d)
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.tok.weight  # tied
        for mod in self.modules():  # BERT's initialisation
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.ln(self.tok(ids) + self.pos(pos) + self.typ(torch.zeros_like(ids))))
        x = self.encoder(x)
        logits = self.decoder(self.ln_head(F.gelu(self.transform(x))))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def build(args, fixes: set[str], dev: torch.device) -> tuple[Callable[[], torch.Tensor], nn.Module]:
    """The DDP model and optimizer with ``fixes`` applied; returns (one training step, returning
    its loss on the device; the DDP model)."""
    vocab, ctx, d, layers, heads, batch, seq = 30522, 512, 768, 12, 12, 16, 128
    if args.small:
        vocab, ctx, d, layers, heads, batch, seq = 128, 32, 32, 2, 2, 2, 16
    torch.manual_seed(0)  # every rank and every variant starts from the same weights
    model = BertMLM(vocab, ctx, d, layers, heads).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
              bucket_cap_mb=None if "default_buckets" in fixes else 1,
              gradient_as_bucket_view="gradient_as_bucket_view" in fixes,
              static_graph="static_graph" in fixes)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, weight_decay=0.01,
                            fused=True if "fused_adamw" in fixes else None)
    gen = torch.Generator(device=dev).manual_seed(1000 + torch.distributed.get_rank())
    amp = bf16_autocast(dev)

    def forward() -> torch.Tensor:
        ids = torch.randint(0, vocab, (batch, seq), device=dev, generator=gen)
        # 15% of the positions predicted, the others ignored (BERT's masking, without the mask token)
        keep = torch.rand((batch, seq), device=dev, generator=gen) < 0.15
        return ddp(ids, torch.where(keep, ids, torch.full_like(ids, -100)))

    def step() -> torch.Tensor:
        return train_step(forward, opt, amp).detach()
    return step, ddp


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    _ddp.run(build, args, fixes, dev, "w_ddp_small_buckets_train")


if __name__ == "__main__":
    main()

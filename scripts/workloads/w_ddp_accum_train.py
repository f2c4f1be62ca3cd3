"""GPT-2 small pre-training on two GPUs with DistributedDataParallel and gradient accumulation,
written the way many hand-rolled loops are: every micro-batch's backward all-reduces every
gradient bucket, though only the last micro-batch's gradients are needed. A GPT-2-small-like
decoder built from torch.nn (12 layers, hidden 768, 12 heads, vocabulary 50304, 1,024
positions, tied embeddings; F.scaled_dot_product_attention, causal): 124M parameters, 498 MB of
fp32 gradients a round, all-reduced in DDP's default 25 MB buckets. Per rank and optimizer step,
4 micro-batches of 4 x 1,024 tokens, each forward under ``torch.autocast(bfloat16)``, ``(loss /
4).backward()``; then ``clip_grad_norm_(1.0)`` and AdamW (PyTorch's default, foreach on CUDA).
Losses stay on the GPU (read once, after the loop).

Launched with ``torchrun --standalone --nproc-per-node 2`` (``_ddp.py``); one optimizer step is
an NVTX range ``train_step`` holding per micro-batch ``forward`` and ``backward``, then
``optimizer``.

Defect: 4 all-reduces of every bucket per optimizer step instead of 1: three rounds of 498 MB
each over NVLink, overlapped with the backward as far as DDP's buckets allow, competing with it
for SMs and memory bandwidth, each with its last bucket and DDP's copy-back exposed.

    torchrun --standalone --nproc-per-node 2 w_ddp_accum_train.py [--steps 20] [--fix no_sync]
        [--fix bucket_100mb] [--fix fused_adamw] [--fix bf16_compress]

Fixes:
  no_sync        the first 3 micro-batches' forward and backward inside ``model.no_sync()``:
                 gradients accumulate locally, one all-reduce round per optimizer step.
  bucket_100mb   ``DDP(bucket_cap_mb=100)``: 5 or 6 buckets a round instead of about 20.
  fused_adamw    ``AdamW(fused=True)`` instead of the default foreach.
  bf16_compress  DDP's ``bf16_compress_hook``: gradients all-reduced in bf16 (half the bytes),
                 cast back to fp32.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import _ddp
from _corpus import nvtx, program_args

FIXES = ("no_sync", "bucket_100mb", "fused_adamw", "bf16_compress")
CUDA_ONLY = ("bf16_compress",)  # the hook needs NCCL
ACCUM = 4


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for mod in self.modules():  # GPT-2's initialisation
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def build(args, fixes: set[str], dev: torch.device) -> tuple[Callable[[], torch.Tensor], nn.Module]:
    """The DDP model and optimizer with ``fixes`` applied; returns (one optimizer step over
    ACCUM micro-batches, returning the step's loss on the device; the DDP model)."""
    vocab, ctx, d, layers, heads, micro = 50304, 1024, 768, 12, 12, 4
    if args.small:
        vocab, ctx, d, layers, heads, micro = 128, 16, 32, 2, 2, 2
    torch.manual_seed(0)  # every rank and every variant starts from the same weights
    model = GPT(vocab, ctx, d, layers, heads).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
              bucket_cap_mb=100 if "bucket_100mb" in fixes else None)
    if "bf16_compress" in fixes:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95),
                            fused=True if "fused_adamw" in fixes else None)
    gen = torch.Generator(device=dev).manual_seed(1000 + torch.distributed.get_rank())

    def step() -> torch.Tensor:
        total = torch.zeros((), device=dev)
        with nvtx("train_step"):
            for m in range(ACCUM):
                ids = torch.randint(0, vocab, (micro, ctx), device=dev, generator=gen)
                # the fix: no all-reduce until the last micro-batch's backward
                quiet = ddp.no_sync() if ("no_sync" in fixes and m < ACCUM - 1) else contextlib.nullcontext()
                with quiet:
                    with nvtx("forward"), torch.autocast(dev.type, dtype=torch.bfloat16):
                        loss = ddp(ids) / ACCUM
                    with nvtx("backward"):
                        loss.backward()
                total += loss.detach()
            with nvtx("optimizer"):
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
        return total
    return step, ddp


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=20,
                                    steps_help="optimizer steps (the first ones are warm-up)")
    _ddp.run(build, args, fixes, dev, "w_ddp_accum_train")


if __name__ == "__main__":
    main()

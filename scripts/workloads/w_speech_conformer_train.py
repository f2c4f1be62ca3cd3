"""Speech recognition training with CTC: a hand-written Conformer encoder (conv2d subsampling by 4
over 80 log-mel bins, 8 blocks of d=256 with 4 heads: half-step FFN, self-attention with a
key-padding mask, convolution module with GLU, depthwise conv (kernel 31) and BatchNorm, half-step
FFN, LayerNorm), a linear CTC head over 128 tokens, ``F.ctc_loss``, fp32, AdamW with PyTorch's
default implementation (foreach on CUDA), random weights.

The data: a pool of 2,048 synthetic utterances (random features made on the GPU each step), 4 to
16 s long (400-1,600 frames), with transcripts of about one token per 6 encoder frames. Each step
takes 64 utterances drawn at random (a shuffling sampler), pads them to the longest (rounded up to
16 frames) and masks the padding in attention and in the loss lengths.

Each step is an NVTX range ``train_step`` holding ``forward`` (encoder, head and CTC loss),
``backward`` and ``optimizer``.

Defects: the GEMMs run in fp32 on the CUDA cores (TF32 off by default); a random batch is padded
to its longest utterance, so about a third of the frames are padding; AdamW's foreach passes
over 14M parameters in 248 tensors. The step also issues some 1,300 kernels, and
``F.ctc_loss`` copies the GPU length tensors to the host (the CPU waits for each step's forward
there, as in most CTC training code): at this size the CPU's launching is about as long as the
GPU's fp32 work. (A first look on an H200 at batch 32 and 12 blocks: 83 ms a step, and bf16 gave
1.00x: the CPU set the pace. Hence batch 64 and 8 blocks.)

    python w_speech_conformer_train.py [--steps 30] [--fix bf16] [--fix fused_adamw]
        [--fix compile] [--fix sorted_lengths]

Fixes:
  bf16            the forward under ``torch.autocast(bfloat16)`` (the CTC loss stays fp32 on the
                  log-softmax cast to float).
  fused_adamw     ``AdamW(fused=True)``.
  compile         ``torch.compile(model)`` (default mode): the elementwise passes, LayerNorms,
                  GLU and SiLU fused. The padded length changes from batch to batch, so it
                  compiles once for the first shape and once more with dynamic shapes.
  sorted_lengths  the sampler sorts the pool by length and draws batches of neighbours (shuffled
                  batch order, as a bucketing sampler does): the same utterances, far less
                  padding, so less work per step.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16", "fused_adamw", "compile", "sorted_lengths")
CUDA_ONLY: tuple[str, ...] = ()
FEATS, VOCAB, POOL = 80, 128, 2048


class FFN(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Dropout(0.1),
                                 nn.Linear(4 * d, d), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.5 * self.net(x)


class MHSA(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.norm = heads, nn.LayerNorm(d)
        self.qkv, self.out, self.drop = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        a = self.drop(scores.softmax(-1)) @ v
        return x + self.drop(self.out(a.transpose(1, 2).reshape(b, t, d)))


class ConvModule(nn.Module):
    def __init__(self, d: int, kernel: int = 31) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1, self.dw = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn, self.pw2, self.drop = nn.BatchNorm1d(d), nn.Conv1d(d, d, 1), nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = F.glu(self.pw1(self.norm(x).transpose(1, 2)), dim=1)
        h = h.masked_fill(pad[:, None, :], 0.0)  # padding must not leak into the depthwise conv
        h = self.pw2(F.silu(self.bn(self.dw(h))))
        return x + self.drop(h.transpose(1, 2))


class ConformerBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ff1, self.attn, self.conv, self.ff2 = FFN(d), MHSA(d, heads), ConvModule(d), FFN(d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.norm(self.ff2(self.conv(self.attn(self.ff1(x), pad), pad)))


class Conformer(nn.Module):
    def __init__(self, d: int, heads: int, layers: int) -> None:
        super().__init__()
        self.sub = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
        self.proj = nn.Linear(d * (((FEATS - 1) // 2 - 1) // 2), d)
        self.blocks = nn.ModuleList(ConformerBlock(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, VOCAB)

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.sub(feats[:, None])                       # [B, d, T', F']
        x = self.proj(x.permute(0, 2, 1, 3).flatten(2))    # [B, T', d]
        out_len = ((lengths - 1) // 2 - 1) // 2
        pad = torch.arange(x.shape[1], device=x.device)[None] >= out_len[:, None]
        pos = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)[:, None]
        freqs = torch.exp(torch.arange(0, x.shape[2], 2, device=x.device) * (-math.log(10000.0) / x.shape[2]))
        x = x + torch.cat(((pos * freqs).sin(), (pos * freqs).cos()), -1)  # absolute positions
        for blk in self.blocks:
            x = blk(x, pad)
        return self.head(x).float().log_softmax(-1), out_len


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer and sampler with ``fixes`` applied; returns one training step (a batch
    drawn from the pool; its loss)."""
    d, heads, layers, batch, lo, hi = 256, 4, 8, 64, 400, 1600
    if args.small:
        d, heads, layers, batch, lo, hi = 32, 2, 2, 2, 32, 64
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(lo, hi + 1, (POOL,), generator=gen)
    model = Conformer(d, heads, layers).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, fused=True if "fused_adamw" in fixes else None)
    net = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev, "bf16" in fixes)
    if "sorted_lengths" in fixes:  # neighbours by length make a batch; the batches come shuffled
        order = lengths.argsort().view(-1, batch)
        batches = [order[i] for i in torch.randperm(len(order), generator=gen).tolist()]
    else:
        batches = list(torch.randperm(POOL, generator=gen).view(-1, batch))
    count = [0]

    def step() -> torch.Tensor:
        idx = batches[count[0] % len(batches)]
        count[0] += 1
        lens = lengths[idx]
        frames = -(-int(lens.max()) // 16) * 16  # padded to a multiple of 16 frames
        feats = torch.randn(batch, frames, FEATS, device=dev)
        feats = feats.masked_fill(torch.arange(frames, device=dev)[None, :, None] >= lens.to(dev)[:, None, None], 0)
        tgt_lens = (lens // 24).clamp(min=1)  # about one token per 6 encoder frames
        targets = torch.randint(1, VOCAB, (int(tgt_lens.sum()),), device=dev)
        lens, tgt_lens = lens.to(dev), tgt_lens.to(dev)

        def forward() -> torch.Tensor:
            logp, out_len = net(feats, lens)
            return F.ctc_loss(logp.transpose(0, 1), targets, out_len, tgt_lens, zero_infinity=True)
        return train_step(forward, opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_speech_conformer_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

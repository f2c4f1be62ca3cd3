"""Batch classification with a BERT-base-shaped encoder over texts of very different lengths,
every batch padded to the model's maximum: the encoder written in plain PyTorch (word, position
and token-type embeddings, 12 post-LayerNorm layers of hidden 768, 12 heads and FFN 3072 with
GELU, attention by ``F.scaled_dot_product_attention`` with the additive padding mask BERT builds,
``(1 - mask) * finfo.min``; the pooler's tanh on [CLS] and a 3-class head), random weights in
fp32, run without autocast under ``torch.inference_mode()``.

The data: batches of 32 texts whose token counts follow a skewed, long-tailed distribution
(lognormal, mean about 90 tokens, clipped to 16-512), drawn from a seeded generator in pools of 8
batches, so that every variant sees the same lengths in the same order. Each batch is tokenised
as a tokenizer called with ``padding="max_length", max_length=512`` returns it: fresh random ids
made on the host, [PAD] past each text's end, ``input_ids`` and ``attention_mask`` of [32, 512],
copied to the GPU. The predictions (the logits' argmax) are kept on the GPU and read once at the
end.

Each batch is an NVTX range ``batch`` holding ``copy_in`` and ``forward`` (the encoder, the head
and the argmax).

Defect: about 18% of the 16,384 positions of a batch are text; the rest is padding that every
GEMM, LayerNorm and GELU computes all the same, and the attention over 512 keys for every query.
The GEMMs (~3 TFLOP a batch) also run in fp32 on the CUDA cores (TF32 off, PyTorch's default).

    python w_padded_encoder_infer.py [--steps 48] [--fix pad_to_longest | --fix sort_by_length]
                                     [--fix bf16] [--fix tf32]

Fixes:
  pad_to_longest  each batch padded to its longest text, rounded up to a multiple of 8
                  (``padding="longest", pad_to_multiple_of=8``): about 315 positions a text
                  instead of 512, the longest of 32 draws from a long tail.
  sort_by_length  each pool of 8 batches' texts (256) sorted by length before it is cut into
                  batches, each padded to its longest (rounded up to 8), as a length-grouping
                  sampler does: the same texts, about 130 positions a text.
  bf16            the forward under ``torch.autocast(bfloat16)``: GEMMs and attention on the
                  tensor cores; LayerNorm and the softmax's reductions as autocast runs them.
  tf32            ``torch.set_float32_matmul_precision("high")``: the fp32 GEMMs as TF32 on the
                  tensor cores.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("pad_to_longest", "sort_by_length", "bf16", "tf32")
CUDA_ONLY: tuple[str, ...] = ()
POOL = 8          # batches whose texts sort_by_length sorts together
SIGMA = 0.7       # the lognormal's spread: a long tail of long texts
CLS, PAD = 101, 0


class Layer(nn.Module):
    """BERT's layer: self-attention and FFN, each followed by residual and LayerNorm."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.ln1(x + self.out(a.transpose(1, 2).reshape(b, s, d)))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, ffn: int, max_len: int, classes: int) -> None:
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(vocab, d), nn.Embedding(max_len, d), nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(Layer(d, heads, ffn) for _ in range(layers))
        self.pooler, self.classifier = nn.Linear(d, d), nn.Linear(d, classes)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        x = self.word(ids) + self.pos(torch.arange(s, device=ids.device)) + self.token_type(torch.zeros_like(ids))
        x = self.ln(x)
        # BERT's extended attention mask: 0 where a key is text, the dtype's minimum where it is padding
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def lengths_stream(batch: int, mean: float, lo: int, hi: int, sort: bool):
    """The texts' token counts, a batch at a time: pools of ``POOL`` batches drawn from one seeded
    generator (the same in every variant), each pool's texts in drawn order, or sorted by length
    (``sort``) before they are cut into batches."""
    rng = np.random.default_rng(1)
    mu = np.log(mean) - SIGMA ** 2 / 2          # the lognormal's mean is ``mean``
    while True:
        pool = np.clip(np.round(rng.lognormal(mu, SIGMA, POOL * batch)), lo, hi).astype(np.int64)
        if sort:
            pool = np.sort(pool)
        yield from pool.reshape(POOL, batch)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model with ``fixes`` applied and the stream of lengths; returns one batch's
    classification (its 32 predictions, kept on the GPU)."""
    vocab, d, heads, layers, ffn, max_len, classes, batch, mean, lo = 30522, 768, 12, 12, 3072, 512, 3, 32, 90, 16
    if args.small:
        vocab, d, heads, layers, ffn, max_len, classes, batch, mean, lo = 1000, 64, 4, 2, 256, 64, 3, 4, 12, 4
    torch.manual_seed(0)
    model = Encoder(vocab, d, heads, layers, ffn, max_len, classes).to(dev).eval()
    amp = bf16_autocast(dev, "bf16" in fixes)
    sort = "sort_by_length" in fixes
    longest = sort or "pad_to_longest" in fixes
    lengths = lengths_stream(batch, mean, lo, max_len, sort)

    def step() -> torch.Tensor:
        lens = torch.from_numpy(next(lengths))
        # the tokenizer's output: padding="max_length", or to the longest rounded up to 8
        width = min(max_len, -(-int(lens.max()) // 8) * 8) if longest else max_len
        attention_mask = (torch.arange(width)[None, :] < lens[:, None]).long()
        words = torch.randint(vocab // 30, vocab, (batch, width))  # ids past the special tokens
        input_ids = words.masked_fill(attention_mask == 0, PAD)
        input_ids[:, 0] = CLS
        with nvtx("batch"):
            with nvtx("copy_in"):
                ids, mask = input_ids.to(dev), attention_mask.to(dev)
            with nvtx("forward"), torch.inference_mode(), amp():
                return model(ids, mask).argmax(-1)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=48,
                                    alternatives=[("pad_to_longest", "sort_by_length")],
                                    steps_help="batches (the first ones are warm-up)",
                                    small_help="tiny encoder, short texts and small batches, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        counts = torch.bincount(torch.cat(ran[1]).cpu(), minlength=3).tolist()
        print(f"w_padded_encoder_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"predicted classes {counts}")


if __name__ == "__main__":
    main()

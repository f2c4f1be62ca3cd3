"""A translation model's training step as nn.Transformer's tutorials write it: an encoder-decoder
``nn.Transformer`` (d_model 512, 8 heads, 3 + 3 layers, feed-forward 2048, dropout 0.1) with
source and target embeddings and an output projection over a vocabulary of 8,000, in fp32, on
batches of 32 sentence pairs padded to 64 tokens; label-smoothed cross-entropy that ignores the
padding; Adam. Each step builds its masks on the host, as the tutorials do: the causal target
mask from ``nn.Transformer.generate_square_subsequent_mask`` (a CPU tensor) and the padding
masks from the batch's lengths (a Python list), each copied to the GPU.

Each step is an NVTX range ``train_step`` holding ``forward`` (the masks built inside it),
``backward`` and ``optimizer``.

Defect: the GEMMs in full fp32 (PyTorch's default matmul precision), where TF32 or bf16 would
run them on the tensor cores; and three small pageable copies of masks a step.

    python w_seq2seq_transformer_train.py [--steps 40] [--fix tf32] [--fix bf16] [--fix gpu_masks] [--fix fused_adam]

Fixes:
  tf32        ``torch.set_float32_matmul_precision("high")`` before the model is built.
  bf16        the forward and the loss under bf16 autocast.
  gpu_masks   the causal mask built once on the GPU and the padding masks compared there from
              the lengths' tensor: no copy in the step.
  fused_adam  ``Adam(fused=True)``.
"""
from __future__ import annotations

import random
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("tf32", "bf16", "gpu_masks", "fused_adam")
CUDA_ONLY: tuple[str, ...] = ()
PAD = 0


class Translator(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, ff: int, max_len: int) -> None:
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(max_len, d) * 0.02)
        self.core = nn.Transformer(d, heads, layers, layers, ff, dropout=0.1, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, tgt_mask: torch.Tensor,
                src_pad: torch.Tensor, tgt_pad: torch.Tensor) -> torch.Tensor:
        s = self.src_emb(src) + self.pos[: src.shape[1]]
        t = self.tgt_emb(tgt) + self.pos[: tgt.shape[1]]
        h = self.core(s, t, src_mask=None, tgt_mask=tgt_mask, src_key_padding_mask=src_pad,
                      tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.out(h)


def pad_mask(lengths: list[int], length: int) -> torch.Tensor:
    """True where a position is padding (on the host, as a tutorial's collate builds it)."""
    return torch.arange(length)[None, :] >= torch.tensor(lengths)[:, None]


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer and batch source with ``fixes`` applied; returns one training step
    (its loss)."""
    vocab, d, heads, layers, ff, batch, length = 8000, 512, 8, 3, 2048, 32, 64
    if args.small:
        vocab, d, heads, layers, ff, batch, length = 50, 16, 2, 1, 32, 3, 6
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Translator(vocab, d, heads, layers, ff, length).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True if "fused_adam" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)
    on_gpu = "gpu_masks" in fixes
    causal = nn.Transformer.generate_square_subsequent_mask(length, device=dev) if on_gpu else None
    positions = torch.arange(length, device=dev)

    def loss_of() -> torch.Tensor:
        src_len = [rng.randint(length // 2, length) for _ in range(batch)]
        tgt_len = [rng.randint(length // 2, length) for _ in range(batch)]
        src = torch.randint(1, vocab, (batch, length), device=dev)
        tgt = torch.randint(1, vocab, (batch, length + 1), device=dev)
        if on_gpu:
            sl, tl = (torch.tensor(v).to(dev, non_blocking=True) for v in (src_len, tgt_len))
            src_pad, tgt_pad = positions[None] >= sl[:, None], positions[None] >= tl[:, None]
            tgt_mask = causal
        else:
            src_pad, tgt_pad = pad_mask(src_len, length).to(dev), pad_mask(tgt_len, length).to(dev)
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(length).to(dev)
        src = src.masked_fill(src_pad, PAD)
        tgt_in, tgt_out = tgt[:, :-1].masked_fill(tgt_pad, PAD), tgt[:, 1:].masked_fill(tgt_pad, PAD)
        logits = model(src, tgt_in, tgt_mask, src_pad, tgt_pad)
        return F.cross_entropy(logits.float().reshape(-1, vocab), tgt_out.reshape(-1), ignore_index=PAD,
                               label_smoothing=0.1)

    def step() -> torch.Tensor:
        return train_step(loss_of, opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_seq2seq_transformer_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()

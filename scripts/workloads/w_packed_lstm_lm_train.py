"""Training a recurrent language model on variable-length sequences packed with
``pack_padded_sequence``, as PyTorch's tutorials write it: an embedding (vocabulary 10,000,
dimension 512, padding index 0), ``nn.LSTM(512, 1024, num_layers=2, batch_first=True)`` (cuDNN),
a Linear to the vocabulary; batch 64 of sequences whose lengths are drawn uniformly from 16 to
256 each step (the data's lengths, on the host), their token ids padded to the longest on the
GPU, and the lengths moved to the GPU with the batch (pinned, ``non_blocking``, as a tuned
training loop moves every tensor of its batch). The model packs the embedded batch with
``pack_padded_sequence(emb, lengths.cpu(), batch_first=True, enforce_sorted=False)`` (it takes
host lengths only: the ``.cpu()`` copies them back from the GPU, a wait for the GPU every
step), runs the LSTM, ``pad_packed_sequence`` back; the head over the padded output and the
cross entropy over the real tokens only (padding targets ``ignore_index``); fp32, Adam
(PyTorch's default: foreach).

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): waits for the GPU and padding. Three host copies a step: the lengths' round
trip (``.cpu()``: the GPU drains, then idles while the host launches the packing), and inside
the packing the sort order copied to the GPU from pageable memory (a blocking copy: it waits
for the stream too) and, in ``pad_packed_sequence``, the inverse order copied back to the host
(``unsorted_indices.cpu()``: a wait for the LSTM's forward). The packing itself is a sort, a
gather and one copy per distinct length, forward and backward. And the padding: the head, the
loss and the LSTM's sequential steps run to the longest of 64 lengths drawn from 16-256 (about
252) where the mean length is 136; all in fp32 (the head's GEMMs on the CUDA cores, no TF32).

    python w_packed_lstm_lm_train.py [--steps 30] [--fix cpu_lengths] [--fix sorted_buckets]
        [--fix no_pack] [--fix bf16]

Fixes:
  cpu_lengths     the data's host lengths handed to the model (the batch's other tensors on the
                  GPU as before): ``lengths.cpu()`` is a no-op, no device-to-host copy of them
                  (the packing's own two copies stay).
  sorted_buckets  each batch drawn from one bucket of lengths 16 wide and sorted longest first
                  (a bucketing sampler; the same lengths overall), packed with
                  ``enforce_sorted=True``: little padding, no sort (nor the packing's copies of
                  its order; the lengths' round trip stays).
  no_pack         the LSTM run over the padded batch, the loss masked as before: no packing,
                  no lengths on the host (the outputs at the real tokens are the packed run's:
                  the LSTM is unidirectional).
  bf16            bf16 autocast over the forward and the loss (autocast runs cuDNN's LSTM in
                  float16, the head's GEMMs in bf16).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("cpu_lengths", "sorted_buckets", "no_pack", "bf16")
CUDA_ONLY: tuple[str, ...] = ()
PAD = 0             # the padding token (the embedding's padding index)
IGNORE = -100       # the targets of padded positions (cross entropy's default ignore_index)


class LSTMLM(nn.Module):
    """Embedding, a multi-layer LSTM and a head to the vocabulary; ``forward(tokens, lengths)``
    packs the embedded batch by ``lengths`` (``pack``), sorted longest first already or not
    (``presorted``), or runs the LSTM over the padded batch."""

    def __init__(self, vocab: int, dim: int, hidden: int, layers: int, pack: bool = True,
                 presorted: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)
        self.pack, self.presorted = pack, presorted

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        emb = self.embed(tokens)
        if not self.pack:
            out, _ = self.lstm(emb)
            return self.head(out)
        # pack_padded_sequence refuses lengths on the GPU ("should be a 1D CPU int64 tensor"):
        # the .cpu() users add waits for the GPU where the lengths came with the batch
        packed = pack_padded_sequence(emb, lengths.cpu(), batch_first=True, enforce_sorted=self.presorted)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        return self.head(out)


def draw_lengths(batch: int, lo: int, hi: int, width: int, bucketed: bool,
                 gen: torch.Generator | None = None) -> torch.Tensor:
    """A batch's sequence lengths on the host (int64), each uniform in [lo, hi] overall; with
    ``bucketed``, all from one bucket of ``width`` lengths (lo, lo + width, ...; the last one
    cut at hi), drawn with its share of the lengths, sorted longest first."""
    if not bucketed:
        return torch.randint(lo, hi + 1, (batch,), generator=gen)
    anchor = int(torch.randint(lo, hi + 1, (1,), generator=gen))
    start = lo + (anchor - lo) // width * width
    end = min(start + width - 1, hi)
    return torch.randint(start, end + 1, (batch,), generator=gen).sort(descending=True).values


def make_batch(lengths: torch.Tensor, vocab: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random sequences of ``lengths`` (host) tokens and their next tokens, padded to the longest
    on ``dev``: (inputs, PAD past each length; targets, IGNORE past each length; the lengths
    moved to ``dev`` with the batch: pinned and ``non_blocking`` on a GPU, no wait)."""
    longest = int(lengths.max())
    on_dev = lengths.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else lengths
    ids = torch.randint(1, vocab, (len(lengths), longest + 1), device=dev)
    pad = torch.arange(longest, device=dev)[None] >= on_dev[:, None]
    return ids[:, :-1].masked_fill(pad, PAD), ids[:, 1:].masked_fill(pad, IGNORE), on_dev


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross entropy over the real tokens (targets not ``IGNORE``)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (a fresh batch of
    random sequences; the step's loss)."""
    vocab, dim, hidden, layers, batch, lo, hi, width = 10_000, 512, 1024, 2, 64, 16, 256, 16
    if args.small:
        vocab, dim, hidden, layers, batch, lo, hi, width = 50, 8, 16, 2, 4, 2, 12, 4
    bucketed = "sorted_buckets" in fixes
    torch.manual_seed(0)
    model = LSTMLM(vocab, dim, hidden, layers, pack="no_pack" not in fixes, presorted=bucketed).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    amp = bf16_autocast(dev, "bf16" in fixes)

    def step() -> torch.Tensor:
        lengths = draw_lengths(batch, lo, hi, width, bucketed)
        tokens, targets, on_dev = make_batch(lengths, vocab, dev)
        feed = lengths if "cpu_lengths" in fixes else on_dev
        return train_step(lambda: lm_loss(model(tokens, feed), targets), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_packed_lstm_lm_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

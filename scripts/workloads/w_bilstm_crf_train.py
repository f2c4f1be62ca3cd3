"""Training a BiLSTM-CRF tagger for named-entity recognition: an embedding (vocabulary 30,000,
width 256), a two-layer bidirectional ``nn.LSTM`` (hidden 256 each way, cuDNN), a Linear to 17
tags and a linear-chain CRF whose loss runs the forward algorithm as a Python loop over the 128
positions, as CRF layers are written (pytorch-crf's ``_compute_normalizer``): at each position
``logsumexp(alpha[:, :, None] + transitions + emissions[:, t, None, :], 1)``, kept only where the
sentence has not ended; the gold path's score by gathers. Batches of 64 sentences of 20-128
tokens (padded to 128, a mask), random tokens and tags, Adam, float32.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect (if any): the CRF's loop launches about ten small kernels a position forward and more
backward, each over 64 x 17 x 17 values: a few thousand launches a step whose GPU work is
microseconds each, beside the LSTM's few milliseconds of cuDNN kernels.

    python w_bilstm_crf_train.py [--steps 40] [--fix compile | --fix graph] [--fix bf16]

Fixes:
  compile  ``torch.compile`` of the CRF's negative log-likelihood (Dynamo unrolls the 128
           positions; Inductor fuses each position's ops).
  graph    the whole step (data drawn on the GPU, forward, backward, Adam with capturable=True)
           captured once in a CUDA graph and replayed.
  bf16     bf16 autocast over the forward (the LSTM, the emissions' Linear; the CRF's logsumexp
           runs in float32 under autocast).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from _corpus import bf16_autocast, body_step, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("compile", "graph", "bf16")
CUDA_ONLY = ("graph",)
TAGS = 17


def crf_nll(emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor, transitions: torch.Tensor,
            start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """The linear-chain CRF's mean negative log-likelihood of the gold ``tags`` (batch x length)
    under ``emissions`` (batch x length x tags), ``mask`` (batch x length, bool: a prefix of each
    row) and the ``transitions`` (from x to), ``start`` and ``end`` scores: the forward algorithm's
    log-partition less the gold path's score, one position at a time."""
    b, n, _ = emissions.shape
    rows = torch.arange(b, device=emissions.device)
    # the gold path's score
    score = start[tags[:, 0]] + emissions[rows, 0, tags[:, 0]]
    for t in range(1, n):
        step = transitions[tags[:, t - 1], tags[:, t]] + emissions[rows, t, tags[:, t]]
        score = score + step * mask[:, t]
    last = tags[rows, mask.sum(1) - 1]
    score = score + end[last]
    # the log-partition: the forward algorithm
    alpha = start + emissions[:, 0]
    for t in range(1, n):
        nxt = torch.logsumexp(alpha[:, :, None] + transitions + emissions[:, t, None, :], dim=1)
        alpha = torch.where(mask[:, t, None], nxt, alpha)
    log_z = torch.logsumexp(alpha + end, dim=1)
    return (log_z - score).mean()


class Tagger(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.proj = nn.Linear(2 * hidden, tags)
        self.transitions = nn.Parameter(0.1 * torch.randn(tags, tags))
        self.start = nn.Parameter(0.1 * torch.randn(tags))
        self.end = nn.Parameter(0.1 * torch.randn(tags))

    def emissions(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.lstm(self.embed(tokens))[0])


def random_batch(batch: int, length: int, vocab: int, dev: torch.device,
                 shortest: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, tags and the mask of ``batch`` sentences of ``shortest``-``length`` tokens, padded
    to ``length`` (token 0 and tag 0 past each end), all drawn on ``dev``."""
    lengths = torch.randint(shortest, length + 1, (batch,), device=dev)
    mask = torch.arange(length, device=dev)[None, :] < lengths[:, None]
    tokens = torch.randint(1, vocab, (batch, length), device=dev) * mask
    tags = torch.randint(0, TAGS, (batch, length), device=dev) * mask
    return tokens, tags, mask


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The tagger and Adam with ``fixes`` applied; returns one training step (a fresh batch; its
    loss)."""
    vocab, dim, hidden, batch, length, shortest = ((50, 8, 8, 4, 12, 3) if args.small
                                                   else (30000, 256, 256, 64, 128, 20))
    torch.manual_seed(0)
    model = Tagger(vocab, dim, hidden, TAGS).to(dev)
    graph = "graph" in fixes
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=graph)
    nll = torch.compile(crf_nll) if "compile" in fixes else crf_nll
    amp = bf16_autocast(dev, "bf16" in fixes)

    def forward() -> torch.Tensor:
        tokens, tags, mask = random_batch(batch, length, vocab, dev, shortest)
        with amp():
            em = model.emissions(tokens)
        return nll(em.float(), tags, mask, model.transitions, model.start, model.end)
    return body_step(forward, opt, graph)


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40, alternatives=[("compile", "graph")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_bilstm_crf_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

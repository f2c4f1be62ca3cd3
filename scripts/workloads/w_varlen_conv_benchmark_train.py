"""Training a wav2vec2-style convolutional audio encoder with ``torch.backends.cudnn.benchmark =
True`` on batches padded to their longest clip: 8 clips a batch of 2 to 6 s at 16 kHz (32,000 to
96,000 samples, drawn on the host), zero-padded to the batch's longest, the seven 1-D convolutions
of wav2vec2's feature encoder (512 channels, kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2, GELU,
GroupNorm after the first), a linear projection, mean pooling over the frames and a 35-way
classifier; fp32 weights (cuDNN's convolutions in TF32, PyTorch's default), AdamW.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: ``cudnn.benchmark = True`` makes cuDNN time every algorithm for a convolution the first
time it meets its shape, and the padded length changes with every batch (the longest of 8 random
lengths: thousands of values), so nearly every step benchmarks all seven layers' forward,
backward-data and backward-weight algorithms again, with their workspaces, for one use each.

    python w_varlen_conv_benchmark_train.py [--steps 30] [--fix no_benchmark|bucketed] [--fix bf16]

Fixes:
  no_benchmark  ``cudnn.benchmark = False``: cuDNN's heuristics pick each algorithm at once.
  bucketed      benchmark kept, each batch padded up to the next whole second (16,000 samples):
                five lengths, each benchmarked once (here before the first step).
  bf16          bf16 autocast over the encoder, benchmark and the padding kept.
"""
from __future__ import annotations

import random
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402

FIXES = ("no_benchmark", "bucketed", "bf16")
CUDA_ONLY: tuple[str, ...] = ()
# wav2vec2's feature encoder: (kernel, stride) of each 1-D convolution
LAYERS = ((10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2))


class Encoder(nn.Module):
    def __init__(self, channels: int, dim: int, classes: int) -> None:
        super().__init__()
        convs, c_in = [], 1
        for k, s in LAYERS:
            convs.append(nn.Conv1d(c_in, channels, k, stride=s, bias=False))
            c_in = channels
        self.convs = nn.ModuleList(convs)
        self.norm = nn.GroupNorm(channels, channels)
        self.proj = nn.Linear(channels, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        x = wave.unsqueeze(1)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            x = F.gelu(self.norm(x) if i == 0 else x)
        return self.head(self.proj(x.transpose(1, 2)).mean(1))


def padded_length(lengths: list[int], bucket: int) -> int:
    """The batch's length: its longest clip, or that rounded up to a multiple of ``bucket``."""
    longest = max(lengths)
    return -(-longest // bucket) * bucket if bucket else longest


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The encoder and optimizer with ``fixes`` applied; returns one training step (a fresh batch
    of random clips of random lengths; the step's loss)."""
    channels, dim, classes, batch, lo, hi, second = 512, 256, 35, 8, 32_000, 96_000, 16_000
    if args.small:
        channels, dim, classes, batch, lo, hi, second = 16, 8, 5, 2, 400, 800, 200
    benchmark = "no_benchmark" not in fixes
    bucket = second if "bucketed" in fixes else 0
    torch.manual_seed(0)
    model = Encoder(channels, dim, classes).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    amp = bf16_autocast(dev, "bf16" in fixes)
    draw = random.Random(0)  # the clips' lengths, as a dataset's would come

    def batch_of(length: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        wave = torch.randn(batch, length, device=dev)
        valid = torch.arange(length, device=dev) < torch.tensor(lengths, device=dev)[:, None]
        return wave * valid, torch.randint(0, classes, (batch,), device=dev)

    def step() -> torch.Tensor:
        torch.backends.cudnn.benchmark = benchmark  # process-wide: each variant sets its own
        lengths = [draw.randint(lo, hi) for _ in range(batch)]
        wave, labels = batch_of(padded_length(lengths, bucket), lengths)
        return train_step(lambda: F.cross_entropy(model(wave), labels), opt, amp)

    if bucket:  # a bucketed program meets each of its few lengths in its first steps
        torch.backends.cudnn.benchmark = True
        for length in range(-(-lo // bucket) * bucket, hi + 1, bucket):
            wave, labels = batch_of(length, [length] * batch)
            with amp():
                loss = F.cross_entropy(model(wave), labels)
            loss.backward()
            model.zero_grad(set_to_none=True)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    alternatives=[("no_benchmark", "bucketed")])
    # cuDNN keeps which algorithm each shape was given for the whole process: variants sharing one
    # would time each other's benchmarking (interleaved, the baseline ran 8.2 ms an iteration;
    # alone 784 ms, as in its capture's run: an H100, 2026-12-07)
    shared_cache = "shares cuDNN's benchmark cache with the other variants in one process"
    ran = run(build, args, fixes, dev, not_interleaved={"no_benchmark": shared_cache, "bucketed": shared_cache,
                                                        "bf16": shared_cache})
    if ran:
        print(f"w_varlen_conv_benchmark_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

"""Inference with a data-dependent early exit: a bf16 encoder (6 pre-norm MLP blocks, hidden
2048, 8 x 512 tokens) classifies each sequence; only when some sequence is not confident does
a small iterative refiner (a GRU cell, 40 rounds, about 300 small kernels) revise the scores.

Each batch is an NVTX range ``infer`` holding ``encoder``, ``exit_check`` and ``refine``.

Defect: the exit test ``if conf.min().item() >= threshold`` reads a GPU value in the middle of
the forward. The CPU waits there for the whole encoder (a few ms of GEMMs), and only then
launches the refiner's few hundred small kernels one by one while the GPU sits idle between
them. With random weights no sequence is ever confident, so the refiner runs every batch.

    python w_early_exit_sync.py [--steps 40] [--fix no_sync | --fix graphs]

Fixes:
  no_sync  the branch taken on the GPU: the refiner always runs and
           ``torch.where(confident, scores, refined)`` picks the result, so nothing is read
           back and the CPU queues the refiner (and the next batch) while the encoder runs.
           Same GPU work as the baseline here, since the baseline always refines.
  graphs   the sync kept, the two pieces around it captured as CUDA graphs (the encoder with the
           exit test's reduction on a static input buffer, and the refiner), each replayed with
           one launch: the CPU still waits at ``.item()``, but then queues the refiner's few
           hundred kernels in one call instead of one by one.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_sync", "graphs")
CUDA_ONLY = ("graphs",)
THRESHOLD = 0.9


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Refiner(nn.Module):
    """Revises class scores in small rounds: softmax, project, GRU cell, project back, add."""

    def __init__(self, classes: int, width: int, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds
        self.inp = nn.Linear(classes, width)
        self.cell = nn.GRUCell(width, width)
        self.out = nn.Linear(width, classes)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        h = scores.new_zeros(scores.shape[0], self.cell.hidden_size)
        for _ in range(self.rounds):
            h = self.cell(self.inp(scores.softmax(-1)), h)
            scores = scores + self.out(h)
        return scores


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], None]:
    """The encoder, head and refiner (and the graphs) with ``fixes`` applied; returns one batch's
    step (a fresh input, the annotated forward, its prediction appended to ``step.preds``)."""
    d, blocks, batch, seq, classes, width, rounds = 2048, 6, 8, 512, 1000, 256, 40
    if args.small:
        d, blocks, batch, seq, classes, width, rounds = 64, 2, 2, 16, 10, 16, 4
    encoder = nn.Sequential(*[Block(d) for _ in range(blocks)], nn.LayerNorm(d))
    encoder = encoder.to(dev, torch.bfloat16).eval()
    head = nn.Linear(d, classes).to(dev).eval()  # small fp32 parts
    refiner = Refiner(classes, width, rounds).to(dev).eval()

    def front(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = head(encoder(x).mean(1).float())
        return scores, scores.softmax(-1).amax(-1).min()

    if "graphs" in fixes:
        with torch.no_grad():
            static_x = torch.randn(batch, seq, d, device=dev, dtype=torch.bfloat16)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
                for _ in range(3):
                    refiner(front(static_x)[0])
            torch.cuda.current_stream().wait_stream(side)
            g_front, g_refine = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(g_front):
                g_scores, g_cmin = front(static_x)
            with torch.cuda.graph(g_refine, pool=g_front.pool()):  # replayed in capture order
                g_refined = refiner(g_scores)
    preds: list[torch.Tensor] = []

    @torch.no_grad()
    def step() -> None:
        x = torch.randn(batch, seq, d, device=dev, dtype=torch.bfloat16)  # embedded input
        if "graphs" in fixes:
            with nvtx("infer"):
                with nvtx("encoder"):
                    static_x.copy_(x)
                    g_front.replay()
                with nvtx("exit_check"):
                    if g_cmin.item() >= THRESHOLD:  # the sync stays
                        preds.append(g_scores.argmax(-1))
                        return
                with nvtx("refine"):
                    g_refine.replay()
                preds.append(g_refined.argmax(-1))
            return
        with nvtx("infer"):
            with nvtx("encoder"):
                scores = head(encoder(x).mean(1).float())
            with nvtx("exit_check"):
                conf = scores.softmax(-1).amax(-1)
                if "no_sync" in fixes:
                    confident = conf.min() >= THRESHOLD  # a GPU bool, never read here
                elif conf.min().item() >= THRESHOLD:  # the defect: waits for the encoder
                    preds.append(scores.argmax(-1))
                    return
            with nvtx("refine"):
                refined = refiner(scores)
                if "no_sync" in fixes:
                    refined = torch.where(confident, scores, refined)
            preds.append(refined.argmax(-1))
    step.preds = preds
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("no_sync", "graphs")],
                                    steps_help="batches (the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_early_exit_sync: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"class histogram max {torch.stack(ran[0].preds).flatten().bincount().max().item()}")


if __name__ == "__main__":
    main()

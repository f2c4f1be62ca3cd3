"""Sequence-encoder inference written as a Python loop over ``nn.LSTMCell``: 2 layers, hidden
512, input 256, batch 16, 256 timesteps, fp32, a fresh random sequence every batch.

Each batch is an NVTX range ``infer``. The loop launches 3 small kernels a cell a timestep
(two GEMMs and the fused cell update), about 1,500 launches a batch, each a few microseconds
of GPU work: the CPU's launch rate sets the pace and the GPU is mostly idle.

    python w_lstm_cell_loop.py [--steps 40] [--fix cuda_graph | --fix cudnn_lstm]

Fixes:
  cuda_graph  the whole loop captured once in a CUDA graph (``torch.cuda.graph``) on a static
              input buffer; each batch is copied into it and the graph replayed: one launch.
  cudnn_lstm  ``nn.LSTM(num_layers=2)`` with the same weights: cuDNN runs the recurrence with
              a handful of kernels (input GEMM for all timesteps, persistent recurrent kernels).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from _corpus import graphed, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("cuda_graph", "cudnn_lstm")
CUDA_ONLY = ("cuda_graph",)


def cell_loop(cells: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """Run the stacked cells over x (time, batch, features); returns the last layer's outputs."""
    batch = x.shape[1]
    h = [x.new_zeros(batch, c.hidden_size) for c in cells]
    c = [x.new_zeros(batch, c.hidden_size) for c in cells]
    outs = []
    for t in range(x.shape[0]):
        inp = x[t]
        for i, cell in enumerate(cells):
            h[i], c[i] = cell(inp, (h[i], c[i]))
            inp = h[i]
        outs.append(inp)
    return torch.stack(outs)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The cells (and the cuDNN LSTM or the graph) with ``fixes`` applied; returns one batch's
    step (a fresh sequence, the forward in an NVTX range ``infer``, the output consumed on the
    GPU into ``step.checksum``)."""
    feat, hidden, layers, batch, steps_t = 256, 512, 2, 16, 256
    if args.small:
        feat, hidden, batch, steps_t = 16, 32, 2, 8
    cells = nn.ModuleList(nn.LSTMCell(feat if i == 0 else hidden, hidden) for i in range(layers))
    cells = cells.to(dev).eval()
    call = lambda x: cell_loop(cells, x)

    if "cudnn_lstm" in fixes:
        lstm = nn.LSTM(feat, hidden, num_layers=layers).to(dev).eval()
        with torch.no_grad():  # same weights as the cells
            for i, cell in enumerate(cells):
                getattr(lstm, f"weight_ih_l{i}").copy_(cell.weight_ih)
                getattr(lstm, f"weight_hh_l{i}").copy_(cell.weight_hh)
                getattr(lstm, f"bias_ih_l{i}").copy_(cell.bias_ih)
                getattr(lstm, f"bias_hh_l{i}").copy_(cell.bias_hh)
        call = lambda x: lstm(x)[0]

    if "cuda_graph" in fixes:
        static_x = torch.randn(steps_t, batch, feat, device=dev)
        call = graphed(call, static_x)

    checksum = torch.zeros((), device=dev)

    @torch.no_grad()
    def step() -> torch.Tensor:
        x = torch.randn(steps_t, batch, feat, device=dev)
        with nvtx("infer"):
            y = call(x)
            checksum.add_(y[-1].float().mean())  # consumes the output on the GPU
        return checksum
    step.checksum = checksum
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=({"cuda_graph", "cudnn_lstm"},),
                                    steps_help="batches (the first ones are warm-up)",
                                    small_help="short sequences, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_lstm_cell_loop: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"checksum {ran[0].checksum.item():.4f}")


if __name__ == "__main__":
    main()

"""A sequence-to-sequence forecaster run autoregressively, as time-series code often writes it:
a ``nn.GRUCell`` encoder (hidden 256) stepped over 96 past observations of 8 series, then a
``nn.GRUCell`` decoder that predicts the next observation with a linear head and feeds each
prediction back as its next input, 48 steps ahead. Batch 64 windows, fp32, under
``torch.no_grad()``, fresh random histories each batch.

Each batch is an NVTX range ``forecast``.

Defect: 144 Python steps of a few small kernels each (the cell's two GEMMs and its update; the
head's GEMM and the feedback's copy in the decoder): about 600 launches of microseconds each a
batch, the host's issue of them sets the pace and the GPU waits between them.

    python w_gru_rollout_infer.py [--steps 40] [--fix graph] [--fix cudnn_encoder] [--fix bf16]

Fixes:
  graph          the whole forecast (encoder and decoder loops) captured in one CUDA graph on a
                 static input buffer, replayed each batch.
  cudnn_encoder  the encoder as ``nn.GRU`` over the whole history (cuDNN, the cell's weights);
                 the decoder's loop stays (each step's input is the last step's output).
  bf16           the cells and the head in bf16 autocast.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from _corpus import bf16_autocast, graphed, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("graph", "cudnn_encoder", "bf16")
CUDA_ONLY = ("graph",)


class Forecaster(nn.Module):
    def __init__(self, series: int, hidden: int, horizon: int) -> None:
        super().__init__()
        self.horizon = horizon
        self.enc, self.dec = nn.GRUCell(series, hidden), nn.GRUCell(series, hidden)
        self.head = nn.Linear(hidden, series)
        self.gru: nn.GRU | None = None

    def use_cudnn_encoder(self) -> None:
        """The encoder as ``nn.GRU`` with the cell's weights (cuDNN over the whole history)."""
        gru = nn.GRU(self.enc.input_size, self.enc.hidden_size).to(self.enc.weight_ih.device)
        with torch.no_grad():
            gru.weight_ih_l0.copy_(self.enc.weight_ih)
            gru.weight_hh_l0.copy_(self.enc.weight_hh)
            gru.bias_ih_l0.copy_(self.enc.bias_ih)
            gru.bias_hh_l0.copy_(self.enc.bias_hh)
        self.gru = gru.eval()

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        """``history`` (time, batch, series) -> the next ``horizon`` observations (horizon, batch, series)."""
        if self.gru is not None:
            h = self.gru(history)[1][0]
        else:
            h = history.new_zeros(history.shape[1], self.enc.hidden_size)
            for x in history:
                h = self.enc(x, h)
        y, out = history[-1], []
        for _ in range(self.horizon):
            h = self.dec(y, h)
            y = self.head(h)
            out.append(y)
        return torch.stack(out)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The forecaster with ``fixes`` applied; returns one batch (its forecast, on the GPU)."""
    series, hidden, past, horizon, batch = 8, 256, 96, 48, 64
    if args.small:
        series, hidden, past, horizon, batch = 3, 16, 6, 4, 2
    torch.manual_seed(0)
    model = Forecaster(series, hidden, horizon).to(dev).eval()
    if "cudnn_encoder" in fixes:
        model.use_cudnn_encoder()
    amp = bf16_autocast(dev, "bf16" in fixes)

    def forecast(h: torch.Tensor) -> torch.Tensor:
        with amp():
            return model(h).float()
    call = forecast
    if "graph" in fixes:
        call = graphed(forecast, torch.zeros(past, batch, series, device=dev))

    def step() -> torch.Tensor:
        history = torch.randn(past, batch, series, device=dev)
        with nvtx("forecast"), torch.no_grad():
            return call(history).clone()
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40,
                                    steps_help="batches forecast (the first ones are warm-up)",
                                    small_help="tiny cells and short windows, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_gru_rollout_infer: {args.steps} batches, fixes {sorted(fixes) or 'none'}, "
              f"last mean {ran[1][-1].mean().item():.4f}")


if __name__ == "__main__":
    main()

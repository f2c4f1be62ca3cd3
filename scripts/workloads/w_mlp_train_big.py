"""Eager MLP training, large batch, GPU-bound: a regressor of 2 pre-norm residual MLP blocks
(LayerNorm, Linear 1024 -> 4096, GELU, Linear 4096 -> 1024) on rows of 1024 features, batch
65,536 rows, bf16 autocast, AdamW with PyTorch's default implementation (foreach on CUDA).

Each step (fresh random rows and targets, made on the GPU) is an NVTX range ``train_step``
holding ``forward``, ``backward`` and ``optimizer``. About 7 TFLOP of GEMMs a step against
about 60 kernel launches: the GPU is the bottleneck, the CPU runs far ahead.

    python w_mlp_train_big.py [--steps 40] [--fix cuda_graph | --fix fused_adamw | --fix compile]

Fixes (none is expected to pay much):
  cuda_graph   the whole step (forward, backward, ``AdamW(capturable=True)`` step) captured once
               in a CUDA graph on static input buffers and replayed: removes launch overhead,
               which a GPU-bound step hides anyway. Expected ~1.0x.
  fused_adamw  ``AdamW(fused=True)``: one pass over 17M fp32 weights and states instead of about
               ten foreach passes; a fraction of a ms against a ~15 ms step. Expected ~1.03x.
  compile      ``torch.compile(model)`` (default mode): Inductor fuses each LayerNorm, bias, GELU
               and residual pass with its neighbours; the GEMMs (most of the step) stay cuBLAS's.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args  # noqa: E402 (the workloads' shared helpers)

FIXES = ("cuda_graph", "fused_adamw", "compile")
CUDA_ONLY = ("cuda_graph",)


class Block(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("cuda_graph", "compile")])

    d, ffn, blocks, rows = (32, 128, 2, 64) if args.small else (1024, 4096, 2, 65536)
    model = nn.Sequential(*[Block(d, ffn) for _ in range(blocks)], nn.LayerNorm(d), nn.Linear(d, 1)).to(dev)
    graphed = "cuda_graph" in fixes
    fwd = torch.compile(model) if "compile" in fixes else model
    # capturable=True keeps the step count on the GPU, which a captured optimizer step needs.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None,
                            capturable=graphed)
    # (autocast's weight-cast cache must be off where a CUDA graph is captured)
    amp = lambda: torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=not graphed)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with nvtx("forward"), amp():
            loss = F.mse_loss(fwd(x).float().squeeze(-1), y)
        with nvtx("backward"):
            loss.backward()
        with nvtx("optimizer"):
            opt.step()
            if not graphed:  # a captured step leaves the grads to the next replay's backward
                opt.zero_grad(set_to_none=True)
        return loss.detach()

    if graphed:
        static_x = torch.randn(rows, d, device=dev)
        static_y = torch.randn(rows, device=dev)
        # one top-level range around warm-up and capture, so that their sub-ranges nest in it
        with nvtx("graph_capture"):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    step(static_x, static_y)
            torch.cuda.current_stream().wait_stream(side)
            opt.zero_grad(set_to_none=True)  # the captured backward allocates the grads in the graph's pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_loss = step(static_x, static_y)

    losses = []
    for _ in range(args.steps):
        x = torch.randn(rows, d, device=dev)
        y = torch.randn(rows, device=dev)
        with nvtx("train_step"):
            if graphed:
                static_x.copy_(x)
                static_y.copy_(y)
                graph.replay()
                losses.append(static_loss.clone())
            else:
                losses.append(step(x, y))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"w_mlp_train_big: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
          f"loss {losses[0].item():.4f} -> {losses[-1].item():.4f}")


if __name__ == "__main__":
    main()

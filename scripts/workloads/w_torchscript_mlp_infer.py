"""Serving a gated-MLP encoder exported with ``torch.jit.script``, as models deployed before
torch.compile often still are: eight pre-norm blocks (LayerNorm, a SwiGLU MLP 512 -> 1,408 ->
512, a residual add), 64 requests of 16 tokens a call, fp32, under ``torch.no_grad``; the
TorchScript profiling executor and its fuser (NNC) left at their defaults, so that after its
first calls the scripted graph runs the elementwise chains as fused kernels generated at run time.

Each call is an NVTX range ``infer``.

Defect (if any): a small batch whose 17 kernels a block are launched by TorchScript's
interpreter one after another: the GPU waits on the host between them; what a legacy fuser
already fused, and what is left for torch.compile or a CUDA graph, is the question.

    python w_torchscript_mlp_infer.py [--steps 60] [--fix graph] [--fix compile] [--fix eager]

Fixes:
  graph    the scripted module's call captured once in a CUDA graph (``torch.cuda.graph``) and
           replayed, its input copied into the captured one.
  compile  ``torch.compile`` of the eager module (default mode) instead of the script.
  eager    the module as written, not scripted (a control: what the script's fusion gave).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import graphed, nvtx, program_args, run  # noqa: E402

FIXES = ("graph", "compile", "eager")
CUDA_ONLY = ("graph",)


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Encoder(nn.Module):
    def __init__(self, dim: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The encoder as the fixes serve it; returns one call (fresh random requests; the output)."""
    batch, tokens, dim, hidden, depth = 64, 16, 512, 1408, 8
    if args.small:
        batch, tokens, dim, hidden, depth = 2, 3, 8, 16, 2
    torch.manual_seed(0)
    model = Encoder(dim, hidden, depth).to(dev).eval()
    if "compile" in fixes:
        serve = torch.compile(model)
    elif "eager" in fixes:
        serve = model
    else:
        serve = torch.jit.script(model)
    if "graph" in fixes:
        # (graphed's three warm-up calls are also the profiling executor's: its fused graph is
        # what the capture holds)
        serve = graphed(serve, torch.randn(batch, tokens, dim, device=dev))

    def step() -> torch.Tensor:
        with nvtx("infer"), torch.no_grad():
            return serve(torch.randn(batch, tokens, dim, device=dev))
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=60, steps_help="calls (the first ones "
                                    "are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_torchscript_mlp_infer: {args.steps} calls, fixes {sorted(fixes) or 'none'}, "
              f"last output norm {ran[1][-1].norm().item():.3f}")


if __name__ == "__main__":
    main()

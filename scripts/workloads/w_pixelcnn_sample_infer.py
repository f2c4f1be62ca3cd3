"""Sampling from an autoregressive PixelCNN (van den Oord et al., 2016) as its tutorials write it:
for each of the 16 x 16 pixels in raster order, the whole network runs over the whole partly
drawn batch, and that pixel of every image is drawn from its Bernoulli. The network: a 7 x 7
mask-A convolution to 64 channels, 6 residual blocks of a 3 x 3 mask-B convolution between two
1 x 1 ones (ReLU between), a 1 x 1 head to one logit; the masks multiplied into the weights at
every call (as the tutorials' ``MaskedConv2d.forward`` does), fp32, weights random, 16 binary
16 x 16 images a batch. One step draws one batch of images: 256 passes.

Each batch drawn is an NVTX range ``sample``.

Defect (if any): every pass is ~70 small kernels over 16 x 64 x 16 x 16 values (a few
microseconds each on the GPU) and a Bernoulli draw: ~18,000 launches a batch, their dispatch
and the Python around them setting the pace while the GPU waits; the passes depend on each
other (each reads the pixel the last one drew).

    python w_pixelcnn_sample_infer.py [--steps 30] [--fix graph] [--fix compile_graphs] [--fix bf16]

Fixes:
  graph           one pass (the network, the draw, the write of the pixel) captured once in a
                  CUDA graph, the pixel's index read from a device tensor set before each
                  replay: 256 graph launches a batch.
  compile_graphs  ``torch.compile(net, mode="reduce-overhead")`` (the draw and the write eager).
  bf16            bf16 autocast around the network (the loop kept).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("graph", "compile_graphs", "bf16")
CUDA_ONLY = ("graph", "compile_graphs")


class MaskedConv2d(nn.Conv2d):
    """A convolution that sees only the pixels above and to the left (mask A: not the centre;
    mask B: the centre too), its mask multiplied into the weight at every call."""

    def __init__(self, kind: str, cin: int, cout: int, k: int) -> None:
        super().__init__(cin, cout, k, padding=k // 2)
        mask = torch.ones_like(self.weight)
        c = k // 2
        mask[:, :, c, c + (kind == "B"):] = 0
        mask[:, :, c + 1:] = 0
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight * self.mask, self.bias, padding=self.padding)


class Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.m, self.b = nn.Conv2d(c, c // 2, 1), MaskedConv2d("B", c // 2, c // 2, 3), nn.Conv2d(c // 2, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(F.relu(self.m(F.relu(self.a(F.relu(x))))))


class PixelCNN(nn.Module):
    def __init__(self, c: int, blocks: int) -> None:
        super().__init__()
        self.first = MaskedConv2d("A", 1, c, 7)
        self.blocks = nn.Sequential(*[Residual(c) for _ in range(blocks)])
        self.head = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.blocks(self.first(x))))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The network with ``fixes`` applied; returns one step: a batch of images drawn pixel by
    pixel (the images returned)."""
    c, blocks, batch, size = 64, 6, 16, 16
    if args.small:
        c, blocks, batch, size = 8, 1, 2, 5
    torch.manual_seed(0)
    net = PixelCNN(c, blocks).to(dev).eval()
    amp = bf16_autocast(dev, "bf16" in fixes)
    img = torch.zeros(batch, 1, size, size, device=dev)
    call = torch.compile(net, mode="reduce-overhead") if "compile_graphs" in fixes else net

    def draw(i: int, j: int) -> None:
        with amp():
            logit = call(img)[:, 0, i, j].float()
        img[:, 0, i, j] = torch.bernoulli(torch.sigmoid(logit))

    graph = None
    if "graph" in fixes:
        # one graph for every position: the pixel's flat index read from a device tensor
        pos = torch.zeros(1, dtype=torch.long, device=dev)
        flat = img.view(batch, size * size)

        def draw_at() -> None:
            logit = net(img).view(batch, size * size).index_select(1, pos).float()
            flat.index_copy_(1, pos, torch.bernoulli(torch.sigmoid(logit)))

        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    draw_at()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                draw_at()

    @torch.no_grad()
    def step() -> torch.Tensor:
        with nvtx("sample"):
            img.zero_()
            for i in range(size):
                for j in range(size):
                    if graph is not None:
                        pos.fill_(i * size + j)
                        graph.replay()
                    else:
                        draw(i, j)
        return img.clone()
    step.net, step.img = net, img
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30,
                                    steps_help="batches of images drawn (the first is warm-up)",
                                    small_help="tiny network and images, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_pixelcnn_sample_infer: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last mean pixel {ran[1][-1].float().mean().item():.3f}")


if __name__ == "__main__":
    main()

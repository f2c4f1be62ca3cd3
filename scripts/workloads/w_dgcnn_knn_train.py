"""Training DGCNN (dynamic graph CNN) for point-cloud classification as its reference code
writes it: batches of 16 clouds of 1,024 points (fresh random points and labels each step), four
EdgeConv layers (64, 64, 128, 256 channels) that each rebuild a k-nearest-neighbour graph (k = 20)
from the current features (pairwise distances by a batched matmul, ``topk``), gather each
point's neighbours, concatenate ``[x_j - x_i, x_i]`` into a [16, 2C, 1024, 20] tensor, run a 1x1
``Conv2d``, BatchNorm and LeakyReLU and take the max over the neighbours; then a 1-D convolution to
1,024 channels, max and mean pooling, and a 3-layer classifier over 40 classes; fp32, SGD with
momentum.

Each training step is an NVTX range ``train_step`` (``forward``, ``backward``, ``optimizer``).

Defect: the edge tensors (k = 20 copies of every point's features, up to 335 MB a layer in fp32)
are written and read again by a chain of separate kernels (the gather, the subtraction, the
concatenation, the permute, BatchNorm, LeakyReLU, the max over k), forward and backward: a
memory-bound step that moves each edge tensor several times over.

    python w_dgcnn_knn_train.py [--steps 30] [--fix compile] [--fix bf16] [--fix tf32]

Fixes:
  compile  ``torch.compile(model)`` (default mode): Inductor fuses the gather and the elementwise
           work around each convolution.
  bf16     bf16 autocast over the model (the edge tensors half the bytes; ``topk`` of bf16
           distances may pick other neighbours among near ties).
  tf32     TF32 for the fp32 matmuls (the pairwise distances, the classifier).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402

FIXES = ("compile", "bf16", "tf32")
CUDA_ONLY: tuple[str, ...] = ()


def knn(x: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of each point's ``k`` nearest points (itself first) among the cloud's
    points; ``x`` is [batch, channels, points]."""
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x ** 2, dim=1, keepdim=True)
    return (-xx - inner - xx.transpose(2, 1)).topk(k=k, dim=-1)[1]  # the largest negative distances


def graph_feature(x: torch.Tensor, k: int) -> torch.Tensor:
    """[batch, 2 channels, points, k]: for each point and each of its neighbours, the neighbour's
    features minus its own, and its own."""
    b, c, n = x.shape
    idx = (knn(x, k) + torch.arange(b, device=x.device).view(-1, 1, 1) * n).view(-1)
    x = x.transpose(2, 1).contiguous()
    neighbours = x.view(b * n, -1)[idx, :].view(b, n, k, c)
    x = x.view(b, n, 1, c).repeat(1, 1, k, 1)
    return torch.cat((neighbours - x, x), dim=3).permute(0, 3, 1, 2).contiguous()


class DGCNN(nn.Module):
    def __init__(self, k: int, widths: tuple[int, ...], emb: int, classes: int) -> None:
        super().__init__()
        self.k = k
        edges, c_in = [], 3
        for w in widths:
            edges.append(nn.Sequential(nn.Conv2d(2 * c_in, w, 1, bias=False), nn.BatchNorm2d(w),
                                       nn.LeakyReLU(0.2)))
            c_in = w
        self.edges = nn.ModuleList(edges)
        self.conv = nn.Sequential(nn.Conv1d(sum(widths), emb, 1, bias=False), nn.BatchNorm1d(emb),
                                  nn.LeakyReLU(0.2))
        self.head = nn.Sequential(nn.Linear(2 * emb, 512, bias=False), nn.BatchNorm1d(512), nn.LeakyReLU(0.2),
                                  nn.Dropout(0.5), nn.Linear(512, 256), nn.BatchNorm1d(256), nn.LeakyReLU(0.2),
                                  nn.Dropout(0.5), nn.Linear(256, classes))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        x, outs = points, []
        for edge in self.edges:
            x = edge(graph_feature(x, self.k)).max(dim=-1)[0]
            outs.append(x)
        x = self.conv(torch.cat(outs, dim=1))
        return self.head(torch.cat((x.amax(-1), x.mean(-1)), 1))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh clouds
    and labels; the step's loss)."""
    batch, points, k, widths, emb, classes = 16, 1024, 20, (64, 64, 128, 256), 1024, 40
    if args.small:
        batch, points, k, widths, emb, classes = 4, 32, 4, (8, 8), 16, 5
    torch.manual_seed(0)
    model = DGCNN(k, widths, emb, classes).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev, "bf16" in fixes)

    def step() -> torch.Tensor:
        clouds = torch.rand(batch, 3, points, device=dev) * 2 - 1
        labels = torch.randint(0, classes, (batch,), device=dev)
        return train_step(lambda: F.cross_entropy(fwd(clouds), labels), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=30)
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_dgcnn_knn_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

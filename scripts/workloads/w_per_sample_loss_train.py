"""Person re-identification training step with a batch-hard triplet loss written as a Python
loop over the anchors, as in many re-id and metric-learning code bases: a ViT-S/16 on 256 x 128
crops (plain PyTorch: a patch convolution and ``nn.TransformerEncoder``, 12 layers, hidden 384,
dropout 0.1), a 256-wide embedding and an identity classifier over 751 identities; batch 64 =
16 identities x 4 crops (fresh random images every step), bf16 autocast over fp32 weights,
AdamW with PyTorch's default implementation (foreach on CUDA).

The loss is the identity cross-entropy plus, for each of the 64 anchors: distances to the
batch, hardest positive (``masked_fill`` + ``max``), hardest negative (``masked_fill`` +
``min``), ``relu(pos - neg + 0.3)``; the 64 terms are stacked and averaged.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``
(the loss is in ``forward``).

Defect: the loop launches about 13 tiny kernels per anchor in the forward and about as many in
the backward, some 1,700 in all, each working on 64 numbers: the step runs at the CPU's launch
pace while the GPU, whose real work (the ViT) takes a few ms, mostly waits.

    python w_per_sample_loss_train.py [--steps 40] [--fix vectorized | --fix graph | --fix compile]

Fixes:
  vectorized  the same loss over the whole batch at once: the 64 x 64 distance matrix, masked
              row-wise max and min, one ``relu`` and ``mean`` (a dozen kernels).
  graph       the loop kept; the whole step (forward, loss, backward, ``AdamW(capturable=True)``
              step) captured in one CUDA graph on static input buffers (autocast without its
              weight cache, as capture requires) and replayed: one launch a step, the GPU then
              runs the ~1,700 tiny kernels back to back.
  compile     the loop kept, the loss function under ``torch.compile`` (default mode): Dynamo
              unrolls the 64 iterations and Inductor fuses them, forward and backward; the
              ViT stays eager. Compilation (tens of seconds) happens in the first steps.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

FIXES = ("vectorized", "graph", "compile")
CUDA_ONLY = ("graph",)
MARGIN = 0.3


class ReIdViT(nn.Module):
    def __init__(self, h: int, w: int, patch: int, d: int, depth: int, heads: int, emb: int, ids: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (h // patch) * (w // patch) + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm, self.embed = nn.LayerNorm(d), nn.Linear(d, emb)
        self.classifier = nn.Linear(emb, ids, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        feat = self.embed(self.norm(self.encoder(x))[:, 0])
        return feat, self.classifier(feat)


def triplet_loop(emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Batch-hard triplet loss, one anchor at a time."""
    losses = []
    for i in range(emb.shape[0]):
        dist = (emb[i] - emb).pow(2).sum(1).clamp_min(1e-12).sqrt()
        same = labels == labels[i]
        hardest_pos = dist.masked_fill(~same, float("-inf")).max()
        hardest_neg = dist.masked_fill(same, float("inf")).min()
        losses.append(F.relu(hardest_pos - hardest_neg + MARGIN))
    return torch.stack(losses).mean()


def triplet_vectorized(emb: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same loss for all anchors at once."""
    dist = (emb[:, None] - emb[None]).pow(2).sum(2).clamp_min(1e-12).sqrt()
    same = labels[:, None] == labels[None]
    hardest_pos = dist.masked_fill(~same, float("-inf")).amax(1)
    hardest_neg = dist.masked_fill(same, float("inf")).amin(1)
    return F.relu(hardest_pos - hardest_neg + MARGIN).mean()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer and loss (and the graph) with ``fixes`` applied; returns one
    training step (fresh images and identities; the step's loss)."""
    h, w, patch, d, depth, heads, emb, ids, n_ids, per_id = 256, 128, 16, 384, 12, 6, 256, 751, 16, 4
    if args.small:
        h, w, patch, d, depth, heads, emb, ids, n_ids, per_id = 32, 16, 8, 32, 2, 4, 16, 20, 4, 2
    model = ReIdViT(h, w, patch, d, depth, heads, emb, ids).to(dev).train()
    graph = "graph" in fixes
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4, capturable=graph)
    triplet = triplet_vectorized if "vectorized" in fixes else triplet_loop
    if "compile" in fixes:
        triplet = torch.compile(triplet)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        feat, logits = model(x)
        return F.cross_entropy(logits.float(), y) + triplet(F.normalize(feat.float(), dim=1), y)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n_ids * per_id, 3, h, w, device=dev)
        y = torch.randperm(ids, device=dev)[:n_ids, None].expand(n_ids, per_id).reshape(-1)  # P x K sampling
        return x, y

    if not graph:
        amp = bf16_autocast(dev)

        def step() -> torch.Tensor:
            x, y = batch()
            return train_step(lambda: loss_fn(x, y), opt, amp)
        return step

    static_x, static_y = batch()
    amp_nc = lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream (also makes AdamW's state)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            with amp_nc():
                loss = loss_fn(static_x, static_y)
            loss.backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # the captured backward allocates the gradients in the graph's pool
    with torch.cuda.graph(g):
        with amp_nc():
            static_loss = loss_fn(static_x, static_y)
        static_loss.backward()
        opt.step()

    def step() -> torch.Tensor:
        x, y = batch()
        with nvtx("train_step"):
            with nvtx("copy_in"):
                static_x.copy_(x)
                static_y.copy_(y)
            with nvtx("replay"):
                g.replay()  # forward, loss, backward and optimizer
        return static_loss
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    alternatives=[("vectorized", "graph"), ("vectorized", "compile"),
                                                  ("graph", "compile")])
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_per_sample_loss_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

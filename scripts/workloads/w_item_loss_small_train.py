"""A small transformer classifier trained at a small batch, with the loss read back every step for
a running log and a NaN check: ``nn.TransformerEncoder`` (4 layers, d=256, 4 heads, feed-forward
1024, dropout 0.1, batch first), token embedding and mean-pooled linear head, batch 32 of 64
tokens, fp32, AdamW with PyTorch's default implementation (foreach on CUDA), random weights,
fresh random token ids and labels made on the GPU each step.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward``, ``optimizer`` and
``log``.

Defect: the model is tiny for an H200 (5M parameters, ~0.04 TFLOP a step) while a step issues
several hundred kernels; ``loss.item()`` at the end of every step then makes the CPU wait for
the GPU to drain, so the next step's launches start from an idle GPU and nothing overlaps: the
step costs the CPU's launch time plus the GPU's run time.

    python w_item_loss_small_train.py [--steps 200] [--fix no_item]
        [--fix compile_graphs | --fix graph]

Fixes:
  no_item         the loss summed on the GPU and read (logged, NaN-checked) every 50 steps; the
                  CPU runs ahead and its launches overlap the GPU's work.
  compile_graphs  ``torch.compile(model, mode="reduce-overhead")``: fused kernels, the forward
                  and backward replayed as CUDA graphs; the optimizer and ``.item()`` every step
                  stay eager.
  graph           the whole step (forward, backward, ``AdamW(capturable=True)``) captured by hand
                  with ``torch.cuda.graph`` on static input buffers and replayed: one launch a
                  step; the ``.item()`` every step stays, outside the graph.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_item", "compile_graphs", "graph")
CUDA_ONLY = ("graph",)
LOG_EVERY = 50


class Classifier(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, classes: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(ids)).mean(1))


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, optimizer and loss log with ``fixes`` applied; returns one training step (its
    loss, as a tensor)."""
    vocab, d, heads, layers, classes, batch, seq = 8000, 256, 4, 4, 10, 32, 64
    if args.small:
        vocab, d, heads, layers, classes, batch, seq = 100, 32, 2, 2, 10, 4, 8
    model = Classifier(vocab, d, heads, layers, classes).to(dev).train()
    graphed = "graph" in fixes
    # capturable=True keeps the step count on the GPU, which a captured optimizer step needs.
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, capturable=graphed)
    net = torch.compile(model, mode="reduce-overhead") if "compile_graphs" in fixes else model
    history: list[float] = []
    running = torch.zeros((), device=dev)
    count = [0]

    def fwd_bwd_opt(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with nvtx("forward"):
            loss = F.cross_entropy(net(ids), labels)
        with nvtx("backward"):
            loss.backward()
        with nvtx("optimizer"):
            opt.step()
            if not graphed:  # a captured step leaves the grads to the next replay's backward
                opt.zero_grad(set_to_none=True)
        return loss.detach()

    if graphed:
        s_ids = torch.randint(0, vocab, (batch, seq), device=dev)
        s_labels = torch.randint(0, classes, (batch,), device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                fwd_bwd_opt(s_ids, s_labels)
        torch.cuda.current_stream().wait_stream(side)
        opt.zero_grad(set_to_none=True)  # the captured backward allocates the grads in the graph's pool
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            s_loss = fwd_bwd_opt(s_ids, s_labels)

    def log(loss: torch.Tensor) -> None:
        with nvtx("log"):
            count[0] += 1
            if "no_item" in fixes:
                running.add_(loss)
                if count[0] % LOG_EVERY:
                    return
                value = running.item() / LOG_EVERY  # one read every 50 steps
                running.zero_()
            else:
                value = loss.item()  # waits for the whole step
            if math.isnan(value):
                raise SystemExit(f"loss is NaN at step {count[0]}")
            history.append(value)

    def step() -> torch.Tensor:
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        with nvtx("train_step"):
            if graphed:
                s_ids.copy_(ids)
                s_labels.copy_(labels)
                graph.replay()
                loss = s_loss
            else:
                if "compile_graphs" in fixes:
                    torch.compiler.cudagraph_mark_step_begin()
                loss = fwd_bwd_opt(ids, labels)
            log(loss)
        return loss
    step.history = history
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=200,
                                    alternatives=[("compile_graphs", "graph")])
    ran = run(build, args, fixes, dev)
    if ran:
        h = ran[0].history
        print(f"w_item_loss_small_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"{len(h)} losses logged, last {h[-1] if h else float('nan'):.3f}")


if __name__ == "__main__":
    main()

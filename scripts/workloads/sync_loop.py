"""A training loop that reads its loss back every step and then does CPU-side bookkeeping.

`loss.item()` blocks the CPU until the GPU has finished the step, so the CPU work after it
(logging, metrics) runs while the GPU idles. `--no-sync` keeps the losses on the GPU and
reads them once at the end. `--graph` keeps the `.item()` and captures the step before it
(forward, backward, the fused AdamW step) in one CUDA graph, replayed with one launch.

    python sync_loop.py [--steps 30] [--no-sync | --graph]
    python sync_loop.py --interleave OUT.json --variants baseline,no_sync,graph
"""
from __future__ import annotations

import argparse
import contextlib
import math
from typing import Callable

import torch

from _corpus import capture_training, check_interleave, interleave, interleave_args  # noqa: E402 (the workloads' shared helpers)


def bookkeeping(history: list, value) -> None:
    """CPU work of about 2 ms, as metric trackers and loggers do."""
    history.append(value)
    acc = 0.0
    for k in range(20000):
        acc += math.sin(k * 1e-3)
    history[-1] = (history[-1], acc)


def build(no_sync: bool, graph: bool) -> Callable[[bool], None]:
    """The model, its fused AdamW and (``graph``) the captured step; returns one step of the
    loop (``step(ncu)``: ``ncu`` marks it with the range ``ncu_iter``)."""
    d = 4096
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(6)]).cuda()
    # capturable=True keeps the step count on the GPU, which a captured optimizer step needs.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True, capturable=graph)
    x = torch.randn(2048, d, device="cuda")

    def train_step() -> torch.Tensor:
        # (autocast's weight-cast cache must be off where a CUDA graph is captured)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not graph):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        if not graph:  # a captured step leaves the grads to the next replay's backward
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    if graph:
        cuda_graph, static_loss = capture_training(train_step, opt)
    history: list = []
    nvtx = torch.cuda.nvtx

    def step(ncu: bool = False) -> None:
        mark = nvtx.range("ncu_iter") if ncu else contextlib.nullcontext()
        with mark, nvtx.range("step"):
            if graph:
                cuda_graph.replay()
                loss = static_loss
            else:
                loss = train_step()
            bookkeeping(history, loss.detach() if no_sync else loss.item())
    step.history = history
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-sync", action="store_true")
    ap.add_argument("--graph", action="store_true")
    interleave_args(ap)
    args = ap.parse_args()
    if args.no_sync and args.graph:
        ap.error("--no-sync and --graph are alternatives: pick one")
    fixes = {f for f, on in (("no_sync", args.no_sync), ("graph", args.graph)) if on}
    check_interleave(ap, args, fixes, ("no_sync", "graph"), alternatives=({"no_sync", "graph"},))
    torch.manual_seed(0)
    if args.interleave:
        interleave({n: build("no_sync" in fx, "graph" in fx) for n, fx in args.variant_fixes.items()},
                   args.variant_fixes, args.interleave, torch.device("cuda"), rounds=args.rounds)
        return
    step = build(args.no_sync, args.graph)
    for i in range(args.steps):
        step(ncu=i == args.steps // 2)
    torch.cuda.synchronize()
    last = step.history[-1][0]
    print(f"loss {float(last):.4f}")


if __name__ == "__main__":
    main()

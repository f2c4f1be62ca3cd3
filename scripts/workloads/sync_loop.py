"""A training loop that reads its loss back every step and then does CPU-side bookkeeping.

`loss.item()` blocks the CPU until the GPU has finished the step, so the CPU work after it
(logging, metrics) runs while the GPU idles. `--no-sync` keeps the losses on the GPU and
reads them once at the end.

    python sync_loop.py [--steps 30] [--no-sync]
"""
from __future__ import annotations

import argparse
import contextlib
import math

import torch


def bookkeeping(history: list, value) -> None:
    """CPU work of about 2 ms, as metric trackers and loggers do."""
    history.append(value)
    acc = 0.0
    for k in range(20000):
        acc += math.sin(k * 1e-3)
    history[-1] = (history[-1], acc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-sync", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    d = 4096
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d) for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(2048, d, device="cuda")
    history: list = []
    nvtx = torch.cuda.nvtx
    for i in range(args.steps):
        mark = nvtx.range("ncu_iter") if i == args.steps // 2 else contextlib.nullcontext()
        with mark, nvtx.range("step"):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            bookkeeping(history, loss.detach() if args.no_sync else loss.item())
    torch.cuda.synchronize()
    last = history[-1][0]
    print(f"loss {float(last):.4f}")


if __name__ == "__main__":
    main()

"""A small data-parallel training step (DistributedDataParallel), for multi-rank profkit traces.

    torchrun --nproc-per-node 2 scripts/workloads/ddp_step.py            # NCCL, one GPU a rank
    torchrun --nproc-per-node 2 scripts/workloads/ddp_step.py --cpu      # gloo on CPU (logic test)
    torchrun --nproc-per-node 2 scripts/workloads/ddp_step.py --no-sync  # the fix profkit advises

Each step ends with ``torch.cuda.synchronize()`` and rank 0 prints ``loss.item()``: the GPU
drains its queue every step and idles while the CPU starts the next one. ``--no-sync`` is the
fix (profkit rule PK101): no per-step synchronisation; losses stay on the GPU and are read once
after the last step.

Model: a stack of pre-norm MLP blocks (LayerNorm -> Linear(d, 4d) -> GELU -> Linear(4d, d) +
residual), hidden 2048, 2 blocks: 67M parameters, 268 MB of fp32 gradients per step, which DDP
all-reduces in 25 MB buckets (about 11 NCCL AllReduce calls a step). Forward runs under bf16
autocast; AdamW steps the fp32 master weights.

NVTX ranges per step: ``step`` around ``forward``, ``backward`` and ``optimizer``; and each DDP
bucket's all-reduce inside ``ddp.allreduce {bytes=N}`` (a comm hook that wraps PyTorch's default
all-reduce hook), so the NCCL kernel of each bucket carries the bytes it moves. Backward runs on
the calling thread (``torch.autograd.set_multithreading_enabled(False)``): otherwise autograd
launches CUDA kernels from its own device thread and nsys would project none of them into the
``backward`` range, which is pushed on the main thread.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from profkit.read.hints import format_range_name  # noqa: E402  (pure Python)

USE_NVTX = False


@contextlib.contextmanager
def rng(name: str):
    if not USE_NVTX:
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def nvtx_allreduce_hook(process_group, bucket):
    """PyTorch's default all-reduce hook, inside an NVTX range that names the bucket's bytes."""
    buf = bucket.buffer()
    nbytes = buf.numel() * buf.element_size()
    with rng(format_range_name("ddp.allreduce", bytes=nbytes)):
        return default_hooks.allreduce_hook(process_group, bucket)


def main() -> None:
    global USE_NVTX
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="gloo backend on CPU (tests the logic)")
    ap.add_argument("--steps", type=int, default=6, help="training steps (the first 2 are warm-up)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per rank per step")
    ap.add_argument("--threaded-backward", action="store_true",
                    help="leave autograd's device threads on (backward kernels then launch off the main thread)")
    ap.add_argument("--no-sync", action="store_true",
                    help="no per-step synchronisation: losses kept on the GPU, read after the last step")
    args = ap.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        args.hidden, args.tokens = min(args.hidden, 256), min(args.tokens, 512)
    else:
        for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
            if os.environ.get(k) != v:
                raise SystemExit(f"set {k}={v} in the environment (NVLink multicast must stay off)")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
        USE_NVTX = True
        torch.backends.cuda.matmul.allow_tf32 = True

    torch.manual_seed(0)
    model = nn.Sequential(*[Block(args.hidden) for _ in range(args.blocks)]).to(dev)
    ddp = DDP(model, device_ids=None if args.cpu else [local])
    ddp.register_comm_hook(None, nvtx_allreduce_hook)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=not args.cpu)
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)
    x = torch.randn(args.tokens, args.hidden, device=dev, generator=gen)
    y = torch.randn(args.tokens, args.hidden, device=dev, generator=gen)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if not args.cpu else contextlib.nullcontext())

    nparams = sum(p.numel() for p in model.parameters())
    losses = []
    t0 = time.perf_counter()
    with torch.autograd.set_multithreading_enabled(args.threaded_backward):
        for step in range(args.steps):
            with rng("step"):
                with rng("forward"):
                    with amp:
                        loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
                with rng("backward"):
                    loss.backward()
                with rng("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            if args.no_sync:
                losses.append(loss.detach())
                continue
            if not args.cpu:
                torch.cuda.synchronize()
            if rank == 0:
                print(f"step {step} loss {loss.item():.5f}", flush=True)
    if not args.cpu:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if losses and rank == 0:
        for step, v in enumerate(torch.stack(losses).tolist()):
            print(f"step {step} loss {v:.5f}", flush=True)
    # every rank must end with the same weights (DDP averaged the gradients)
    w = torch.cat([p.detach().reshape(-1)[:1000] for p in model.parameters()])
    ws = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    same = all(torch.equal(ws[0], t) for t in ws)
    if rank == 0:
        print(f"ddp_step: world {world}, {nparams / 1e6:.1f}M params "
              f"({nparams * 4 / 1e6:.0f} MB fp32 grads), {args.steps} steps in {dt:.2f} s, "
              f"weights identical across ranks: {same}", flush=True)
    dist.destroy_process_group()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

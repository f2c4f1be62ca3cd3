"""What the data-parallel corpus programs (``w_ddp_*.py``) share: the process group made from the
environment ``torchrun`` gives each rank, their main loop (``_corpus.run``'s, with the ranks kept
in step) and the end-of-run check that every rank holds the same weights.

Launched as ``torchrun --standalone --nproc-per-node 2 SCRIPT ...`` (one process a GPU, NCCL), or
with ``--device cpu`` on gloo (two CPU processes: the logic, for the tests). Alone, without
torchrun, a program runs as a world of one. On GPUs NVLink multicast must stay off
(``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``): the program
refuses to start otherwise.

``--interleave`` times the variants as ``_corpus.interleave`` does, every rank running the same
blocks (their collectives pair up across ranks: a block size chosen by each rank from its own
warm-up could differ and leave one rank waiting in a collective the other never starts), so the
ranks agree on each variant's warm-up time (the slowest rank's); rank 0 writes the timings. With
``--small`` (the CPU smoke runs) the warm-up and the blocks are short.
"""
from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

import _corpus

MULTICAST_OFF = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                 ("NVSHMEM_DISABLE_NVLS", "1"))


def setup(dev: torch.device) -> tuple[int, int, torch.device]:
    """The process group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*; a
    world of one without them): NCCL with one GPU a rank, or gloo on the CPU. Returns (rank,
    world size, this rank's device)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        wrong = [f"{k}={v}" for k, v in MULTICAST_OFF if os.environ.get(k) != v]
        if wrong:
            raise SystemExit(f"set {' '.join(wrong)} in the environment (NVLink multicast must stay off)")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")
    return rank, world, dev


def agree_max(dev: torch.device) -> Callable[[float], float]:
    """A number made one value on every rank: the largest (``_corpus.interleave``'s ``agree``)."""
    def agree(x: float) -> float:
        t = torch.tensor([float(x)], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())
    return agree


def same_weights(model: torch.nn.Module) -> bool:
    """Whether every rank ends with the same weights (DDP averaged the gradients): the first
    thousand values of each parameter, gathered from every rank."""
    w = torch.cat([p.detach().reshape(-1)[:1000].float() for p in model.parameters()])
    ws = [torch.zeros_like(w) for _ in range(dist.get_world_size())]
    dist.all_gather(ws, w)
    return all(torch.equal(ws[0], t) for t in ws)


def run(build: Callable, args: argparse.Namespace, fixes: set[str], dev: torch.device, name: str,
        ) -> Optional[tuple[float, list]]:
    """A data-parallel corpus program's main loop. ``build(args, fixes, dev)`` returns (one
    iteration's step, the DDP-wrapped model). Runs ``--steps`` iterations and prints, on rank 0,
    one line: the world, the fixes, the steady iterations' mean time (the first fifth, at least
    one, left out as warm-up), the last loss and whether every rank ends with the same weights;
    or, with ``--interleave``, builds every variant and times them side by side
    (``_corpus.interleave``), rank 0 writing the timings. Returns (mean iteration ns, the
    steps' outputs) on rank 0 of a plain run, else None."""
    rank, world, dev = setup(dev)
    try:
        if args.interleave:
            _interleave(build, args, dev, rank)
            return None
        return _loop(build, args, fixes, dev, name, rank, world)
    finally:
        # The DDP models (their reducers hold the process group's work) are gone by now, with
        # the function that built them: destroying the group under a live one let gloo's threads
        # abort the process at exit ("terminate called without an active exception").
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def _interleave(build: Callable, args: argparse.Namespace, dev: torch.device, rank: int) -> None:
    steps = {v: build(args, fx, dev)[0] for v, fx in args.variant_fixes.items()}
    _corpus.interleave(steps, args.variant_fixes, args.interleave if rank == 0 else None, dev,
                       rounds=args.rounds, agree=agree_max(dev),
                       **_corpus.smoke_blocks(args))


def _loop(build: Callable, args: argparse.Namespace, fixes: set[str], dev: torch.device, name: str,
          rank: int, world: int) -> Optional[tuple[float, list]]:
    step, model = build(args, fixes, dev)
    warm = max(1, args.steps // 5)
    outs, t0 = [], None
    for i in range(args.steps):
        if i == warm:
            _corpus.finish(dev)
            t0 = time.perf_counter_ns()
        outs.append(step())
    _corpus.finish(dev)
    mean = (time.perf_counter_ns() - t0) / (args.steps - warm) if t0 is not None else float("nan")
    last = float(outs[-1]) if outs and isinstance(outs[-1], torch.Tensor) else float("nan")
    same = same_weights(model)
    if rank == 0:
        print(f"{name}: world {world}, {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"{mean / 1e6:.3f} ms a step (mean of {args.steps - warm} after warm-up), "
              f"last loss {last:.4f}, weights identical across ranks: {same}", flush=True)
    if not same:
        raise SystemExit(f"{name}: the ranks' weights differ")
    return (mean, outs) if rank == 0 else None

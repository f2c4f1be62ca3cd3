"""What the what-if corpus programs (``w_*.py``) share: the NVTX range helper, the ``--fix``
parser and the annotated training step. The programs import it as a sibling module (a script's folder is first on sys.path)."""
from __future__ import annotations

import argparse
import contextlib
from typing import Callable, Optional

import torch


def nvtx(name: str):
    """An NVTX range (nothing where CUDA is absent, for CPU smoke runs)."""
    return torch.cuda.nvtx.range(name) if torch.cuda.is_available() else contextlib.nullcontext()


def parse_fixes(ap: argparse.ArgumentParser, args: argparse.Namespace, known, cuda_only=(),
                alternatives=()) -> set[str]:
    """The fixes asked for (``--fix`` repeatable or comma-separated), checked: each known, the
    CUDA-only ones not on the CPU, no two of one set of ``alternatives`` together."""
    fixes = {f.strip() for v in args.fix for f in v.split(",") if f.strip()}
    if fixes - set(known):
        ap.error(f"unknown fix {sorted(fixes - set(known))}; known: {', '.join(known)}")
    if args.device == "cpu" and fixes & set(cuda_only):
        ap.error(f"fix {sorted(fixes & set(cuda_only))} needs --device cuda")
    for alt in alternatives:
        if set(alt) <= fixes:
            ap.error(f"{' and '.join(sorted(alt))} are alternatives: pick one")
    return fixes


def program_args(doc: str, known, cuda_only=(), alternatives=(), steps: int = 40,
                 steps_help: str = "training steps (the first ones are warm-up)",
                 small_help: str = "tiny model and batch, for a CPU smoke run",
                 more: Optional[Callable[[argparse.ArgumentParser], None]] = None,
                 ) -> tuple[argparse.Namespace, set[str], torch.device]:
    """The corpus programs' command line: ``--steps``, ``--fix`` (checked by parse_fixes),
    ``--device``, ``--small`` and whatever ``more`` adds; then the ``tf32`` fix, when asked for,
    and the torch seed are set. Returns the arguments, the fixes asked for and the device."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps, help=steps_help)
    ap.add_argument("--fix", action="append", default=[], help="fixes, repeatable or comma-separated: "
                    + ", ".join(known))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help=small_help)
    if more is not None:
        more(ap)
    args = ap.parse_args()
    fixes = parse_fixes(ap, args, known, cuda_only, alternatives)
    if "tf32" in fixes:  # every corpus program's tf32 fix is this one call, made before the model
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    return args, fixes, torch.device(args.device)


def train_step(forward: Callable[[], torch.Tensor], opt: torch.optim.Optimizer,
               amp: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
               before: Optional[Callable[[], None]] = None,
               after: Optional[Callable[[torch.Tensor], None]] = None) -> torch.Tensor:
    """One training step as the corpus programs annotate it: an NVTX range ``train_step`` holding
    ``forward`` (``forward()`` under ``amp()``, returning the loss), ``backward`` and
    ``optimizer`` (step, then gradients set to None); ``before`` and ``after(loss)`` run inside
    ``train_step``, first and last. Returns the loss."""
    with nvtx("train_step"):
        if before is not None:
            before()
        with nvtx("forward"), amp():
            loss = forward()
        with nvtx("backward"):
            loss.backward()
        with nvtx("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if after is not None:
            after(loss)
    return loss


class LossLog:
    """A fine-tuning loop's loss log, run after each step (``train_step``'s ``after``): in an
    NVTX range ``log``, ``loss.item()`` every step, which waits for the step's GPU work, or with
    ``on_gpu`` (the ``no_item`` fix) the loss summed on the GPU and read once by ``total()``."""

    def __init__(self, dev: torch.device, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        self.running = torch.zeros((), device=dev)
        self.logged: list[float] = []

    def __call__(self, loss: torch.Tensor) -> None:
        with nvtx("log"):
            if self.on_gpu:
                self.running.add_(loss.detach())
            else:
                self.logged.append(loss.item())  # waits for the step's GPU work

    def total(self) -> float:
        return self.running.item() if self.on_gpu else sum(self.logged)


def bf16_autocast(dev: torch.device, on: bool = True) -> Callable[[], contextlib.AbstractContextManager]:
    """``train_step``'s ``amp``: bf16 autocast on ``dev`` when ``on``, else no autocast."""
    return (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if on else contextlib.nullcontext


def finish(dev: torch.device) -> None:
    """Wait for the GPU's queued work, so that the program's end is its last step's end."""
    if dev.type == "cuda":
        torch.cuda.synchronize()


def capture(fn: Callable[[torch.Tensor], torch.Tensor], static: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``fn`` captured in a CUDA graph on the input buffer ``static``, without autograd, after three
    warm-up calls on a side stream (as capture requires): the graph and its output buffer."""
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(static)
    return graph, out


def graphed(fn: Callable[[torch.Tensor], torch.Tensor], static: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` captured (``capture``) on ``static``. Returns ``run(x)``: ``x`` copied into ``static``,
    the graph replayed, its output buffer returned."""
    graph, out = capture(fn, static)

    def run(x: torch.Tensor) -> torch.Tensor:
        static.copy_(x)
        graph.replay()
        return out
    return run

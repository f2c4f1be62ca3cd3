"""What the what-if corpus programs (``w_*.py``) share: the NVTX range helper, the ``--fix``
parser, the annotated training step and the interleaved timing of variants in one process. The
programs import it as a sibling module (a script's folder is first on sys.path)."""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from profkit.capture.switches import one_line  # noqa: E402  (pure Python: a failure on one line)


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
    interleave_args(ap)
    if more is not None:
        more(ap)
    args = ap.parse_args()
    fixes = parse_fixes(ap, args, known, cuda_only, alternatives)
    check_interleave(ap, args, fixes, known, cuda_only, alternatives)
    if wants_tf32(fixes):  # every corpus program's tf32 fix is this one call, made before the model
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


def lm_train_step(model: torch.nn.Module, fixes: set[str], vocab: int, batch: int, seq: int,
                  dev: torch.device) -> Callable[[], torch.Tensor]:
    """A GPT training step as the corpus's language-model programs run it: AdamW (lr 6e-4, weight
    decay 0.1; ``fused=True`` with the ``fused_adamw`` fix, else PyTorch's default), the model
    under ``torch.compile`` with the ``compile`` fix, bf16 autocast, fresh random tokens each step
    (``batch`` x ``seq`` inputs and their next tokens as targets; ``model(x, y)`` returns the loss).
    Returns the step (``train_step``: its loss)."""
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1,
                            fused=True if "fused_adamw" in fixes else None)
    fwd = torch.compile(model) if "compile" in fixes else model
    amp = bf16_autocast(dev)

    def step() -> torch.Tensor:
        data = torch.randint(0, vocab, (batch, seq + 1), device=dev)
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        return train_step(lambda: fwd(x, y), opt, amp)
    return step


class Optimizers:
    """Several optimizers stepped as one (an embedding table's sparse one beside the dense
    layers'), for ``train_step``."""

    def __init__(self, *opts: torch.optim.Optimizer) -> None:
        self.opts = opts

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)


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


def capture_training(body: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """A whole training step ``body()`` (forward, backward, optimizer) captured in a CUDA graph
    after three warm-up steps on a side stream (as capture requires): the graph and ``body``'s
    output buffer. The gradients are set to None before capture, so the captured backward
    allocates them in the graph's pool and writes them afresh each replay: ``body`` must not zero
    them itself."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()
    return graph, out


def body_step(forward: Callable[[], torch.Tensor], opt: torch.optim.Optimizer, graph: bool) -> Callable[[], torch.Tensor]:
    """One training iteration, an NVTX range ``train_step`` holding ``forward`` (``forward()``,
    returning the loss), ``backward`` and ``optimizer`` (its step): with ``graph`` captured once
    (``capture_training``) and replayed, its output buffer (the loss) returned; else run, the
    gradients then set to None. Returns the iteration."""
    def body() -> torch.Tensor:
        with nvtx("forward"):
            loss = forward()
        with nvtx("backward"):
            loss.backward()
        with nvtx("optimizer"):
            opt.step()
        return loss.detach()

    if graph:
        g, out = capture_training(body, opt)

        def replay() -> torch.Tensor:
            with nvtx("train_step"):
                g.replay()
            return out
        return replay

    def step() -> torch.Tensor:
        with nvtx("train_step"):
            loss = body()
            opt.zero_grad(set_to_none=True)
        return loss
    return step


def graphed(fn: Callable[[torch.Tensor], torch.Tensor], static: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` captured (``capture``) on ``static``. Returns ``run(x)``: ``x`` copied into ``static``,
    the graph replayed, its output buffer returned."""
    graph, out = capture(fn, static)

    def run(x: torch.Tensor) -> torch.Tensor:
        static.copy_(x)
        graph.replay()
        return out
    return run


# --- the variants timed side by side in one process ---------------------------------------------

def interleave_args(ap: argparse.ArgumentParser) -> None:
    """``--interleave OUT.json --variants baseline,FIX,...``: the variants built side by side in
    this one process and timed in alternating blocks (``interleave``), instead of the program's
    own loop; ``+`` joins fixes that make one variant (``channels_last+tf32``)."""
    ap.add_argument("--interleave", metavar="OUT.json",
                    help="time the --variants side by side in this process and write their timings here")
    ap.add_argument("--variants", default="", help="with --interleave: comma-separated variants "
                    "(baseline, a fix, or fixes joined by +)")
    ap.add_argument("--rounds", type=int, default=15, help="with --interleave: rounds of blocks")


def variant_fixes(ap: argparse.ArgumentParser, args: argparse.Namespace, known, cuda_only=(),
                  alternatives=()) -> dict[str, set[str]]:
    """``--variants`` as {name: its fixes}, each checked as ``--fix`` is."""
    out = {}
    for name in (v.strip() for v in args.variants.split(",") if v.strip()):
        fixes = set() if name == "baseline" else set(name.split("+"))
        if fixes - set(known):
            ap.error(f"unknown fix in variant {name!r}; known: {', '.join(known)}")
        if fixes & set(cuda_only) and args.device == "cpu":
            ap.error(f"variant {name!r} needs --device cuda")
        if any(set(alt) <= fixes for alt in alternatives):
            ap.error(f"variant {name!r} joins alternatives: pick one")
        out[name] = fixes
    return out


def check_interleave(ap: argparse.ArgumentParser, args: argparse.Namespace, fixes: set[str], known,
                     cuda_only=(), alternatives=()) -> None:
    """--interleave needs two or more --variants and no --fix (the variants carry the fixes)."""
    if args.interleave is None:
        if args.variants:
            ap.error("--variants needs --interleave OUT.json")
        return
    if fixes:
        ap.error("--interleave times --variants: give the fixes there, not as the run's own flags")
    args.variant_fixes = variant_fixes(ap, args, known, cuda_only, alternatives)
    if len(args.variant_fixes) < 2:
        ap.error("--interleave needs two or more --variants, e.g. --variants baseline,tf32")
    if args.rounds < 3:
        ap.error("--rounds must be 3 or more (the first round is warm-up)")


def run(build: Callable, args: argparse.Namespace, fixes: set[str], dev: torch.device,
        not_interleaved: Optional[dict[str, str]] = None) -> Optional[tuple[Callable, list]]:
    """A corpus program's main loop: ``build(args, fixes, dev)`` makes one iteration's step; run
    it ``--steps`` times and wait for the GPU, returning (step, what each call returned); or,
    with ``--interleave``, build every variant and time them side by side (``interleave``),
    returning None. ``not_interleaved``: fixes that cannot share a process with other
    variants, each with the reason said when asked for."""
    if args.interleave:
        for fix, why in (not_interleaved or {}).items():
            if any(fix in fx for fx in args.variant_fixes.values()):
                raise SystemExit(f"{fix} {why}: time it in runs of its own, not interleaved")
        steps, failed = {}, {}
        for name, fx in args.variant_fixes.items():
            try:
                steps[name] = build(args, fx, dev)
            except Exception as e:  # noqa: BLE001 (one variant's failure is a result, not the run's end)
                if name == "baseline":
                    raise
                failed[name] = one_line(e)
        interleave(steps, args.variant_fixes, args.interleave, dev, rounds=args.rounds, failed=failed,
                   **smoke_blocks(args))
        return None
    step = build(args, fixes, dev)
    outs = [step() for _ in range(args.steps)]
    finish(dev)
    return step, outs


def set_precision(fixes: set[str]) -> None:
    """The ``tf32`` fix as a process-wide setting, on or off: a builder calls it first (a CUDA
    graph keeps the GEMMs chosen when it was captured), ``interleave`` before each block."""
    torch.set_float32_matmul_precision("high" if wants_tf32(fixes) else "highest")


def wants_tf32(fixes: set[str]) -> bool:
    """Whether ``fixes`` turn TF32 on: ``tf32`` or a fix named ``..._tf32`` (one that changes
    something else as well, e.g. float64 to float32, and turns TF32 on with it)."""
    return any(f == "tf32" or f.endswith("_tf32") for f in fixes)


def smoke_blocks(args: argparse.Namespace) -> dict:
    """``interleave``'s warm-up and block lengths for ``--small`` (the tests' CPU smoke runs:
    short), else its defaults."""
    return {"warm": 2, "min_block": 2, "block_s": 0.02} if getattr(args, "small", False) else {}


def interleave(steps: dict[str, Callable[[], object]], fixes: dict[str, set[str]], path: Optional[str],
               dev: torch.device, rounds: int = 15, warm: int = 10, block_s: float = 0.2,
               agree: Optional[Callable[[float], float]] = None, min_block: int = 10,
               failed: Optional[dict[str, str]] = None) -> dict:
    """Time each variant's ``steps[name]()`` (one iteration of the program) in blocks that take
    turns, and write the timings to ``path`` as JSON: per variant the mean iteration of each
    block and their median over the rounds after the first.

    Why: separate runs of the same program, seconds apart, ran at CPU speeds up to 1.9x apart on
    the timing machines, so a host-bound program's small fix could not be told from that drift.
    Blocks of every variant taking turns in one process share the process's CPU, its clocks and
    its cores; the order reverses every round (ABC CBA ...) so that neither side always follows
    the other. A block starts and ends with a device synchronisation and is about ``block_s``
    seconds long (10 iterations or more), so the queue's filling and draining at its ends is a
    small part of it. ``tf32`` is a process-wide setting: it is set before each block of a
    variant that has it and unset before the others.

    After each round, each variant's issue time is timed on the host alone (``issue_ns``): from an
    idle GPU, one untimed iteration (the first of a variant after another ran finds the CPU's
    caches cold: 1 ms more on MobileNetV3 at batch 4), then two timed and not waited for, their
    mean: what the CPU takes to issue an iteration. Where the GPU sets the blocks' pace they show
    nothing of the CPU's speed, which changes from machine to machine; this does (a step that
    waits for the GPU inside shows its wait in it too).

    Several ranks of one data-parallel job (``_ddp.py``) run this together: every rank must run the
    same iterations, whose collectives pair up across ranks, so ``agree`` makes each variant's
    warm-up time one value on every rank (the slowest rank's) before the block size is set, and
    only the rank given a ``path`` writes the timings. ``warm`` and ``min_block`` are smaller in the
    CPU smoke runs of the tests.

    A variant other than the baseline that raises while it is built (``run``) or warmed up (where
    torch.compile compiles) is left out of the rounds and written under ``failed`` with its error
    on one line: one fix that breaks (an InductorError on varying shapes) leaves the others
    timed. A single rank's failure is not agreed on across ranks: there, it ends the job."""
    def enter(name: str) -> None:
        set_precision(fixes[name])

    failed = dict(failed or {})
    steps = {name: step for name, step in steps.items() if name not in failed}
    block, size = {}, {}
    for name, step in list(steps.items()):  # warm-up: compilation, cuDNN's algorithm choice, the allocator
        enter(name)
        last = None
        try:
            for _ in range(warm):
                last = step()
            finish(dev)
        except Exception as e:  # noqa: BLE001 (see the docstring: the other variants go on)
            if name == "baseline" or agree is not None:
                raise
            failed[name] = one_line(e)
            del steps[name], step, last
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            continue
        size[name] = output_size(last)
        t0 = time.perf_counter_ns()
        for _ in range(3):
            step()
        finish(dev)
        per = (time.perf_counter_ns() - t0) / 3
        if agree is not None:
            per = agree(per)
        block[name] = max(min_block, min(500, math.ceil(block_s * 1e9 / max(per, 1.0))))
    times: dict[str, list[float]] = {name: [] for name in steps}
    issue: dict[str, list[float]] = {name: [] for name in steps}
    collect: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    clock = GcClock()
    live = len(gc.get_objects())
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            enter(name)
            step = steps[name]
            finish(dev)
            g0 = clock.ns
            t0 = time.perf_counter_ns()
            for _ in range(block[name]):
                step()
            finish(dev)
            times[name].append((time.perf_counter_ns() - t0) / block[name])
            collect[name].append((clock.ns - g0) / block[name])
        for name in (order if r % 2 == 0 else order[::-1]):
            enter(name)
            finish(dev)
            steps[name]()
            t0 = time.perf_counter_ns()
            steps[name]()
            steps[name]()
            issue[name].append((time.perf_counter_ns() - t0) / 2)
            finish(dev)
    clock.stop()
    torch.set_float32_matmul_precision("highest")
    out = {"how": "interleaved blocks in one process; the first round is warm-up",
           "rounds": rounds, "live_objects": live, "variants": {
               name: {"block_iterations": block[name], "block_ns": [round(t) for t in ts],
                      "output_size": size[name],
                      "median_ns": round(statistics.median(ts[1:])), "n_used": len(ts) - 1,
                   "issue_ns": [round(t) for t in issue[name]],
                   "issue_median_ns": round(statistics.median(issue[name][1:])),
                   "gc_median_ns": round(statistics.median(collect[name][1:]))}
               for name, ts in times.items()}, **({"failed": failed} if failed else {})}
    if path is None:
        return out
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    base = out["variants"].get("baseline", {}).get("median_ns")
    for name, v in out["variants"].items():
        gain = f", {base / v['median_ns']:.2f}x" if base and name != "baseline" else ""
        print(f"interleaved {name}: {v['median_ns'] / 1e6:.3f} ms an iteration ({v['n_used']} blocks of "
              f"{v['block_iterations']}){gain}; output of {v['output_size']} values")
    for name, why in failed.items():
        print(f"interleaved {name}: FAILED ({why})")
    return out



class GcClock:
    """The time Python's garbage collector spends in its passes while it is installed (``ns``).

    Why: a host-bound Python step (a loader reading rows one by one) makes many objects, and each
    of the collector's full passes walks every object the process holds. In one process holding
    every variant, those passes walk the other variants' models and loaders too: on the 2-core
    development machine tabular_mlp_train's row-by-row loader took 22.5 ms a batch alone and
    40.9 ms with 2M more objects alive in the process (13.2 ms with them frozen out of the passes,
    ``gc.freeze``); on an H100 (2026-12-06) its baseline took 41.0 ms an iteration beside its
    fixes, 19.3 ms of it collecting, and 16.1-16.8 ms in a process of its own. What each block
    spent collecting is kept beside its time (``gc_median_ns``), and the corpus page leaves such a
    block out where separate runs timed the pair (scripts/whatif/store.py, ``gc_biased``)."""

    def __init__(self) -> None:
        self.ns = 0
        self._t0 = 0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        elif self._t0:
            self.ns += time.perf_counter_ns() - self._t0
            self._t0 = 0

    def stop(self) -> None:
        if self._on in gc.callbacks:
            gc.callbacks.remove(self._on)


def output_size(x: object) -> Optional[int]:
    """How many values an iteration returned (tensor elements, numbers, nested in lists, tuples
    and dicts); None for anything else. A fix whose iteration returns far fewer values than the
    baseline's (detections, tokens) may have been timed doing less work: a confound, not a gain."""
    if isinstance(x, torch.Tensor):
        return int(x.numel())
    if isinstance(x, (bool, int, float)):
        return 1
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        sizes = [output_size(y) for y in x]
        return sum(s for s in sizes if s is not None)
    return None

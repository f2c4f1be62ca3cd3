"""What a graph break costs torch.compile on the host (GPU).

The step model prices ``torch.compile`` by the fusion it does: each run of elementwise kernels
one compiled graph holds becomes one kernel, its launches gone. A blocking call (``.item()``,
``nonzero``, a copy to the host) breaks the graph: what follows is another compiled graph, and
each compiled graph costs the host a fixed amount per call (Dynamo's guards, AOTAutograd's
wrapper, the autograd node of its backward) that an eager op does not. On a step with many
breaks that cost can exceed what the fusion saves. This measures it on small training steps that
are host-bound by construction (64 tokens, width 256), eager against ``torch.compile`` (default
mode), in one process, alternated:

* ``plain``: STAGES pre-norm MLP stages (LayerNorm, Linear, GELU, Linear, residual), no break;
* ``item``: the same with ``if x.abs().max().item() > 1e4`` after each stage (a sync and a graph
  break per stage, shapes static);
* ``moe``: each stage a top-1 mixture of EXPERTS MLPs routed by ``nonzero`` per expert (a sync,
  a graph break and a data-dependent shape per expert), as first MoE implementations do;
* ``call``: one compiled function of two pointwise ops called STAGES times in a row (a compiled
  graph's fixed cost, forward and backward, with no fusion to gain beside the eager two ops).

Per program: the median iteration (ms) of eager and compiled over ``--rounds`` rounds of
``--iters`` iterations each (the GPU synchronised at each round's end), the compiled graphs'
count (Dynamo's unique graphs), the recompilations seen during the timed rounds, and the
compiled program's extra host time per compiled graph called, forward and backward together
(``item``: relative to ``plain``; ``moe`` and ``call``: relative to the same ops eager).

With ``--inference`` the forward alone, under ``torch.no_grad()`` (no backward graphs).

    python scripts/bench/compile_breaks.py [--inference] [--stages 8] [--experts 8] [--rounds 7] [--iters 30] [--out F.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import date

import torch
import torch.nn as nn
import torch.nn.functional as F

D, TOKENS = 256, 64
DEV = "cuda"
INFERENCE = False


class Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Expert(nn.Module):
    # a class of the program's own: Dynamo compiles its forward as a frame of its own where the
    # routing loop around it falls back to eager (it skips torch.nn's own modules at the top)
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoEStage(nn.Module):
    def __init__(self, experts: int) -> None:
        super().__init__()
        self.ln, self.router = nn.LayerNorm(D), nn.Linear(D, experts, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        p = self.router(h).softmax(-1)
        w, idx = p.max(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok = (idx == e).nonzero().squeeze(1)          # waits for the GPU; shape follows the data
            if tok.numel() == 0:
                continue
            out = out.index_add(0, tok, (expert(h.index_select(0, tok)) * w[tok, None]).to(out.dtype))
        return x + out


class Net(nn.Module):
    def __init__(self, kind: str, stages: int, experts: int) -> None:
        super().__init__()
        self.kind = kind
        self.stages = nn.ModuleList(MoEStage(experts) if kind == "moe" else Stage() for _ in range(stages))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for s in self.stages:
            x = s(x)
            if self.kind == "item" and x.abs().max().item() > 1e4:   # a sync and a graph break
                x = x * 0.5
        return x.float().pow(2).mean()


def _pointwise(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * x


class Calls(nn.Module):
    """STAGES calls of one small function: compiled, each call is a compiled graph of its own."""

    def __init__(self, stages: int, fn) -> None:
        super().__init__()
        self.n, self.fn, self.w = stages, fn, nn.Parameter(torch.randn(TOKENS, D) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.w
        for _ in range(self.n):
            y = self.fn(y)
        return y.pow(2).mean()


def build(kind: str, compiled: bool, stages: int, experts: int):
    torch.manual_seed(0)
    if kind == "call":
        model = Calls(stages, torch.compile(_pointwise) if compiled else _pointwise).to(DEV)
        fwd = model
    else:
        model = Net(kind, stages, experts).to(DEV)
        fwd = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    if INFERENCE:
        def infer() -> None:
            x = torch.randn(TOKENS, D, device=DEV)
            with torch.no_grad(), torch.autocast(DEV, torch.bfloat16):
                fwd(x)
        return infer

    def step() -> None:
        x = torch.randn(TOKENS, D, device=DEV)
        with torch.autocast(DEV, torch.bfloat16):
            loss = fwd(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def graphs() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--out", default="")
    ap.add_argument("--inference", action="store_true", help="the forward alone under torch.no_grad()")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script, no timing worth reading")
    a = ap.parse_args()
    global DEV, INFERENCE
    DEV, INFERENCE = a.device, a.inference
    if DEV == "cuda" and not torch.cuda.is_available():
        print("compile_breaks: needs a CUDA GPU", file=sys.stderr)
        return 2
    import torch._dynamo as dynamo
    dynamo.config.cache_size_limit = 64
    kinds = ("plain", "item", "moe", "call")
    steps, meta = {}, {}
    for kind in kinds:
        for compiled in (False, True):
            g0 = graphs()
            t0 = time.perf_counter()
            step = build(kind, compiled, a.stages, a.experts)
            for _ in range(a.warmup):
                step()
            sync()
            g1 = graphs()
            steps[kind, compiled] = step
            meta[kind, compiled] = {"graphs": g1 - g0, "recompiled_while_timed": 0,
                                    "warmup_s": round(time.perf_counter() - t0, 1)}
            print(f"built {kind} {'compiled' if compiled else 'eager'}: {meta[kind, compiled]}", flush=True)
    times: dict = {k: [] for k in steps}
    for _ in range(a.rounds):
        for k, step in steps.items():
            g0 = graphs()
            sync()
            t = time.perf_counter()
            for _ in range(a.iters):
                step()
            sync()
            times[k].append((time.perf_counter() - t) / a.iters * 1e3)
            meta[k]["recompiled_while_timed"] += graphs() - g0
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    base = med["plain", True] - med["plain", False]
    for kind in kinds:
        e, c = med[kind, False], med[kind, True]
        m = meta[kind, True]
        breaks = {"plain": 0, "item": a.stages, "moe": a.stages * a.experts, "call": a.stages}[kind]
        # item: the same stages as plain, more graphs; moe and call: each compiled graph against
        # the eager ops it runs
        extra = ((c - e) - (base if kind == "item" else 0.0)) / breaks * 1e3 if breaks else None
        rows.append({"program": kind, "eager_ms": round(e, 3), "compiled_ms": round(c, 3),
                     "speedup": round(e / c, 3), "graphs": m["graphs"],
                     "recompiled_while_timed": m["recompiled_while_timed"], "breaks_per_iteration": breaks,
                     "extra_host_us_per_break": None if extra is None else round(extra, 1),
                     "eager_spread_ms": [round(min(times[kind, False]), 3), round(max(times[kind, False]), 3)],
                     "compiled_spread_ms": [round(min(times[kind, True]), 3), round(max(times[kind, True]), 3)]})
    print(f"{'program':8s} {'eager ms':>9s} {'compiled':>9s} {'speedup':>8s} {'graphs':>7s} "
          f"{'recomp':>7s} {'breaks/it':>9s} {'us/break':>9s}")
    for r in rows:
        ub = "-" if r["extra_host_us_per_break"] is None else f"{r['extra_host_us_per_break']:.1f}"
        print(f"{r['program']:8s} {r['eager_ms']:9.3f} {r['compiled_ms']:9.3f} {r['speedup']:7.2f}x "
              f"{r['graphs']:7d} {r['recompiled_while_timed']:7d} {r['breaks_per_iteration']:9d} {ub:>9s}")
    out = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__, "date": date.today().isoformat(),
           "inference": a.inference, "stages": a.stages, "experts": a.experts, "tokens": TOKENS, "width": D, "rounds": a.rounds,
           "iters": a.iters, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

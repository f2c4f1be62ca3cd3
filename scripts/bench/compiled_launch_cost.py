"""What one kernel of a compiled graph costs the host, against one eager op (GPU).

torch.compile's default mode fuses kernels and removes their launches; the kernels it keeps are
launched from Inductor's generated Python (a Triton kernel's launcher, or an extern call such as
``extern_kernels.mm`` with the buffers it allocates), not from eager dispatch. Where a step is
host-bound, what compiling gains is the launches it removes times eager's cost a launch, less
the launches it keeps times the difference of the two costs. This measures both costs on steps
that are host-bound by construction (64 tokens, width 256, float32: every kernel a few
microseconds of GPU time), eager against ``torch.compile`` (default mode), in one process,
alternated, at two depths, so that the cost a kernel is the slope between them (a compiled
graph's fixed cost per call cancels):

* ``chain``: STAGES of ``softmax(x * w + b)``: three eager kernels a stage, one Triton kernel
  compiled (only Triton kernels);
* ``mm``: STAGES of ``relu(x @ W)``: two eager kernels a stage, compiled a cuBLAS GEMM called
  from Inductor's code and a Triton kernel;
* ``mlp``: STAGES pre-norm MLP blocks (LayerNorm, Linear, GELU, Linear, residual), the mix of a
  transformer's.

Per program, mode and depth: the median iteration (ms) over ``--rounds`` rounds of ``--iters``
iterations (the GPU synchronised at each round's end), the kernels an iteration (counted by
torch.profiler over three iterations, Inductor's ``triton_*`` apart), and the kernels' GPU time
over the iteration (host-bound where it is well under 1). Then the host time a kernel, eager and
compiled, from the slope between the two depths (none where compiling leaves as many kernels at
both: ``chain`` fused whole), and the host time of a compiled graph's call beyond the step's own
(the intercept at the shallow depth less eager's: the loss and autograd's engine run eager in
both).

    python scripts/bench/compiled_launch_cost.py [--inference] [--rounds 7] [--iters 30] [--out F.json]
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
DEPTHS = (4, 16)


class Chain(nn.Module):
    def __init__(self, stages: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(stages, D) * 0.1 + 1.0)
        self.b = nn.Parameter(torch.randn(stages, D) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.w.shape[0]):
            x = torch.softmax(x * self.w[i] + self.b[i], dim=-1)
        return x


class MM(nn.Module):
    def __init__(self, stages: int) -> None:
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.randn(D, D) / D ** 0.5) for _ in range(stages)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.w:
            x = torch.relu(x @ w)
        return x


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class MLP(nn.Module):
    def __init__(self, stages: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(stages)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


PROGRAMS = {"chain": Chain, "mm": MM, "mlp": MLP}


def step_fn(model: nn.Module, x: torch.Tensor, inference: bool):
    if inference:
        def step() -> None:
            with torch.no_grad():
                model(x)
    else:
        def step() -> None:
            model(x).pow(2).mean().backward()
    return step


def kernels(step) -> tuple[float, float, float]:
    """Kernels an iteration (all, Inductor's), and their GPU time (ms), over three iterations."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu = sum(e.device_time for e in ev) / 1e3
    return len(ev) / 3, sum(e.name.startswith("triton") for e in ev) / 3, gpu / 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inference", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compiled_launch_cost: needs a CUDA GPU")
    torch.manual_seed(0)
    rows = []
    for name, cls in PROGRAMS.items():
        for depth in DEPTHS:
            x = torch.randn(TOKENS, D, device="cuda", requires_grad=not a.inference)
            eager = cls(depth).cuda()
            compiled = torch.compile(cls(depth).cuda())
            steps = {"eager": step_fn(eager, x, a.inference), "compiled": step_fn(compiled, x, a.inference)}
            for s in steps.values():
                for _ in range(a.warmup):
                    s()
            torch.cuda.synchronize()
            times: dict[str, list[float]] = {k: [] for k in steps}
            for _ in range(a.rounds):
                for k, s in steps.items():
                    t0 = time.perf_counter()
                    for _ in range(a.iters):
                        s()
                    torch.cuda.synchronize()
                    times[k].append((time.perf_counter() - t0) * 1e3 / a.iters)
            for k, s in steps.items():
                n, tri, gpu = kernels(s)
                ms = statistics.median(times[k])
                rows.append({"program": name, "depth": depth, "mode": k, "ms": round(ms, 4),
                             "spread": [round(min(times[k]), 4), round(max(times[k]), 4)],
                             "kernels": n, "triton": tri, "gpu_ms": round(gpu, 4),
                             "gpu_share": round(gpu / ms, 3)})
                print(f"{name:6s} depth {depth:3d} {k:9s} {ms:8.3f} ms  kernels {n:6.1f} (triton {tri:5.1f})"
                      f"  gpu {gpu / ms:5.1%}", flush=True)
            torch._dynamo.reset()
    slopes = []
    for name in PROGRAMS:
        fit = {}
        for mode in ("eager", "compiled"):
            lo, hi = (next(r for r in rows if r["program"] == name and r["mode"] == mode and r["depth"] == d)
                      for d in DEPTHS)
            dk = hi["kernels"] - lo["kernels"]
            # where compiling leaves the same kernel count at both depths (a chain fused whole),
            # there is no slope: its kernels are taken at eager's cost
            us = (hi["ms"] - lo["ms"]) * 1e3 / dk if dk >= 4 else None
            fit[mode] = (us, lo)
        e_us, e_lo = fit["eager"]
        c_us, c_lo = fit["compiled"]
        per_kernel = c_us if c_us is not None else e_us
        # the step's time outside its kernels' launches (the loss, autograd's engine) is eager's
        # intercept; what the compiled step has beyond it, at the shallow depth, is the compiled
        # graph's call
        call_us = (c_lo["ms"] * 1e3 - per_kernel * c_lo["kernels"]) - max(e_lo["ms"] * 1e3 - e_us * e_lo["kernels"], 0.0)
        slopes.append({"program": name, "eager_us_per_kernel": round(e_us, 2),
                       "compiled_us_per_kernel": round(c_us, 2) if c_us is not None else None,
                       "compiled_call_us": round(call_us, 1)})
        ratio = f"{c_us / e_us:.2f}" if c_us is not None else "-"
        print(f"{name:6s} host a kernel: eager {e_us:.2f} us, compiled {c_us if c_us is not None else float('nan'):.2f} us "
              f"(ratio {ratio}); a compiled graph's call {call_us:.0f} us", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": str(date.today()),
              "inference": a.inference, "tokens": TOKENS, "width": D, "depths": DEPTHS,
              "rounds": a.rounds, "iters": a.iters, "rows": rows, "slopes": slopes}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

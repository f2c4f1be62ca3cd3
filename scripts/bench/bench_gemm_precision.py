"""fp32 GEMMs against TF32 and bf16, aligned and unaligned, on GPT-2 (124M)'s training shapes (GPU).

PK302 prices TF32 and bf16 for a trace of fp32 GEMMs. A library GEMM reaches about the same
share of the tensor cores' roof as it did of the CUDA cores' one, but only when its leading
dimensions are 16-byte aligned (4 fp32 / 8 bf16 elements): otherwise cuBLAS runs a kernel that
loads one element at a time. This measures both on the shapes of one GPT-2 training step (batch
8 x 512 = 4096 tokens): each layer's four projections (HF ``Conv1D``: ``x @ W``, W is [in, out])
and the LM head tied to the 50,257-word embedding (``x @ E.T``), each forward, input gradient and
weight gradient, and the LM head padded to 50,304 words beside it. Per shape and precision the
median of ``--reps`` CUDA-event timings (each over ``--calls`` calls back to back, so that the
host's launch hides behind the GPU) after ``--warmup``, the three precisions alternated in every
round so that clocks and neighbours affect them alike.

    python scripts/bench/bench_gemm_precision.py [--reps 30] [--warmup 5] [--calls 10] [--out FILE.json]

bf16 runs on bf16 copies of the operands (what autocast feeds a GEMM; the casts themselves are
not timed here).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import date

import torch

TOKENS = 4096
# (name, K, N, weight layout): Conv1D keeps W as [in, out]; the LM head uses the embedding [N, K]
LAYERS = [("attn.c_attn", 768, 2304, "in_out"), ("attn.c_proj", 768, 768, "in_out"),
          ("mlp.c_fc", 768, 3072, "in_out"), ("mlp.c_proj", 3072, 768, "in_out"),
          ("lm_head", 768, 50257, "out_in"), ("lm_head padded", 768, 50304, "out_in")]


def gemms(k: int, n: int, layout: str, dtype: torch.dtype) -> dict:
    """The three GEMMs of one linear layer in training, as autograd runs them."""
    g = torch.Generator(device="cuda").manual_seed(k * n)
    x = torch.randn(TOKENS, k, device="cuda", generator=g).to(dtype)
    gy = torch.randn(TOKENS, n, device="cuda", generator=g).to(dtype)
    if layout == "in_out":
        w = torch.randn(k, n, device="cuda", generator=g).to(dtype)
        return {"forward": lambda: x @ w, "input grad": lambda: gy @ w.t(), "weight grad": lambda: x.t() @ gy}
    w = torch.randn(n, k, device="cuda", generator=g).to(dtype)
    return {"forward": lambda: x @ w.t(), "input grad": lambda: gy @ w, "weight grad": lambda: gy.t() @ x}


def time_once(fn, calls: int) -> float:
    """One GEMM's time (us): ``calls`` of it back to back between two events, so that the host's
    launch of each (~10 us) hides behind the GPU's work instead of being timed with it."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()  # queued ahead: the first timed call does not wait for the host
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def run(reps: int, warmup: int, calls: int) -> list[dict]:
    rows = []
    for name, k, n, layout in LAYERS:
        f32, b16 = gemms(k, n, layout, torch.float32), gemms(k, n, layout, torch.bfloat16)
        for which in f32:
            times = {"fp32": [], "tf32": [], "bf16": []}
            for i in range(warmup + reps):
                for prec in times:
                    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
                    t = time_once(b16[which] if prec == "bf16" else f32[which], calls)
                    if i >= warmup:
                        times[prec].append(t)
            torch.backends.cuda.matmul.allow_tf32 = False
            med = {p: statistics.median(v) for p, v in times.items()}
            rows.append({"layer": name, "gemm": which, "m_k_n": _mkn(which, k, n),
                         **{f"{p}_us": round(v, 1) for p, v in med.items()},
                         "tf32_gain": round(med["fp32"] / med["tf32"], 2),
                         "bf16_gain": round(med["fp32"] / med["bf16"], 2)})
    return rows


def _mkn(which: str, k: int, n: int) -> list[int]:
    return {"forward": [TOKENS, k, n], "input grad": [TOKENS, n, k], "weight grad": [k, TOKENS, n]}[which]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10, help="back-to-back calls per timing")
    ap.add_argument("--out", help="also write the table as JSON here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gemm_precision: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run(a.reps, a.warmup, a.calls)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {date.today()}; "
          f"medians of {a.reps} after {a.warmup} warm-up, {a.calls} calls back to back each, microseconds")
    print(f"{'layer':16s} {'gemm':12s} {'M x K x N':>20s} {'fp32':>8s} {'tf32':>8s} {'bf16':>8s} "
          f"{'tf32 gain':>9s} {'bf16 gain':>9s}")
    for r in rows:
        print(f"{r['layer']:16s} {r['gemm']:12s} {' x '.join(map(str, r['m_k_n'])):>20s} {r['fp32_us']:8.1f} "
              f"{r['tf32_us']:8.1f} {r['bf16_us']:8.1f} {r['tf32_gain']:9.2f} {r['bf16_gain']:9.2f}")
    for group, names in (("aligned layers", [x[0] for x in LAYERS[:4]]), ("lm_head", ["lm_head"]),
                         ("lm_head padded", ["lm_head padded"])):
        sel = [r for r in rows if r["layer"] in names]
        tot = {p: sum(r[f"{p}_us"] for r in sel) for p in ("fp32", "tf32", "bf16")}
        print(f"{group}: all GEMMs together tf32 {tot['fp32'] / tot['tf32']:.2f}x, "
              f"bf16 {tot['fp32'] / tot['bf16']:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "date": str(date.today()), "reps": a.reps, "calls": a.calls, "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

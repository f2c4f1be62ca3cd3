#!/usr/bin/env python3
"""Run every CUDA-backend and Triton-backend op on small shapes, for compute-sanitizer:

    compute-sanitizer --tool memcheck  python scripts/gpu/sanitize_kernels.py
    compute-sanitizer --tool racecheck python scripts/gpu/sanitize_kernels.py --backends cuda

Shapes cover the vector path, the scalar (misaligned / odd hidden) path and the looping long-row
path of each kernel.  Every case runs twice: Triton launches a specialisation's second call through
the compiled kernel's own launcher, not its JIT.  Exits non-zero if an op raises or returns a wrong
result.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import kernels  # noqa: E402

SHAPES = [(1, 8), (3, 1000), (2, 4096), (2, 12345), (1, 40000)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="cuda,triton")
    args = ap.parse_args()
    backends = args.backends.split(",")
    if "cuda" in backends:
        from kernels import _build

        _build.ensure_loaded()
    bad = 0
    n = 0
    for be in backends:
        for dtype in (torch.bfloat16, torch.float32):
            for rows, hidden in SHAPES * 2:
                for misaligned in (False, True):
                    def mk(*shape):
                        numel = 1
                        for s in shape:
                            numel *= s
                        buf = torch.randn(numel + (1 if misaligned else 0), device="cuda", dtype=dtype)
                        return buf[1:].view(*shape) if misaligned else buf.view(*shape)

                    x, r, w, b = mk(rows, hidden), mk(rows, hidden), mk(hidden), mk(hidden)
                    ref_out, ref_h = kernels.add_rmsnorm(x, r, w, backend="torch")
                    out, h = kernels.add_rmsnorm(x, r, w, backend=be)
                    r2 = r.clone()
                    out2 = kernels.add_rmsnorm_(x, r2, w, backend=be)
                    ln, lh = kernels.add_layernorm(x, r, w, b, backend=be)
                    g1 = kernels.bias_gelu(x, b, "none", backend=be)
                    g2 = kernels.bias_gelu(x, b, "tanh", backend=be)
                    sm = kernels.softmax(x, 0.5, backend=be)
                    torch.cuda.synchronize()
                    n += 6
                    tol = 5e-2 if dtype == torch.bfloat16 else 1e-4
                    checks = [
                        (out, ref_out), (h, ref_h), (out2, ref_out), (r2, ref_h),
                        (ln, kernels.add_layernorm(x, r, w, b, backend="torch")[0]),
                        (g1, kernels.bias_gelu(x, b, "none", backend="torch")),
                        (g2, kernels.bias_gelu(x, b, "tanh", backend="torch")),
                        (sm, kernels.softmax(x, 0.5, backend="torch")),
                    ]
                    for i, (got, want) in enumerate(checks):
                        err = ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()
                        if not err <= tol:
                            bad += 1
                            print(f"MISMATCH {be} {dtype} {rows}x{hidden} misaligned={misaligned} check {i}: {err:.3g}")
    print(f"sanitize_kernels: {n} op calls, {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

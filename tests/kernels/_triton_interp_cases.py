"""Run the Triton kernels through Triton's interpreter on CPU tensors (small shapes only).

Launched in a subprocess by test_triton_interpreter.py with TRITON_INTERPRET=1 set before triton is
imported.  Outputs are preallocated and poisoned with NaN so unwritten elements fail.  Exits 1 and
lists the failures if any case is off.  Arguments pick the parts to run (``float32``, ``bfloat16``,
``float16``: the shape sweep in that type; ``special``: the tile path, special values and the shared
row prologue); none runs them all.
"""
from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

from kernels import triton_kernels as tk  # noqa: E402
from _kernel_refs import TOL, make_inputs, ref64, rel_err  # noqa: E402

PARTS = ("float32", "bfloat16", "float16", "special")
parts = set(sys.argv[1:]) or set(PARTS)
assert parts <= set(PARTS), f"unknown part(s) {sorted(parts - set(PARTS))}; parts: {PARTS}"
seed = int.from_bytes(os.urandom(4), "little")
torch.manual_seed(seed)
failures: list[str] = []
n_cases = 0


def nan_like(t):
    return torch.full_like(t, float("nan"))


def check(name, outs, refs, dtype):
    global n_cases
    n_cases += 1
    for i, (o, r) in enumerate(zip(outs, refs)):
        err = rel_err(o, r)
        if not err <= TOL[dtype]:
            failures.append(f"{name} output {i}: relative error {err:.3g} > {TOL[dtype]:.3g}")


# (rows, hidden, max_single): max_single forces the looping path on small rows
# 300 rows: the prefill class, where add+RMSNorm reads its row twice. The other kernels' bodies do
# not depend on the row count (it only picks their autotuning candidates, which the interpreter
# does not time), and the interpreter runs each of the 300 rows as a program of its own (most of
# this file's time): only add+RMSNorm runs it.
CASES = [(1, 64, None), (3, 1000, None), (2, 5120, None), (2, 1000, 256), (1, 12345, 4096), (300, 96, None)]
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    if str(dtype).removeprefix("torch.") not in parts:
        continue
    for rows, n, ms in CASES:
        tag = f"{dtype}-{rows}x{n}-max_single={ms}"
        assert (tk._rows_class(rows) == 1) == (rows == 300)
        inp = make_inputs("add_rmsnorm", rows, n, dtype)
        out, h = nan_like(inp["x"]), nan_like(inp["x"])
        tk.add_rmsnorm(inp["x"], inp["residual"], inp["weight"], inp["eps"], out=out, residual_out=h,
                       max_single=ms)
        check(f"add_rmsnorm {tag}", (out, h), ref64("add_rmsnorm", inp), dtype)

        res = inp["residual"].clone()
        out = nan_like(inp["x"])
        tk.add_rmsnorm_inplace(inp["x"], res, inp["weight"], inp["eps"], out=out, max_single=ms)
        check(f"add_rmsnorm_ {tag}", (out, res), ref64("add_rmsnorm", inp), dtype)
        if tk._rows_class(rows) == 1:
            continue

        inp = make_inputs("add_layernorm", rows, n, dtype)
        out, h = nan_like(inp["x"]), nan_like(inp["x"])
        tk.add_layernorm(inp["x"], inp["residual"], inp["weight"], inp["bias"], inp["eps"], out=out,
                         residual_out=h, max_single=ms)
        check(f"add_layernorm {tag}", (out, h), ref64("add_layernorm", inp), dtype)

        inp = make_inputs("softmax", rows, n, dtype)
        out = nan_like(inp["x"])
        tk.softmax(inp["x"], inp["scale"], out=out, max_single=ms)
        check(f"softmax {tag}", (out,), ref64("softmax", inp), dtype)

        if ms is None:
            for approx in ("none", "tanh"):
                inp = make_inputs("bias_gelu", rows, n, dtype)
                out = nan_like(inp["x"])
                tk.bias_gelu(inp["x"], inp["bias"], approx, out=out)
                check(f"bias_gelu[{approx}] {tag}", (out,), ref64("bias_gelu", inp, approx), dtype)

# The shared @triton.jit row prologue (_add_rows) on its own, in a tiny kernel: h = round(x + r).
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _probe(X, R, H, F, N, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    hf = tk._add_rows(X, R, H, cols, mask, True, True)
    tl.store(F + cols, hf, mask=mask)


if "special" in parts:
    # bias+GELU past FLAT_GELU_MAX elements takes the 2-D tile kernel (a ragged last row block and column tile)
    for approx in ("none", "tanh"):
        inp = make_inputs("bias_gelu", tk.FLAT_GELU_MAX // 1000 + 3, 1000, torch.float32)
        out = nan_like(inp["x"])
        tk.bias_gelu(inp["x"], inp["bias"], approx, out=out)
        check(f"bias_gelu[{approx}] tile path", (out,), ref64("bias_gelu", inp, approx), torch.float32)

    # -inf rows and NaN propagate like eager softmax, on both paths
    for ms in (None, 128):
        x = torch.randn(3, 300)
        x[0] = float("-inf")
        x[1, 5] = float("nan")
        x[2, :150] = float("-inf")
        out = nan_like(x)
        tk.softmax(x, 1.0, out=out, max_single=ms)
        base = torch.softmax(x, -1)
        n_cases += 1
        if not (torch.equal(out.isnan(), base.isnan()) and torch.allclose(out[2], base[2], atol=1e-6)):
            failures.append(f"softmax special values (max_single={ms}) differ from eager")

    # the shared row prologue, in the tiny kernel above
    for dtype in (torch.float32, torch.bfloat16):
        xs, rs = torch.randn(100, dtype=dtype), torch.randn(100, dtype=dtype)
        hs, fs = nan_like(xs), torch.full((100,), float("nan"))
        _probe[(1,)](xs, rs, hs, fs, 100, BLOCK=128)
        want = (xs.double() + rs.double()).to(dtype)
        n_cases += 1
        # (the interpreter's fp32 -> bf16 conversion may round differently: compare within tolerance)
        if not (rel_err(hs, want.double()) <= TOL[dtype] and torch.equal(fs, hs.float())):
            failures.append(f"_add_rows {dtype}: stored/returned h differs from round(x + r)")


print(f"triton interpreter: {n_cases} cases, {len(failures)} failures, seed {seed}")
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)

"""Triton backend: private @triton.jit kernels and their host launchers.

Every row kernel runs one program per row.  Rows that fit in registers (next_pow2(hidden) up to
MAX_SINGLE_BLOCK) are read once and written once, except add+RMSNorm's prefill-sized calls, which
read the row a second time from L2 (as torch.compile's kernel; measured faster); longer rows loop
over BLOCK-sized chunks and re-read the row (from L2, mostly) instead of holding it.

The launchers take optional preallocated outputs (out=, residual_out=) so tests can poison them.
With TRITON_INTERPRET=1 (set before triton is imported) they also run on CPU tensors.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# evict_first on the single-pass loads of prefill-sized calls: off.  Side by side on an H200
# (2026-11-30) it made every large row kernel 3-6% slower (add+RMSNorm 16384x4096 140.1 vs
# 132.2 µs, softmax 65536x8192 548.7 vs 516.1, bias+GELU 65536x8192 627.6 vs 602.8) and cost
# 0.3-0.4 µs at 16x4096.  PROFKIT_TRITON_EVICT=1 turns it back on, and add+RMSNorm's prefill rows
# back to one read in registers (a benchmarking switch, read once).
_EVICT_PREFILL = os.environ.get("PROFKIT_TRITON_EVICT", "0") == "1"
MAX_SINGLE_BLOCK = 16384  # elements of one row held by one program; longer rows loop
LOOP_BLOCK = 4096


def _row_configs():
    """num_warps candidates of the row kernels, tuned once per (hidden, dtype, few/many rows).

    A fixed 8 warps left the 16384x4096 bf16 add+RMSNorm at 0.92-0.99x of torch.compile on H200;
    the best count depends on the hidden size and the row count, so it is measured once per key
    (analyses/kernels_h200.md has what this reaches).  The interpreter gets a single config, so it
    never benchmarks.
    """
    if _INTERPRET:
        return [triton.Config({}, num_warps=4)]
    # 32 warps: add+RMSNorm 65536x8192 re-reading its row, in place, ran 1004 µs with 32, 1023 with 16.
    return [triton.Config({}, num_warps=w) for w in (4, 8, 16, 32)]


def _decode_warps(block: int, wide: int = 16) -> int:
    """num_warps for a decode row: a fixed rule by row length (as Liger-Kernel's), since timing
    a 2 µs kernel in the autotuner measures launch noise, not the kernel.  `wide`: rows of 8192 and
    more, per kernel.  At 64x8192 on an H200 (scripts/gpu/probe_variants.py decode_warps, µs with 8 / 16
    / 32 warps): add+RMSNorm 3.81 / 3.52 / 3.38, add+LayerNorm 4.01 / 3.91 / 3.95, softmax 3.26 /
    3.21 / 3.43; so 32 for add+RMSNorm, 16 for the others."""
    return 4 if block < 2048 else 8 if block < 8192 else wide


def _reload_warps(block: int) -> int:
    """num_warps for add+RMSNorm's reload mode: block // 256 (16 for 4096, 32 for 8192).  Timing
    the candidates, the autotuner picked 8 for 4096 in one run and 16 in another; side by side
    (scripts/gpu/probe_variants.py reload: analyses/data/probe_variants_h200.json.gz) 16 beat 8 by 2% at
    16384x4096 and 32 beat 16 by 2% at 65536x8192, in place and not."""
    return min(32, max(4, block // 256))


def _prune_by_rule(configs, named_args, wide: int = 16, **kwargs):
    """Autotune prune: decode-like calls (ROWS_CLASS 0) and add+RMSNorm's reload mode get the one
    rule-chosen config (Triton still times it once, but the timing cannot change the choice);
    other prefill-like calls keep every candidate."""
    if len(configs) == 1:
        return configs
    block = int(kwargs.get("BLOCK", named_args.get("BLOCK", 4096)))
    if named_args.get("ROWS_CLASS", 1) == 0:
        want = _decode_warps(block, wide)
    elif kwargs.get("RELOAD", named_args.get("RELOAD", False)):
        want = _reload_warps(block)
    else:
        return configs
    kept = [c for c in configs if c.num_warps == want]
    return kept or configs[:1]


def _prune_wide(configs, named_args, **kwargs):
    """_prune_by_rule for add+RMSNorm: 32 warps on decode rows of 8192 and more (measured at 8192)."""
    return _prune_by_rule(configs, named_args, wide=32, **kwargs)


# ----------------------------------------------------------------------------------------------
# launching a compiled kernel without Triton's per-call binding
# ----------------------------------------------------------------------------------------------
_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})
_FAST: dict[tuple, tuple | bool] = {}  # specialisation -> (run, function, metadata, constexpr tail), or False
_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)
_current_device = torch.cuda.current_device
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _launch(kernel, grid: tuple, x: Tensor, *args, **consts) -> None:
    """kernel[grid](x, *args, **consts) on x's device (Triton launches on the current one; the
    CUDA extension guards the device the same way).

    From the second call of a specialisation on, the compiled kernel is launched through its own
    launcher, without Triton's per-call argument binding, cache key and autotuner lookup: on an
    H200 host a 16x4096 softmax launch took 5.3 µs of CPU that way, against 13.6 µs through the
    JIT function and 19.9 µs through the autotuner (scripts/gpu/probe_variants.py host;
    analyses/kernels_h200.md).  The specialisation is keyed more finely than Triton's own: each
    tensor's dtype and 16-byte alignment, every integer's exact value, the compile-time arguments
    and the device; a float's value is never compiled in.  Launch hooks (Triton's profiler) and
    arguments of any other type take Triton's own path."""
    if _INTERPRET or _raw_stream is None:
        kernel[grid](x, *args, **consts)
        return
    dev = x.get_device()
    if dev != _current_device():
        with torch.cuda.device(dev):
            _launch(kernel, grid, x, *args, **consts)
        return
    args = (x, *args)
    try:
        key = (kernel, dev, tuple(consts.items()), *[_spec(a) for a in args])
    except TypeError:  # an argument type the key does not know
        key = None
    hit = _FAST.get(key) if key is not None and not _hooked() else False
    if hit:
        run, function, metadata, tail = hit
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, _raw_stream(dev),
            function, metadata, None, None, None, *args, *tail)
        return
    compiled = kernel[grid](*args, **consts)
    if hit is None and len(_FAST) < 4096:
        _FAST[key] = _fast_entry(kernel, compiled, len(args), consts)


def _spec(a):
    """One argument's part of _launch's key: what Triton may compile into the kernel."""
    cls = a.__class__
    if cls is int or cls is bool:
        return cls, a
    if cls is float:
        return float
    if isinstance(a, Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    raise TypeError(cls.__name__)


def _hooked() -> bool:
    """Whether a launch hook is installed (Triton 3.6 keeps them in HookChains, empty by default)."""
    for name in ("launch_enter_hook", "launch_exit_hook"):
        hook = getattr(_KNOBS, name, None)
        if hook is not None and bool(getattr(hook, "calls", True)):
            return True
    return False


def _fast_entry(kernel, compiled, n_args: int, consts: dict):
    """What _launch needs to launch `compiled` again, or False where this Triton's internals differ
    from 3.6's (then every call takes Triton's own path)."""
    try:
        best = getattr(kernel, "best_config", None)  # an autotuner: the config this call ran
        given = {k: v for k, v in consts.items() if k not in _OPTIONS}
        given.update(best.kwargs if best is not None else {})
        names = list(kernel.arg_names)  # the JIT function's and the autotuner's alike
        if set(given) != set(names[n_args:]):
            return False
        return (compiled.run, compiled.function, compiled.packed_metadata, tuple(given[n] for n in names[n_args:]))
    except Exception:  # noqa: BLE001
        return False


def _rows_class(rows: int) -> int:
    return 0 if rows <= 264 else 1  # decode-like (fewer rows than 2 per SM) or prefill-like


# ----------------------------------------------------------------------------------------------
# shared row prologue of the add+norm kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _add_rows(X, R, RES_OUT, offs, mask, STORE: tl.constexpr, POLICY: tl.constexpr):
    """h = x + residual rounded to the output dtype (as eager's `x + r`), returned in fp32; stored
    to RES_OUT when STORE.  POLICY of the x and residual loads: 0 (or False) default; 1 (or True)
    evict_first (the row is read for the last time); 2 evict_last (the row is read again soon: keep
    it in L2).  One body for add+RMSNorm and add+LayerNorm, every pass."""
    if POLICY == 1:
        x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        r = tl.load(R + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    elif POLICY == 2:
        x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        r = tl.load(R + offs, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    else:
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(RES_OUT.dtype.element_ty)
    if STORE:
        tl.store(RES_OUT + offs, h, mask=mask)
    return h.to(tl.float32)


# ----------------------------------------------------------------------------------------------
# residual add + RMSNorm
# ----------------------------------------------------------------------------------------------
# restore_value: tuning runs the kernel several times, and the in-place variant writes R.
@triton.autotune(configs=_row_configs(), key=["N", "ROWS_CLASS"], restore_value=["R"], warmup=5, rep=20,
                 prune_configs_by={"early_config_prune": _prune_wide})
@triton.jit
def _add_rmsnorm_kernel(
    X, R, W, OUT, RES_OUT, N, eps, ROWS_CLASS, BLOCK: tl.constexpr, SINGLE: tl.constexpr, N_ITERS: tl.constexpr,
    EVICT: tl.constexpr, RELOAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = row * N
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        if RELOAD:
            # Prefill-sized calls: read the row for the sum of squares keeping it in L2, then read it
            # again (streaming it out) for the outputs, as torch.compile's kernel does, instead of
            # holding it in registers.  In-place on an H200, against torch.compile in the same run:
            # 16384x4096 0.96x -> 1.00x, 65536x8192 0.96x -> 1.00x (analyses/kernels_h200.md).
            hf = _add_rows(X, R, RES_OUT, base + cols, mask, False, 2)
            rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps)
            hf = _add_rows(X, R, RES_OUT, base + cols, mask, True, 1)
        else:
            hf = _add_rows(X, R, RES_OUT, base + cols, mask, True, EVICT)
            rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps)
        w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(OUT + base + cols, (hf * rstd * w).to(OUT.dtype.element_ty), mask=mask)
    else:
        # pass 1: sum of squares only (no stores, so the in-place variant can re-read R in pass 2)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            hf = _add_rows(X, R, RES_OUT, base + cols, mask, False, 0)
            acc += hf * hf
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        # pass 2: recompute h, write both outputs
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            hf = _add_rows(X, R, RES_OUT, base + cols, mask, True, 0)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(OUT + base + cols, (hf * rstd * w).to(OUT.dtype.element_ty), mask=mask)


def _row_config(n: int, max_single: int | None, rows: int) -> dict:
    """Constexpr launch arguments of a row kernel: one block per row, or a loop over chunks;
    EVICT: stream the single-pass loads (evict_first), only if _EVICT_PREFILL and prefill-like."""
    limit = MAX_SINGLE_BLOCK if max_single is None else max_single
    block = triton.next_power_of_2(max(n, 1))
    single = block <= limit
    if not single:
        block = min(LOOP_BLOCK, limit)
    return dict(BLOCK=block, SINGLE=single, N_ITERS=_iters(n, block, single),
                EVICT=_EVICT_PREFILL and _rows_class(rows) == 1)


def _iters(n: int, block: int, single: bool) -> int:
    # The loop trip count is a constexpr (one compile per distinct count of the rare long-row path):
    # Triton 3.6's interpreter cannot take a runtime bound in range() with numpy 2.
    return 1 if single else triton.cdiv(n, block)


def _check_rows(x: Tensor, *others: Tensor) -> None:
    for t in (x, *others):
        if not t.is_contiguous():
            raise ValueError("the Triton launchers need contiguous tensors (ops.py makes them contiguous).")


def _launch_add_rmsnorm(x, residual, weight, eps, out, residual_out, max_single):
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    if x.numel() == 0:
        return
    _launch(
        _add_rmsnorm_kernel, (rows,),
        x, residual, weight, out, residual_out, n, float(eps), _rows_class(rows), **_row_config(n, max_single, rows),
        RELOAD=_rows_class(rows) == 1 and not _EVICT_PREFILL,
    )


def add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, *, out=None, residual_out=None,
                max_single: int | None = None):
    x, residual, weight = x.contiguous(), residual.contiguous(), weight.contiguous()
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    _check_rows(out, residual_out)
    _launch_add_rmsnorm(x, residual, weight, eps, out, residual_out, max_single)
    return out, residual_out


def add_rmsnorm_inplace(x: Tensor, residual: Tensor, weight: Tensor, eps: float, *, out=None,
                        max_single: int | None = None):
    if not residual.is_contiguous():
        raise ValueError("residual must be contiguous for the in-place add_rmsnorm_ (it is written in place).")
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x) if out is None else out
    _check_rows(out)
    _launch_add_rmsnorm(x, residual, weight, eps, out, residual, max_single)
    return out


# ----------------------------------------------------------------------------------------------
# residual add + LayerNorm
# ----------------------------------------------------------------------------------------------
@triton.autotune(configs=_row_configs(), key=["N", "ROWS_CLASS"], warmup=5, rep=20,
                 prune_configs_by={"early_config_prune": _prune_by_rule})
@triton.jit
def _add_layernorm_kernel(
    X, R, W, B, OUT, RES_OUT, N, eps, ROWS_CLASS, BLOCK: tl.constexpr, SINGLE: tl.constexpr, N_ITERS: tl.constexpr,
    EVICT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = row * N
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        hf = _add_rows(X, R, RES_OUT, base + cols, mask, True, EVICT)
        mean = tl.sum(hf, axis=0) / N
        d = tl.where(mask, hf - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=0) / N + eps)
        w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(OUT + base + cols, (d * rstd * w + b).to(OUT.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            acc += _add_rows(X, R, RES_OUT, base + cols, mask, False, 0)
        mean = tl.sum(acc, axis=0) / N
        acc2 = tl.zeros([BLOCK], dtype=tl.float32)
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            d = tl.where(mask, _add_rows(X, R, RES_OUT, base + cols, mask, False, 0) - mean, 0.0)
            acc2 += d * d
        rstd = tl.rsqrt(tl.sum(acc2, axis=0) / N + eps)
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            hf = _add_rows(X, R, RES_OUT, base + cols, mask, True, 0)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            y = (hf - mean) * rstd * w + b
            tl.store(OUT + base + cols, y.to(OUT.dtype.element_ty), mask=mask)


def add_layernorm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor, eps: float, *, out=None,
                  residual_out=None, max_single: int | None = None):
    x, residual = x.contiguous(), residual.contiguous()
    weight, bias = weight.contiguous(), bias.contiguous()
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    _check_rows(out, residual_out)
    n = x.shape[-1]
    if x.numel() == 0:
        return out, residual_out
    rows = x.numel() // n
    _launch(
        _add_layernorm_kernel, (rows,),
        x, residual, weight, bias, out, residual_out, n, float(eps), _rows_class(rows), **_row_config(n, max_single, rows)
    )
    return out, residual_out


# ----------------------------------------------------------------------------------------------
# bias + GELU (erf or tanh form), 2-D tiles so the bias column needs no integer modulo
# ----------------------------------------------------------------------------------------------
@triton.jit
def _gelu(u, TANH: tl.constexpr):
    if TANH:
        # 0.5 u (1 + tanh(z)) == u * sigmoid(2 z)
        z = 0.7978845608028654 * (u + 0.044715 * u * u * u)
        y = u * tl.sigmoid(2.0 * z)
    else:
        # Branch-free erfc (Abramowitz & Stegun 7.1.26, |erf error| <= 1.5e-7): libdevice erf made this
        # kernel ALU-bound on H200.  For u < 0 the GELU is 0.5 u erfc(|u|/sqrt 2), taken directly.
        xa = tl.abs(u) * 0.7071067811865476
        t = 1.0 / (1.0 + 0.3275911 * xa)
        p = 1.061405429 * t - 1.453152027
        p = p * t + 1.421413741
        p = p * t - 0.284496736
        p = p * t + 0.254829592
        c = t * p * tl.exp2(-xa * xa * 1.4426950408889634)
        y = 0.5 * u * tl.where(u >= 0, 2.0 - c, c)
    return y


@triton.jit
def _bias_gelu_kernel(X, B, OUT, M, N, n_col_blocks, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      TANH: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    pid_m = pid // n_col_blocks
    pid_n = pid % n_col_blocks
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = (rows[:, None] < M) & cmask[None, :]
    offs = rows[:, None] * N + cols[None, :]
    if EVICT:
        x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    else:
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=cmask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = _gelu(x + b[None, :], TANH)
    tl.store(OUT + offs, y.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _bias_gelu_flat_kernel(X, B, OUT, NUMEL, N: tl.constexpr, XBLOCK: tl.constexpr, TANH: tl.constexpr):
    # Small (decode) tensors: the flattened index, whose bias column is idx % N with N a compile-time
    # constant (a multiply and shift, not a division).  The 2-D tile's program -> (row, column block)
    # split and 2-D masks sit before the loads, on the critical path of a 1-2 µs kernel: side by side
    # on an H200 (scripts/gpu/probe_variants.py gelu_flat) the flat kernel took 1.17 vs 1.25 µs at
    # 1x4096 (same block) and 2.41 vs 2.59 at 64x8192 (each at its best block).
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = idx < NUMEL
    x = tl.load(X + idx, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + idx % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + idx, _gelu(x + b, TANH).to(OUT.dtype.element_ty), mask=mask)


# Largest tensor the flat kernel takes (64x8192): one compile per hidden size, as torch.compile's.
FLAT_GELU_MAX = 1 << 19


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none", *, out=None):
    if approximate not in ("none", "tanh"):
        raise ValueError(f'approximate must be "none" or "tanh", got {approximate!r}.')
    x, bias = x.contiguous(), bias.contiguous()
    out = torch.empty_like(x) if out is None else out
    _check_rows(out)
    n = x.shape[-1]
    if x.numel() == 0:
        return out
    tanh = approximate == "tanh"
    if x.numel() <= FLAT_GELU_MAX:
        # 2 elements a thread (programs of 128 threads) while that is at most ~4 programs an SM, else 4
        # (programs of 256).  Side by side (scripts/gpu/probe_variants.py gelu_flat, µs, 256/4 vs 1024/8):
        # 1x4096 1.17 vs 1.24, 16x4096 1.44 vs 1.47, 64x8192 2.69 vs 2.41.
        xblock, warps = (256, 4) if x.numel() <= 1 << 17 else (1024, 8)
        _launch(_bias_gelu_flat_kernel, (triton.cdiv(x.numel(), xblock),),
                x, bias, out, x.numel(), N=n, XBLOCK=xblock, TANH=tanh, num_warps=warps)
        return out
    m = x.numel() // n
    # tiles of 4096 elements; at least ~2 programs per SM
    tile = max(512, min(4096, triton.next_power_of_2(max(1, x.numel() // 264))))
    block_n = min(triton.next_power_of_2(n), 1024)
    block_m = max(1, tile // block_n)
    block_m = min(block_m, triton.next_power_of_2(m))
    n_col_blocks = triton.cdiv(n, block_n)
    grid = (triton.cdiv(m, block_m) * n_col_blocks,)
    _launch(
        _bias_gelu_kernel, grid, x, bias, out, m, n, n_col_blocks, BLOCK_M=block_m, BLOCK_N=block_n,
        TANH=tanh, EVICT=_EVICT_PREFILL and m >= 264,
        num_warps=4 if block_m * block_n >= 2048 else 2,
    )
    return out


# ----------------------------------------------------------------------------------------------
# row softmax with a scale
# ----------------------------------------------------------------------------------------------
@triton.autotune(configs=_row_configs(), key=["N", "ROWS_CLASS"], warmup=5, rep=20,
                 prune_configs_by={"early_config_prune": _prune_by_rule})
@triton.jit
def _softmax_kernel(X, OUT, N, scale, ROWS_CLASS, BLOCK: tl.constexpr, SINGLE: tl.constexpr, N_ITERS: tl.constexpr,
                    EVICT: tl.constexpr, STREAM_STORE: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    row = tl.program_id(0).to(tl.int64)
    base = row * N
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        if EVICT:
            x = tl.load(X + base + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            x = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.where(mask, x * scale, -float("inf"))
        m = tl.max(x, axis=0)
        e = tl.exp2((x - m) * LOG2E)
        e = tl.where(mask, e, 0.0)
        s = tl.sum(e, axis=0)
        if STREAM_STORE:
            tl.store(OUT + base + cols, (e / s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=".cs")
        else:
            tl.store(OUT + base + cols, (e / s).to(OUT.dtype.element_ty), mask=mask)
    else:
        # online max/sum per lane, then combine the lanes (lanes that saw only -inf contribute 0)
        m_vec = tl.full([BLOCK], -float("inf"), tl.float32)
        s_vec = tl.zeros([BLOCK], dtype=tl.float32)
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
            x = tl.where(mask, x * scale, -float("inf"))
            m_new = tl.maximum(m_vec, x)
            safe = m_new != -float("inf")
            alpha = tl.where(safe, tl.exp2((m_vec - m_new) * LOG2E), 0.0)
            p = tl.where(safe, tl.exp2((x - m_new) * LOG2E), 0.0)
            s_vec = s_vec * alpha + p
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        s = tl.sum(tl.where(m_vec != -float("inf"), s_vec * tl.exp2((m_vec - m) * LOG2E), 0.0), axis=0)
        for it in range(N_ITERS):
            start = it * BLOCK
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(X + base + cols, mask=mask, other=0.0).to(tl.float32)
            e = tl.exp2((x * scale - m) * LOG2E)
            tl.store(OUT + base + cols, (e / s).to(OUT.dtype.element_ty), mask=mask)


def softmax(x: Tensor, scale: float = 1.0, *, out=None, max_single: int | None = None):
    x = x.contiguous()
    out = torch.empty_like(x) if out is None else out
    _check_rows(out)
    n = x.shape[-1]
    if x.numel() == 0:
        return out
    rows = x.numel() // n
    _launch(_softmax_kernel, (rows,), x, out, n, float(scale), _rows_class(rows), **_row_config(n, max_single, rows),
            STREAM_STORE=_stream_softmax_store(rows))
    return out


def _stream_softmax_store(rows: int) -> bool:
    """Store a decode batch's probabilities with the streaming hint (.cs), as Liger-Kernel does.
    On an H200 (scripts/gpu/probe_variants.py consumer, analyses/data/probe_variants_h200.json.gz, keys
    consumer_earlier_run and consumer) it took 16x4096 from 1.99 to 1.91 µs, and 1.96 to 1.87 in a
    second run, and cost nothing when the matmul that reads the probabilities follows (16x4096 with
    p @ v: 9.48 and 9.43 either way); a single row measured 1.81 plain vs 1.84 µs in the first run and
    a tie in the second, so one row keeps the plain store."""
    return 2 <= rows and _rows_class(rows) == 0

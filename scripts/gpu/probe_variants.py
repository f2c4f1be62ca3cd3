"""Kernel-variant probes behind this round's changes (experiments, not the benchmark).

    python scripts/gpu/probe_variants.py MODE     # -> $OUT/probe_variants_MODE.json (GPU µs per call)

Modes:
  gelu_cuda     CUDA bias+GELU launch configurations (flat: vector width, threads, vectors a thread;
                rows: rows a thread), built from kernels/csrc/bias_gelu.cu's own kernel templates
  gelu_flat     Triton bias+GELU: a flat 1-D kernel (bias column idx % N, N a constant) against the
                2-D tile kernel at the same block size, our erf formula or libdevice's, and torch.compile
  rms_two_pass  in-place add+RMSNorm that reads its row twice (evict_last, then evict_first, as
                torch.compile's kernel) per chunk size and warp count, beside compile and our Triton
  consumer      softmax alone and followed by the matmul that consumes it (p @ v): ours, the same
                kernel with a plain and with a streaming (.cs) store, and Liger-Kernel's (.cs)
  reload        kernels.triton_kernels' add+RMSNorm in its reload mode at 8/16/32 warps, both
                variants, beside torch.compile and the autotuned choice
  host          CPU µs per plain launch of a 16x4096 softmax, layer by layer: torch.softmax, the
                CUDA op, the Triton op, the Triton launcher without torch.library, the JIT kernel
                without the autotuner, and the compiled kernel's own launcher (no binder)
  decode_warps  the Triton row kernels at 64x8192 with 8, 16 and 32 warps, beside the CUDA ops
  cuda_index    a bisect of the CUDA bias+GELU at decode sizes: the same GELU with the bias index
                from a 64-bit modulo, a 32-bit one, or a 2-D grid (none); __ldg or plain loads;
                vector width and block size; and copy-only kernels of the same shapes
  gelu_mid      bias+GELU at the prefill shapes against copies of the same bytes, one kernel body
                (bias_gelu.cu's row kernel) per variant: what it computes (-x, x + bias, the erf GELU,
                a tanh.approx GELU), cache hints on loads/stores (.cs streaming, .nc), rows a thread,
                threads, and a capped (persistent, grid-striding) grid; beside torch's -x and ours

Timing is scripts/bench/bench_kernels.py's (CUDA-graph replays over rotated input sets); every timed
callable returns its outputs, so each call writes fresh memory as the benchmark's do.  Needs a GPU;
`consumer` needs Liger-Kernel.  Results of the H200 runs: analyses/data/probe_variants_h200.json.gz, one
key per mode (`reload_earlier_run`: the reload mode in an earlier run the same day;
`consumer_earlier_run`: before softmax took the streaming store; `host_before_cached_launch`: before
Triton kernels were launched through the compiled kernel's own launcher).
"""
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402

import bench_kernels as bk  # noqa: E402
import kernels  # noqa: E402
from kernels import triton_kernels as tk  # noqa: E402

DT = torch.bfloat16
RES: dict = {}


def timed(fn, sets, rows, nbytes, rounds=2):
    """GPU µs per call, `rounds` medians, with the benchmark's batch sizes."""
    inner = 4 * len(sets) if rows <= 64 else max(len(sets), min(20, math.ceil(2e-3 / (nbytes / 3e12))))
    return [round(bk.time_batches(fn, sets, 15, inner, True) * 1e6, 3) for _ in range(rounds)]


# ------------------------------------------------------------------------------------------ kernels
@triton.jit
def _softmax_row(X, OUT, N, BLOCK: tl.constexpr, STREAM_STORE: tl.constexpr):
    # kernels.triton_kernels' single-block softmax (scale 1), optionally with Liger's .cs store
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.where(mask, x, -float("inf"))
    e = tl.where(mask, tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634), 0.0)
    y = (e / tl.sum(e, axis=0)).to(OUT.dtype.element_ty)
    if STREAM_STORE:
        tl.store(OUT + row * N + cols, y, mask=mask, cache_modifier=".cs")
    else:
        tl.store(OUT + row * N + cols, y, mask=mask)


@triton.jit
def _rms_two_pass(X, R, W, OUT, RES_OUT, N: tl.constexpr, eps, RB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * N
    acc = tl.zeros([RB], dtype=tl.float32)
    for it in tl.range(0, N, RB):
        cols = it + tl.arange(0, RB)
        x = tl.load(X + base + cols, eviction_policy="evict_last").to(tl.float32)
        r = tl.load(R + base + cols, eviction_policy="evict_last").to(tl.float32)
        h = (x + r).to(RES_OUT.dtype.element_ty).to(tl.float32)
        acc += h * h
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for it in tl.range(0, N, RB):
        cols = it + tl.arange(0, RB)
        x = tl.load(X + base + cols, eviction_policy="evict_first").to(tl.float32)
        r = tl.load(R + base + cols, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + cols, eviction_policy="evict_last").to(tl.float32)
        h = (x + r).to(RES_OUT.dtype.element_ty)
        tl.store(RES_OUT + base + cols, h)
        tl.store(OUT + base + cols, (h.to(tl.float32) * rstd * w).to(OUT.dtype.element_ty))


@triton.jit
def _gelu_flat(X, B, OUT, NUMEL, N: tl.constexpr, XBLOCK: tl.constexpr, LIBDEVICE_ERF: tl.constexpr):
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = idx < NUMEL
    u = tl.load(X + idx, mask=mask, other=0.0).to(tl.float32) + tl.load(B + idx % N, mask=mask, other=0.0).to(tl.float32)
    if LIBDEVICE_ERF:
        y = 0.5 * u * (libdevice.erf(u * 0.7071067811865476) + 1.0)
    else:
        y = tk._gelu(u, False)
    tl.store(OUT + idx, y.to(OUT.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------ modes
def _build_probe(name: str, device_src: str, cases: list[str]):
    """A CUDA extension with one function, probe(x, bias, cfg): `device_src` (bias_gelu.cu's kernel
    templates, ending inside its anonymous namespace) plus a switch over `cases`, each launching one
    configuration on the current stream into a fresh output."""
    from torch.utils.cpp_extension import load_inline
    body = device_src + """
}  // namespace
at::Tensor probe(const at::Tensor& x_t, const at::Tensor& b_t, int64_t cfg) {
  using T = c10::BFloat16;
  at::Tensor out = at::empty_like(x_t);
  cudaStream_t s = c10::cuda::getCurrentCUDAStream();
  const T* x = x_t.data_ptr<T>(); const T* b = b_t.data_ptr<T>(); T* o = out.data_ptr<T>();
  const int64_t numel = x_t.numel(), n = x_t.size(-1);
  switch (cfg) {
""" + "\n".join(cases) + """
    default: TORCH_CHECK(false, "bad cfg");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
}  // namespace profkit_kernels
at::Tensor probe(const at::Tensor& x, const at::Tensor& b, int64_t cfg) { return profkit_kernels::probe(x, b, cfg); }
"""
    return load_inline(name, cpp_sources="at::Tensor probe(const at::Tensor& x, const at::Tensor& b, int64_t cfg);",
                       cuda_sources=body, functions=["probe"], extra_include_paths=[os.path.join(ROOT, "kernels/csrc")],
                       extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"])


GELU_CFGS = [  # (kind, vector width, threads, vectors a thread (flat) or rows a thread (rows))
    ("flat", 8, 128, 1), ("flat", 8, 64, 1), ("flat", 8, 32, 1), ("flat", 4, 128, 1), ("flat", 4, 64, 1),
    ("flat", 2, 128, 1), ("flat", 1, 128, 1), ("flat", 1, 256, 1), ("flat", 2, 64, 1), ("flat", 4, 32, 1),
    ("flat", 8, 256, 4), ("flat", 8, 256, 2), ("flat", 8, 128, 4), ("flat", 8, 512, 2), ("flat", 8, 256, 8),
    ("rows", 8, 256, 4), ("rows", 8, 256, 2), ("rows", 8, 256, 8), ("rows", 8, 128, 4), ("rows", 8, 128, 8),
    ("flat", 1, 64, 1), ("flat", 2, 32, 1), ("flat", 8, 512, 4), ("flat", 8, 128, 8), ("rows", 8, 64, 4),
]


def gelu_cuda():
    src = open(os.path.join(ROOT, "kernels/csrc/bias_gelu.cu")).read()
    device_src = src[:src.index("template <typename T, int VEC>\nvoid launch(int variant")]
    cases = []
    for i, (kind, vec, thr, u) in enumerate(GELU_CFGS):
        if kind == "flat":
            cases.append(f"    case {i}: launch_cfg<T, {vec}, {thr}, {u}>(false, x, b, o, numel / {vec}, n / {vec}, s); break;")
        else:
            cases.append(f"    case {i}: launch_rows_cfg<T, {vec}, {u}>(false, {thr}, x, b, o, numel / n, n / {vec}, s); break;")
    mod = _build_probe("pk_probe_gelu_cfg", device_src, cases)
    for rows, hidden in [(1, 4096), (16, 4096), (64, 8192), (4096, 4096), (16384, 4096)]:
        sets = bk.rotation_sets("bias_gelu", rows, hidden, DT)
        ref = torch.nn.functional.gelu(sets[0]["x"].double() + sets[0]["bias"].double())
        for i, c in enumerate(GELU_CFGS):
            if (rows <= 64 and c[0] == "flat" and c[3] > 1) or (rows > 64 and c[0] == "flat" and c[3] == 1 and c[2] < 128):
                continue
            err = (mod.probe(sets[0]["x"], sets[0]["bias"], i).double() - ref).abs().max().item()
            key = f"{rows}x{hidden} {c}"
            RES[key] = f"ERR {err}" if err > 0.05 else timed(lambda d, i=i: mod.probe(d["x"], d["bias"], i), sets, rows,
                                                               4 * rows * hidden)


def gelu_flat():
    for rows, hidden in [(1, 4096), (16, 4096), (64, 8192)]:
        sets = bk.rotation_sets("bias_gelu", rows, hidden, DT)
        numel, nb = rows * hidden, 4 * rows * hidden
        for rnd in range(2):
            RES[f"{rows}x{hidden} compile r{rnd}"] = timed(bk.make_fn("bias_gelu", "compile"), sets, rows, nb)
            RES[f"{rows}x{hidden} cuda r{rnd}"] = timed(bk.make_fn("bias_gelu", "cuda"), sets, rows, nb)
            for xb, w in ((256, 4), (512, 4), (1024, 4), (1024, 8), (128, 4), (256, 2)):
                for erf in (0, 1):
                    def f(d, xb=xb, w=w, erf=erf):
                        o = torch.empty_like(d["x"])
                        _gelu_flat[(triton.cdiv(numel, xb),)](d["x"], d["bias"], o, numel, hidden, XBLOCK=xb,
                                                              LIBDEVICE_ERF=erf, num_warps=w)
                        return o
                    RES[f"{rows}x{hidden} flat xb{xb} w{w} erf{erf} r{rnd}"] = timed(f, sets, rows, nb)
            for bn, w in ((256, 4), (512, 4), (1024, 4)):
                ncb = triton.cdiv(hidden, bn)

                def g(d, bn=bn, w=w, ncb=ncb):
                    o = torch.empty_like(d["x"])
                    tk._bias_gelu_kernel[(rows * ncb,)](d["x"], d["bias"], o, rows, hidden, ncb, BLOCK_M=1, BLOCK_N=bn,
                                                       TANH=False, EVICT=False, num_warps=w)
                    return o
                RES[f"{rows}x{hidden} tile bn{bn} w{w} r{rnd}"] = timed(g, sets, rows, nb)


def rms_two_pass():
    op = "add_rmsnorm_"
    for rows, hidden in [(16384, 4096), (65536, 8192)]:
        sets = bk.rotation_sets(op, rows, hidden, DT)
        nb = 8 * rows * hidden
        RES[f"{rows}x{hidden} compile"] = timed(bk.make_fn(op, "compile"), sets, rows, nb)
        RES[f"{rows}x{hidden} triton"] = timed(bk.make_fn(op, "triton"), sets, rows, nb)
        for rb, w in ((2048, 8), (4096, 8), (4096, 16), (8192, 16), (1024, 4), (2048, 4), (8192, 32)):
            if rb > hidden:
                continue

            def f(d, rb=rb, w=w):
                o = torch.empty_like(d["x"])
                _rms_two_pass[(rows,)](d["x"], d["residual"], d["weight"], o, d["residual"], hidden, 1e-6, RB=rb,
                                       num_warps=w)
                return o
            RES[f"{rows}x{hidden} two-pass rb{rb} w{w}"] = timed(f, sets, rows, nb)


def consumer():
    for rows, hidden in [(1, 4096), (16, 4096), (64, 8192)]:
        sets = bk.rotation_sets("softmax", rows, hidden, DT)
        for d in sets:
            d["v"] = torch.randn(hidden, 128, device="cuda", dtype=DT)
        w = tk._decode_warps(hidden)

        def ours(d):
            return kernels.softmax(d["x"], 1.0, backend="triton")

        def plain_or_cs(cs):
            def f(d):
                o = torch.empty_like(d["x"])
                _softmax_row[(rows,)](d["x"], o, hidden, BLOCK=hidden, STREAM_STORE=cs, num_warps=w)
                return o
            return f
        impls = (("ours", ours), ("plain", plain_or_cs(False)), ("cs", plain_or_cs(True)),
                 ("liger", bk.make_fn("softmax", "liger")))
        for rnd in range(3):
            for name, fn in impls:
                RES[f"{rows}x{hidden} {name} alone r{rnd}"] = timed(fn, sets, rows, 4 * rows * hidden, rounds=1)
                RES[f"{rows}x{hidden} {name} +pv r{rnd}"] = timed(lambda d, fn=fn: fn(d) @ d["v"], sets, rows,
                                                                  4 * rows * hidden, rounds=1)
            RES[f"{rows}x{hidden} pv only r{rnd}"] = timed(lambda d: d["x"] @ d["v"], sets, rows, 4 * rows * hidden,
                                                           rounds=1)


def reload():
    for rows, hidden in [(4096, 4096), (16384, 4096), (65536, 8192)]:
        nb = 8 * rows * hidden
        for op in ("add_rmsnorm_", "add_rmsnorm"):
            sets = bk.rotation_sets(op, rows, hidden, DT)
            cfg = tk._row_config(hidden, None, rows)
            for rnd in range(2):
                RES[f"{rows}x{hidden} {op} compile r{rnd}"] = timed(bk.make_fn(op, "compile"), sets, rows, nb, rounds=1)
                RES[f"{rows}x{hidden} {op} triton r{rnd}"] = timed(bk.make_fn(op, "triton"), sets, rows, nb, rounds=1)
                for w in (8, 16, 32):
                    def f(d, w=w, inplace=op == "add_rmsnorm_"):
                        out = torch.empty_like(d["x"])
                        ro = d["residual"] if inplace else torch.empty_like(d["x"])
                        tk._add_rmsnorm_kernel.fn[(rows,)](d["x"], d["residual"], d["weight"], out, ro, hidden, 1e-6,
                                                            1, **cfg, RELOAD=True, num_warps=w)
                        return out, ro
                    RES[f"{rows}x{hidden} {op} reload w{w} r{rnd}"] = timed(f, sets, rows, nb, rounds=1)
            RES[f"{rows}x{hidden} {op} tuned"] = str({str(k): str(v) for k, v in tk._add_rmsnorm_kernel.cache.items()})


INDEX_SRC = r"""
template <int VEC> struct LoadT;
template <> struct LoadT<2> { using type = unsigned int; };
template <> struct LoadT<8> { using type = uint4; };

template <int VEC, bool NC>
__device__ __forceinline__ Vec<c10::BFloat16, VEC> ld(const c10::BFloat16* p, int64_t i) {
  using U = typename LoadT<VEC>::type;
  const U* q = reinterpret_cast<const U*>(p) + i;
  U u = NC ? __ldg(q) : *q;
  Vec<c10::BFloat16, VEC> v;
  *reinterpret_cast<U*>(&v) = u;
  return v;
}

// MODE 0: 64-bit index, 64-bit modulo; 1: 32-bit index and modulo; 2: 2-D (row, column block), no modulo
template <int VEC, int THREADS, bool NC, int MODE, bool GELU>
__global__ void __launch_bounds__(THREADS) kb(const c10::BFloat16* x, const c10::BFloat16* b, c10::BFloat16* o,
                                              int64_t total_vec, int64_t row_vec, int ncb) {
  using T = c10::BFloat16;
  using V = Vec<T, VEC>;
  int64_t i, bi;
  if (MODE == 2) {
    const int row = blockIdx.x / ncb;
    const int col = (blockIdx.x - row * ncb) * THREADS + threadIdx.x;
    bi = col;
    i = static_cast<int64_t>(row) * row_vec + col;
  } else if (MODE == 0) {
    i = static_cast<int64_t>(blockIdx.x) * THREADS + threadIdx.x;
    bi = i % row_vec;
  } else {
    const unsigned ii = blockIdx.x * THREADS + threadIdx.x;
    i = ii;
    bi = ii % static_cast<unsigned>(row_vec);
  }
  if (i >= total_vec) return;
  const V xa = ld<VEC, NC>(x, i);
  if (!GELU) { reinterpret_cast<V*>(o)[i] = xa; return; }
  const V ba = ld<VEC, NC>(b, bi);
  V r;
#pragma unroll
  for (int j = 0; j < VEC; ++j) r.v[j] = from_f<T>(gelu<false>(to_f(xa.v[j]) + to_f(ba.v[j])));
  reinterpret_cast<V*>(o)[i] = r;
}
"""
# (vector width, threads, __ldg, index MODE, GELU or copy only)
INDEX_CFGS = [(2, 128, True, 0, True), (2, 128, True, 1, True), (2, 128, False, 1, True), (2, 128, True, 2, True),
              (2, 128, False, 2, True), (8, 128, True, 0, True), (8, 128, True, 1, True), (8, 128, False, 1, True),
              (8, 128, True, 2, True), (8, 128, False, 2, True), (8, 32, False, 2, True), (8, 64, False, 2, True),
              (2, 128, False, 2, False), (8, 128, False, 2, False), (8, 32, False, 2, False), (2, 256, False, 2, True),
              (8, 256, False, 2, True)]


def cuda_index():
    src = open(os.path.join(ROOT, "kernels/csrc/bias_gelu.cu")).read()
    device_src = src[:src.index("template <typename T, int VEC, bool TANH, int kThreads, int kUnroll>")] + INDEX_SRC
    cases = []
    for i, (vec, thr, nc, mode, g) in enumerate(INDEX_CFGS):
        cases.append(f"    case {i}: {{ const int64_t tv = numel / {vec}, rv = n / {vec}; const int ncb = (int)((rv + {thr} - 1) / {thr});"
                     f" const int64_t blocks = {mode} == 2 ? (numel / n) * ncb : (tv + {thr} - 1) / {thr};"
                     f" kb<{vec}, {thr}, {'true' if nc else 'false'}, {mode}, {'true' if g else 'false'}><<<blocks, {thr}, 0, s>>>(x, b, o, tv, rv, ncb); break; }}")
    mod = _build_probe("pk_probe_gelu_index", device_src, cases)
    for rows, hidden in [(1, 4096), (16, 4096), (64, 8192)]:
        sets = bk.rotation_sets("bias_gelu", rows, hidden, DT)
        nb = 4 * rows * hidden
        ref = torch.nn.functional.gelu(sets[0]["x"].double() + sets[0]["bias"].double())
        RES[f"{rows}x{hidden} compile"] = timed(bk.make_fn("bias_gelu", "compile"), sets, rows, nb, rounds=3)
        RES[f"{rows}x{hidden} cuda"] = timed(bk.make_fn("bias_gelu", "cuda"), sets, rows, nb, rounds=3)
        for i, c in enumerate(INDEX_CFGS):
            y = mod.probe(sets[0]["x"], sets[0]["bias"], i)
            if c[4] and (y.double() - ref).abs().max().item() > 0.05:
                RES[f"{rows}x{hidden} {c} ERR"] = (y.double() - ref).abs().max().item()
                continue
            RES[f"{rows}x{hidden} {c}"] = timed(lambda d, i=i: mod.probe(d["x"], d["bias"], i), sets, rows, nb, rounds=3)


MID_SRC = r"""
// WHAT 0: -x (a copy); 1: x + bias; 2: the shipped erf GELU; 3: GELU's tanh form through tanh.approx
// LD 0 plain, 1 __ldcs (streaming), 2 __ldg (.nc);  ST 0 plain, 1 __stcs (streaming)
template <int WHAT>
__device__ __forceinline__ float mid_f(float xv, float bv) {
  if (WHAT == 0) return -xv;
  const float u = xv + bv;
  if (WHAT == 1) return u;
  if (WHAT == 2) return gelu<false>(u);
  float t;
  const float z = 0.7978845608028654f * fmaf(0.044715f * u, u * u, u);
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(z));
  const float h = 0.5f * u;
  return fmaf(h, t, h);
}

template <int WHAT, int LD, int ST, int kRows>
__global__ void __launch_bounds__(256) mid_kernel(const c10::BFloat16* __restrict__ x, const c10::BFloat16* __restrict__ b,
                                                  c10::BFloat16* __restrict__ out, int64_t rows, int64_t row_vec) {
  using V = Vec<c10::BFloat16, 8>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= row_vec) return;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  uint4* ov = reinterpret_cast<uint4*>(out);
  V bb;
  *reinterpret_cast<uint4*>(&bb) = reinterpret_cast<const uint4*>(b)[col];
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kRows) {
    V xa[kRows];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      if (r0 + u < rows) {
        const uint4* q = xv + (r0 + u) * row_vec + col;
        const uint4 w = LD == 1 ? __ldcs(q) : LD == 2 ? __ldg(q) : *q;
        *reinterpret_cast<uint4*>(&xa[u]) = w;
      }
    }
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      if (r0 + u < rows) {
        V o;
#pragma unroll
        for (int j = 0; j < 8; ++j) o.v[j] = from_f<c10::BFloat16>(mid_f<WHAT>(to_f(xa[u].v[j]), to_f(bb.v[j])));
        uint4* q = ov + (r0 + u) * row_vec + col;
        if (ST == 1) __stcs(q, *reinterpret_cast<uint4*>(&o)); else *q = *reinterpret_cast<uint4*>(&o);
      }
    }
  }
}
"""

MID_CFGS = [  # (what, ld, st, rows a thread, threads, grid rows cap: 0 = none, else blocks per SM)
    (0, 0, 0, 4, 128, 0), (0, 1, 1, 4, 128, 0), (0, 0, 1, 4, 128, 0), (0, 2, 0, 4, 128, 0), (0, 0, 0, 1, 128, 0),
    (0, 0, 0, 2, 256, 0), (0, 0, 0, 8, 128, 0), (0, 0, 0, 4, 128, 16), (0, 0, 0, 4, 128, 8), (0, 0, 0, 4, 256, 8),
    (1, 0, 0, 4, 128, 0), (1, 1, 1, 4, 128, 0),
    (2, 0, 0, 4, 128, 0), (2, 1, 1, 4, 128, 0), (2, 0, 1, 4, 128, 0), (2, 1, 0, 4, 128, 0), (2, 2, 0, 4, 128, 0),
    (2, 0, 0, 2, 128, 0), (2, 0, 0, 4, 64, 0), (2, 0, 0, 2, 256, 0), (2, 0, 0, 4, 128, 16), (2, 0, 0, 4, 128, 8),
    (2, 0, 0, 8, 128, 8), (2, 1, 1, 4, 128, 16),
    (3, 0, 0, 4, 128, 0), (3, 1, 1, 4, 128, 0),
]


def gelu_mid():
    src = open(os.path.join(ROOT, "kernels/csrc/bias_gelu.cu")).read()
    device_src = src[:src.index("template <typename T, int VEC, bool TANH, int kThreads, int kUnroll>")] + MID_SRC
    cases = []
    for i, (what, ld, st, kr, thr, cap) in enumerate(MID_CFGS):
        gy = "gy" if cap == 0 else f"std::min<int64_t>(gy, std::max<int64_t>(1, 132 * {cap} / gx))"
        cases.append(f"    case {i}: {{ const int64_t rv = n / 8, rows = numel / n, gx = (rv + {thr} - 1) / {thr};"
                     f" const int64_t gy = std::min<int64_t>((rows + {kr} - 1) / {kr}, 65535);"
                     f" mid_kernel<{what}, {ld}, {st}, {kr}><<<dim3((unsigned)gx, (unsigned)({gy}), 1u), {thr}, 0, s>>>"
                     f"(x, b, o, rows, rv); break; }}")
    mod = _build_probe("pk_probe_gelu_mid", device_src, cases)
    RES["copy bandwidth GB/s (1 GiB copy_)"] = round(bk.measure_copy_bandwidth() / 1e9, 1)
    for rows, hidden in [(4096, 4096), (16384, 4096), (65536, 8192)]:
        sets = bk.rotation_sets("bias_gelu", rows, hidden, DT)
        nb = 4 * rows * hidden
        x0, b0 = sets[0]["x"], sets[0]["bias"]
        u = x0.double() + b0.double()
        refs = {0: -x0.double(), 1: u, 2: torch.nn.functional.gelu(u), 3: torch.nn.functional.gelu(u, approximate="tanh")}
        for name, impl in (("torch -x", "copy"), ("cuda (shipped)", "cuda"), ("compile", "compile")):
            RES[f"{rows}x{hidden} {name}"] = timed(bk.make_fn("bias_gelu", impl), sets, rows, nb, rounds=3)
        for i, c in enumerate(MID_CFGS):
            y = mod.probe(x0, b0, i).double()
            err = (y - refs[c[0]]).abs().max().item()
            if err > 0.05:
                RES[f"{rows}x{hidden} {c} ERR"] = err
                continue
            RES[f"{rows}x{hidden} {c}"] = timed(lambda d, i=i: mod.probe(d["x"], d["bias"], i), sets, rows, nb, rounds=3)


def _host_us(fn, calls=3000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best.append(round((t1 - t0) / calls * 1e6, 2))
    return best


def host():
    rows, n = 16, 4096
    x = torch.randn(rows, n, device="cuda", dtype=DT)
    out = torch.empty_like(x)
    cfg = dict(tk._row_config(n, None, rows), STREAM_STORE=tk._stream_softmax_store(rows))
    warps = tk._decode_warps(cfg["BLOCK"])
    args = (x, out, n, 1.0, tk._rows_class(rows))
    jit = tk._softmax_kernel.fn
    compiled = jit.warmup(*args, grid=(rows,), num_warps=warps, **cfg)
    compiled._init_handles()
    allargs = args + tuple(cfg[k] for k in ("BLOCK", "SINGLE", "N_ITERS", "EVICT", "STREAM_STORE"))
    dev = torch.cuda.current_device()
    raw_stream = torch._C._cuda_getCurrentRawStream
    fn, meta = compiled.function, compiled.packed_metadata
    run = compiled.run

    def direct():
        run(rows, 1, 1, raw_stream(dev), fn, meta, None, None, None, *allargs)

    cases = {
        "torch.softmax": lambda: torch.softmax(x, -1),
        "torch.empty_like": lambda: torch.empty_like(x),
        "raw stream": lambda: raw_stream(dev),
        "kernels.softmax cuda": lambda: kernels.softmax(x, 1.0, backend="cuda"),
        "kernels.softmax triton": lambda: kernels.softmax(x, 1.0, backend="triton"),
        "kernels.softmax auto": lambda: kernels.softmax(x, 1.0),
        "torch.ops softmax_cuda": lambda: torch.ops.profkit_kernels.softmax_cuda.default(x, 1.0),
        "torch.ops softmax_triton": lambda: torch.ops.profkit_kernels.softmax_triton.default(x, 1.0),
        "tk.softmax (launcher)": lambda: tk.softmax(x, 1.0),
        "autotuner[grid] (out given)": lambda: tk._softmax_kernel[(rows,)](*args, **cfg),
        "jit[grid] (out given)": lambda: jit[(rows,)](*args, num_warps=warps, **cfg),
        "compiled.run (out given)": direct,
    }
    direct()
    torch.cuda.synchronize()
    ref = torch.softmax(x.float(), -1)
    RES["compiled.run max err"] = (out.float() - ref).abs().max().item()
    for name, f in cases.items():
        RES[name] = _host_us(f)


def decode_warps():
    rows, n = 64, 8192
    cfg = tk._row_config(n, None, rows)
    for op in ("add_rmsnorm", "add_layernorm", "softmax"):
        sets = bk.rotation_sets(op, rows, n, DT)
        nb = bk.fused_bytes(op, rows, n, 2)
        RES[f"{op} cuda"] = timed(bk.make_fn(op, "cuda"), sets, rows, nb, rounds=3)
        RES[f"{op} triton"] = timed(bk.make_fn(op, "triton"), sets, rows, nb, rounds=3)
        for w in (8, 16, 32):
            def f(d, w=w, op=op):
                out, h = torch.empty_like(d["x"]), torch.empty_like(d["x"])
                if op == "add_rmsnorm":
                    tk._add_rmsnorm_kernel.fn[(rows,)](d["x"], d["residual"], d["weight"], out, h, n, 1e-6, 0,
                                                       RELOAD=False, num_warps=w, **cfg)
                elif op == "add_layernorm":
                    tk._add_layernorm_kernel.fn[(rows,)](d["x"], d["residual"], d["weight"], d["bias"], out, h, n,
                                                         1e-5, 0, num_warps=w, **cfg)
                else:
                    tk._softmax_kernel.fn[(rows,)](d["x"], out, n, 1.0, 0, STREAM_STORE=True, num_warps=w, **cfg)
                return out, h
            RES[f"{op} triton w{w}"] = timed(f, sets, rows, nb, rounds=3)


MODES = {"gelu_mid": gelu_mid, "host": host, "decode_warps": decode_warps, "gelu_cuda": gelu_cuda, "cuda_index": cuda_index, "gelu_flat": gelu_flat, "rms_two_pass": rms_two_pass, "consumer": consumer,
         "reload": reload}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        sys.exit("usage: probe_variants.py " + "|".join(MODES))
    if not torch.cuda.is_available():
        sys.exit("probe_variants.py needs a CUDA device.")
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    t0 = time.time()
    MODES[sys.argv[1]]()
    RES["wall s"] = round(time.time() - t0, 1)
    out = os.environ.get("OUT", ".")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"probe_variants_{sys.argv[1]}.json"), "w") as fh:
        json.dump(RES, fh, indent=1)

// Shared helpers of the profkit CUDA kernels: 16-byte vectors, warp/block reductions, host checks.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace profkit_kernels {

// A vector of N elements of T, aligned so that one load/store is a single 16-byte transaction
// when sizeof(T) * N == 16.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(c10::Half v) { return static_cast<float>(v); }
__device__ __forceinline__ float to_f(c10::BFloat16 v) { return static_cast<float>(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v) {
  return static_cast<T>(v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum (kMax false) or max; every thread gets the result.  blockDim.x must be a multiple
// of 32; `smem` holds 32 floats.  kFirst: the kernel's first reduction on `smem` (nothing read it
// before), so no leading barrier; otherwise the leading barrier makes back-to-back calls on one
// buffer race-free.
template <bool kFirst, bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  if constexpr (!kFirst) __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : (kMax ? -INFINITY : 0.f);
  return kMax ? warp_max(v) : warp_sum(v);
}

__device__ __forceinline__ float block_sum(float v, float* smem) { return block_reduce<false, false>(v, smem); }
__device__ __forceinline__ float block_max(float v, float* smem) { return block_reduce<false, true>(v, smem); }
__device__ __forceinline__ float block_sum_first(float v, float* smem) { return block_reduce<true, false>(v, smem); }
__device__ __forceinline__ float block_max_first(float v, float* smem) { return block_reduce<true, true>(v, smem); }

// Elements per 16-byte vector for T.
template <typename T>
constexpr int vec16() {
  return static_cast<int>(16 / sizeof(T));
}

// ------------------------------------------------------------------------------------------------
// Launch variants.  Variant 1 (the default) is the current launch configuration / kernel body of
// each op; variant 0 is the previous one, kept selectable at run time so one benchmark run can time
// both side by side (kernels/_build.py sets them, e.g. PROFKIT_KERNELS_LAUNCH=legacy).
// ------------------------------------------------------------------------------------------------
enum OpId { kOpAddRmsnorm = 0, kOpAddLayernorm = 1, kOpSoftmax = 2, kOpBiasGelu = 3, kNumOps = 4 };

// One array for the whole shared library (an inline function's static is unique across TUs).
inline int* launch_variants() {
  static int v[kNumOps] = {1, 1, 1, 1};  // kernels/_build.py sets LAUNCH_DEFAULTS on load
  return v;
}

inline int launch_variant(OpId op) { return launch_variants()[op]; }

// The register-resident row kernels hold up to kMaxItems vectors per thread with at most
// kMaxThreads threads; longer rows use the looping kernels.
constexpr int kMaxThreads = 512;
constexpr int kMaxItems = 8;

struct RowPlan {
  int vec;      // elements per vector: 16 bytes' worth, or 1 (scalar path)
  int threads;  // block size, a multiple of 32
  int items;    // vectors per thread held in registers (1, 2, 4, 8), or 0 = looping kernel
};

// Vector path when every row starts 16-byte aligned (base pointers aligned, hidden divisible by
// the vector width); otherwise the scalar path.
//
// Vectors per thread:
//   many rows (>= 2 per SM): 4, short blocks, many resident per SM, lots of bytes in flight;
//   few rows (decode), variants 1, 2 and 3: 2, e.g. 256 threads (8 warps) for a 4096-wide bf16 row.  All of a
//     thread's loads are independent and issued back to back, so 2 vectors cost the same one memory
//     round trip as 1, while the block reduction spans 8 warps instead of 16 (shorter barrier, half
//     the partial sums) and the block is cheaper to launch;
//   few rows, variant 0 (previous): 1, i.e. 512 threads for a 4096-wide bf16 row.
inline RowPlan plan_rows(int64_t rows, int64_t n, int elem_size, std::initializer_list<const at::Tensor*> ts,
                         int variant) {
  const int v16 = 16 / elem_size;
  bool aligned = n % v16 == 0;
  for (const at::Tensor* t : ts) aligned = aligned && (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
  RowPlan p;
  p.vec = aligned ? v16 : 1;
  const int64_t nvec = n / p.vec;
  const int64_t target = rows >= 2 * 132 ? 4 : (variant == 0 ? 1 : 2);
  int64_t threads = (nvec + target - 1) / target;
  threads = ((threads + 31) / 32) * 32;
  threads = threads < 32 ? 32 : (threads > kMaxThreads ? kMaxThreads : threads);
  const int64_t need = (nvec + threads - 1) / threads;
  p.threads = static_cast<int>(threads);
  p.items = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= 8 ? 8 : 0;
  if (p.items == 0) p.threads = kMaxThreads;  // looping kernel: full blocks
  return p;
}

// ------------------------------------------------------------------------------------------------
// Row prologue shared by the register-resident row kernels (add+RMSNorm, add+LayerNorm, softmax):
// vector idx of item i of this thread is threadIdx.x + i * blockDim.x; items past nvec are skipped.
// ------------------------------------------------------------------------------------------------

// The one loop of every register-resident row kernel: f(i, idx) for each item i of this thread
// that lies in the row.  Unrolled and inlined, i is a constant, so per-item arrays stay in registers.
template <int ITEMS, typename F>
__device__ __forceinline__ void for_each_item(int nvec, F&& f) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int idx = threadIdx.x + i * blockDim.x;
    if (idx < nvec) f(i, idx);
  }
}

template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ void load_row(const Vec<T, VEC>* src, Vec<T, VEC> (&dst)[ITEMS], int nvec) {
  for_each_item<ITEMS>(nvec, [&](int i, int idx) { dst[i] = src[idx]; });
}

// h <- round_T(x + h) element-wise, then store h to hv (residual_out).  The caller has issued all
// loads of x and residual before (residual and residual_out may alias in the in-place variant; each
// thread rewrites exactly the vectors it read).  Returns the number of valid elements of this thread.
template <typename T, int VEC, int ITEMS>
__device__ __forceinline__ int add_round_store(const Vec<T, VEC> (&xa)[ITEMS], Vec<T, VEC> (&h)[ITEMS],
                                               Vec<T, VEC>* hv, int nvec) {
  int count = 0;
  for_each_item<ITEMS>(nvec, [&](int i, int idx) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) h[i].v[j] = from_f<T>(to_f(xa[i].v[j]) + to_f(h[i].v[j]));
    hv[idx] = h[i];
    count += VEC;
  });
  return count;
}

// Chan et al. pairwise combine of (count, mean, M2) partial statistics.
__device__ __forceinline__ void welford_combine(float& n, float& mean, float& m2, float nb, float mb, float m2b) {
  const float nn = n + nb;
  if (nn > 0.f) {
    const float d = mb - mean;
    const float fb = __fdividef(nb, nn);
    mean = fmaf(d, fb, mean);
    m2 = m2 + m2b + d * d * n * fb;
  }
  n = nn;
}

__device__ __forceinline__ void warp_welford(float& n, float& mean, float& m2) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float nb = __shfl_xor_sync(0xffffffffu, n, o);
    const float mb = __shfl_xor_sync(0xffffffffu, mean, o);
    const float m2b = __shfl_xor_sync(0xffffffffu, m2, o);
    welford_combine(n, mean, m2, nb, mb, m2b);
  }
  // The pairwise combine is not bit-symmetric: take lane 0's result so the warp agrees exactly.
  n = __shfl_sync(0xffffffffu, n, 0);
  mean = __shfl_sync(0xffffffffu, mean, 0);
  m2 = __shfl_sync(0xffffffffu, m2, 0);
}

// Block-wide (mean, M2) in ONE reduction (one barrier) instead of a sum and then a centred sum of
// squares (two reductions, four barriers).  First use of `smem` (96 floats) in the kernel.
__device__ __forceinline__ void block_welford_first(float& n, float& mean, float& m2, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  warp_welford(n, mean, m2);
  if (lane == 0) {
    smem[wid] = n;
    smem[32 + wid] = mean;
    smem[64 + wid] = m2;
  }
  __syncthreads();
  n = lane < nw ? smem[lane] : 0.f;
  mean = lane < nw ? smem[32 + lane] : 0.f;
  m2 = lane < nw ? smem[64 + lane] : 0.f;
  warp_welford(n, mean, m2);
}

// Online-softmax combine of (max, sum of exp2(v - max)) pairs, log2 domain.  Bit-symmetric in its
// two arguments, so a butterfly gives every lane the same result.  -inf maxima contribute nothing;
// a +inf maximum gives NaN (like eager softmax).
__device__ __forceinline__ void max_sum_combine(float& m, float& s, float mb, float sb) {
  const float mm = fmaxf(m, mb);
  if (mm == -INFINITY) {
    s = 0.f;
  } else {
    s = s * exp2f(m - mm) + sb * exp2f(mb - mm);
  }
  m = mm;
}

// Block-wide (max, sum) in ONE reduction instead of a max and then a sum.  First use of `smem`
// (64 floats) in the kernel.
__device__ __forceinline__ void block_max_sum_first(float& m, float& s, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float mb = __shfl_xor_sync(0xffffffffu, m, o);
    const float sb = __shfl_xor_sync(0xffffffffu, s, o);
    max_sum_combine(m, s, mb, sb);
  }
  if (lane == 0) {
    smem[wid] = m;
    smem[32 + wid] = s;
  }
  __syncthreads();
  m = lane < nw ? smem[lane] : -INFINITY;
  s = lane < nw ? smem[32 + lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float mb = __shfl_xor_sync(0xffffffffu, m, o);
    const float sb = __shfl_xor_sync(0xffffffffu, s, o);
    max_sum_combine(m, s, mb, sb);
  }
}

inline void check_input(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor.");
  TORCH_CHECK(t.device() == x.device(), name, " must be on the device of x.");
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), name, " must have the dtype of x.");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous.");
}

inline void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor.");
  TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension.");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              "x must be float32, float16 or bfloat16.");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous.");
}

#define PROFKIT_DISPATCH_FLOATING(TYPE, NAME, ...)                                  \
  switch (TYPE) {                                                                   \
    case at::kFloat: {                                                              \
      using scalar_t = float;                                                       \
      __VA_ARGS__();                                                                \
      break;                                                                        \
    }                                                                               \
    case at::kHalf: {                                                               \
      using scalar_t = c10::Half;                                                   \
      __VA_ARGS__();                                                                \
      break;                                                                        \
    }                                                                               \
    case at::kBFloat16: {                                                           \
      using scalar_t = c10::BFloat16;                                               \
      __VA_ARGS__();                                                                \
      break;                                                                        \
    }                                                                               \
    default:                                                                        \
      TORCH_CHECK(false, NAME, ": unsupported dtype ", TYPE);                       \
  }

}  // namespace profkit_kernels

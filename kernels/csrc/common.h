// Shared helpers of the profkit CUDA kernels: 16-byte vectors, warp/block reductions, host checks.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

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

// Block-wide sum/max; every thread gets the result.  blockDim.x must be a multiple of 32.
// `smem` holds 32 floats.  The leading barrier makes back-to-back calls on one buffer race-free.
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : 0.f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : -INFINITY;
  return warp_max(v);
}

// Elements per 16-byte vector for T.
template <typename T>
constexpr int vec16() {
  return static_cast<int>(16 / sizeof(T));
}

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
inline RowPlan plan_rows(int64_t rows, int64_t n, int elem_size, std::initializer_list<const at::Tensor*> ts) {
  const int v16 = 16 / elem_size;
  bool aligned = n % v16 == 0;
  for (const at::Tensor* t : ts) aligned = aligned && (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0);
  RowPlan p;
  p.vec = aligned ? v16 : 1;
  const int64_t nvec = n / p.vec;
  // Many rows: 4 vectors per thread (short blocks, many resident per SM, lots of bytes in flight).
  // Few rows (decode): 1 vector per thread, so each row's serial chain of loads is short.
  const int64_t target = rows >= 2 * 132 ? 4 : 1;
  int64_t threads = (nvec + target - 1) / target;
  threads = ((threads + 31) / 32) * 32;
  threads = threads < 32 ? 32 : (threads > kMaxThreads ? kMaxThreads : threads);
  const int64_t need = (nvec + threads - 1) / threads;
  p.threads = static_cast<int>(threads);
  p.items = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= 8 ? 8 : 0;
  if (p.items == 0) p.threads = kMaxThreads;  // looping kernel: full blocks
  return p;
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

// Fused bias + GELU (erf or tanh form).  Registers only the CUDA kernel of
// profkit_kernels::bias_gelu_cuda; the schema lives in kernels/_library.py.
//
// Elementwise over the flattened tensor: each thread issues kUnroll 16-byte loads before any math
// (enough bytes in flight to saturate HBM), bias vectors come from L1/L2.  GELU is evaluated with
// a branch-free erfc approximation (see gelu() below) so the kernel stays memory-bound.  Scalar path when
// misaligned or when hidden is not a multiple of the vector width.
#include "common.h"

#include <string_view>

namespace profkit_kernels {
namespace {


// GELU without the branchy libm erff/tanhf, which made this kernel ALU-bound (2.6 TB/s on H200).
//  erf form:  0.5 u (1 + erf(u / sqrt 2)), with erfc(x) = t P(t) exp(-x^2), t = 1 / (1 + p x) for x >= 0
//             (Abramowitz & Stegun 7.1.26: |error of erf| <= 1.5e-7, i.e. fp32 level; checked against
//             math.erf: max abs error of the GELU 4.2e-7, relative L2 error 2e-8.  Relative accuracy
//             fades only in the far negative tail, u < -5, where |gelu(u)| < 1.5e-6).
//             gelu = u (1 - c) for u >= 0 and u c for u < 0, c = erfc(|u| / sqrt 2) / 2 (no 1 - (1 - c)
//             cancellation in the tail).  The 1/2 and the 1/sqrt 2 are folded into the constants,
//             and the reciprocal and exp2 are the bare approximate instructions (rcp/ex2.approx.ftz,
//             errors of 1 ulp and 2^-22): ncu counted 32 instructions per element with
//             __fdividef/exp2f and separate scalings, which kept the large-shape kernel issue-bound
//             (88% of issue slots) below the copy bandwidth.
//  tanh form: 0.5 u (1 + tanh(z)) == u * sigmoid(2 z), z = sqrt(2/pi) (u + 0.044715 u^3).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool TANH>
__device__ __forceinline__ float gelu(float u) {
  if (TANH) {
    const float z = 0.7978845608028654f * fmaf(0.044715f * u, u * u, u);
    return __fdividef(u, 1.f + __expf(-2.f * z));
  } else {
    // t = 1 / (1 + p |u| / sqrt 2);  p' = the A&S polynomial / 2
    const float t = rcp_approx(fmaf(0.3275911f * 0.7071067811865476f, fabsf(u), 1.f));
    float p = 0.5307027145f;
    p = fmaf(p, t, -0.7265760135f);
    p = fmaf(p, t, 0.7107068705f);
    p = fmaf(p, t, -0.142248368f);
    p = fmaf(p, t, 0.127414796f);
    // exp(-u^2 / 2) = 2^(-u^2 log2(e) / 2)
    const float c = (t * p) * ex2_approx((u * u) * -0.7213475204444817f);
    return u * (u >= 0.f ? 1.f - c : c);
  }
}

template <typename T, int VEC, bool TANH, int kThreads, int kUnroll>
__global__ void __launch_bounds__(kThreads) bias_gelu_kernel(const T* __restrict__ x, const T* __restrict__ b,
                                                             T* __restrict__ out, int64_t total_vec,
                                                             int64_t row_vec) {
  using V = Vec<T, VEC>;
  const V* xv = reinterpret_cast<const V*>(x);
  const V* bv = reinterpret_cast<const V*>(b);
  V* ov = reinterpret_cast<V*>(out);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  const bool small = total_vec < (int64_t{1} << 32);
  V xa[kUnroll], ba[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * kThreads;
    if (i < total_vec) {
      xa[u] = xv[i];
      // 32-bit modulo whenever the index fits (64-bit division is a long software sequence)
      ba[u] = bv[small ? static_cast<int64_t>(static_cast<uint32_t>(i) % static_cast<uint32_t>(row_vec))
                       : i % row_vec];
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * kThreads;
    if (i < total_vec) {
      V o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(gelu<TANH>(to_f(xa[u].v[j]) + to_f(ba[u].v[j])));
      ov[i] = o;
    }
  }
}

template <typename T, int VEC, int kThreads, int kUnroll>
void launch_cfg(bool tanh_form, const T* x, const T* b, T* out, int64_t total_vec, int64_t row_vec, cudaStream_t s) {
  const int64_t blocks = (total_vec + kThreads * kUnroll - 1) / (kThreads * kUnroll);
  TORCH_CHECK(blocks < (int64_t{1} << 31), "tensor too large for one launch.");
  if (tanh_form)
    bias_gelu_kernel<T, VEC, true, kThreads, kUnroll><<<blocks, kThreads, 0, s>>>(x, b, out, total_vec, row_vec);
  else
    bias_gelu_kernel<T, VEC, false, kThreads, kUnroll><<<blocks, kThreads, 0, s>>>(x, b, out, total_vec, row_vec);
}

// Launch variant 1: a 2-D grid, blockIdx.x over column vectors of a row, blockIdx.y over groups of
// kRows rows.  Each thread loads its bias vector once (the column index IS the bias index: no
// integer modulo before the loads) and reuses it for kRows rows, whose x vectors are all loaded
// before any math (kRows vectors in flight per thread).  Grid-strides over row groups past 65535.
template <typename T, int VEC, bool TANH, int kRows>
__global__ void __launch_bounds__(256) bias_gelu_rows_kernel(const T* __restrict__ x, const T* __restrict__ b,
                                                            T* __restrict__ out, int64_t rows, int64_t row_vec) {
  using V = Vec<T, VEC>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= row_vec) return;  // no barriers below: an early exit is safe
  const V* xv = reinterpret_cast<const V*>(x);
  const V* bv = reinterpret_cast<const V*>(b);
  V* ov = reinterpret_cast<V*>(out);
  const V bb = bv[col];
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kRows) {
    V xa[kRows];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      if (r0 + u < rows) xa[u] = xv[(r0 + u) * row_vec + col];
    }
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      if (r0 + u < rows) {
        V o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(gelu<TANH>(to_f(xa[u].v[j]) + to_f(bb.v[j])));
        ov[(r0 + u) * row_vec + col] = o;
      }
    }
  }
}

template <typename T, int VEC, int kRows>
void launch_rows_cfg(bool tanh_form, int threads, const T* x, const T* b, T* out, int64_t rows, int64_t row_vec,
                     cudaStream_t s) {
  const int64_t gx = (row_vec + threads - 1) / threads;
  int64_t gy = (rows + kRows - 1) / kRows;
  gy = gy > 65535 ? 65535 : gy;
  TORCH_CHECK(gx < (int64_t{1} << 31), "hidden size too large for one launch.");
  const dim3 grid(static_cast<unsigned int>(gx), static_cast<unsigned int>(gy), 1u);
  if (tanh_form)
    bias_gelu_rows_kernel<T, VEC, true, kRows><<<grid, threads, 0, s>>>(x, b, out, rows, row_vec);
  else
    bias_gelu_rows_kernel<T, VEC, false, kRows><<<grid, threads, 0, s>>>(x, b, out, rows, row_vec);
}

template <typename T, int VEC>
void launch(int variant, bool tanh_form, const T* x, const T* b, T* out, int64_t numel, int64_t n, cudaStream_t s) {
  const int64_t total_vec = numel / VEC;
  const int64_t row_vec = n / VEC;
  const int64_t rows = numel / n;
  if (variant == 1 && row_vec >= 64 && total_vec >= int64_t{132} * 4 * 256 * 4 && rows >= 4) {
    // Large tensors: 128 threads x 4 rows in flight each, the bias loaded once per 4 rows (128
    // threads: 19.3 vs 19.8 µs at 4096x4096 and 67.1 vs 68.5 at 16384x4096 with 256, on an H200;
    // scripts/probe_variants.py gelu_cuda).
    // At decode sizes the 2-D grid measured slower than the flat kernel (1x4096 bf16: 1.66 vs
    // 1.40 µs), so small tensors keep the flat kernel below.
    launch_rows_cfg<T, VEC, 4>(tanh_form, 128, x, b, out, rows, row_vec, s);
    return;
  }
  // Variant 0 (previous), and rows narrower than 64 vectors: the flattened 1-D kernel.
  // Large tensors: 256 threads x 4 vectors in flight each.  Small (decode) tensors: 128 threads x 1
  // vector, so that even 16 x 4096 elements spread over 64 blocks instead of 8.
  if (total_vec >= int64_t{132} * 4 * 256 * 4) {
    launch_cfg<T, VEC, 256, 4>(tanh_form, x, b, out, total_vec, row_vec, s);
  } else if (VEC > 1 && variant != 0 && numel <= 132 * 128) {
    // Tiny (1 x 4096): one element a thread, 32 blocks instead of 4, as torch.compile's kernel.
    // A thread's elements are a chain of dependent GELU instructions; at 8 a thread that chain was
    // most of the kernel (ncu: 2.59 vs 2.27 µs for torch.compile's 1-element threads; graph
    // replays 1.29 -> 1.25 µs).  At 16 x 4096, 4 elements a thread in 128 blocks measured slower
    // than one 16-byte vector a thread in 64 (1.69 vs 1.52 µs), so larger tensors keep vectors.
    launch_cfg<T, 1, 128, 1>(tanh_form, x, b, out, numel, n, s);
  } else {
    launch_cfg<T, VEC, 128, 1>(tanh_form, x, b, out, total_vec, row_vec, s);
  }
}

at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  check_x(x);
  check_input(bias, "bias", x);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), "bias must have shape (hidden,).");
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "approximate must be \"none\" or \"tanh\".");
  const bool tanh_form = approximate == "tanh";
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const int64_t n = x.size(-1);
  const int v16 = 16 / static_cast<int>(x.element_size());
  const bool aligned = n % v16 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(bias.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0;
  const int variant = launch_variant(kOpBiasGelu);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PROFKIT_DISPATCH_FLOATING(x.scalar_type(), "bias_gelu", [&] {
    constexpr int V16 = vec16<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* bp = bias.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (aligned)
      launch<scalar_t, V16>(variant, tanh_form, xp, bp, op, x.numel(), n, stream);
    else
      launch<scalar_t, 1>(variant, tanh_form, xp, bp, op, x.numel(), n, stream);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace profkit_kernels

// Only the CUDA kernel is registered here; the schema is defined once, in Python.
TORCH_LIBRARY_IMPL(profkit_kernels, CUDA, m) {
  m.impl("bias_gelu_cuda", &profkit_kernels::bias_gelu_cuda);
}

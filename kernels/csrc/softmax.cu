// Row softmax with a scale, over the last dim.  Registers only the CUDA kernel of
// profkit_kernels::softmax_cuda; the schema lives in kernels/_library.py.
//
// One block per row; register-resident rows read x once (max, then sum of exp, then write).  Longer
// rows keep an online (max, sum) per thread, combine them, and re-read the row to write.
#include "common.h"

namespace profkit_kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Kernel bodies (BODY):
//  0 (launch variants 0 and 2): block max, then block sum (four barriers), exp2 evaluated twice.
//  1 (variant 1): each thread takes the max and the sum of exp2 over its own registers, then ONE
//    block reduction combines the (max, sum) pairs (online-softmax rule): one barrier.
//  3 (variant 3): block max, then block sum on a second shared-memory buffer (so neither needs a
//    leading barrier: two barriers), and each exp2 computed once and kept in registers for the
//    output (the 0 body recomputes it after the second reduction, on the critical path).
template <typename T, int VEC, int ITEMS, int BODY>
__global__ void __launch_bounds__(kMaxThreads) softmax_reg_kernel(const T* __restrict__ x, T* __restrict__ out,
                                                                  int64_t n, float scale) {
  using V = Vec<T, VEC>;
  __shared__ float smem[64];
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(n / VEC);
  const V* xv = reinterpret_cast<const V*>(x + row * n);
  V* ov = reinterpret_cast<V*>(out + row * n);
  V xa[ITEMS];
  load_row<T, VEC, ITEMS>(xv, xa, nvec);  // shared prologue (common.h)
  const float sl = scale * kLog2e;  // log2 domain
  float m = -INFINITY;
  for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) m = fmaxf(m, to_f(xa[i].v[j]) * sl);
  });
  if constexpr (BODY == 3) {
    m = block_max_first(m, smem);
    float e[ITEMS][VEC];
    float s = 0.f;
    for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        e[i][j] = exp2f(to_f(xa[i].v[j]) * sl - m);
        s += e[i][j];
      }
    });
    const float inv3 = 1.f / block_sum_first(s, smem + 32);
    for_each_item<ITEMS>(nvec, [&](int i, int idx) {
      V o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(e[i][j] * inv3);
      ov[idx] = o;
    });
    return;
  }
  float ms, inv;
  if constexpr (BODY == 1) {
    float s = 0.f;
    if (m != -INFINITY) {
      for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) s += exp2f(to_f(xa[i].v[j]) * sl - m);
      });
    }
    block_max_sum_first(m, s, smem);
    ms = m;
    inv = 1.f / s;
  } else {
    m = block_max(m, smem);
    ms = m;
    float s = 0.f;
    for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += exp2f(to_f(xa[i].v[j]) * sl - ms);
    });
    inv = 1.f / block_sum(s, smem);
  }
  for_each_item<ITEMS>(nvec, [&](int i, int idx) {
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(exp2f(to_f(xa[i].v[j]) * sl - ms) * inv);
    ov[idx] = o;
  });
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads) softmax_loop_kernel(const T* __restrict__ x, T* __restrict__ out,
                                                                   int64_t n, float scale) {
  using V = Vec<T, VEC>;
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(n / VEC);
  const V* xv = reinterpret_cast<const V*>(x + row * n);
  V* ov = reinterpret_cast<V*>(out + row * n);
  // online max/sum in the log2 domain; -inf inputs contribute nothing, NaN/+inf propagate like eager
  float m = -INFINITY, s = 0.f;
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float v = to_f(a.v[j]) * scale * kLog2e;
      if (v > m) {
        s = s * exp2f(m - v) + exp2f(v - v);
        m = v;
      } else if (v != -INFINITY) {
        s += exp2f(v - m);
      }
    }
  }
  const float mb = block_max(m, smem);
  s = (m == -INFINITY) ? 0.f : s * exp2f(m - mb);
  const float inv = 1.f / block_sum(s, smem);
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(exp2f(to_f(a.v[j]) * scale * kLog2e - mb) * inv);
    ov[idx] = o;
  }
}

template <typename T, int VEC, int BODY>
void launch_v(const RowPlan& p, int64_t rows, const T* x, T* out, int64_t n, float scale, cudaStream_t s) {
  switch (p.items) {
    case 1: softmax_reg_kernel<T, VEC, 1, BODY><<<rows, p.threads, 0, s>>>(x, out, n, scale); break;
    case 2: softmax_reg_kernel<T, VEC, 2, BODY><<<rows, p.threads, 0, s>>>(x, out, n, scale); break;
    case 4: softmax_reg_kernel<T, VEC, 4, BODY><<<rows, p.threads, 0, s>>>(x, out, n, scale); break;
    case 8: softmax_reg_kernel<T, VEC, 8, BODY><<<rows, p.threads, 0, s>>>(x, out, n, scale); break;
    default: softmax_loop_kernel<T, VEC><<<rows, p.threads, 0, s>>>(x, out, n, scale); break;
  }
}

template <typename T, int VEC>
void launch(const RowPlan& p, int variant, int64_t rows, const T* x, T* out, int64_t n, float scale,
            cudaStream_t s) {
  // variant 1: the one-barrier body on 8 warps a decode row; 2: the two-pass body on 8 warps;
  // 3: the two-barrier body with kept exponentials on 8 warps; 0: the two-pass body on 16 warps
  // (plan_rows sizes the block from the variant)
  if (variant == 1)
    launch_v<T, VEC, 1>(p, rows, x, out, n, scale, s);
  else if (variant == 3)
    launch_v<T, VEC, 3>(p, rows, x, out, n, scale, s);
  else
    launch_v<T, VEC, 0>(p, rows, x, out, n, scale, s);
}

at::Tensor softmax_cuda(const at::Tensor& x, double scale) {
  check_x(x);
  TORCH_CHECK(x.size(-1) < (int64_t{1} << 31), "hidden size must be below 2^31.");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  TORCH_CHECK(rows < (int64_t{1} << 31), "too many rows for one launch.");
  const int variant = launch_variant(kOpSoftmax);
  const RowPlan p = plan_rows(rows, n, x.element_size(), {&x, &out}, variant);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PROFKIT_DISPATCH_FLOATING(x.scalar_type(), "softmax", [&] {
    constexpr int V16 = vec16<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (p.vec == V16)
      launch<scalar_t, V16>(p, variant, rows, xp, op, n, static_cast<float>(scale), stream);
    else
      launch<scalar_t, 1>(p, variant, rows, xp, op, n, static_cast<float>(scale), stream);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace profkit_kernels

// Only the CUDA kernel is registered here; the schema is defined once, in Python.
TORCH_LIBRARY_IMPL(profkit_kernels, CUDA, m) {
  m.impl("softmax_cuda", &profkit_kernels::softmax_cuda);
}

// Fused residual add + LayerNorm (weight and bias).  Registers only the CUDA kernel of
// profkit_kernels::add_layernorm_cuda; the schema lives in kernels/_library.py.
//
// One block per row; register-resident rows take the mean and then the centred variance from
// registers (two reductions, numerically stable), reading x/residual once and writing both outputs
// once.  Longer rows loop (three passes over the row, the re-reads mostly hit L2).
#include "common.h"

namespace profkit_kernels {
namespace {

// BODY 1 (launch variant 1): the mean and the centred sum of squares come out of ONE block
// reduction of per-thread (count, mean, M2) partials (Chan's pairwise combine, as stable as the
// two-pass form): one barrier instead of four.  BODY 0 (variants 0 and 2): a block sum for the
// mean, then a block sum of squared deviations (three barriers).  BODY 3 (variant 3): the same two
// sums, the second on its own shared-memory buffer, so it needs no leading barrier (two).
template <typename T, int VEC, int ITEMS, int BODY>
__global__ void __launch_bounds__(kMaxThreads) add_layernorm_reg_kernel(
    const T* __restrict__ x, const T* r, const T* __restrict__ w, const T* __restrict__ b,
    T* __restrict__ out, T* res_out, int64_t n, float eps) {
  using V = Vec<T, VEC>;
  __shared__ float smem[96];
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(n / VEC);
  const V* xv = reinterpret_cast<const V*>(x + row * n);
  const V* rv = reinterpret_cast<const V*>(r + row * n);
  const V* wv = reinterpret_cast<const V*>(w);
  const V* bv = reinterpret_cast<const V*>(b);
  V* hv = reinterpret_cast<V*>(res_out + row * n);
  V* ov = reinterpret_cast<V*>(out + row * n);

  // Few-rows (decode) configurations prefetch weight and bias with x and residual (one memory
  // round trip before the reductions instead of two); with many rows other blocks hide it.
  constexpr bool kPrefetchWB = ITEMS <= 2;  // the decode configurations
  constexpr int kW = kPrefetchWB ? ITEMS : 1;
  V xa[ITEMS], h[ITEMS], wa[kW], ba[kW];
  // Shared prologue (common.h): every load is issued before the first store.
  load_row<T, VEC, ITEMS>(xv, xa, nvec);
  load_row<T, VEC, ITEMS>(rv, h, nvec);
  if constexpr (kPrefetchWB) {
    load_row<T, VEC, ITEMS>(wv, wa, nvec);
    load_row<T, VEC, ITEMS>(bv, ba, nvec);
  }
  const int count = add_round_store<T, VEC, ITEMS>(xa, h, hv, nvec);
  float sum = 0.f;
  for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += to_f(h[i].v[j]);
  });
  float mean, rstd;
  if constexpr (BODY == 1) {
    // this thread's (count, mean, M2), then one block-wide combine
    float cnt = static_cast<float>(count);
    float tm = count > 0 ? __fdividef(sum, cnt) : 0.f;
    float m2 = 0.f;
    for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = to_f(h[i].v[j]) - tm;
        m2 += d * d;
      }
    });
    block_welford_first(cnt, tm, m2, smem);
    mean = tm;
    rstd = rsqrtf(m2 / static_cast<float>(n) + eps);
  } else {
    mean = block_sum_first(sum, smem) / static_cast<float>(n);
    float sq = 0.f;
    for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = to_f(h[i].v[j]) - mean;
        sq += d * d;
      }
    });
    const float ssq = BODY == 3 ? block_sum_first(sq, smem + 32) : block_sum(sq, smem);
    rstd = rsqrtf(ssq / static_cast<float>(n) + eps);
  }
  for_each_item<ITEMS>(nvec, [&](int i, int idx) {
    const V w_i = kPrefetchWB ? wa[kPrefetchWB ? i : 0] : wv[idx];
    const V b_i = kPrefetchWB ? ba[kPrefetchWB ? i : 0] : bv[idx];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      o.v[j] = from_f<T>((to_f(h[i].v[j]) - mean) * rstd * to_f(w_i.v[j]) + to_f(b_i.v[j]));
    ov[idx] = o;
  });
}

template <typename T, int VEC>
__device__ __forceinline__ float add_round(const Vec<T, VEC>& a, const Vec<T, VEC>& b, int j) {
  return to_f(from_f<T>(to_f(a.v[j]) + to_f(b.v[j])));
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads) add_layernorm_loop_kernel(
    const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w, const T* __restrict__ b,
    T* __restrict__ out, T* __restrict__ res_out, int64_t n, float eps) {
  using V = Vec<T, VEC>;
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(n / VEC);
  const V* xv = reinterpret_cast<const V*>(x + row * n);
  const V* rv = reinterpret_cast<const V*>(r + row * n);
  const V* wv = reinterpret_cast<const V*>(w);
  const V* bv = reinterpret_cast<const V*>(b);
  V* hv = reinterpret_cast<V*>(res_out + row * n);
  V* ov = reinterpret_cast<V*>(out + row * n);
  float sum = 0.f;
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx], c = rv[idx];
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += add_round<T, VEC>(a, c, j);
  }
  const float mean = block_sum(sum, smem) / static_cast<float>(n);
  float sq = 0.f;
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx], c = rv[idx];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = add_round<T, VEC>(a, c, j) - mean;
      sq += d * d;
    }
  }
  const float rstd = rsqrtf(block_sum(sq, smem) / static_cast<float>(n) + eps);
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx], c = rv[idx], wa = wv[idx], ba = bv[idx];
    V hh, o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      hh.v[j] = from_f<T>(to_f(a.v[j]) + to_f(c.v[j]));
      o.v[j] = from_f<T>((to_f(hh.v[j]) - mean) * rstd * to_f(wa.v[j]) + to_f(ba.v[j]));
    }
    hv[idx] = hh;
    ov[idx] = o;
  }
}

template <typename T, int VEC, int BODY>
void launch_v(const RowPlan& p, int64_t rows, const T* x, const T* r, const T* w, const T* b, T* out,
              T* res_out, int64_t n, float eps, cudaStream_t s) {
  switch (p.items) {
    case 1: add_layernorm_reg_kernel<T, VEC, 1, BODY><<<rows, p.threads, 0, s>>>(x, r, w, b, out, res_out, n, eps); break;
    case 2: add_layernorm_reg_kernel<T, VEC, 2, BODY><<<rows, p.threads, 0, s>>>(x, r, w, b, out, res_out, n, eps); break;
    case 4: add_layernorm_reg_kernel<T, VEC, 4, BODY><<<rows, p.threads, 0, s>>>(x, r, w, b, out, res_out, n, eps); break;
    case 8: add_layernorm_reg_kernel<T, VEC, 8, BODY><<<rows, p.threads, 0, s>>>(x, r, w, b, out, res_out, n, eps); break;
    default: add_layernorm_loop_kernel<T, VEC><<<rows, p.threads, 0, s>>>(x, r, w, b, out, res_out, n, eps); break;
  }
}

template <typename T, int VEC>
void launch(const RowPlan& p, int variant, int64_t rows, const T* x, const T* r, const T* w, const T* b, T* out,
            T* res_out, int64_t n, float eps, cudaStream_t s) {
  // variant 1: the one-barrier body on 8 warps a decode row; 2: the two-pass body on 8 warps;
  // 3: the two-barrier two-pass body on 8 warps; 0: the two-pass body on 16 warps (plan_rows
  // sizes the block from the variant)
  if (variant == 1)
    launch_v<T, VEC, 1>(p, rows, x, r, w, b, out, res_out, n, eps, s);
  else if (variant == 3)
    launch_v<T, VEC, 3>(p, rows, x, r, w, b, out, res_out, n, eps, s);
  else
    launch_v<T, VEC, 0>(p, rows, x, r, w, b, out, res_out, n, eps, s);
}

std::tuple<at::Tensor, at::Tensor> add_layernorm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const at::Tensor& bias,
                                                      double eps) {
  check_x(x);
  check_input(residual, "residual", x);
  check_input(weight, "weight", x);
  check_input(bias, "bias", x);
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual must have the shape of x.");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must have shape (hidden,).");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == x.size(-1), "bias must have shape (hidden,).");
  TORCH_CHECK(x.size(-1) < (int64_t{1} << 31), "hidden size must be below 2^31.");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out = at::empty_like(x);
  if (x.numel() == 0) return {out, res_out};
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  TORCH_CHECK(rows < (int64_t{1} << 31), "too many rows for one launch.");
  const int variant = launch_variant(kOpAddLayernorm);
  const RowPlan p = plan_rows(rows, n, x.element_size(), {&x, &residual, &weight, &bias, &out, &res_out}, variant);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PROFKIT_DISPATCH_FLOATING(x.scalar_type(), "add_layernorm", [&] {
    constexpr int V16 = vec16<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    const scalar_t* bp = bias.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    scalar_t* hp = res_out.data_ptr<scalar_t>();
    if (p.vec == V16)
      launch<scalar_t, V16>(p, variant, rows, xp, rp, wp, bp, op, hp, n, static_cast<float>(eps), stream);
    else
      launch<scalar_t, 1>(p, variant, rows, xp, rp, wp, bp, op, hp, n, static_cast<float>(eps), stream);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, res_out};
}

}  // namespace
}  // namespace profkit_kernels

// Only the CUDA kernel is registered here; the schema is defined once, in Python.
TORCH_LIBRARY_IMPL(profkit_kernels, CUDA, m) {
  m.impl("add_layernorm_cuda", &profkit_kernels::add_layernorm_cuda);
}

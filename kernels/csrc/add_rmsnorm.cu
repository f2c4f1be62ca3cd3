// Fused residual add + RMSNorm (functional and in-place).  Registers only the CUDA kernels of
// profkit_kernels::add_rmsnorm_cuda / add_rmsnorm_inplace_cuda; the schemas live in kernels/_library.py.
//
// One block per row.  Rows that fit (<= kMaxThreads * kMaxItems vectors) are held in registers:
// x and residual are read once, residual_out and out written once (4 passes, the minimum).  Longer
// rows loop and re-read x and residual for the second pass.  16-byte vector loads when every row is
// 16-byte aligned, else a scalar path.
#include "common.h"

namespace profkit_kernels {
namespace {

template <typename T, int VEC, int ITEMS>
__global__ void __launch_bounds__(kMaxThreads) add_rmsnorm_reg_kernel(
    const T* __restrict__ x, const T* r, const T* __restrict__ w, T* __restrict__ out, T* res_out,
    int64_t n, float eps) {
  using V = Vec<T, VEC>;
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(n / VEC);
  const V* xv = reinterpret_cast<const V*>(x + row * n);
  const V* rv = reinterpret_cast<const V*>(r + row * n);
  const V* wv = reinterpret_cast<const V*>(w);
  V* hv = reinterpret_cast<V*>(res_out + row * n);
  V* ov = reinterpret_cast<V*>(out + row * n);

  // In the few-rows (decode) configurations the weight is prefetched with x and residual: one
  // memory round trip before the reduction instead of two.  With many rows other blocks hide that
  // latency and the extra registers would only lower occupancy.
  constexpr bool kPrefetchW = ITEMS <= 2;  // the decode configurations
  V xa[ITEMS], h[ITEMS], wa[kPrefetchW ? ITEMS : 1];
  // Shared prologue (common.h): every load is issued before the first store.
  load_row<T, VEC, ITEMS>(xv, xa, nvec);
  load_row<T, VEC, ITEMS>(rv, h, nvec);
  if constexpr (kPrefetchW) load_row<T, VEC, ITEMS>(wv, wa, nvec);
  add_round_store<T, VEC, ITEMS>(xa, h, hv, nvec);
  float ss = 0.f;
  for_each_item<ITEMS>(nvec, [&](int i, int) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = to_f(h[i].v[j]);
      ss += f * f;
    }
  });
  ss = block_sum_first(ss, smem);
  const float rstd = rsqrtf(ss / static_cast<float>(n) + eps);
  for_each_item<ITEMS>(nvec, [&](int i, int idx) {
    const V w_i = kPrefetchW ? wa[kPrefetchW ? i : 0] : wv[idx];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = from_f<T>(to_f(h[i].v[j]) * rstd * to_f(w_i.v[j]));
    ov[idx] = o;
  });
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads) add_rmsnorm_loop_kernel(
    const T* __restrict__ x, const T* r, const T* __restrict__ w, T* __restrict__ out, T* res_out,
    int64_t n, float eps) {
  using V = Vec<T, VEC>;
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const int nvec = static_cast<int>(n / VEC);
  const V* xv = reinterpret_cast<const V*>(x + row * n);
  const V* rv = reinterpret_cast<const V*>(r + row * n);
  const V* wv = reinterpret_cast<const V*>(w);
  V* hv = reinterpret_cast<V*>(res_out + row * n);
  V* ov = reinterpret_cast<V*>(out + row * n);
  // pass 1: sum of squares, no stores (so the in-place variant re-reads the old residual)
  float ss = 0.f;
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx], b = rv[idx];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = to_f(from_f<T>(to_f(a.v[j]) + to_f(b.v[j])));
      ss += f * f;
    }
  }
  ss = block_sum(ss, smem);
  const float rstd = rsqrtf(ss / static_cast<float>(n) + eps);
  // pass 2: each thread rewrites exactly the elements it read, so aliasing is safe
  for (int idx = threadIdx.x; idx < nvec; idx += blockDim.x) {
    const V a = xv[idx], b = rv[idx], wa = wv[idx];
    V hh, o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      hh.v[j] = from_f<T>(to_f(a.v[j]) + to_f(b.v[j]));
      o.v[j] = from_f<T>(to_f(hh.v[j]) * rstd * to_f(wa.v[j]));
    }
    hv[idx] = hh;
    ov[idx] = o;
  }
}

template <typename T, int VEC>
void launch(const RowPlan& p, int64_t rows, const T* x, const T* r, const T* w, T* out, T* res_out,
            int64_t n, float eps, cudaStream_t s) {
  switch (p.items) {
    case 1: add_rmsnorm_reg_kernel<T, VEC, 1><<<rows, p.threads, 0, s>>>(x, r, w, out, res_out, n, eps); break;
    case 2: add_rmsnorm_reg_kernel<T, VEC, 2><<<rows, p.threads, 0, s>>>(x, r, w, out, res_out, n, eps); break;
    case 4: add_rmsnorm_reg_kernel<T, VEC, 4><<<rows, p.threads, 0, s>>>(x, r, w, out, res_out, n, eps); break;
    case 8: add_rmsnorm_reg_kernel<T, VEC, 8><<<rows, p.threads, 0, s>>>(x, r, w, out, res_out, n, eps); break;
    default: add_rmsnorm_loop_kernel<T, VEC><<<rows, p.threads, 0, s>>>(x, r, w, out, res_out, n, eps); break;
  }
}

void check_args(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) {
  check_x(x);
  check_input(residual, "residual", x);
  check_input(weight, "weight", x);
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual must have the shape of x.");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must have shape (hidden,).");
  TORCH_CHECK(x.size(-1) < (int64_t{1} << 31), "hidden size must be below 2^31.");
}

void run(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& out,
         const at::Tensor& res_out, double eps) {
  if (x.numel() == 0) return;
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  TORCH_CHECK(rows < (int64_t{1} << 31), "too many rows for one launch.");
  const RowPlan p = plan_rows(rows, n, x.element_size(), {&x, &residual, &weight, &out, &res_out},
                             launch_variant(kOpAddRmsnorm));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  PROFKIT_DISPATCH_FLOATING(x.scalar_type(), "add_rmsnorm", [&] {
    constexpr int V16 = vec16<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    scalar_t* hp = res_out.data_ptr<scalar_t>();
    if (p.vec == V16)
      launch<scalar_t, V16>(p, rows, xp, rp, wp, op, hp, n, static_cast<float>(eps), stream);
    else
      launch<scalar_t, 1>(p, rows, xp, rp, wp, op, hp, n, static_cast<float>(eps), stream);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> add_rmsnorm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  check_args(x, residual, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  at::Tensor res_out = at::empty_like(x);
  run(x, residual, weight, out, res_out, eps);
  return {out, res_out};
}

at::Tensor add_rmsnorm_inplace_cuda(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight,
                                    double eps) {
  check_args(x, residual, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  run(x, residual, weight, out, residual, eps);
  return out;
}

}  // namespace
}  // namespace profkit_kernels

// Launch-variant switch for benchmarks (kernels/_build.py calls it through ctypes): op is an OpId,
// variant 0 (previous launch configuration) to 3 (see each op's launch()).  Returns the old value,
// or -1 if op or variant is out of range.
extern "C" __attribute__((visibility("default"))) int profkit_kernels_set_launch_variant(int op, int variant) {
  if (op < 0 || op >= profkit_kernels::kNumOps || variant < 0 || variant > 3) return -1;
  int* v = profkit_kernels::launch_variants();
  const int old = v[op];
  v[op] = variant;
  return old;
}

extern "C" __attribute__((visibility("default"))) int profkit_kernels_get_launch_variant(int op) {
  if (op < 0 || op >= profkit_kernels::kNumOps) return -1;
  return profkit_kernels::launch_variants()[op];
}

// Only the CUDA kernels are registered here; the schemas are defined once, in Python.
TORCH_LIBRARY_IMPL(profkit_kernels, CUDA, m) {
  m.impl("add_rmsnorm_cuda", &profkit_kernels::add_rmsnorm_cuda);
  m.impl("add_rmsnorm_inplace_cuda", &profkit_kernels::add_rmsnorm_inplace_cuda);
}

"""Per-op element types from kernel names: no trace-wide vote."""
from __future__ import annotations

import pytest

from profkit.judge.dtypes import kernel_dtype, op_dtype


@pytest.mark.parametrize("name,prec", [
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "bf16"),
    ("nvjet_hsh_128x64_64x4_2x1_v_bz_NNT", "fp16"),
    ("nvjet_sm90_sss_128x128_32x4_1x2_h_bz_NNT", "fp32"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "bf16"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_warpsize4x2x1_ffma", "fp32"),
    # fp32 data, TF32 math: cuBLAS with TF32 allowed, cuDNN's 1x1 convolutions as GEMMs
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "tf32"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "bf16"),
    ("cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4", "tf32"),
    ("ampere_sgemm_128x64_nn", "fp32"),
    ("ampere_h16816gemm_256x128_ldg8_stages_32x3_nn", "fp16"),
    ("void at::native::vectorized_elementwise_kernel<(int)8, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "std::array<char *, (unsigned long)3>>(int, T2, T3)", "bf16"),
    # 16-bit data with fp32 math: the data type wins
    ("void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<"
     "at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
     "at::native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase &, const T1 &)", "bf16"),
    ("void kernel<__nv_bfloat16, 8>(const __nv_bfloat16 *)", "bf16"),
    ("void cutlass::Kernel<cutlass::half_t>(Params)", "fp16"),
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
     "std::array<char *, (unsigned long)1>>(int, T2, T3)", "fp32"),
    ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<int>, "
     "std::array<char *, (unsigned long)1>>(int, T2, T3)", "int32"),
    ("triton_poi_fused_add_gelu_0", None),
    ("[CUDA memset]", None),
])
def test_kernel_dtype(name, prec):
    assert kernel_dtype(name).precision == prec


def test_cudnn_f16_is_a_16_bit_type_settled_by_a_sibling():
    sdpa = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1"
    alone = op_dtype([sdpa])
    assert alone.precision is None and set(alone.candidates) == {"bf16", "fp16"}
    assert alone.elem_bytes == 2
    fill_fp32 = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>>"
    with_bf16 = op_dtype([sdpa, fill_fp32, "void k<c10::BFloat16>(int)"], [100.0, 50.0, 1.0])
    assert with_bf16.precision == "bf16"  # fp32 helper does not out-vote: it is no candidate


def test_gemm_kernels_decide_over_fp32_helpers():
    gemm = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    helpers = [f"void at::native::reduce_kernel<float, {i}>(float)" for i in range(5)]
    assert op_dtype([gemm] + helpers, [1.0] + [100.0] * 5).precision == "bf16"


def test_cast_kernel_names_source_and_destination():
    d = op_dtype(["void at::native::vectorized_elementwise_kernel<(int)8, "
                  "at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda(float) "
                  "(instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)"])
    assert (d.src, d.dst) == ("fp32", "bf16")


def test_unknown_is_unknown():
    d = op_dtype(["triton_poi_fused_add_0"])
    assert d.precision is None and not d.known and d.elem_bytes is None


def test_cudnn_backward_helpers_with_float_buffers_do_not_decide():
    bprop = "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1"
    helper = ("void cudnn::fusion::compute_dot_do_o_specialized<(bool)1, (int)64>(const void *, "
              "const float *, float *, unsigned int)")
    d = op_dtype([bprop, helper], [1_000_000.0, 20_000.0])
    assert d.precision is None and set(d.candidates) == {"bf16", "fp16"} and d.elem_bytes == 2

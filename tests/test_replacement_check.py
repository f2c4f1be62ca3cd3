"""The replacement timings held against captures of the fixed programs (scripts/whatif/replacements.py):
the predicted side recomputes from the committed corpus traces, the page is current, and each
kind's op is the kernels it should be."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from whatif import replacements as check  # noqa: E402

DATA = json.loads(check.DATA.read_text())


def _row(kind: str, program: str) -> dict:
    return next(r for r in DATA["checks"] if r["kind"] == kind and r["program"] == program)


@pytest.mark.parametrize("kind,program", [("optimizer", "compiled_step_train"), ("gemm_tf32", "tuned_gpt_train")])
def test_the_prediction_recomputes_from_the_committed_trace(kind, program):
    row = _row(kind, program)
    assert row["baseline"] == f"traces/corpus/{program}.sqlite.xz"
    assert check.predicted(ROOT / row["baseline"], kind) == row["predicted"]


def test_a_whole_op_is_its_timed_replacement_times_its_calls():
    row = _row("optimizer", "compiled_step_train")["predicted"]
    # one fused AdamW step an iteration, timed at 939,455 ns on the H100 of the capture
    assert row["ns_per_iteration"] == row["replacement_ns"] == 939455 and row["entries"] == 1


def test_the_page_is_current(capsys):
    check.cmd_replacements(argparse.Namespace(add=None, check=True))


def test_a_tiny_op_and_a_fix_that_is_not_the_replacement_are_not_counted():
    tiny = _row("gemm_tf32", "tuned_gpt_train")
    assert check.too_small(tiny) and not check.counts(tiny)
    assert check.counts(_row("conv_bf16", "resnet50_fp32_infer"))
    assert not check.counts({"kind": "conv_bf16", "fix": "bf16_autocast",
                             "predicted": {"ns_per_iteration": 10**6}, "measured": {"ns_per_iteration": 10**6}})


NAMES = ["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
         "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::FusedOptimizerTensorListMetadata"
         "<(int)4>, at::native::<unnamed>::FusedAdamMathFunctor<float, (int)4, (ADAM_MODE)1, (bool)0>>",
         "void elemWiseRNNcell<float, float, float, (cudnnRNNMode_t)2, (cudnnRNNBiasMode_t)2>(int)",
         "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cudnn",
         "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_kernel__5x_cudnn",
         "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, (bool)0, (bool)1>(int)",
         "[CUDA memcpy Device-to-Host]",
         "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>>(int)"]
KINDS = ["kernel"] * 6 + ["memcpy", "kernel"]


@pytest.mark.parametrize("kind,want", [
    ("attention", [0]), ("optimizer", [1]), ("rnn", [2, 3]), ("copy", [6]), ("gemm_tf32", [3]),
    # a CNN's convolutions: the convolution kernels, the GEMMs cuDNN runs 1x1 ones as, its layout kernels
    ("conv_bf16", [3, 4, 5]),
])
def test_each_kinds_op_is_its_kernels(kind, want):
    mask = check.op_mask(kind, NAMES, KINDS)
    assert [i for i, m in enumerate(mask) if m] == want

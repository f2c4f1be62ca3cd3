"""PK306 fp64-compute on fp64_surrogate_train's capture (an MLP of 6 x 1024 trained in float64 on
an H100): the float64 GEMMs priced at the TF32 roof and the other float64 kernels at half their
bytes, through the step model; measured by hand on the same H100 (run folder ab-57, interleaved):
float32 with TF32 4.48x, float32 alone 1.24x, float32 with bf16 autocast 4.76x."""
from __future__ import annotations

from pathlib import Path

import profkit
from profkit.judge.dtypes import kernel_dtype

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "corpus" / "fp64_surrogate_train.sqlite.xz"


def test_a_float64_mlp_is_priced_in_float32_with_tf32_and_its_variants():
    prof = profkit.load(TRACE)
    (f,) = [f for f in prof.findings() if f.code == "PK306"]
    # 22 float64 kernels: the GEMMs 12.2 ms an iteration (14 iterations), the rest 2.1 ms
    assert f.evidence["kernels"] == 22
    assert f.evidence["fp64_gemm_ns"] == 170_539_317 and f.evidence["fp64_other_ns"] == 28_978_027
    assert round(f.expected_end_to_end_speedup, 3) == 5.117          # measured 4.48x
    assert f.evidence["fp32_speedup"] == 1.078                        # measured 1.24x
    assert f.evidence["bf16_speedup"] == 4.555                        # measured 4.76x
    assert f.evidence["priced_from"] == "estimate"
    assert "model.float()" in f.action and "[float32 without TF32: 1.08x]" in f.action
    # the action leads the run's, above torch.compile (tried at 1.01x)
    assert prof.findings()[0].code == "PK306"


def test_cutlass_dmma_kernels_read_as_float64():
    name = "void cutlass::Kernel2<cutlass_80_tensorop_d884gemm_64x32_16x4_tn_align1>(T1::Params)"
    assert kernel_dtype(name).precision == "fp64"
    # a tensorop kernel of another type keeps its own
    assert kernel_dtype("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8").precision == "bf16"


def test_float32_and_bf16_steps_are_left_alone():
    for name in ("mae_pretrain_train", "tuned_gpt_train"):
        assert "PK306" not in {f.code for f in profkit.load(ROOT / "traces" / "corpus" / f"{name}.sqlite.xz").findings()}

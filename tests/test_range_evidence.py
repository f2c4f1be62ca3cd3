"""Range rows of a --aten capture: their work is the sum of the aten calls nested in them.

A range holding aten ranges (``profkit capture --aten``) gets shapes-based evidence: the FLOPs and
bytes of the aten calls that launched its kernels, each call counted once (the innermost aten
range owns a kernel), over the range's mean busy time per call. Checked on a hand-made trace
whose every number is known and on real H200 captures.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

import profkit
from profkit.judge import evidence as ev
from profkit.model import Source
from synth import TID, make_trace

ROOT = Path(__file__).resolve().parents[1]
load_all = partial(profkit.load, window="all", attribution="thread")

GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
        "execute_segment_k_off_kernel__5x_cublas")
RELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
        "launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
        "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}::"
        "operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, "
        "c10::BFloat16, at::detail::Array<char*, 2>)")
LINEAR = "aten::linear, seq = {o}, op_id = {o}, sizes = [[4096, 4096], [4096, 4096], [4096]], input_op_ids = []"
ADDMM = ("aten::addmm, seq = {o}, op_id = {o}, sizes = [[4096], [4096, 4096], [4096, 4096], [], []], "
         "input_op_ids = []")
RELU_RANGE = "aten::relu, seq = {o}, op_id = {o}, sizes = [[4096, 4096]], input_op_ids = []"


def _trace(path: Path) -> Path:
    """'block' (2 calls): aten::linear around aten::addmm (a 250 us GEMM), then aten::relu
    (25 us). 'partial': a relu call (25 us) and a 30 us kernel outside any aten call.
    'mostly': a relu call (25 us) and a 5 us kernel outside any aten call."""
    kernels, runtime, nvtx = [], [], []

    def launch(t_api, start, end, name_id):
        corr = len(kernels) + 1
        runtime.append((t_api, t_api + 500, corr))
        kernels.append((start, end, corr, name_id))

    for i, t0 in enumerate((0, 1_000_000)):
        o = 10 * i
        nvtx.append((t0, t0 + 400_000, "block", TID))
        nvtx.append((t0 + 1_000, t0 + 20_000, LINEAR.format(o=o + 1), TID))
        nvtx.append((t0 + 2_000, t0 + 19_000, ADDMM.format(o=o + 2), TID))
        launch(t0 + 3_000, t0 + 30_000, t0 + 280_000, 1)
        nvtx.append((t0 + 21_000, t0 + 30_000, RELU_RANGE.format(o=o + 3), TID))
        launch(t0 + 22_000, t0 + 280_000, t0 + 305_000, 2)
    for t0, name, own_ns in ((2_000_000, "partial", 30_000), (3_000_000, "mostly", 5_000)):
        nvtx.append((t0, t0 + 100_000, name, TID))
        nvtx.append((t0 + 1_000, t0 + 10_000, RELU_RANGE.format(o=t0 // 1000), TID))
        launch(t0 + 2_000, t0 + 50_000, t0 + 75_000, 2)
        launch(t0 + 20_000, t0 + 75_000, t0 + 75_000 + own_ns, 3)
    return make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx,
                      strings={1: GEMM, 2: RELU, 3: "my_custom_kernel", 9: "cudaLaunchKernel"})


@pytest.fixture(scope="module")
def synth_prof(tmp_path_factory):
    return load_all(_trace(tmp_path_factory.mktemp("aten") / "t.sqlite"))


def test_a_range_sums_the_aten_calls_that_launched_its_kernels(synth_prof):
    aten = synth_prof.ops(by="aten")
    addmm = aten.loc[[n for n in aten.index if n.startswith("aten::addmm")][0], "evidence"]
    relu = aten.loc["aten::relu [[4096, 4096]]", "evidence"]
    # 2*4096^3 FLOPs and the bias add; bf16 from the GEMM kernel's name
    assert addmm["flops_per_call"] == 137_455_730_688 and addmm["bytes_per_call"] == 100_671_488
    assert relu["flops_per_call"] == 16_777_216 and relu["bytes_per_call"] == 67_108_864
    block = synth_prof.ops(by="range").loc["block"]
    e = block["evidence"]
    assert block["source"] == "shapes" and block["class"] == "compute" and block["confidence"] == "medium"
    # aten::linear wraps aten::addmm: its GEMM is counted once, at the innermost range
    assert e["flops_per_call"] == 137_455_730_688 + 16_777_216
    assert e["bytes_per_call"] == 100_671_488 + 67_108_864
    assert e["aten_calls_per_call"] == 2 and e["aten_modelled_share"] == 1.0 and e["aten_ops"] == 2
    assert e["precision"] == "bf16"
    # over the mean busy time per call: 275 us (250 us GEMM + 25 us relu)
    assert e["achieved_flops_per_s"] == pytest.approx((137_455_730_688 + 16_777_216) / 275e-6)
    assert block["pct_of_roof"] == pytest.approx((137_455_730_688 + 16_777_216) / 989.5e12 / 275e-6)


def test_work_outside_aten_calls_lowers_the_confidence_or_leaves_the_timeline(synth_prof):
    ops = synth_prof.ops(by="range")
    # 25 of 55 us in a modelled call: under half, so no sum (it would say little)
    assert ops.loc["partial", "source"] == "timeline"
    mostly = ops.loc["mostly"]
    assert mostly["source"] == "shapes" and mostly["confidence"] == "low"
    assert mostly["evidence"]["aten_modelled_share"] == pytest.approx(25 / 30)
    assert mostly["evidence"]["aten_sum_confidence"].startswith(
        "low: only 83% of its GPU time is in aten calls the shape model covers")
    assert mostly["evidence"]["bytes_per_call"] == 67_108_864


def test_kernel_and_aten_levels_are_unchanged(synth_prof):
    assert set(synth_prof.ops(by="kernel")["source"]) == {"timeline"}
    assert set(synth_prof.ops(by="aten")["source"]) == {"shapes"}


def _w(flops, nbytes, precision="bf16", cap=None, candidates=()):
    return ev.Work(Source.SHAPES, flops=flops, bytes=nbytes, precision=precision, confidence_cap=cap,
                   candidates=candidates)


def test_from_aten_calls_rules():
    # 2 calls of the range: 4 GEMM calls and 2 casts; the roof is the type with the most FLOPs
    w = ev.from_aten_calls([("aten::mm", _w(1e12, 1e9), 4, 900.0), ("aten::_to_copy", _w(0.0, 4e8, "fp32"), 2, 100.0),
                            ("aten::view", None, 3, 0.0)], 2, 1000.0, 2000.0)
    assert (w.flops, w.bytes, w.precision, w.time_ns, w.parts) == (2e12, 2.4e9, "bf16", 1000.0, 2)
    assert w.confidence_cap == "medium" and w.notes["aten_calls_per_call"] == 4.5
    assert w.notes["aten_modelled_calls_per_call"] == 3.0
    # most of the time in unmodelled calls: no evidence; part of it: low confidence
    assert ev.from_aten_calls([("aten::mm", _w(1e12, 1e9), 1, 40.0)], 1, 100.0, 100.0) is None
    assert ev.from_aten_calls([("aten::mm", _w(1e12, 1e9), 1, 80.0)], 1, 100.0, 100.0).confidence_cap == "low"
    # FLOPs split between types: low; calls of guessed element type holding the time: low
    mixed = ev.from_aten_calls([("aten::mm", _w(6e11, 1e9), 1, 50.0),
                                ("aten::mm", _w(4e11, 1e9, "fp32"), 1, 50.0)], 1, 100.0, 100.0)
    assert mixed.precision == "bf16" and mixed.confidence_cap == "low"
    assert mixed.notes["element_type_share"] == pytest.approx(0.6)
    guessed = ev.from_aten_calls([("aten::mul", _w(1e6, 1e9, None, "low", ("bf16", "fp32")), 1, 100.0)],
                                 1, 100.0, 100.0)
    assert guessed.precision is None and guessed.candidates == ("bf16", "fp32")
    assert guessed.confidence_cap == "low"


# --------------------------------------------------------------- real captures (H200)

@pytest.fixture(scope="module")
def llama_rec():
    return profkit.load(ROOT / "traces" / "real" / "train_llama_rec.sqlite.xz").ops(by="range")


def test_llama_training_step_golden(llama_rec):
    """The Llama training step under profkit's recorder: every range gets the summed evidence
    of its aten calls, and train_step's work is exactly forward + backward + optimizer."""
    ev_ = {n: llama_rec.loc[n, "evidence"] for n in ("train_step", "forward", "backward", "optimizer")}
    assert {n: (e["flops_per_call"], e["bytes_per_call"]) for n, e in ev_.items()} == {
        "train_step": (1_469_595_315_712, 21_306_065_024),
        "forward": (488_409_080_320, 5_423_665_280),
        "backward": (980_182_691_840, 9_678_675_968),
        "optimizer": (1_003_543_552, 6_203_723_776)}
    for what in ("flops_per_call", "bytes_per_call"):
        assert ev_["train_step"][what] == sum(ev_[n][what] for n in ("forward", "backward", "optimizer"))
    assert {n: e["aten_calls_per_call"] for n, e in ev_.items()} == {
        "train_step": 337, "forward": 126, "backward": 203, "optimizer": 8}
    assert {n: round(e["pct_of_roof"], 4) for n, e in ev_.items()} == {
        "train_step": 0.5121, "forward": 0.4496, "backward": 0.4873, "optimizer": 0.6410}
    assert set(llama_rec.loc[list(ev_), "source"]) == {"shapes"}
    assert llama_rec.loc["train_step", "evidence"]["precision"] == "bf16"
    # the optimizer's fused-Adam kernels hold 14% of its time outside a modelled call
    assert llama_rec.loc["optimizer", "confidence"] == "low"
    assert llama_rec.loc["optimizer", "evidence"]["aten_modelled_share"] == pytest.approx(0.8568, abs=1e-4)
    for n, row in llama_rec.iterrows():  # never above a roof
        assert (row["pct_of_roof"] != row["pct_of_roof"]) or row["pct_of_roof"] <= 1.0, n


def test_a_range_around_one_attention_call_reads_like_the_call():
    """emit_nvtx's autograd range around the cuDNN attention backward: 'unknown' on the
    timeline, now compute-bound with the aten call's own FLOPs and bytes, and its advice."""
    prof = profkit.load(ROOT / "traces" / "real" / "train_llama_aten.sqlite.xz")
    row = prof.ops(by="range").loc["ScaledDotProductCudnnAttentionBackward0"]
    aten = prof.ops(by="aten")
    call = aten.loc[[n for n in aten.index if n.startswith("aten::_cudnn_attention_backward")][0]]
    assert row["source"] == "shapes" and row["class"] == "compute" == call["class"]
    assert row["confidence"] == call["confidence"] == "medium"
    for what in ("flops_per_call", "bytes_per_call", "compute_roof"):
        assert row["evidence"][what] == call["evidence"][what]
    assert row["evidence"]["flops_per_call"] == 21_474_836_480  # 4*B*H*L^2*D x 2.5 (backward)
    assert round(row["pct_of_roof"], 4) == 0.2829
    assert row["action"].startswith("Leave it: attention already runs on a fused flash / cuDNN kernel")


def test_ncu_counters_still_come_first():
    ops = profkit.load(ROOT / "traces" / "real" / "train_llama_rec_ncu.sqlite.xz").ops(by="range")
    assert ops.loc["train_step", "source"] == "ncu"
    assert ops.loc["ncu_iter", "source"] == "shapes"  # the ncu pass itself has no counters

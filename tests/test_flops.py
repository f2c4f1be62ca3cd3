"""The analytic FLOP/byte model: hand counts per formula, and the emit_nvtx text parser."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from synth import plain

from profkit.judge.flops import (AtenCall, OpCost, aten_is_wrapper, broadcast_shapes, estimate,
                           estimate_call, has_model, innermost_modeled, normalize_op,
                           parse_aten_range)

ROOT = Path(__file__).resolve().parent.parent
ATEN_TRACE = ROOT / "traces" / "model_tiny_llama_aten.sqlite.xz"


# --- parser ---------------------------------------------------------------------------------------
def test_parse_full_form():
    c = parse_aten_range("aten::addmm, seq = 12, op_id = 3, sizes = [[4096], [8, 1024], "
                         "[1024, 4096], [], []], input_op_ids = [(1,0), (2,0), (0,-1)]")
    assert c == AtenCall("aten::addmm", [[4096], [8, 1024], [1024, 4096], [], []], seq=12, op_id=3)


def test_parse_variants():
    # torch 2.11 under no_grad: no seq
    c = parse_aten_range("aten::mm, op_id = 32, sizes = [[2048, 2048], [2048, 6144]], "
                         "input_op_ids = [(30,0), (26,0)]")
    assert (c.op, c.sizes, c.seq, c.op_id) == ("aten::mm", [[2048, 2048], [2048, 6144]], None, 32)
    # older torch: seq only, no op_id, no input_op_ids
    c = parse_aten_range("aten::add, seq = 5, sizes = [[4, 8], [4, 8], []]")
    assert (c.op, c.sizes, c.seq, c.op_id) == ("aten::add", [[4, 8], [4, 8], []], 5, None)
    # no shapes recorded at all
    c = parse_aten_range("aten::relu")
    assert (c.op, c.sizes) == ("aten::relu", [])
    # a tensor list argument is flattened, the nesting kept in raw_sizes
    c = parse_aten_range("aten::cat, op_id = 9, sizes = [[[2, 3], [2, 5]], []]")
    assert c.sizes == [[2, 3], [2, 5], []] and c.raw_sizes == [[[2, 3], [2, 5]], []]
    # a scalar tensor and a 0-size dim
    c = parse_aten_range("aten::mul, seq = 1, sizes = [[0, 4], []]")
    assert c.sizes == [[0, 4], []]


@pytest.mark.parametrize("text", ["forward", "layer0", "gemm {flops=1e9, bytes=2e6}", "",
                                  "cublasCreate_v2", "aten::mm, sizes = [[1, 2]", None])
def test_parse_rejects_non_op_text(text):
    assert parse_aten_range(text) is None


@pytest.mark.skipif(not ATEN_TRACE.exists(), reason="real emit_nvtx trace not present")
def test_parse_every_aten_range_in_a_real_trace():
    con = sqlite3.connect(plain(ATEN_TRACE))
    texts = [r[0] for r in con.execute(
        "SELECT COALESCE(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
        "ON s.id = n.textId WHERE n.eventType = 59")]
    aten = [t for t in texts if t and t.startswith("aten::")]
    assert aten
    calls = [parse_aten_range(t) for t in aten]
    assert all(c is not None for c in calls)
    mms = [c for c in calls if c.op == "aten::mm"]
    assert mms and all(len(c.sizes) == 2 and all(len(s) == 2 for s in c.sizes) for c in mms)
    sdpa = [c for c in calls if c.op == "aten::_cudnn_attention_forward"]
    assert sdpa and estimate_call(sdpa[0]).kind == "attention"


# --- GEMMs ----------------------------------------------------------------------------------------
def test_mm():
    c = estimate("aten::mm", [[8, 16], [16, 4]], elem_bytes=2)
    assert c.flops == 2 * 8 * 16 * 4 == 1024
    assert c.bytes == (8 * 16 + 16 * 4 + 8 * 4) * 2 == 448
    assert c.kind == "gemm" and c.formula.startswith("mm: 2*8*16*4 FLOP")


def test_addmm_counts_the_bias():
    c = estimate("aten::addmm", [[4], [8, 16], [16, 4], [], []], elem_bytes=4)
    assert c.flops == 2 * 8 * 16 * 4 + 8 * 4
    assert c.bytes == (4 + 128 + 64 + 32) * 4


def test_bmm_and_baddbmm():
    c = estimate("aten::bmm", [[3, 8, 16], [3, 16, 4]])
    assert c.flops == 2 * 3 * 8 * 16 * 4
    assert c.bytes == 3 * (128 + 64 + 32) * 2
    c = estimate("aten::baddbmm", [[3, 8, 4], [3, 8, 16], [3, 16, 4], [], []])
    assert c.flops == 2 * 3 * 8 * 16 * 4 + 3 * 8 * 4
    assert c.bytes == (96 + 3 * (128 + 64) + 96) * 2


def test_matmul_batched_and_1d():
    c = estimate("aten::matmul", [[4, 512, 2048], [2048, 6144]])
    assert c.flops == 2 * 4 * 512 * 2048 * 6144
    assert c.bytes == (4 * 512 * 2048 + 2048 * 6144 + 4 * 512 * 6144) * 2
    c = estimate("aten::matmul", [[2, 1, 8, 16], [3, 16, 4]])      # broadcast batch 2x3
    assert c.flops == 2 * 6 * 8 * 16 * 4
    c = estimate("aten::matmul", [[16], [16, 4]])                    # vector @ matrix
    assert c.flops == 2 * 16 * 4
    assert estimate("aten::matmul", [[8, 16], [15, 4]]) is None      # K mismatch: no guess


def test_linear():
    c = estimate("aten::linear", [[4, 512, 2048], [6144, 2048], []])
    m = 4 * 512
    assert c.flops == 2 * m * 2048 * 6144
    assert c.bytes == (m * 2048 + 6144 * 2048 + m * 6144) * 2
    c = estimate("aten::linear", [[10, 32], [64, 32], [64]], elem_bytes=4)
    assert c.flops == 2 * 10 * 32 * 64 + 10 * 64
    assert c.bytes == (320 + 2048 + 64 + 640) * 4


# --- conv -----------------------------------------------------------------------------------------
def test_conv2d_same_size_assumption():
    # x[2,3,32,32], w[16,3,3,3], bias[16]
    c = estimate("aten::conv2d", [[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []], 2)
    out = 2 * 16 * 32 * 32
    assert c.flops == 2 * out * 3 * 9 + out
    assert c.bytes == (2 * 3 * 32 * 32 + 16 * 27 + 16 + out) * 2
    assert c.kind == "conv" and "assumed" in c.formula


def test_grouped_conv1d_and_cudnn_variant():
    c = estimate("aten::cudnn_convolution", [[1, 8, 100], [8, 1, 5], [], [], [], [], [], []])
    assert c.flops == 2 * (1 * 8 * 100) * 1 * 5      # depthwise: Cin/groups = 1
    assert estimate("aten::convolution", [[1, 8, 100], [8, 1, 5, 5]]) is None  # rank mismatch


# --- attention ------------------------------------------------------------------------------------
def test_sdpa_and_causal():
    q = [4, 16, 512, 128]
    c = estimate("aten::scaled_dot_product_attention", [q, q, q, [], [], [], []])
    assert c.flops == 4 * 4 * 16 * 512 * 512 * 128
    assert c.bytes == 4 * (4 * 16 * 512 * 128) * 2
    causal = estimate("aten::_scaled_dot_product_flash_attention", [q, q, q], causal=True)
    assert causal.flops == c.flops / 2 and "causal" in causal.formula


def test_attention_cross_and_blhd_layout():
    c = estimate("aten::_scaled_dot_product_cudnn_attention",
                 [[2, 8, 100, 64], [2, 8, 300, 64], [2, 8, 300, 64]])
    assert c.flops == 4 * 2 * 8 * 100 * 300 * 64
    assert c.bytes == (2 * 8 * 100 * 64 + 2 * 2 * 8 * 300 * 64 + 2 * 8 * 100 * 64) * 2
    # _flash_attention_forward takes [B, L, H, D]
    c = estimate("aten::_flash_attention_forward",
                 [[2, 100, 8, 64], [2, 300, 8, 64], [2, 300, 8, 64], [], [], [], []])
    assert c.flops == 4 * 2 * 8 * 100 * 300 * 64


# --- elementwise ----------------------------------------------------------------------------------
def test_add_with_broadcast_and_alpha_scalar():
    c = estimate("aten::add", [[4, 1, 8], [3, 1], []], elem_bytes=4)
    assert c.flops == 4 * 3 * 8
    assert c.bytes == (32 + 3 + 96) * 4
    assert c.kind == "elementwise"


def test_inplace_and_unary():
    c = estimate("aten::mul_", [[1024], [1024]])
    assert (c.flops, c.bytes) == (1024, 3 * 1024 * 2)
    c = estimate("aten::relu", [[10, 10]])
    assert (c.flops, c.bytes) == (100, 400)


def test_gelu_silu_cost_more_and_say_so():
    g = estimate("aten::gelu", [[1000], []])
    assert g.flops == 8 * 1000 and "~8 FLOP/element" in g.formula
    s = estimate("aten::silu", [[4, 512, 5632]])
    assert s.flops == 4 * 4 * 512 * 5632


def test_where_three_inputs():
    c = estimate("aten::where", [[8, 1], [8, 4], [1, 4]], elem_bytes=2)
    assert c.flops == 32 and c.bytes == (8 + 32 + 4 + 32) * 2


def test_broadcast_failure_is_no_model():
    assert estimate("aten::add", [[3, 4], [5, 4]]) is None
    assert broadcast_shapes([3, 4], [5, 4]) is None
    assert broadcast_shapes([4, 1, 8], [3, 1]) == [4, 3, 8]


# --- reductions, norms, softmax ---------------------------------------------------------------------
def test_reductions():
    c = estimate("aten::sum", [[64, 128], [], [], []], elem_bytes=4)
    assert (c.flops, c.bytes, c.kind) == (8192, 8192 * 4, "reduction")
    assert estimate("aten::mean", [[10, 10], []]).flops == 100
    assert estimate("aten::amax", [[10, 10], [], []]).bytes == 200


def test_norms():
    c = estimate("aten::native_layer_norm", [[4, 512, 2048], [], [2048], [2048], []])
    n = 4 * 512 * 2048
    assert c.flops == 8 * n and c.bytes == (2 * n + 2 * 2048) * 2
    assert estimate("aten::layer_norm", [[4, 512, 2048], [], [2048], [2048], [], []]).flops == 8 * n
    r = estimate("aten::_fused_rms_norm", [[4, 512, 2048], [], [2048], []])
    assert r.flops == 4 * n and r.bytes == (2 * n + 2048) * 2
    assert estimate("aten::rms_norm", [[4, 512, 2048], [], [2048], []]) == r.__class__(
        r.flops, r.bytes, r.kind, r.formula)


def test_softmax():
    c = estimate("aten::_softmax", [[8, 1000], [], []], elem_bytes=4)
    assert (c.flops, c.bytes) == (5 * 8000, 2 * 8000 * 4)
    assert estimate("aten::log_softmax", [[8, 1000], [], []]).kind == "softmax"


# --- gathers and copies ---------------------------------------------------------------------------
def test_embedding():
    c = estimate("aten::embedding", [[32000, 2048], [4, 512], [], [], []])
    n = 4 * 512
    assert c.flops == 0
    assert c.bytes == 2 * n * 2048 * 2 + n * 8
    assert c.kind == "gather"


def test_index_select_and_index():
    c = estimate("aten::index_select", [[32000, 2048], [], [2048]])
    assert c.bytes == 2 * 2048 * 2048 * 2 + 2048 * 8
    c = estimate("aten::index", [[100, 64], [10]], elem_bytes=4)
    assert c.bytes == 2 * 10 * 64 * 4 + 10 * 8


def test_copies():
    assert estimate("aten::copy_", [[1024], [1024], []]).bytes == 2 * 1024 * 2
    assert estimate("aten::_to_copy", [[10, 10], [], [], [], [], [], []], 4).bytes == 800
    assert estimate("aten::contiguous", [[3, 5], []]).bytes == 60
    assert estimate("aten::clone", [[3, 5], []]).flops == 0
    c = estimate("aten::cat", [[2, 3], [2, 5], []])
    assert (c.flops, c.bytes) == (0, 2 * 16 * 2)


def test_views_cost_nothing_and_unknown_ops_have_no_model():
    assert estimate("aten::view", [[4, 512], []]).kind == "view"
    assert estimate("aten::transpose", [[6144, 2048], [], []]).bytes == 0
    assert estimate("aten::my_custom_thing", [[4, 4]]) is None
    assert estimate("aten::cholesky", [[4, 4]]) is None
    assert estimate("aten::mm", [[8, 16]]) is None        # too few shapes
    assert estimate("aten::mm", []) is None
    assert not has_model("aten::cholesky") and has_model("aten::addmm")


# --- wrappers -------------------------------------------------------------------------------------
def test_normalize_op():
    assert normalize_op("aten::add_") == "add"
    assert normalize_op("aten::add.Tensor") == "add"
    assert normalize_op("aten::_softmax") == "_softmax"
    assert normalize_op("mm") == "mm"


def test_wrappers():
    for op in ("aten::linear", "aten::matmul", "aten::rms_norm", "aten::layer_norm",
               "aten::scaled_dot_product_attention", "aten::conv2d", "aten::embedding"):
        assert aten_is_wrapper(op), op
    for op in ("aten::mm", "aten::addmm", "aten::_fused_rms_norm", "aten::native_layer_norm",
               "aten::_cudnn_attention_forward", "aten::add"):
        assert not aten_is_wrapper(op), op


def test_innermost_modeled_avoids_double_counting():
    stack = [
        "layer0",
        "aten::linear, op_id = 25, sizes = [[4, 512, 2048], [6144, 2048], []], input_op_ids = []",
        "aten::matmul, op_id = 29, sizes = [[4, 512, 2048], [2048, 6144]], input_op_ids = []",
        "aten::mm, op_id = 32, sizes = [[2048, 2048], [2048, 6144]], input_op_ids = []",
    ]
    call, cost = innermost_modeled(stack)
    assert call.op == "aten::mm" and cost.flops == 2 * 2048 * 2048 * 6144
    # a view op innermost is skipped; the op that carries the work is found above it
    call, cost = innermost_modeled(stack[:2] + ["aten::t, sizes = [[6144, 2048]]"])
    assert call.op == "aten::linear"
    assert innermost_modeled(["forward", "aten::view, sizes = [[4], []]"]) is None


def test_opcost_intensity():
    c = estimate("aten::mm", [[4096, 4096], [4096, 4096]])
    assert c.intensity == pytest.approx(2 * 4096 ** 3 / (3 * 4096 ** 2 * 2))
    assert OpCost(1.0, 0.0, "x", "").intensity == float("inf")


# --- byte model: out=, casts, foreach ---------------------------------------------------------------
def test_out_tensor_is_written_not_read():
    plain = estimate("aten::add", [[1024], [1024], []], 2)
    out = estimate("aten::add", [[1024], [1024], [], [1024]], 2)
    assert plain.bytes == out.bytes == 3 * 1024 * 2  # two reads, one write; out= adds no read
    assert "out= written" in out.formula
    assert estimate("aten::mul.out", [[64], [64], [64]], 4).bytes == 3 * 64 * 4


def test_cast_counts_source_and_destination_types():
    c = estimate("aten::_to_copy", [[1024, 1024], [], [], [], [], [], []], 2,
                 src_elem_bytes=4, dst_elem_bytes=2)
    assert c.bytes == 1024 * 1024 * (4 + 2)
    same = estimate("aten::copy_", [[8, 8], [8, 8], []], 4)
    assert same.bytes == 2 * 64 * 4


def test_causal_attention_counts_half_the_flops():
    q = [4, 16, 512, 128]
    full = estimate("aten::_scaled_dot_product_cudnn_attention", [q, q, q], 2)
    causal = estimate("aten::_scaled_dot_product_cudnn_attention", [q, q, q], 2, causal=True)
    assert causal.flops * 2 == full.flops and causal.bytes == full.bytes


def test_foreach_and_fused_optimizer():
    c = estimate_call(parse_aten_range(
        "aten::_foreach_add_, op_id = 3, sizes = [[[4, 8], [16]], [[4, 8], [16]], []]"), 4)
    assert c.kind == "foreach" and c.flops == 48 and c.bytes == (96 + 48) * 4
    adam = estimate_call(parse_aten_range(
        "aten::_fused_adam_, op_id = 3, sizes = [[[4, 8]], [[4, 8]], [[4, 8]], [[4, 8]], [], "
        "[[]], [], [], [], [], [], [], []]"), 4)
    assert adam.kind == "optimizer" and adam.bytes == 7 * 32 * 4
    assert has_model("aten::_foreach_mul_") and has_model("aten::_fused_adamw_")


def test_foreach_lists_flattened_by_emit_nvtx():
    # _foreach_addcdiv_(self, tensor1, tensor2, value): three lists of two tensors, then a scalar
    c = estimate_call(parse_aten_range(
        "aten::_foreach_addcdiv_, op_id = 9, sizes = [[4, 8], [16], [4, 8], [16], [4, 8], [16], []]"), 4)
    assert c.flops == 3 * 48 and c.bytes == (3 * 48 + 48) * 4
    # _foreach_mul_(self, scalar): one list whose shapes do not repeat
    c = estimate_call(parse_aten_range(
        "aten::_foreach_mul_, op_id = 9, sizes = [[32, 8], [8, 8], [8], []]"), 4)
    assert c.bytes == (328 + 328) * 4


def test_attention_backward():
    q = [8, 16, 512, 64]
    fwd = estimate("aten::_cudnn_attention_forward", [q, q, q], 2)
    bwd = estimate("aten::_cudnn_attention_backward", [q, q, q, q, q, [8, 16, 512, 1]], 2)
    assert bwd.flops == 2.5 * fwd.flops and bwd.bytes == 8 * 8 * 16 * 512 * 64 * 2
    assert estimate("aten::_cudnn_attention_backward", [q, q, q, q, q], 2, causal=True).flops \
        == bwd.flops / 2

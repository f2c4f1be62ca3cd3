"""Verdicts and suggestions on the real H200 captures: each micro case lands where it should."""
from __future__ import annotations

from functools import partial

from pathlib import Path

import pytest

import profkit
from profkit.judge.estimate import amdahl

# Golden numbers here are over the whole capture with Nsight Systems' per-thread projection.
load_all = partial(profkit.load, window="all", attribution="thread")

ROOT = Path(__file__).resolve().parents[1] / "traces"


def ops(name: str, by: str = "range"):
    return load_all(ROOT / f"{name}.sqlite.xz").ops(by=by)


def test_tiny_elementwise_chain_is_launch_bound_and_should_be_fused():
    op = ops("micro_chain").loc["tiny_chain"]
    assert op["class"] == "launch" and op["rung"] == "torch.compile"
    assert op["evidence"]["kernels_per_call"] == 20
    assert op["evidence"]["gpu_busy_fraction"] < 0.1      # the GPU waits on launches
    assert "fuse the 20 kernels" in op["action"]


def test_cuda_graph_replay_is_still_launch_bound_and_says_so():
    o = ops("micro_graph")
    g, e = o.loc["graph_replay"], o.loc["eager_chain"]
    assert g["class"] == "launch" and e["class"] == "launch"
    assert "already replay from a CUDA graph" in g["action"]
    # the graph removed the CPU gaps: its median call is >10x shorter than eager's
    assert e["gpu_time_median_ns"] / g["gpu_time_median_ns"] > 10


def test_eager_add_rmsnorm_points_to_the_bundled_fused_kernel():
    op = ops("micro_addnorm").loc["add_rmsnorm"]
    assert op["class"] == "memory" and op["rung"] == "triton"
    assert "kernels.add_rmsnorm" in op["action"] and "5 passes over HBM become 4" in op["action"]
    assert op["gpu_time_median_ns"] == 175440.0
    assert op["first_call_ns"] > 10 * op["gpu_time_median_ns"]  # first call: set-up outlier


def test_scaled_softmax_points_to_the_bundled_softmax():
    op = ops("micro_softmax").loc["scaled_softmax"]
    assert op["class"] == "memory" and "kernels.softmax" in op["action"]


def test_hinted_bf16_matmul_near_its_roof_is_left_alone():
    op = ops("micro_hinted").loc["my_matmul"]
    assert op["source"] == "hints" and op["class"] == "compute"
    n = 4096
    achieved = 2.0 * n**3 / (op["busy_median_ns"] * 1e-9)
    assert op["evidence"]["achieved_flops_per_s"] == pytest.approx(achieved)
    assert op["pct_of_roof"] == pytest.approx(achieved / 989.5e12)
    assert op["pct_of_roof"] > 0.7 and op["rung"] == "none" and op["action"].startswith("Leave it")


def test_copies_are_memory_work_with_exact_bytes():
    o = ops("micro_memcpy")
    h2d = o.loc["h2d_copy"]
    assert h2d["class"] == "memory" and h2d["source"] == "copy"
    assert h2d["evidence"]["bytes_per_call"] == 64 * 1024 * 1024
    assert "pct_of_memory_roof" not in h2d["evidence"]   # host link, not HBM
    d2d = o.loc["d2d_copy"]
    assert d2d["evidence"]["bytes_per_call"] == 2 * 64 * 1024 * 1024  # read + write
    assert d2d["rung"] == "none"


def test_aten_level_uses_op_shapes():
    o = ops("model_tiny_llama_aten", by="aten")
    mm = o.loc["aten::mm [[2048, 2048], [2048, 11264]]"]
    assert mm["source"] == "shapes" and mm["class"] == "compute"
    assert mm["evidence"]["flops_per_call"] == 2 * 2048 * 2048 * 11264
    silu = o.loc["aten::silu [[4, 512, 5632]]"]
    assert silu["class"] == "memory" and silu["evidence"]["bytes_per_call"] == 2 * 4 * 512 * 5632 * 2


def test_end_to_end_gain_follows_amdahl():
    op = ops("micro_addnorm").loc["add_rmsnorm"]
    # Amdahl over the window's GPU time; the wall-time figure can only be smaller.
    s, e2e = op["expected_op_speedup"], op["expected_gpu_time_speedup"]
    assert 1.0 < e2e < s
    assert 1.0 <= op["expected_end_to_end_speedup"] <= e2e
    total = load_all(ROOT / "micro_addnorm.sqlite.xz").trace.total_gpu_time_ns
    saved = min(op["gpu_time_median_ns"] * op["count"] * (1 - 1 / s), op["busy_ns"])
    assert e2e == pytest.approx(total / (total - saved))
    assert amdahl(0.25, 4.0) == pytest.approx(1.2307692)

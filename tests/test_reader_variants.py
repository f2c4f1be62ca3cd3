"""Hand-made exports, one per schema variant, with numbers worked out by hand."""
from __future__ import annotations

import pytest

from profkit.errors import ProfkitError
from profkit.run.ops import group_ops
from profkit.read.trace import Trace
from synth import TID, make_trace

# outer [0, 1000] holds inner [100, 500]; corr 1 launches from inner, corr 2 from outer only
# (two kernels, like a graph launch), corr 3 from outside any range.
RUNTIME = [(110, 120, 1), (600, 610, 2), (1200, 1210, 3)]
KERNELS = [(200, 300, 1, 1), (650, 700, 2, 2), (720, 760, 2, 1), (1300, 1350, 3, 1)]
NVTX = [(0, 1000, "outer", TID), (100, 500, "inner", TID)]


def ops(path, by="range", innermost=False):
    return group_ops(Trace(path), by=by, innermost=innermost).ops


def test_nested_projection_counts_every_enclosing_range(tmp_path):
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX))
    assert o.loc["outer", "gpu_time_ns"] == 760 - 200      # span: first start to last end
    assert o.loc["outer", "busy_ns"] == 100 + 50 + 40      # union of the three kernels
    assert o.loc["outer", "kernels"] == 3
    assert o.loc["inner", "gpu_time_ns"] == 100
    assert o.loc["outer", "cpu_time_ns"] == 1000
    assert o.loc["outer", "share"] == pytest.approx(190 / 240)


def test_innermost_gives_each_kernel_one_range(tmp_path):
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX), innermost=True)
    assert o.loc["outer", "gpu_time_ns"] == 760 - 650
    assert o.loc["outer", "busy_ns"] == 90
    assert o.loc["inner", "gpu_time_ns"] == 100


def test_by_kernel_sums_and_counts(tmp_path):
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX), by="kernel")
    assert o.loc["kernel_a", "count"] == 3 and o.loc["kernel_a", "gpu_time_ns"] == 190
    assert o.loc["kernel_b", "count"] == 1 and o.loc["kernel_b", "gpu_time_ns"] == 50


def test_text_through_string_ids(tmp_path):
    nvtx = [(0, 1000, 3, TID)]
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=nvtx))
    assert list(o.index) == ["range_text"]


def test_export_without_text_id_column(tmp_path):
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX,
                       nvtx_text_id=False))
    assert set(o.index) == {"outer", "inner"}


def test_versioned_kernel_table(tmp_path):
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX,
                       kernel_table="CUPTI_ACTIVITY_KIND_KERNEL_V2"), by="kernel")
    assert o["gpu_time_ns"].sum() == 240


def test_short_name_only(tmp_path):
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=NVTX,
                       short_name_only=True), by="kernel")
    assert set(o.index) == {"kernel_a", "kernel_b"}


def test_range_that_never_closed_ends_at_the_last_nvtx_timestamp(tmp_path):
    nvtx = [(0, None, "open", TID), (1100, 1250, "late", TID)]
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=nvtx))
    # "open" runs to 1250, so it holds all three launches
    assert o.loc["open", "kernels"] == 4
    assert o.loc["open", "gpu_time_ns"] == 1350 - 200


def test_start_end_range_closed_on_another_thread_is_left_out(tmp_path):
    nvtx = [(0, 1000, "crosses", TID, 60, TID + 1), (0, 1000, "same", TID, 60, None)]
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=nvtx))
    assert list(o.index) == ["same"]


def test_correlation_ids_are_per_process(tmp_path):
    pid2 = 200 << 24
    kernels = KERNELS + [(2000, 2100, 1, 2, 1, 9, pid2)]       # same corr id 1, other process
    runtime = RUNTIME + [(1900, 1910, 1, pid2 + 3)]
    nvtx = NVTX + [(1800, 2500, "other_proc", pid2 + 3)]
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx))
    assert o.loc["other_proc", "gpu_time_ns"] == 100
    assert o.loc["inner", "gpu_time_ns"] == 100


def test_overlapping_streams_busy_is_a_union(tmp_path):
    kernels = [(200, 300, 1, 1, 0, 7), (250, 400, 2, 2, 0, 8)]
    runtime = [(110, 120, 1), (130, 140, 2)]
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime, nvtx=NVTX))
    assert o.loc["inner", "busy_ns"] == 200 and o.loc["inner", "gpu_time_ns"] == 200


def test_memcpy_is_gpu_work(tmp_path):
    memcpy = [(800, 900, 5, 1 << 20, 1)]
    runtime = RUNTIME + [(620, 630, 5)]
    o = ops(make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=runtime, nvtx=NVTX, memcpy=memcpy),
            by="kernel")
    assert o.loc["[CUDA memcpy Host-to-Device]", "gpu_time_ns"] == 100


def test_no_nvtx_table_by_range_is_a_clear_error_but_kernels_work(tmp_path):
    p = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, with_nvtx=False)
    with pytest.raises(ProfkitError, match="no NVTX ranges"):
        ops(p)
    assert ops(p, by="kernel")["gpu_time_ns"].sum() == 240


def test_no_runtime_table_by_range_is_a_clear_error(tmp_path):
    p = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, nvtx=NVTX, with_runtime=False)
    with pytest.raises(ProfkitError, match="no CUDA runtime calls"):
        ops(p)
    assert ops(p, by="kernel")["gpu_time_ns"].sum() == 240


def test_two_devices_and_streams(tmp_path):
    """Work on two GPUs: per-kernel totals add up across devices, busy time is per device."""
    kernels = [(200, 300, 1, 1, 0, 7), (250, 350, 2, 1, 1, 9), (400, 450, 3, 2, 1, 9)]
    runtime = [(110, 120, 1), (130, 140, 2), (150, 160, 3)]
    p = make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime, nvtx=NVTX)
    tr = Trace(p)
    assert sorted(tr.activities["deviceId"].unique()) == [0, 1]
    assert tr.total_gpu_time_ns == 100 + 100 + 50
    # overlapping kernels on different devices are both busy time: 100 on device 0, 150 on device 1
    assert tr.gpu_busy_ns == 100 + 150
    o = group_ops(tr, by="kernel").ops
    assert o.loc["kernel_a", "count"] == 2 and o.loc["kernel_a", "gpu_time_ns"] == 200
    r = group_ops(tr, by="range").ops
    assert r.loc["inner", "gpu_time_ns"] == 450 - 200 and r.loc["inner", "busy_ns"] == 200

"""nsys GPU-metrics samples as an evidence tier (synthetic export; the real one is an H200
ResNet-50 capture: same tables, 22 metrics)."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

import profkit
from profkit.read.gpu_metrics import overlap_weights, read_gpu_metrics
from synth import TID, make_trace

PERIOD = 100_000  # 10 kHz
METRICS = [(0, "GPC Clock Frequency [MHz]"), (3, "SMs Active [Throughput %]"),
           (4, "SM Issue [Throughput %]"), (5, "Tensor Active [Throughput %]"),
           (9, "DRAM Read Bandwidth [Throughput %]"), (10, "DRAM Write Bandwidth [Throughput %]")]
TYPE_ID = 0x10000  # low byte: device 0


def add_gpu_metrics(path: Path, phases: list[tuple[int, int, dict[int, float]]]) -> None:
    """phases: (t0, t1, {metricId: value}) sampled every PERIOD ns from t0 to t1."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, "
                "typeName TEXT, metricId INTEGER, metricName TEXT)")
    # metric ids differ from the names' order on purpose: readers must join by name
    con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?,0,'GH100',?,?)",
                    [(TYPE_ID, mid, name) for mid, name in METRICS])
    con.execute("CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, "
                "value INTEGER)")
    rows = []
    for t0, t1, values in phases:
        for t in range(t0, t1, PERIOD):
            for mid, _ in METRICS:
                rows.append((t, TYPE_ID, mid, values.get(mid, 0)))
    con.executemany("INSERT INTO GPU_METRICS VALUES (?,?,?,?)", rows)
    con.commit()
    con.close()


@pytest.fixture
def trace(tmp_path):
    # range "gemm": one 2 ms kernel; range "stream": one 2 ms kernel; 10 calls each
    kernels, runtime, nvtx = [], [], []
    t, corr = 1_000_000, 1
    phases = []
    for i in range(10):
        for name_id, text, vals in ((1, "gemm", {3: 99, 4: 60, 5: 85, 9: 10, 10: 5}),
                                    (2, "stream", {3: 99, 4: 12, 5: 0, 9: 55, 10: 35})):
            runtime.append((t - 5000, t - 4000, corr))
            nvtx.append((t - 6000, t - 3000, text, TID))  # the launch call is inside
            kernels.append((t, t + 2_000_000, corr, name_id))
            phases.append((t, t + 2_000_000, vals))
            t += 2_000_000
            corr += 1
        phases.append((t, t + 300_000, {}))  # idle between calls
        t += 300_000
    path = make_trace(tmp_path / "gm.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx,
                      strings={1: "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_NNT", 2: "stream_kernel",
                               9: "cudaLaunchKernel"})
    add_gpu_metrics(path, phases)
    return path


def test_reader_joins_by_metric_name(trace):
    gm = read_gpu_metrics(trace)
    assert gm.period_ns == PERIOD
    assert {"dram_read", "dram_write", "tensor", "sm_issue", "sm_active"} <= set(gm.samples.columns)
    assert gm.names["dram_read"] == "DRAM Read Bandwidth [Throughput %]"


def test_ops_get_their_own_samples(trace):
    df = profkit.load(trace).ops(by="range")
    g, s = df.loc["gemm"], df.loc["stream"]
    assert g["source"] == "gpu_metrics" and s["source"] == "gpu_metrics"
    assert g["evidence"]["gpu_metrics_dram_pct"] == pytest.approx(15)   # read + write
    assert g["evidence"]["gpu_metrics_tensor_active_pct"] == pytest.approx(85)
    assert g["class"] == "compute"
    assert s["evidence"]["gpu_metrics_dram_pct"] == pytest.approx(90)
    assert s["class"] == "memory"
    assert s["evidence"]["pct_of_memory_roof"] == pytest.approx(0.9)


def test_overlap_weights_split_a_straddling_sample():
    ts = np.array([0.0, 100.0, 200.0])
    w = overlap_weights(ts, 100.0, np.array([50, 60]), np.array([150, 120]))  # union [50, 150)
    assert list(w) == [50.0, 50.0, 0.0]


def test_no_tables_no_tier(tmp_path):
    path = make_trace(tmp_path / "plain.sqlite", kernels=[(0, 10, 1, 1)], runtime=[(0, 1, 1)])
    assert read_gpu_metrics(path) is None


def test_kernels_much_shorter_than_a_sample_get_no_reading(tmp_path):
    # 10 us kernels, one per 100 us sample: each sample is 90% someone else's time
    kernels, runtime, nvtx, phases = [], [], [], []
    t = 1_000_000
    for i in range(50):
        runtime.append((t - 5000, t - 4000, i + 1))
        nvtx.append((t - 6000, t - 3000, "tiny", TID))
        kernels.append((t, t + 10_000, i + 1, 1))
        phases.append((t, t + PERIOD, {9: 50}))
        t += PERIOD
    path = make_trace(tmp_path / "short.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx,
                      strings={1: "k_small", 9: "cudaLaunchKernel"})
    add_gpu_metrics(path, phases)
    df = profkit.load(path).ops(by="range")
    assert df.loc["tiny", "source"] != "gpu_metrics"


def test_compute_bound_by_metrics_is_placed_by_its_busy_unit(trace):
    df = profkit.load(trace).ops(by="range")
    g = df.loc["gemm"]
    assert g["pct_of_roof"] == pytest.approx(0.85)   # tensor active, not the 15% DRAM
    assert g["expected_op_speedup"] < 1.5

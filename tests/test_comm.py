"""profkit.judge.comm: NCCL kernels are communication, interval arithmetic for exposed time, bandwidth."""
from __future__ import annotations

from functools import partial

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import profkit
from profkit.judge import comm
from profkit.cli import main
from profkit.read.trace import Trace
from synth import TID, make_trace

# Golden numbers here are over the whole capture with Nsight Systems' per-thread projection.
load_all = partial(profkit.load, window="all", attribution="thread")

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp2"
REF = ROOT / "tests" / "data" / "nsys_ref"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"


@pytest.mark.parametrize("name,coll", [
    (ALLREDUCE, "AllReduce"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "Broadcast"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "AllGather"),
    ("void ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE(x)", "ReduceScatter"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "SendRecv"),
])
def test_nccl_kernel_names(name, coll):
    assert comm.is_nccl_kernel(name) and comm.collective_of(name) == coll


@pytest.mark.parametrize("name", ["nvjet_sm90_tst_256x128", "void at::native::reduce_kernel<nccl>",
                                  "my_ncclDevKernel_copy", "[CUDA memcpy Device-to-Device]"])
def test_other_kernels_are_not_nccl(name):
    assert not comm.is_nccl_kernel(name)


def test_bus_factors_follow_nccl_tests():
    assert comm.bus_factor("AllReduce", 8) == pytest.approx(2 * 7 / 8)
    assert comm.bus_factor("AllGather", 8) == pytest.approx(7 / 8)
    assert comm.bus_factor("ReduceScatter", 4) == pytest.approx(3 / 4)
    assert comm.bus_factor("Broadcast", 64) == 1.0
    assert comm.bus_factor("AllReduce", None) is None
    assert comm.link_peak("NVIDIA H200")[1] == 450e9 and comm.link_peak("NVIDIA H100 80GB HBM3")[1] == 450e9
    assert comm.link_peak("NVIDIA A100-SXM4-80GB")[1] == 300e9
    assert comm.link_peak("some GPU") == (None, None)


def _brute_cover(s, e, qs, qe):
    m = np.zeros(int(max(e.max(initial=0), qe.max(initial=0))) + 1, bool)
    for a, b in zip(s, e):
        m[a:b] = True
    return np.array([m[a:b].sum() for a, b in zip(qs, qe)])


def test_interval_sweep_matches_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 30))
        s = rng.integers(0, 500, n)
        e = s + rng.integers(0, 80, n)
        qs = rng.integers(0, 600, 20)
        qe = qs + rng.integers(0, 100, 20)
        us, ue = comm.merge_intervals(s, e)
        assert np.all(us[1:] > ue[:-1])  # disjoint, sorted
        assert (ue - us).sum() == _brute_cover(s, e, np.array([0]), np.array([700]))[0]
        np.testing.assert_array_equal(comm.covered(qs, qe, us, ue), _brute_cover(s, e, qs, qe))


def _trace_with_overlap(tmp_path: Path) -> Path:
    """Compute [0, 100) and [150, 200) on stream 7; AllReduce [50, 180) on stream 13, inside a
    range with a bytes hint; a second AllReduce [300, 340) with nothing beside it and no hint.
    (Times relative to T0: the launches come before 0, and a trace holds no negative times.)"""
    strings = {1: "gemm_kernel", 2: ALLREDUCE, 9: "cudaLaunchKernel"}
    t0 = 1000
    kernels = [(t0 + 0, t0 + 100, 1, 1, 0, 7), (t0 + 150, t0 + 200, 2, 1, 0, 7),
               (t0 + 50, t0 + 180, 3, 2, 0, 13), (t0 + 300, t0 + 340, 4, 2, 0, 13)]
    runtime = [(t0 - 50, t0 - 49, 1), (t0 - 48, t0 - 47, 2), (t0 - 20, t0 - 19, 3),
               (t0 + 250, t0 + 251, 4)]
    nvtx = [(t0 - 30, t0 - 10, "ddp.allreduce {bytes=1.3e5}", TID)]
    return make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx,
                      strings=strings, nvtx_text_id=False)


def test_exposed_time_and_bandwidth_on_synthetic_trace(tmp_path):
    tr = Trace(_trace_with_overlap(tmp_path))
    c = comm.analyze(tr, n_ranks=4)
    row = c.collectives.iloc[0]
    assert row["collective"] == "AllReduce" and row["count"] == 2
    assert row["gpu_time_ns"] == 130 + 40
    # [50,180) is covered by compute on [50,100) and [150,180): 80 ns hidden, 50 exposed; the second: 40
    assert row["exposed_ns"] == 50 + 40 and c.exposed_ns == 90 and c.comm_time_ns == 170
    assert c.compute_busy_ns == 150
    assert row["bytes"] == pytest.approx(1.3e5) and row["calls_with_bytes"] == 1
    algbw = 1.3e5 / 130e-9
    assert row["algbw_bytes_per_s"] == pytest.approx(algbw)
    assert row["busbw_bytes_per_s"] == pytest.approx(algbw * 2 * 3 / 4)
    assert row["pct_of_link_peak"] == pytest.approx(algbw * 1.5 / 450e9)
    assert any("bytes unknown" in n for n in c.notes)


def test_no_nccl_kernels(tmp_path):
    tr = Trace(make_trace(tmp_path / "t.sqlite", kernels=[(10, 20, 1, 1)], runtime=[(5, 6, 1)]))
    c = comm.analyze(tr)
    assert c.collectives.empty and c.comm_time_ns == 0 and c.notes == ["no NCCL kernels in this trace"]


def test_nccl_kernels_get_the_communication_class_in_single_trace_classify():
    prof = load_all(DDP / "rank0.sqlite.xz")
    k = prof.ops(by="kernel")
    nccl = np.array([comm.is_nccl_kernel(n) for n in k.index])
    assert nccl.sum() == 3
    assert set(k.loc[nccl, "class"]) == {"communication"}
    assert "communication" not in set(k.loc[~nccl, "class"])
    assert set(k.loc[nccl, "rung"]) == {"library"}
    for a in k.loc[nccl, "action"]:
        assert "overlap it with compute" in a
    r = prof.ops(by="range")
    assert r.loc["NCCL:ncclAllReduce", "class"] == "communication"
    assert r.loc["ddp.allreduce", "class"] == "communication"       # hook range: scale kernel + NCCL
    assert r.loc["backward", "class"] != "communication"           # compute with NCCL inside
    assert r.loc["ddp.allreduce", "evidence"]["collective"] == "AllReduce"
    rep = prof.report(by="kernel")
    assert {op["class"] for op in rep["ops"] if op["name"].startswith("nccl")} == {"communication"}


def test_single_trace_table_shows_the_communication_class():
    res = CliRunner().invoke(main, ["classify", "--window", "all", "--attribution", "thread", str(DDP / "rank0.sqlite.xz"), "--by", "kernel", "--top", "5"],
                             catch_exceptions=False)
    assert res.exit_code == 0 and "communication" in res.stdout


def test_ddp_hook_bytes_reach_the_collectives():
    """The DDP comm hook wraps each bucket's all-reduce in `ddp.allreduce {bytes=N}`: every
    AllReduce kernel of the training steps carries its bucket's bytes."""
    tr = Trace(DDP / "rank0.sqlite.xz")
    c = comm.analyze(tr, n_ranks=2)
    ar = c.collectives[c.collectives["collective"] == "AllReduce"].iloc[0]
    ref = pd.read_csv(REF / "ddp2_rank0_nvtx_gpu_proj_sum.csv")
    hooks = ref[ref["Range"].str.startswith(":ddp.allreduce")]
    assert ar["calls_with_bytes"] == hooks["Range Instances"].sum() == ar["count"] == 26
    want = sum(float(r.split("bytes=")[1].rstrip("}")) * n
               for r, n in zip(hooks["Range"], hooks["Range Instances"]))
    assert ar["bytes"] == pytest.approx(want)

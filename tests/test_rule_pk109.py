"""PK109 host-tensor-compute: the op record's ops on host tensors (an embedding table looked up
and updated on the CPU) priced through the step model on cpu_embedding_train's capture, and the
record itself: which ops it keeps."""
from __future__ import annotations

from pathlib import Path

import pytest

import profkit
import shared
from profkit.judge.rules import pk109_host_tensor_compute as pk109

torch = pytest.importorskip("torch")
from test_replacements import _record  # noqa: E402 (the watched-iteration helper)

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "corpus" / "cpu_embedding_train.sqlite.xz"


def _with_host_ops(tmp_path: Path, host_ops: list[dict] | None) -> Path:
    """cpu_embedding_train's capture whose op record holds ``host_ops`` (None: no such entry, as a
    record written before it had one), its other entries kept."""
    return shared.with_record_items(TRACE, tmp_path, "host_ops", host_ops)


OPS = [{"op": "add_", "count": 6, "ns": 20_000_000, "bytes": 100_000_000},
       {"op": "_coalesce", "count": 1, "ns": 15_000_000, "bytes": 40_000_000},
       {"op": "_embedding_bag", "count": 1, "ns": 5_000_000, "bytes": 2_000_000}]


def test_pk109_prices_the_committed_captures_host_ops():
    """cpu_embedding_train (a 1M-row table on the CPU, SparseAdam there; 76.2 ms an iteration
    without the profiler, the GPU idle 99%): its record holds 48 host ops, 80.8 ms an iteration
    (the coalesce of the sparse gradient, the bag's backward, SparseAdam's adds, its sparse
    mask), as much as the main thread's CPU time between calls: 26.47x (the table on the GPU
    measured 15.6-18.4x: the GPU's sparse ops launch several kernels each, priced as one)."""
    (f,) = [f for f in profkit.load(TRACE).findings() if f.code == "PK109"]
    assert f.expected_end_to_end_speedup == pytest.approx(26.473, abs=1e-3)
    assert f.evidence["host_ops"] == 48 and f.evidence["host_ops_ns_per_iteration"] == 80_847_804
    assert f.action.startswith("the step computes on tensors in host memory: 80.85 ms an iteration in 48 ops "
                               "(_coalesce 24.22 ms, _embedding_bag_backward 15.99 ms")


def test_pk109_prices_moving_the_host_ops_to_the_gpu_through_the_step_model(tmp_path):
    """With 40 ms of host ops an iteration in the record, the main thread's CPU time between
    calls (71.2 ms) loses those 40 ms less 8 launches at the trace's median launch cost and the
    ops' bytes at the memory bandwidth: 2.17x."""
    (f,) = [f for f in profkit.load(_with_host_ops(tmp_path, OPS)).findings() if f.code == "PK109"]
    assert f.expected_end_to_end_speedup == pytest.approx(2.168, abs=1e-3)
    assert f.evidence["host_ops_ns_per_iteration"] == 40_000_000 and f.evidence["host_ops"] == 8
    assert f.action.startswith("the step computes on tensors in host memory: 40.00 ms an iteration in 8 ops "
                               "(add_ 20.00 ms, _coalesce 15.00 ms, _embedding_bag 5.00 ms)")
    assert "8 launches at 6.9 us" in f.basis and "71.20 -> 31.34 ms" in f.basis


def test_pk109_is_quiet_without_a_record_or_under_its_share(tmp_path):
    for ops in (None, [], [{"op": "add_", "count": 2, "ns": int(0.05 * 76e6), "bytes": 1_000_000}]):
        assert "PK109" not in [f.code for f in profkit.load(_with_host_ops(tmp_path, ops)).findings()], ops
    assert pk109.RULE.param("min_share") == 0.10


def test_the_record_keeps_ops_on_host_tensors_with_an_output_worth_a_kernel():
    """A sparse table's lookup, backward and SparseAdam step on the CPU are kept, each op with its
    calls, time and output bytes; a scalar's bookkeeping (under 4 KB) and an op on another
    device's tensors are not."""
    emb = torch.nn.EmbeddingBag(10_000, 64, mode="sum", sparse=True)
    opt = torch.optim.SparseAdam(list(emb.parameters()))
    ids, offsets = torch.randint(0, 10_000, (4096,)), torch.arange(0, 4096, 16)

    def step():
        emb(ids, offsets).sum().backward()
        opt.step()
        opt.zero_grad()
    recorded = _record(step)["host_ops"]
    host = {o["op"]: o for o in recorded}
    assert {"_embedding_bag", "_embedding_bag_backward", "_coalesce"} <= set(host)
    # the pooled vectors and the op's own index outputs (offset2bag, bag sizes)
    assert host["_embedding_bag"]["bytes"] >= 256 * 64 * 4 and host["_embedding_bag"]["count"] == 1
    assert all(o["ns"] > 0 and o["bytes"] >= 4096 for o in recorded)
    assert [o["ns"] for o in recorded] == sorted((o["ns"] for o in recorded), reverse=True)
    # 32 bytes of bookkeeping, and a large op on another device's tensors: neither kept
    elsewhere = torch.ones(1 << 16, device="meta")
    assert _record(lambda: (torch.ones(8) * 2, elsewhere * 2))["host_ops"] == []


def test_a_host_paced_run_with_no_action_says_what_it_cannot_explain(tmp_path):
    """cpu_embedding_train's capture with a record written before it kept host ops: no rule prices
    anything, and classify says the host's own work is 96% of the iteration, where, and that a
    capture by this version would record it; with a record that looked and found none, it says
    that instead. A run with a priced action says nothing of the kind."""
    from profkit.show.render import run_lines
    run = profkit.load(_with_host_ops(tmp_path, None)).run_json()
    u = run["unexplained"]
    assert (u["share"], u["host_ops_looked_for"], u["where"][0]) == (0.964, False, "optimizer")
    line = next(x for x in run_lines(run) if x.startswith("actions  none priced"))
    assert line.startswith("actions  none priced: the host's own work between CUDA calls is 96% of the "
                           "iteration (73.57 ms, in optimizer")
    assert "a capture by this version of profkit capture records the ops" in line
    looked = profkit.load(_with_host_ops(tmp_path, [])).run_json()["unexplained"]
    assert looked["host_ops_looked_for"] is True
    assert "unexplained" not in profkit.load(ROOT / "traces" / "corpus" / "tabular_mlp_train.sqlite.xz").run_json()


def test_a_malformed_record_entry_is_left_out_not_a_crash(tmp_path):
    bad = [{"op": "add_", "count": "many", "ns": 40_000_000, "bytes": 1}, {"ns": 1}, *OPS]
    (f,) = [f for f in profkit.load(_with_host_ops(tmp_path, bad)).findings() if f.code == "PK109"]
    assert f.evidence["host_ops"] == 8

"""PK307 underfilled-grid on global_prune_train's capture (gradual magnitude pruning of a 23 M-weight
GPT, its global threshold a ``kthvalue`` over every magnitude each step; an H100, 3 of the 14
iterations it was scored on at first sight): the selection kernel runs on one block of the 132
SMs, priced as if every SM did its block's work; measured by hand on the same H100 (run folder
ab-73, interleaved): the threshold from torch.sort 8.64x, the threshold every 100 steps 9.50x."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import profkit
from profkit.cli import main
from profkit.judge.rules.pk307_underfilled_grid import short

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "corpus" / "global_prune_train.sqlite.xz"


def test_a_one_block_selection_is_found_and_priced_over_the_whole_gpu():
    prof = profkit.load(TRACE)
    found = prof.findings()
    (f,) = [f for f in found if f.code == "PK307"]
    assert f.evidence["kernels"] == ["gatherKthValue"] and f.evidence["blocks"] == {"gatherKthValue": 1}
    assert f.evidence["sm_count"] == 132
    # 142.1 ms an iteration on one block; 1.08 ms if every SM did as much
    assert f.evidence["underfilled_ns_per_iteration"] == 142_106_198
    assert f.evidence["full_grid_ns_per_iteration"] == 1_076_562
    assert round(f.expected_op_speedup, 3) == 132.0
    assert round(f.expected_end_to_end_speedup, 3) == 20.327     # measured 8.64x (sort), 9.50x (every 100)
    assert "torch.sort" in f.action and "1 block(s) of the GPU's 132 SMs" in f.action
    # it leads the run's actions; the pruning range is no longer offered a fusion of its kernels
    # (it was offered 5.01x on the op, 4.21x end to end: the five kernels' busy time over five
    # passes, below the selection's own 139.5 ms), nor called memory-bound: latency-bound, priced
    # by the same edit as the finding
    assert found[0].code == "PK307"
    prune = prof.ops(by="range").loc["prune"]
    assert prune["kernel_longest_ns"] == 139_518_168.0
    assert prune["class"] == "latency" and prune["confidence"] == "high"
    assert prune["reason"].startswith("100% of its kernel time on 1 block(s) of the GPU's 132 SMs")
    assert prune["rung"] == "library" and "PK307" in prune["action"]
    assert round(prune["expected_op_speedup"], 3) == 91.086
    assert round(prune["expected_end_to_end_speedup"], 3) == 20.327
    # ... and not offered again as an op's action beside the finding that speaks for its kernel
    res = CliRunner().invoke(main, ["classify", "--format", "json", str(TRACE)])
    rules = [a["rule"] for a in json.loads(res.stdout)["run"]["actions"]]
    assert rules[0] == "underfilled-grid" and not [r for r in rules if r.startswith("op:")]


def test_kernel_names_are_shortened_to_their_function():
    assert short("void at::native::<unnamed>::gatherKthValue<float, int, (int)1>(at::cuda::detail::"
                 "TensorInfo<const T1, T2>, T2)") == "gatherKthValue"
    assert short("void (anonymous namespace)::my_kernel<128>(float *)") == "my_kernel"
    assert short("reduce_kernel") == "reduce_kernel"


def test_the_op_tables_fusion_bounds_stop_at_the_calls_longest_kernel():
    """A call of three kernels, one of them 80 us of its 90 us: fusing them leaves at least that
    kernel, on a range replayed from a CUDA graph (launch-bound) as on a memory-bound one."""
    from profkit.judge.advisor import _choose
    from profkit.judge.classify import Source, Verdict
    from profkit.model import BoundClass
    from profkit.read.peaks import Peaks
    peaks = Peaks(gpu="test", memory_bandwidth=4e12, flops={"bf16": 9e14})
    op = {"name": "chain", "distinct_kernels": 3, "kernel_median_ns": 5_000.0, "kernel_longest_ns": 80_000.0}
    for bound, graph in ((BoundClass.LAUNCH, True), (BoundClass.MEMORY, False)):
        verdict = Verdict(bound, "low", Source.TIMELINE, "test")
        rung, action, gain, basis = _choose(op, verdict, None, peaks, "elementwise_kernel", 3.0, 100_000.0,
                                            90_000.0, None, graph)
        assert gain == pytest.approx(100_000.0 / 80_000.0) and "longest kernel" in basis, (bound, basis)


def test_small_grids_are_long_non_library_kernels_on_an_eighth_of_the_sms_or_fewer():
    import pandas as pd
    from profkit.judge import grid
    acts = pd.DataFrame({"kind": ["kernel"] * 5 + ["memcpy"],
                         "start": [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000],
                         "end": [200_000, 1_050_000, 2_300_000, 3_400_000, 4_500_000, 5_900_000],
                         "correlationId": [1, 2, 3, 4, 5, 6],
                         "name": ["gatherKthValue", "gatherKthValue", "my_kernel", "sm90_xmma_gemm", "wide",
                                  "memcpy"]})
    shapes = pd.DataFrame({"start": [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000],
                           "correlationId": [1, 2, 3, 4, 5], "grid": [1, 1, 16, 2, 17], "block": [1024] * 5})
    got = grid.small_grids(acts, shapes, 132)
    # too short (50 us), a library GEMM's choice and 17 blocks (over 132 / 8) are left out
    assert got.to_dict() == {0: 1, 2: 16}
    stats = grid.op_small_grid(acts.index.to_numpy(), acts, got, 132)
    assert stats["small_grid_share"] == 500_000 / 1_450_000 and stats["small_grid_blocks"] == 8
    # spread over the GPU: 200 us x 1/132 under the 5 us floor; 300 us x 16/132
    assert stats["small_grid_full_ns"] == 5_000 + 300_000 * 16 / 132
    assert grid.op_speedup(stats) == 1_450_000 / (1_450_000 - 500_000 + stats["small_grid_full_ns"])
    assert grid.op_small_grid(acts.index.to_numpy()[3:], acts, got, 132) == {}

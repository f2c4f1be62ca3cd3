"""Every committed trace at every level: no evidence above 100% of its roof, end-to-end gains
never above the op's own, and shares of non-overlapping levels summing to at most 100%."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import profkit
from profkit.errors import ProfkitError

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted(p for p in (ROOT / "traces").rglob("*.sqlite"))
PCT_KEYS = ("pct_of_roof", "pct_of_memory_roof", "pct_of_compute_roof")


def _levels():
    for trace in TRACES:
        for by, innermost in (("range", False), ("range", True), ("kernel", False), ("aten", False)):
            yield pytest.param(trace, by, innermost,
                               id=f"{trace.relative_to(ROOT / 'traces')}-{by}{'-inner' if innermost else ''}")


@pytest.fixture(scope="module")
def profiles():
    cache: dict = {}
    def get(path):
        if path not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[path] = profkit.load(path)
        return cache[path]
    return get


@pytest.mark.parametrize("trace,by,innermost", list(_levels()))
def test_no_row_above_a_roof(profiles, trace, by, innermost):
    prof = profiles(trace)
    try:
        df = prof.ops(by=by, innermost=innermost)
    except ProfkitError:
        pytest.skip(f"no {by} level in {trace.name}")
    bad = []
    for name, row in df.iterrows():
        ev = row["evidence"]
        for key in PCT_KEYS:
            v = row["pct_of_roof"] if key == "pct_of_roof" else ev.get(key)
            if v is not None and v == v and v > 1.0:
                bad.append((name[:60], key, v))
        for key in ("ncu_dram_throughput_pct", "ncu_sm_throughput_pct", "gpu_metrics_dram_pct",
                    "gpu_metrics_tensor_active_pct", "gpu_metrics_sm_pct"):
            v = ev.get(key)
            if v is not None and v == v and v > 100.0:
                bad.append((name[:60], key, v))
        if row["expected_end_to_end_speedup"] > row["expected_op_speedup"] + 1e-9:
            bad.append((name[:60], "end-to-end above op speedup", row["expected_end_to_end_speedup"]))
    assert not bad, bad
    # nested NVTX ranges overlap by design; the other levels attribute each activity once
    if not (by == "range" and not innermost):
        assert df["share"].sum() <= 1.0 + 1e-9

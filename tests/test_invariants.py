"""Every committed trace at every level: no evidence above 100% of its roof, end-to-end gains
never above the op's own, and shares of non-overlapping levels summing to at most 100%."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from profkit.errors import ProfkitError
from profkit.read.compressed import find_traces
import shared

ROOT = Path(__file__).resolve().parents[1]
TRACES = find_traces(ROOT / "traces", recursive=True)
PCT_KEYS = ("pct_of_roof", "pct_of_memory_roof", "pct_of_compute_roof")


MEASURED = ROOT / "traces" / "peaks_h200.json"  # measured roofs sit below the datasheet's


def _levels():
    for trace in TRACES:
        for peaks in (None, MEASURED):
            for by, innermost in (("range", False), ("range", True), ("kernel", False),
                                  ("aten", False)):
                yield pytest.param(trace, peaks, by, innermost,
                                   id=f"{trace.relative_to(ROOT / 'traces')}-{by}"
                                      f"{'-inner' if innermost else ''}{'-measured' if peaks else ''}")


@pytest.mark.parametrize("trace,peaks,by,innermost", list(_levels()))
def test_no_row_above_a_roof(trace, peaks, by, innermost):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shared.profile(trace, peaks=peaks)
    try:
        df = shared.ops(trace, by=by, innermost=innermost, peaks=peaks)
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

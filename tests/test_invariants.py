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


def _highest_share(trace, by: str, innermost: bool) -> float:
    """The largest share of a roof any row of the level reaches under the datasheet's roofs."""
    df = shared.ops(trace, by=by, innermost=innermost)
    vals = [v for _, row in df.iterrows() for v in
            (row["pct_of_roof"], row["evidence"].get("pct_of_memory_roof"), row["evidence"].get("pct_of_compute_roof"))
            if v is not None and v == v]
    return max(vals, default=0.0)


def _lowest_roof_ratio() -> float:
    """The measured roofs over the datasheet's, the lowest of them (memory and every precision)."""
    from profkit.read.peaks import resolve_peaks
    gpu = shared.corpus("sync_loop").gpu
    spec, _ = resolve_peaks(gpu, None)
    meas, _ = resolve_peaks(gpu, MEASURED)
    return min([meas.memory_bandwidth / spec.memory_bandwidth]
               + [meas.flops[k] / spec.flops[k] for k in meas.flops if k in spec.flops])


@pytest.mark.parametrize("trace,peaks,by,innermost", list(_levels()))
def test_no_row_above_a_roof(trace, peaks, by, innermost):
    if peaks is not None:
        # Measured roofs sit at 75-87% of the datasheet's: a level whose every row stays below
        # that share of the datasheet roofs stays under the measured ones too (the datasheet's
        # run of the same level checks its gains), and is not judged again.
        try:
            top = _highest_share(trace, by, innermost)
        except ProfkitError:
            pytest.skip(f"no {by} level in {trace.name}")
        ratio = _lowest_roof_ratio()
        if top <= ratio:
            pytest.skip(f"every row at most {top:.0%} of a datasheet roof, under the measured roofs' "
                        f"lowest {ratio:.0%} of them")
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

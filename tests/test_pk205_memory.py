"""PK205's number is the largest merge of micro-batches whose memory fits, where the calibration
run measured it (profkit.run.memory).

A bf16 ResNet accumulating over 4 micro-batches of 32 (accum_resnet_train, an H100): halving was
the number, 2.05x (measured 1.98x), while one batch of 128, priced 4.07x beside it, measured 3.89x
and was the best fix: the rule could not say whether it fit. The calibration run now reads the
allocator at each step's start and the run's peak. The committed capture predates that record:
these tests write chosen figures (not measured ones) into a copy, as a capture holds them.
"""
from __future__ import annotations

import json
from pathlib import Path

import profkit
import shared
from profkit.capture.calibrate import RangeClock
from profkit.run.memory import StepMemory, step_memory

GIB = 2 ** 30
TRACE = shared.CORPUS / "accum_resnet_train.sqlite.xz"


def _with_memory(tmp_path: Path, resident_gib: float, peak_gib: float, device_gib: float = 80) -> Path:
    """A copy of the capture whose calibration run held ``resident_gib`` at each step's start."""
    def edit(cal: dict) -> None:
        for r in cal["ranges"]:
            if r["name"] == "train_step":
                r["mem_bytes"] = int(resident_gib * GIB)
        cal["memory"] = {"peak_bytes": int(peak_gib * GIB), "device_bytes": int(device_gib * GIB)}
    dst = tmp_path / f"m{resident_gib:g}_{peak_gib:g}"
    dst.mkdir()
    return shared.with_meta(TRACE, dst, "calibration", edit)


def _pk205(path):
    p = shared.profile(path) if str(path).endswith(".xz") else profkit.load(path)
    return next(f for f in p.findings() if f.code == "PK205")


def test_the_calibration_clock_reads_the_allocator_where_cuda_runs(monkeypatch):
    import sys
    import types
    held = iter([5 * GIB, 7 * GIB])

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            pass

        def elapsed_time(self, other) -> float:
            return 1.0
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, is_current_stream_capturing=lambda: False, Event=Event,
        memory_allocated=lambda: next(held), max_memory_allocated=lambda: 9 * GIB, synchronize=lambda: None,
        current_device=lambda: 0, get_device_properties=lambda d: types.SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    clock = RangeClock()
    for _ in range(2):
        clock.push("step")
        clock.pop()
    clock.finish()
    d = clock.as_dict("s.py", [], 1, 0)
    assert [r["mem_bytes"] for r in d["ranges"]] == [5 * GIB, 7 * GIB]
    assert d["memory"] == {"peak_bytes": 9 * GIB, "device_bytes": 80 * GIB}


def test_what_a_micro_batch_takes_and_what_fits():
    m = StepMemory(2 * GIB, 6 * GIB, 80 * GIB)
    assert m.step_bytes == 4 * GIB and m.need(4) == 18 * GIB
    assert m.fits(16) and not m.fits(18)      # 66 GiB fits in 90% of 80, 74 does not
    assert step_memory(None, "train_step") is None
    # figures that are not numbers are read as none, never raised on
    run = {"ranges": [{"name": "train_step", "start_ns": i, "end_ns": i + 1, "mem_bytes": GIB} for i in range(5)],
           "memory": {"peak_bytes": "9 GiB", "device_bytes": 80 * GIB}}
    assert step_memory(json.dumps(run), "train_step") is None


def test_without_the_figures_halving_is_the_number():
    f = _pk205(TRACE)
    assert round(f.expected_end_to_end_speedup, 2) == 2.05
    assert "use 2 micro-batches of twice the size" in f.action and "if the activations fit" in f.action


def test_the_largest_merge_that_fits_is_the_number(tmp_path):
    # 2 GiB held at a step's start, 6 at the peak: a micro-batch takes 4; four of them, 18 GiB
    f = _pk205(_with_memory(tmp_path, 2, 6))
    assert round(f.expected_end_to_end_speedup, 2) == 4.07
    assert f.evidence["micro_batch_bytes"] == 4 * GIB
    assert "use one batch of 4 times the size (no accumulation)" in f.action
    assert "2 of 2 times the size: 2.05x" in f.action and "which fits" in f.action


def test_a_merge_that_would_not_fit_is_not_the_number(tmp_path):
    # 10 GiB held, 30 at the peak: twice the size needs 50 GiB (fits), four times 90 (does not)
    f = _pk205(_with_memory(tmp_path, 10, 30))
    assert round(f.expected_end_to_end_speedup, 2) == 2.05
    assert "use 2 micro-batches of twice the size" in f.action and "which fits" in f.action
    # 30 GiB held, 60 at the peak: not even twice the size fits; halving is said, with what it needs
    f = _pk205(_with_memory(tmp_path, 30, 60))
    assert round(f.expected_end_to_end_speedup, 2) == 2.05
    assert "once the activations fit: at twice the size about 90.0 GiB of the GPU's 80 GiB" in f.action

"""A program whose own speed varies: a calibration run slower than the profiled run (which tracing
cannot cause) brings a second calibration run, and the prices are given over both runs' speeds.
Without Nsight or a GPU: the fake nsys of test_capture.py and a synthetic trace."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from profkit.capture import runner as cap
from synth import TID, make_trace
from test_capture import _invoke, _script, tools  # noqa: F401 - the fixture

STEPS = """
import sys, time
import nvtx
for i in range(int(sys.argv[1])):
    with nvtx.annotate("step"):
        time.sleep(0.002)
"""


def _calibration(period_ns: int, n: int = 20) -> str:
    ranges = [{"name": "step", "start_ns": i * period_ns, "end_ns": i * period_ns + period_ns // 2,
               "gpu_ns": None} for i in range(n)]
    return json.dumps({"format": "profkit-calibration/1", "ranges": ranges})


def _profiled(tmp_path: Path, period_ns: int, n: int = 20) -> Path:
    return make_trace(tmp_path / "t.sqlite", strings={1: "k", 3: "step", 9: "cudaLaunchKernel"},
                      kernels=[(i * period_ns + 100, i * period_ns + 200, i + 1, 1) for i in range(n)],
                      runtime=[(i * period_ns + 10, i * period_ns + 50, i + 1) for i in range(n)],
                      nvtx=[(i * period_ns, i * period_ns + period_ns // 2, "step", TID) for i in range(n)])


@pytest.mark.parametrize("calibrated_ms,slower", [(12.0, True), (10.2, False), (7.0, False)])
def test_a_calibration_run_is_slower_only_past_the_slack(tmp_path, calibrated_ms, slower):
    trace = _profiled(tmp_path, 10_000_000)
    got = cap.calibration_slower(_calibration(int(calibrated_ms * 1e6)), trace)
    assert (got is not None) == slower
    if slower:
        assert got == (pytest.approx(12e6), pytest.approx(10e6))


def test_a_host_running_ahead_of_a_gpu_paced_step_is_not_a_faster_profiled_run(tmp_path):
    # ranges 10 ms apart on the host, each iteration's kernel busy 14 ms on the GPU (no sync in
    # the step: the host runs ahead): the profiled run's period is the GPU's, and a calibration
    # run of 14.2 ms an iteration, paced by that GPU, is not slower than it
    period, busy, n = 10_000_000, 14_000_000, 20
    trace = make_trace(tmp_path / "t.sqlite", strings={1: "k", 3: "step", 9: "cudaLaunchKernel"},
                       kernels=[(i * busy + 100, (i + 1) * busy, i + 1, 1) for i in range(n)],
                       runtime=[(i * period + 10, i * period + 50, i + 1) for i in range(n)],
                       nvtx=[(i * period, i * period + period // 2, "step", TID) for i in range(n)])
    assert cap.calibration_slower(_calibration(14_200_000), trace) is None
    # slower than the GPU's period past the slack: slower still
    assert cap.calibration_slower(_calibration(17_000_000), trace) == (pytest.approx(17e6), pytest.approx(14e6, rel=1e-3))


def test_no_verdict_without_iterations_on_either_side(tmp_path):
    trace = _profiled(tmp_path, 10_000_000)
    assert cap.calibration_slower(json.dumps({"ranges": []}), trace) is None
    assert cap.calibration_slower("not json", trace) is None


def test_a_slower_calibration_run_brings_a_second_one(tools, monkeypatch):
    # the fake nsys's trace has 100 ns steps: every run of the script (2 ms a step) is slower
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k(int)", "k", "step"]] * 12))
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["steps.py", "60"])
    assert r.exit_code == 0, r.stderr
    assert "a second calibration run after the profiled one" in r.stderr
    assert "calibration run 2 (no profiler)" in r.stderr
    meta = dict(sqlite3.connect(tools.work / "steps.sqlite").execute("SELECT key, value FROM PROFKIT_META"))
    runs = json.loads(meta["calibration"])["runs"]
    # the first ran the script's 60 steps; the second, short, is cut after SECOND_RUN_ITERATIONS
    assert len(runs) == 2 and len(runs[0]["ranges"]) == 60 and "cut" not in runs[0]
    assert runs[1]["cut"] == {"range": "step", "iterations": cap.SECOND_RUN_ITERATIONS}
    assert len(runs[1]["ranges"]) == cap.SECOND_RUN_ITERATIONS


def test_calibrate_runs_given_is_left_as_asked(tools, monkeypatch):
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k(int)", "k", "step"]] * 12))
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["--calibrate-runs", "2", "steps.py", "10"])
    assert r.exit_code == 0, r.stderr
    assert "calibration run 2 (no profiler)" not in r.stderr
    meta = dict(sqlite3.connect(tools.work / "steps.sqlite").execute("SELECT key, value FROM PROFKIT_META"))
    assert len(json.loads(meta["calibration"])["runs"]) == 2


def test_a_run_cut_while_still_compiling_is_captured_again_longer(tools, monkeypatch):
    # the profiled trace of the first capture says every iteration loaded new GPU code: a warm-up
    # the cut ended inside; the second capture, 4x longer, does not
    answers = iter([True, False])
    monkeypatch.setattr(cap, "ended_in_warm_up", lambda path: next(answers))
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k(int)", "k", "step"]] * 12))
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["--max-iterations", "6", "steps.py", "60"])
    assert r.exit_code == 0, r.stderr
    assert ("profkit: every iteration of the profiled run up to its cut after 6 loaded new GPU code "
            "(a library compiling a kernel per new shape): it ended inside its warm-up; captured "
            "again with --max-iterations 24") in r.stderr
    assert "[again] calibration run (no profiler)" in r.stderr and "[again] nsys profile" in r.stderr
    profiles = [c for c in tools.calls() if c[:2] == ["nsys", "profile"]]
    assert [p[p.index("--max-iterations") + 1] for p in profiles] == ["6", "24"]
    meta = dict(sqlite3.connect(tools.work / "steps.sqlite").execute("SELECT key, value FROM PROFKIT_META"))
    assert meta["max_iterations"] == "24" and meta["profiled_run_cut"] == "cut after 24 step"
    # the calibration kept is the longer runs' alone (the fake trace's 100 ns steps bring a
    # second calibration run, cut as long)
    runs = json.loads(meta["calibration"])["runs"]
    assert [(r["cut"]["iterations"], len(r["ranges"])) for r in runs] == [(24, 24), (24, 24)]


def test_a_script_that_ends_at_the_cut_is_not_profiled_again(tools, monkeypatch):
    # a script of exactly --max-iterations steps that loads code in every one (cuDNN benchmark
    # mode on a new length each batch): run again longer, it still ends after its 6 steps, so
    # the loads are its steady state and the first trace is kept (no second nsys run)
    monkeypatch.setattr(cap, "ended_in_warm_up", lambda path: True)
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k(int)", "k", "step"]] * 12))
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["--max-iterations", "6", "steps.py", "6"])
    assert r.exit_code == 0, r.stderr
    assert ("it ended inside its warm-up; run again without the profiler, the script ended on its "
            "own after 6 iterations: the loads are its steady state, and the first capture is kept") in r.stderr
    assert "[again] calibration run (no profiler)" in r.stderr and "[again] nsys profile" not in r.stderr
    assert len([c for c in tools.calls() if c[:2] == ["nsys", "profile"]]) == 1
    assert (tools.work / "steps.sqlite").exists()


def test_a_run_not_cut_is_not_captured_again(tools, monkeypatch):
    monkeypatch.setattr(cap, "ended_in_warm_up", lambda path: True)
    monkeypatch.setenv("FAKE_KERNELS", json.dumps([["void k(int)", "k", "step"]] * 12))
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["steps.py", "10"])
    assert r.exit_code == 0, r.stderr
    assert "[again]" not in r.stderr
    assert len([c for c in tools.calls() if c[:2] == ["nsys", "profile"]]) == 1


@pytest.mark.parametrize("name,still", [("corpus/beam_search_decode", True), ("corpus/kv_decode_sampling", True),
                                        ("real/train_llama", False), ("corpus/mae_pretrain_train", False)])
def test_a_warm_up_not_over_is_told_by_its_code_loads(name, still):
    # beam search and the KV-cache sampler: a cuDNN attention compiled per new key length, every
    # captured token; the training steps load nothing after their first iteration
    from profkit.read.trace import Trace
    from profkit.run.warmup import loading_iterations, still_loading
    root = Path(__file__).resolve().parents[1]
    t = Trace(root / f"traces/{name}.sqlite.xz")
    loaded, n, last = loading_iterations(t)
    assert still_loading(t) is still and last is still
    assert (loaded == n) if still else loaded == 0

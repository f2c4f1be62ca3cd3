"""`profkit capture --try` and `--max-iterations` without Nsight or a GPU: the fake nsys of
test_capture.py, and a stand-in torch package (no CUDA) that holds what the switches under test
touch, so a trial run costs a Python start-up, not a torch import."""
from __future__ import annotations

import json
import os
import re
import statistics
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profkit.capture import runner as cap
from profkit.run.trials import summarize
from test_capture import ROOT, _invoke, _script, tools  # noqa: F401 - the fixture

FAKE_TORCH = {
    "__init__.py": "from . import backends, cuda\n",
    "backends/__init__.py": "from . import cudnn\n",
    "backends/cudnn.py": "benchmark = False\n",
    "cuda/__init__.py": textwrap.dedent("""
        def is_available():
            return False
        def is_initialized():
            return False
        def empty_cache():
            pass
    """),
}

# 8 ms a step, 2 ms with cuDNN's benchmark mode on; it fails when the allocator is configured
STEPS = """
import os, sys, time
import nvtx
import torch
if "expandable_segments" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
    raise RuntimeError("this program refuses expandable segments")
for i in range(int(sys.argv[1])):
    with nvtx.annotate("step"):
        time.sleep(0.002 if torch.backends.cudnn.benchmark else 0.008)
    torch.cuda.empty_cache()
print("finished", i + 1)
"""


def _default_sigint() -> None:
    # A shell that starts a job in the background sets SIGINT to "ignore", and children inherit
    # it: the Ctrl-C these tests send would then reach nobody.
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def fake_torch(tools, monkeypatch):
    lib = tools.tmp / "lib"
    for rel, text in FAKE_TORCH.items():
        p = lib / "torch" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(lib), str(ROOT)]))
    return lib


def _meta(path: Path) -> dict:
    return dict(sqlite3.connect(path).execute("SELECT key, value FROM PROFKIT_META").fetchall())


def test_try_alternates_trials_and_baselines_and_records_them(tools, fake_torch):
    _script(tools.work / "steps.py", STEPS)
    # (--try-separate: the two switches that could alternate inside their runs are timed in runs of
    # their own, as the other two are; test_a_trial_that_can_be_turned_off_alternates... has them alternate)
    r = _invoke(["--max-iterations", "12", "--try-separate", "--try",
                 "cudnn_benchmark,no_empty_cache,workers,expandable_segments", "steps.py", "100"])
    assert r.exit_code == 0, r.stderr
    err = r.stderr
    # the order: calibration (B), the profiled run, then T1 T2 B T3 T4, and T1 B T2 again (a run
    # unchanged amid each round's trials: a capture cut late keeps one beside them); the trial
    # that did not apply and the one that failed are not run a second time
    labels = [ln.split("] ", 1)[1].split(":", 1)[0] for ln in err.splitlines()
              if ln.startswith("profkit: [trial ")]
    assert labels == [
        "--try cudnn_benchmark (round 1 of 2, no profiler)", "--try no_empty_cache (round 1 of 2, no profiler)",
        "baseline (round 1 of 2, no profiler)",
        "--try workers (round 1 of 2, no profiler)", "--try expandable_segments (round 1 of 2, no profiler)",
        "--try cudnn_benchmark (round 2 of 2, no profiler)", "baseline (round 2 of 2, no profiler)",
        "--try no_empty_cache (round 2 of 2, no profiler)"]
    assert "with its side effects" in err
    # every run was cut after 12 iterations: the profiled one too
    (prof,) = [c for c in tools.calls() if c[:2] == ["nsys", "profile"]]
    i = prof.index("--max-iterations")
    assert prof[i:i + 4] == ["--max-iterations", "12", "--step", "step"]
    meta = _meta(tools.work / "steps.sqlite")
    assert meta["max_iterations"] == "12" and meta["profiled_run_cut"] == "cut after 12 step"
    cal = json.loads(meta["calibration"])
    assert cal["cut"] == {"range": "step", "iterations": 12} and len(cal["ranges"]) == 12
    rec = json.loads(meta["trials"])
    assert (rec["format"], rec["step_range"], rec["max_iterations"], rec["runs_per_trial"]) == \
        ("profkit-trials/1", "step", 12, 2)
    assert [b["seq"] for b in rec["baseline"]["runs"]] == [0, 3, 7]
    assert all(len(b["iteration_ns"]) == 11 for b in rec["baseline"]["runs"])  # 12 starts
    by = {t["switch"]: t for t in rec["trials"]}
    assert [r["seq"] for r in by["cudnn_benchmark"]["runs"]] == [1, 6]
    assert [r["seq"] for r in by["no_empty_cache"]["runs"]] == [2, 8]
    assert by["cudnn_benchmark"]["applied"] and by["cudnn_benchmark"]["error"] is None
    # the run ends as the 12th step closes, before that step's empty_cache()
    assert by["no_empty_cache"]["note"] == "torch.cuda.empty_cache() skipped x11"
    assert not by["workers"]["applied"] and [r["seq"] for r in by["workers"]["runs"]] == [4]
    assert by["workers"]["note"].startswith("could not be applied (AttributeError: ")
    assert by["expandable_segments"]["error"] == "RuntimeError: this program refuses expandable segments"
    assert all(r["seconds"] > 0 for t in rec["trials"] for r in t["runs"])
    # the speedup: the baseline runs' median iteration over the trial runs' (the run of the
    # workers trial, which did not apply, is the program unchanged: a baseline run too); the
    # spread pairs each trial run with the baseline run made nearest to it (seq 1 with 0, seq 6 with 7)
    res = {t.switch: t for t in summarize(meta["trials"])}
    bench = res["cudnn_benchmark"]
    base = {b["seq"]: statistics.median(b["iteration_ns"][3:])
            for b in rec["baseline"]["runs"] + by["workers"]["runs"]}
    assert sorted(base) == [0, 3, 4, 7]
    mine = {r["seq"]: statistics.median(r["iteration_ns"][3:]) for r in by["cudnn_benchmark"]["runs"]}
    assert bench.runs == 2 and bench.measured
    assert bench.speedup == pytest.approx(statistics.median(base.values()) / statistics.median(mine.values()))
    pairs = [base[0] / mine[1], base[7] / mine[6], bench.speedup]   # widened to hold the speedup
    assert (bench.lo, bench.hi) == pytest.approx((min(pairs), max(pairs)))
    assert bench.speedup > 1.3   # 8 ms of sleep a step against 2: faster whatever the machine's load
    assert res["no_empty_cache"].measured and res["no_empty_cache"].runs == 2
    assert not res["workers"].measured and res["workers"].text().startswith("not applied (could not")
    assert res["expandable_segments"].error and not res["expandable_segments"].measured
    assert f"tried cudnn_benchmark: {bench.text()}" in err
    assert "tried expandable_segments: failed (RuntimeError: this program refuses expandable segments)" in err
    assert "--try=cudnn_benchmark,no_empty_cache,workers,expandable_segments" in meta["command"]
    assert "--try-separate" in meta["command"]


def test_a_trial_that_can_be_turned_off_alternates_with_the_program_in_its_run(tools, fake_torch):
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["--max-iterations", "12", "--try", "cudnn_benchmark,workers", "steps.py", "100"])
    assert r.exit_code == 0, r.stderr
    rec = json.loads(_meta(tools.work / "steps.sqlite")["trials"])
    by = {t["switch"]: t for t in rec["trials"]}
    runs = by["cudnn_benchmark"]["runs"]
    assert len(runs) == 2 and "alternation" not in by["workers"]["runs"][0]
    for run in runs:
        alt = run["alternation"]
        # 24 iterations (twice the trials' 12: half of them the program unchanged) in blocks of
        # 24 // 12 = 2, at least 3; the block open when the run was cut is left out
        assert alt["k"] == 3 and alt["warm_blocks"] == 2 and len(run["iteration_ns"]) == 23
        assert [b["on"] for b in alt["blocks"]] == [True, False] * 3 + [True]
        assert all(b["iterations"] == 3 for b in alt["blocks"])
        per = [b["ns"] / 3 for b in alt["blocks"]]
        assert all(p_on < p_off for p_on, p_off in zip(per[0::2], per[1::2]))   # 2 ms of sleep against 8
    res = {t.switch: t for t in summarize(_meta(tools.work / "steps.sqlite")["trials"])}
    bench = res["cudnn_benchmark"]
    # past the two warm-up blocks: on, off, on, off, on: three blocks on, each beside blocks off
    assert bench.measured and bench.runs == 2 and bench.alternated == 6 and bench.speedup > 1.5
    assert bench.lo <= bench.speedup <= bench.hi
    assert bench.text().endswith("; 6 blocks, each beside the program unchanged in the same run)")
    assert "--try cudnn_benchmark (round 1 of 2, no profiler): alternated with the program unchanged " \
           "in 7 blocks: " in r.stderr


def test_alternated_gain_pairs_each_block_on_with_the_blocks_off_beside_it():
    from profkit.run.trials import alternated_gain
    ms = 1_000_000
    # warm-up (a compile: 5 s in the first block), then a machine slowing by 10% a block: the
    # mean of the blocks off on either side cancels the drift a block before or after would carry
    times = [5000, 12, 5, 11, 5.5, 12.1, 6.05, 13.31]   # ms an iteration
    blocks = [{"on": i % 2 == 0, "iterations": 4, "ns": int(t * ms * 4)} for i, t in enumerate(times)]
    g = alternated_gain({"alternation": {"k": 4, "warm_blocks": 2, "blocks": blocks}})
    # blocks past the warm-up: on 5, off 11, on 5.5, off 12.1, on 6.05, off 13.31
    assert g["ratios"] == pytest.approx([11 / 5, (11 + 12.1) / 2 / 5.5, (12.1 + 13.31) / 2 / 6.05])
    assert g["speedup"] == pytest.approx((11 + 12.1) / 2 / 5.5)
    assert g["on_ns"] == pytest.approx(5.5 * ms) and g["off_ns"] == pytest.approx(12.1 * ms)
    assert g["warm_up_s"] == pytest.approx((5000 - 5.5) * 4 / 1000 + 0)   # the off warm-up block is steady
    # too few blocks past the warm-up to pair, or none recorded: no gain
    assert alternated_gain({"alternation": {"k": 4, "warm_blocks": 2, "blocks": blocks[:3]}}) is None
    assert alternated_gain({"iteration_ns": [1, 2, 3]}) is None


def test_an_alternated_switch_the_script_sets_back_every_step_did_not_apply(tmp_path):
    # A script that sets its own matmul precision at each step (as a program whose variants share a
    # process does): the trial's TF32 is undone before every block it was on for, so its gain is
    # the program's against itself; re-installed at the run's end, the setting would look held.
    pytest.importorskip("torch")
    script = """
        import sys, time
        import torch, nvtx
        for i in range(14):
            with nvtx.annotate("step"):
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.randn(4, 4) @ torch.randn(4, 4)
                time.sleep(0.02)
    """
    res = _bootstrap(tmp_path, "--try", "tf32", "--alternate", "3", "--step", "step",
                     "--calibrate", str(tmp_path / "c.json"), script=script)
    assert res.returncode == 0, res.stderr
    trial = json.loads((tmp_path / "c.json").read_text())["trial"]
    assert not trial["applied"]
    assert "the script set the matmul precision back to \"highest\" while it ran" in trial["note"]
    # set back once, before the loop: the blocks after the first had TF32 on, the trial applied
    once = """
        import sys, time
        import torch, nvtx
        torch.backends.cuda.matmul.allow_tf32 = False
        for i in range(14):
            with nvtx.annotate("step"):
                torch.randn(4, 4) @ torch.randn(4, 4)
                time.sleep(0.02)
    """
    res = _bootstrap(tmp_path, "--try", "tf32", "--alternate", "3", "--step", "step",
                     "--calibrate", str(tmp_path / "d.json"), script=once)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "d.json").read_text())["trial"]["applied"]


def test_alternate_in_the_bootstrap_turns_the_switches_over_between_iterations(tmp_path):
    pytest.importorskip("torch")
    script = """
        import json, sys, time
        import torch, nvtx
        seen = []
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
            def forward(self, x):
                seen.append([torch.is_autocast_enabled("cpu"), torch.get_float32_matmul_precision()])
                return self.lin(x)
        m = M()
        for i in range(14):
            with nvtx.annotate("step"):
                m(torch.randn(2, 4))
                time.sleep(0.02)
        json.dump(seen, open(sys.argv[1], "w"))
    """
    res = _bootstrap(tmp_path, "--try", "tf32+bf16", "--alternate", "3", "--step", "step",
                     "--calibrate", str(tmp_path / "c.json"), script=script, args=[str(tmp_path / "seen.json")])
    assert res.returncode == 0, res.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    on, off = [True, "high"], [False, "highest"]
    # blocks of 3 iterations (each 20 ms: past the 50 ms a block of an uncut run also takes)
    assert seen == [on] * 3 + [off] * 3 + [on] * 3 + [off] * 3 + [on] * 2
    cal = json.loads((tmp_path / "c.json").read_text())
    assert [(b["on"], b["iterations"]) for b in cal["alternation"]["blocks"]] == \
        [(True, 3), (False, 3), (True, 3), (False, 3)]
    assert cal["trial"]["applied"] and cal["alternation"]["k"] == 3
    # a switch that cannot be turned off while the program runs: the run is the trial alone
    res = _bootstrap(tmp_path, "--try", "channels_last", "--alternate", "3", "--step", "step",
                     "--calibrate", str(tmp_path / "d.json"), script=script, args=[str(tmp_path / "s2.json")])
    assert res.returncode == 0 and "alternation" not in json.loads((tmp_path / "d.json").read_text())
    # a fused optimizer turned back to the program's foreach one every 3 iterations, as it steps
    fused = """
        import json, sys, time
        import torch, nvtx
        m = torch.nn.Linear(4, 4)
        opt = torch.optim.Adam(m.parameters(), lr=0.1, foreach=True)
        seen = []
        for i in range(14):
            with nvtx.annotate("step"):
                m(torch.randn(2, 4)).sum().backward()
                opt.step()
                g = opt.param_groups[0]
                seen.append([g["fused"], g["foreach"], float(opt.state[m.weight]["step"])])
                time.sleep(0.02)
        json.dump(seen, open(sys.argv[1], "w"))
    """
    res = _bootstrap(tmp_path, "--try", "fused_optim", "--alternate", "3", "--step", "step",
                     "--calibrate", str(tmp_path / "f.json"), script=fused, args=[str(tmp_path / "s3.json")])
    assert res.returncode == 0, res.stderr
    seen = json.loads((tmp_path / "s3.json").read_text())
    assert [s[:2] for s in seen] == [[True, None]] * 3 + [[None, True]] * 3 + [[True, None]] * 3 + \
        [[None, True]] * 3 + [[True, None]] * 2
    assert [s[2] for s in seen] == list(range(1, 15))  # one Adam, counting on through the turns
    cal = json.loads((tmp_path / "f.json").read_text())
    assert len(cal["alternation"]["blocks"]) == 4 and cal["trial"]["applied"]


def test_try_refuses_what_cannot_run(tools, fake_torch):
    _script(tools.work / "steps.py", STEPS)
    for args, msg in ((["--try", "tf33", "steps.py"], "profkit: error: --try: unknown switch 'tf33'"),
                      (["--try", "tf32", "--no-calibrate", "steps.py"],
                       "profkit: error: --try times each trial against the calibration run"),
                      (["--max-iterations", "3", "steps.py"],
                       "profkit: error: --max-iterations must be at least 5, not 3")):
        r = _invoke(args)
        assert r.exit_code == 2 and r.stderr.startswith(msg), r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tools.work / "steps.sqlite").exists()


def test_try_without_a_value_before_the_script_means_auto(tools, fake_torch, monkeypatch):
    _script(tools.work / "steps.py", STEPS)
    chosen = []
    monkeypatch.setattr("profkit.cli.capture._auto_trials", lambda trace: chosen.append(trace) or ["cudnn_benchmark"])
    r = _invoke(["--max-iterations", "8", "--try-runs", "1", "--try", "steps.py", "60"])
    assert r.exit_code == 0, r.stderr
    assert len(chosen) == 1 and chosen[0].name.endswith(".sqlite")  # the profiled trace, before rename
    assert "profkit: --try auto: cudnn_benchmark (from the rules that fired)" in r.stderr
    rec = json.loads(_meta(tools.work / "steps.sqlite")["trials"])
    assert [t["switch"] for t in rec["trials"]] == ["cudnn_benchmark"] and rec["runs_per_trial"] == 1
    assert [b["seq"] for b in rec["baseline"]["runs"]] == [0, 2]


def test_auto_with_nothing_to_try_keeps_the_trace(tools, fake_torch, monkeypatch):
    _script(tools.work / "steps.py", STEPS)
    monkeypatch.setattr("profkit.cli.capture._auto_trials", lambda trace: [])
    r = _invoke(["--try", "--max-iterations", "6", "steps.py", "20"])
    assert r.exit_code == 0, r.stderr
    assert "--try auto: no rule that a switch can try fired on this trace" in r.stderr
    assert "trials" not in _meta(tools.work / "steps.sqlite")


def test_a_trial_that_runs_too_long_is_stopped(tools, fake_torch):
    _script(tools.work / "slow.py", """
        import os, sys, time
        import nvtx
        import torch
        for i in range(int(sys.argv[1])):
            with nvtx.annotate("step"):
                time.sleep(0.002)
            if torch.backends.cudnn.benchmark:
                time.sleep(60)
    """)
    r = _invoke(["--try", "cudnn_benchmark", "--try-runs", "1", "--try-timeout", "3", "slow.py", "10"])
    assert r.exit_code == 0, r.stderr
    rec = json.loads(_meta(tools.work / "slow.sqlite")["trials"])
    assert rec["trials"][0]["error"] == "timed out after 3 s (--try-timeout)"


def test_try_budget_starts_no_trial_once_spent(tools, fake_torch):
    """--try-budget: the first trial runs (nothing was spent before it), then the budget is spent,
    so the second never starts; the baseline closes the round, and no second round runs. The
    record and classify's trial line say why the second has no time."""
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["--max-iterations", "8", "--try", "cudnn_benchmark,no_empty_cache",
                 "--try-budget", "0.001", "steps.py", "100"])
    assert r.exit_code == 0, r.stderr
    labels = [ln.split("] ", 1)[1].split(":", 1)[0] for ln in r.stderr.splitlines()
              if ln.startswith("profkit: [trial ")]
    assert labels == ["--try cudnn_benchmark (round 1 of 2, no profiler)", "baseline (round 1 of 2, no profiler)"]
    # the cost said before the trials: up to 2 x (2 trials + the baseline) runs, at the
    # calibration run's length, and the budget beside it
    (cost,) = [ln for ln in r.stderr.splitlines() if ln.startswith("profkit: --try: the script runs again")]
    assert re.search(r": up to 6 runs \(2 trials and the script unchanged, 2 rounds\), about \d+ s at the "
                     r"calibration run's \d+\.\d s a run; --try-budget 0.001 s; cudnn_benchmark, "
                     r"no_empty_cache alternate with the script unchanged inside each run, twice the "
                     r"iterations$", cost), cost
    (said,) = [ln for ln in r.stderr.splitlines() if ln.startswith("profkit: --try-budget: ")]
    assert said.startswith("profkit: --try-budget: 0.001 s spent after ")
    assert said.endswith(" s of trials; not run: no_empty_cache; not run again: cudnn_benchmark")
    meta = _meta(tools.work / "steps.sqlite")
    assert "--try-budget 0.001" in meta["command"]
    rec = json.loads(meta["trials"])
    assert (rec["budget_s"], rec["budget_spent"]) == (0.001, True)
    by = {t.switch: t for t in summarize(meta["trials"])}
    assert by["cudnn_benchmark"].measured and by["cudnn_benchmark"].runs == 1
    assert by["no_empty_cache"].text() == "not run (the --try-budget of 0.001 s was spent before it)"
    # a budget the trials stay within changes nothing but the record
    _script(tools.work / "quick.py", STEPS)
    r = _invoke(["--max-iterations", "8", "--try", "cudnn_benchmark", "--try-runs", "1",
                 "--try-budget", "600", "quick.py", "100"])
    assert r.exit_code == 0 and "--try-budget:" not in r.stderr, r.stderr
    rec = json.loads(_meta(tools.work / "quick.sqlite")["trials"])
    assert (rec["budget_s"], rec["budget_spent"]) == (600, False)


@pytest.mark.parametrize("value", ["0", "-5"])
def test_try_budget_must_be_positive(tools, fake_torch, value):
    _script(tools.work / "steps.py", STEPS)
    r = _invoke(["--try", "tf32", "--try-budget", value, "steps.py", "10"])
    assert r.exit_code == 2 and r.stderr == f"profkit: error: --try-budget must be more than 0 seconds, not {value}\n"
    assert not tools.calls()


# -- the bootstrap alone ----------------------------------------------------------------------
def _bootstrap(tmp: Path, *flags: str, script: str, args=(), env=None):
    s = tmp / "s.py"
    s.write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, "-m", "profkit.capture.bootstrap", *flags, "--", str(s), *args],
                          capture_output=True, text=True, cwd=tmp,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


NESTED = """
import sys, nvtx
nvtx.push_range("setup"); nvtx.pop_range()
try:
    for i in range(50):
        with nvtx.annotate("step"):
            with nvtx.annotate("inner"):
                pass
finally:
    print("cleanup ran", i)
print("never reached")
"""


def test_max_iterations_ends_the_run_cleanly_after_the_nth_step(tmp_path):
    res = _bootstrap(tmp_path, "--calibrate", str(tmp_path / "c.json"), "--max-iterations", "7",
                     "--exit-code-file", str(tmp_path / "code"), script=NESTED)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "cleanup ran 6\n"   # the script's finally ran; nothing after it
    assert res.stderr == "profkit: stopped the script after 7 iterations of `step` (--max-iterations)\n"
    cal = json.loads((tmp_path / "c.json").read_text())
    assert [r["name"] for r in cal["ranges"]] == ["setup"] + ["step"] * 7
    assert cal["cut"] == {"range": "step", "iterations": 7} and cal["exit_code"] == 0
    # each step's nested range timed on the host (profkit.run.step.inner); the setup opened none
    assert [sorted(r.get("inner_ns", {})) for r in cal["ranges"]] == [[]] + [["inner"]] * 7
    assert (tmp_path / "code").read_text() == "0\ncut after 7 step"
    assert cap._read_exit_code(tmp_path / "code") == 0 and cap._read_cut(tmp_path / "code") == "cut after 7 step"


def test_max_iterations_with_a_named_step_and_no_timing(tmp_path):
    # --step counts that range only; without --calibrate (the profiled run) nothing is written
    res = _bootstrap(tmp_path, "--max-iterations", "5", "--step", "setup", script=NESTED)
    assert res.returncode == 0 and "cleanup ran 49" in res.stdout and "never reached" in res.stdout
    res = _bootstrap(tmp_path, "--max-iterations", "5", "--step", "step", script=NESTED)
    assert res.returncode == 0 and res.stdout == "cleanup ran 4\n"


def test_try_in_the_bootstrap_records_the_trial(tmp_path):
    pytest.importorskip("torch")
    script = """
        import torch, nvtx
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
        for i in range(20):
            with nvtx.annotate("step"):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
    """
    res = _bootstrap(tmp_path, "--try", "fused_optim", "--calibrate", str(tmp_path / "c.json"),
                     "--max-iterations", "6", script=script)
    assert res.returncode == 0, res.stderr
    cal = json.loads((tmp_path / "c.json").read_text())
    assert cal["trial"] == {"switch": "fused_optim", "applied": True,
                            "note": "SGD(fused=True) x1, an explicit foreach dropped x1"}
    assert cal["cut"]["iterations"] == 6 and "error" not in cal
    # without --calibrate the trial is said on stderr; an exception is the run's error
    res = _bootstrap(tmp_path, "--try", "bf16", script="import torch\ntorch.nn.Linear(2, 2)(torch.ones(1, 2))\n")
    assert res.returncode == 0 and res.stderr.endswith(
        "profkit: --try bf16: applied (autocast bf16 around module Linear (6 params))\n")
    res = _bootstrap(tmp_path, "--try", "tf32", "--calibrate", str(tmp_path / "e.json"),
                     script="import torch\nraise MemoryError('out of memory\\nmore')\n")
    assert res.returncode == 1
    assert json.loads((tmp_path / "e.json").read_text())["error"] == "MemoryError: out of memory"
    # the switches go in when the script imports torch, never before: its start-up is its own
    res = _bootstrap(tmp_path, "--try", "tf32", "--calibrate", str(tmp_path / "n.json"),
                     script="import sys\nprint('torch' in sys.modules)\n")
    assert res.returncode == 0 and res.stdout == "False\n"
    assert json.loads((tmp_path / "n.json").read_text())["trial"] == {
        "switch": "tf32", "applied": False, "note": "the script never imported torch"}
    res = _bootstrap(tmp_path, "--try", "tf33", script="pass\n")
    assert res.returncode == 2 and res.stderr.startswith("profkit: error: --try: unknown switch 'tf33'")
    # a compile of one of the program's two modules says which it left eager, in the record
    # that the trials' record keeps (left_out): the trial measured part of the fix
    two = """
        import torch, nvtx
        enc, dec = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
        for i in range(8):
            with nvtx.annotate("step"):
                dec(enc(torch.randn(4, 8)))
    """
    res = _bootstrap(tmp_path, "--try", "compile", "--calibrate", str(tmp_path / "t.json"), script=two,
                     env={"PROFKIT_TRY_COMPILE_BACKEND": "eager"})
    assert res.returncode == 0, res.stderr
    trial = json.loads((tmp_path / "t.json").read_text())["trial"]
    assert trial["left_out"] == "the program's other module Linear (18 params), not compiled"
    assert trial["note"] == ("torch.compile (backend eager) of module Linear (72 params); "
                             "the program's other module Linear (18 params), not compiled")


def test_ctrl_c_in_a_trial_keeps_the_trace(tools, fake_torch):
    """Ctrl-C while a trial runs: the trial's processes are stopped, the trials end there, and the
    trace is written with what they measured (interrupted: true)."""
    import signal
    import time
    _script(tools.work / "slow.py", """
        import sys, time
        import nvtx
        import torch
        for i in range(int(sys.argv[1])):
            with nvtx.annotate("step"):
                time.sleep(0.002)
            if torch.backends.cudnn.benchmark:
                print("trial running", flush=True)
                time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake_torch), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "capture", "--try", "cudnn_benchmark",
                             "slow.py", "10"], cwd=tools.work, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            if line.startswith("profkit: [2/2] nsys profile: finished"):
                break
        time.sleep(1.5)   # the trial is in its sleep now
        os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(err) + rest
    assert "--try cudnn_benchmark (round 1 of 2, no profiler): interrupted; the trials stop here" in text
    assert proc.returncode == 0, text
    rec = json.loads(_meta(tools.work / "slow.sqlite")["trials"])
    assert rec["interrupted"] is True and rec["trials"][0]["runs"] == []
    assert f"profkit: interrupted: {tools.work / 'slow.sqlite'} holds what ran until then" in text


def test_a_cut_run_waits_for_the_gpu_work_it_queued(monkeypatch):
    """A GPU-bound loop runs iterations ahead of its GPU: the cut waits for them before the script
    ends, so the profiled trace holds their kernels (a GNN step 57 ms on the GPU, 4 ms on the CPU,
    lost 13 iterations' kernels when its run was cut without waiting)."""
    import types

    from profkit.capture.calibrate import RangeClock
    calls = []
    cuda = types.SimpleNamespace(is_initialized=lambda: True, synchronize=lambda: calls.append("sync"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    clock = RangeClock(max_iterations=2, step="step", events=False)
    for i in range(2):
        clock.push("step")
        clock.pop()
        if i == 0:
            clock.stop_if_cut()   # not cut yet: no wait
            assert calls == []
    with pytest.raises(SystemExit):
        clock.stop_if_cut()
    assert calls == ["sync"]
    # a script that never initialised CUDA is not made to
    calls.clear()
    cuda.is_initialized = lambda: False
    with pytest.raises(SystemExit):
        clock.stop_if_cut()
    assert calls == []


def test_a_trial_whose_iterations_do_other_work_is_said_and_not_ranked(tmp_path):
    """An LBFGS step under bf16 stopped after a few of its 20 evaluations, each a nested range, and
    its trial read 4.43x. The calibration files count each iteration's nested ranges (``inner``);
    a trial whose iterations open more than 10% more or fewer than the program's unchanged did
    other work: its gain is said with that, and not ranked (``measured`` False)."""
    res = _bootstrap(tmp_path, "--calibrate", str(tmp_path / "c.json"), "--max-iterations", "7", script=NESTED)
    assert res.returncode == 0
    steps = [r for r in json.loads((tmp_path / "c.json").read_text())["ranges"] if r["name"] == "step"]
    assert [r["inner"] for r in steps] == [1] * 7 and "inner" not in \
        json.loads((tmp_path / "c.json").read_text())["ranges"][0]   # setup opened none
    ms = 1_000_000

    def run(seq, inner, ns=10 * ms, n=12):
        return {"seq": seq, "iteration_ns": [ns] * n, "seconds": 1.0, "exit_code": 0, "inner": [inner] * (n + 1)}
    rec = {"format": "profkit-trials/1", "step_range": "step", "max_iterations": 13, "runs_per_trial": 1,
           "interrupted": False, "baseline": {"runs": [run(0, 20), run(3, 20)]},
           "trials": [{"switch": "bf16", "applied": True, "note": "", "error": None, "runs": [run(1, 3, 2 * ms)]},
                      {"switch": "tf32", "applied": True, "note": "", "error": None, "runs": [run(2, 19, 8 * ms)]}]}
    res = {t.switch: t for t in summarize(json.dumps(rec))}
    assert res["bf16"].speedup == pytest.approx(5.0) and res["bf16"].work == (3.0, 20.0)
    assert not res["bf16"].measured and res["bf16"].as_dict()["work_changed"] == {"trial": 3.0, "baseline": 20.0}
    assert res["bf16"].text().endswith("; not the switch's speed alone: its iterations opened 3 nested ranges, "
                                       "the program's unchanged 20 (the switch changed an iteration's work), "
                                       "not ranked)")
    assert res["tf32"].measured and res["tf32"].work is None   # 19 against 20: within 10%
    # an alternated run compares its own blocks on and off
    blocks = [{"on": i % 2 == 0, "iterations": 3, "ns": (6 if i % 2 == 0 else 30) * ms} for i in range(6)]
    inner = [c for b in blocks for c in [3 if b["on"] else 20] * 3]
    rec["trials"] = [{"switch": "bf16", "applied": True, "note": "", "error": None,
                      "runs": [{**run(1, 0, n=17), "inner": inner,
                                "alternation": {"k": 3, "warm_blocks": 2, "blocks": blocks}}]}]
    (alt,) = summarize(json.dumps(rec))
    assert alt.alternated == 2 and alt.work == (3.0, 20.0) and not alt.measured

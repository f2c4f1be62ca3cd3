"""A program whose own speed varies between its runs without the profiler gets its prices over
every run's speed (Profile.calibration_ranges), not one price from a run that may not be typical,
nor a discarded calibration."""
from __future__ import annotations

import json
import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

import profkit
from profkit.show.render import run_lines

ROOT = Path(__file__).resolve().parents[1]
LSTM = ROOT / "traces" / "corpus" / "lstm_cell_loop.sqlite.xz"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """lstm_cell_loop with a second calibration run 40% slower than its own (a copy: the committed
    trace is never written)."""
    path = tmp_path_factory.mktemp("cal") / "lstm_two_runs.sqlite"
    with lzma.open(LSTM) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(path)
    first = json.loads(con.execute("SELECT value FROM PROFKIT_META WHERE key = 'calibration'").fetchone()[0])
    slow = json.loads(json.dumps(first))
    for r in slow["ranges"]:
        for k in ("start_ns", "end_ns", "gpu_ns"):
            if isinstance(r.get(k), (int, float)):
                r[k] = int(r[k] * 1.4)
    with con:
        con.execute("UPDATE PROFKIT_META SET value = ? WHERE key = 'calibration'",
                    (json.dumps({"runs": [first, slow]}),))
    con.close()
    return path


def test_runs_that_disagree_price_every_action_over_both_speeds(two_runs):
    prof = profkit.load(two_runs)
    cal = prof.step_model().calibration
    assert cal.source == "measured" and cal.unstable and len(cal.run_medians) == 2
    assert cal.run_medians[1] == pytest.approx(1.4 * cal.run_medians[0], rel=0.02)
    run = prof.run_json()
    top = run["actions"][0]
    r = top["range"]
    assert r["runs"] == 2 and not r["estimate"]
    # the main price sits inside the range, and a slower CPU gains more from removing launches
    assert r["lo"] <= top["expected_end_to_end_speedup"] <= r["hi"] and r["hi"] > 1.1 * r["lo"]
    text = " ".join(" ".join(run_lines(run)).split())
    assert f"{r['lo']:.2f}-{r['hi']:.2f}x at the speeds of the 2 runs without the profiler" in text
    assert run["calibration"]["unstable"] and len(run["calibration"]["run_medians_ns"]) == 2


def test_a_refused_calibration_still_prices_at_its_run(tmp_path):
    # EfficientNet-B0 at batch 4: its calibration run took longer than the profiled run
    prof = profkit.load(ROOT / "traces" / "corpus" / "efficientnet_b0_b4_infer.sqlite.xz")
    cal = prof.step_model().calibration
    assert cal.source == "estimated" and cal.unstable
    top = prof.run_json()["actions"][0]
    assert top["range"]["estimate"] and top["range"]["runs"] == 1
    assert top["range"]["lo"] <= top["expected_end_to_end_speedup"] <= top["range"]["hi"]


def test_runs_that_agree_give_one_price():
    prof = profkit.load(LSTM)
    assert not prof.step_model().calibration.unstable
    assert prof.calibration_ranges() == {}
    assert all("range" not in a for a in prof.run_json()["actions"])

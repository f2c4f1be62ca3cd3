"""scripts/gpu/firstsight.sh, the first-sight driver, on a machine where no capture can run (nsys
made unfindable): it goes through its programs one at a time within its budget, skips what the
budget leaves no room for, and packs what there is after each program."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("split") is None, reason="needs bash and split")
def test_each_program_is_tried_in_turn_skipped_when_the_budget_is_spent_and_packed(tmp_path):
    env = dict(os.environ, PROFKIT_NSYS=str(tmp_path / "no-nsys"), FIRSTSIGHT_PACK=str(tmp_path / "fs.tar"),
               FIRSTSIGHT_MIN_LEFT="25",
               # the script's python3 is this one (profkit and its dependencies importable)
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    names = ["recsys_embbag_train", "gnn_scatter_train"]
    r = subprocess.run(["bash", "scripts/gpu/firstsight.sh", str(tmp_path / "out"), "90", *names],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"== programs: {' '.join(names)}" in out
    # the first capture fails at once (no nsys: its one-line error is shown) and leaves time for the second
    assert "recsys_embbag_train failed: profkit: error: PROFKIT_NSYS=" in out
    assert "== gnn_scatter_train at" in out and "firstsight: done in" in out
    # nothing captured: no timing of it was started (a program with no capture cannot be scored),
    # no trace to bring
    assert "recsys_embbag_train: no capture, fixes not timed" in out
    assert "interleave" not in out and not list((tmp_path / "out" / "bring").iterdir())
    with tarfile.open(tmp_path / "fs.tar.00") as t:
        got = set(t.getnames())
    assert {"logs/recsys_embbag_train.log", "logs/gnn_scatter_train.log"} <= got
    # a budget below FIRSTSIGHT_MIN_LEFT starts nothing
    r = subprocess.run(["bash", "scripts/gpu/firstsight.sh", str(tmp_path / "out2"), "10", names[0]],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    # (10 s, or 9 when the machine is slow to start the script)
    assert r.returncode == 0 and re.search(r"== recsys_embbag_train: skipped \((10|9)s left\)", r.stdout)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_timing_cap_that_leaves_no_time_to_time_is_refused(tmp_path):
    # FIRSTSIGHT_TIMING_MAX=40 once let every program be captured and none of its fixes timed
    # (the timing needs more than 45 s): said at once, nothing started.
    env = dict(os.environ, FIRSTSIGHT_TIMING_MAX="40")
    r = subprocess.run(["bash", "scripts/gpu/firstsight.sh", str(tmp_path / "out"), "500", "recsys_embbag_train"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout.strip() == ("firstsight: FIRSTSIGHT_TIMING_MAX=40 leaves no time to time a program's "
                                "fixes: give more than 45 (seconds)")
    assert not (tmp_path / "out").exists()

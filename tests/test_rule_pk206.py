"""PK206 unstepped-backward on distill_teacher_train's capture: a BERT-base teacher in eval mode,
never frozen nor run under no_grad, beside a 6-layer student."""
from __future__ import annotations

import json
import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

import profkit
import shared
from profkit.show.render import run_lines

ROOT = Path(__file__).resolve().parents[1]
TRACE = "traces/corpus/distill_teacher_train.sqlite.xz"


def _with_record(tmp_path: Path, **keys) -> Path:
    """The capture with its op record's ``keys`` replaced."""
    dst = tmp_path / "distill.sqlite"
    with lzma.open(ROOT / TRACE) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out)
    con = sqlite3.connect(dst)
    with con:
        meta = json.loads(con.execute("SELECT value FROM PROFKIT_META WHERE key = 'replacements'").fetchone()[0])
        meta["record"].update(keys)
        con.execute("UPDATE PROFKIT_META SET value = ? WHERE key = 'replacements'", (json.dumps(meta),))
    con.close()
    return dst


def test_pk206_prices_the_teachers_backward_by_its_share_of_the_parameters():
    """109.2M unstepped parameters beside the student's 66.7M in AdamW: 62% of the backward (its
    kernels on autograd's thread, 19.7 ms an iteration) goes: 1.48x (1.47x before the capture was cut
    to 3 iterations). Measured: the teacher under
    no_grad 1.83x by hand, freeze_unstepped 1.91x as profkit's trial (the price leans low: the
    teacher's forward bookkeeping is not priced)."""
    p = shared.corpus("distill_teacher_train")
    f = next(f for f in p.findings() if f.code == "PK206")
    assert (f.evidence["unstepped_elements"], f.evidence["stepped_elements"], f.evidence["share"]) == \
        (109_189_635, 66_662_403, 0.621)
    assert round(f.expected_end_to_end_speedup, 2) == 1.48
    assert f.switch == "freeze_unstepped"
    run = p.run_json()
    assert run["actions"][0]["code"] == "PK206"          # ranked by its trial's 1.91x
    # the action says it: no unpriced noticed line beside it
    assert not any(x.startswith("noticed") for x in run_lines(run))


def test_pk206_needs_the_optimizers_parameters_and_a_share_worth_it(tmp_path):
    assert "PK206" not in [f.code for f in profkit.load(_with_record(tmp_path, optimizer=[])).findings()]
    (tmp_path / "small").mkdir()
    small = _with_record(tmp_path / "small", unstepped=[{"module": "Head", "tensors": 2, "elements": 1000}])
    p = profkit.load(small)
    assert "PK206" not in [f.code for f in p.findings()]
    # unpriced, the record's finding is still said
    assert any(x.startswith("noticed  0.0M parameters of Head") for x in run_lines(p.run_json()))
    assert "PK206" not in [f.code for f in profkit.load(ROOT / "traces" / "real" / "train_llama.sqlite.xz").findings()]
    assert pytest.approx(0.05) == __import__("profkit.judge.rules.pk206_unstepped_backward",
                                             fromlist=["RULE"]).RULE.param("min_share")

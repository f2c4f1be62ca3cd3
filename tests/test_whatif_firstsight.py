"""First-sight scoring (scripts/whatif/firstsight.py): a program is scored once, with the committed
code, and that record is never rewritten; the page shows it with today's score beside it. A
committed corpus program stands in for a first-sight one (no first-sight program has a committed
capture yet)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from whatif import firstsight, page, pricing, registry, store  # noqa: E402


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """sync_loop marked first-sight; the record in a temporary file; the commit a fixed name."""
    progs = [{**p, "first_sight": True} if p["name"] == "sync_loop" else p for p in registry.PROGRAMS]
    monkeypatch.setattr(registry, "PROGRAMS", progs)
    monkeypatch.setattr(firstsight, "FIRST", tmp_path / "first_sight.json.xz")
    monkeypatch.setattr(firstsight, "_commit", lambda: "c0ffee" * 6 + "abcd")
    return tmp_path / "first_sight.json.xz"


def test_a_program_is_scored_once_and_the_record_kept(stand_in, capsys):
    args = argparse.Namespace(programs="sync_loop")
    firstsight.cmd_firstsight(args)
    rec = store.read_data(stand_in)["programs"]["sync_loop"]
    assert rec["commit"].startswith("c0ffee") and rec["top"]["code"]
    # its pairs are the page's: the fixes timed, each with its price and error
    assert {p["fix"] for p in rec["pairs"]} == {"no_sync", "graph"}
    assert all(p["measured"] > 0 and p["predicted"] >= 1.0 for p in rec["pairs"])
    assert isinstance(rec["top_right"], bool) and isinstance(rec["top_step_within"], bool)
    before = stand_in.read_bytes()
    firstsight.cmd_firstsight(args)
    assert "already: first sight happens once" in capsys.readouterr().out
    assert stand_in.read_bytes() == before


def test_the_page_shows_the_record_and_todays_score(stand_in):
    firstsight.cmd_firstsight(argparse.Namespace(programs="sync_loop"))
    rec = store.read_data(stand_in)["programs"]["sync_loop"]
    # a record made by an earlier profkit: its top action said otherwise
    rec["top_right"] = not rec["top_right"]
    store.write_data(stand_in, {"programs": {"sync_loop": rec}})
    lines = page.first_sight_lines(*pricing.page_rows(store.read_measured(),
                                                      only={"sync_loop"}))
    text = "\n".join(lines)
    assert "## First sight: programs profkit had not seen" in text
    row = next(ln for ln in lines if ln.startswith("| sync_loop |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # scored at the record's commit; the record's verdict and today's differ, both shown
    assert cells[2].startswith("c0ffeec0ff") and cells[5] != cells[9]
    assert not any(ln.startswith("Scored at first sight, their capture not committed") for ln in lines)


def test_a_scored_program_whose_capture_is_not_committed_says_so(stand_in):
    firstsight.cmd_firstsight(argparse.Namespace(programs="sync_loop"))
    # today's rows lack it, as they do for a program whose capture was left out of the tree
    lines = firstsight.section({})
    row = next(ln for ln in lines if ln.startswith("| sync_loop |"))
    assert [c.strip() for c in row.strip("|").split("|")][9:] == ["-", "-"]
    assert ("Scored at first sight, their capture not committed (the tree's size bound), so no score today: "
            "sync_loop.") in lines


def test_unknown_programs_are_refused(stand_in):
    with pytest.raises(SystemExit, match="not first-sight programs: nope"):
        firstsight.cmd_firstsight(argparse.Namespace(programs="nope"))


def test_every_registered_first_sight_fix_names_its_rule_before_its_capture():
    from whatif.roles import FIX_RULES
    first = [p for p in registry.PROGRAMS if p.get("first_sight")]
    assert len(first) >= 20 and len({p["family"] for p in first}) >= 12
    assert [(p["name"], f) for p in first for f in p["fixes"] if (p["name"], f) not in FIX_RULES] == []


def test_a_baseline_far_from_the_capture_is_named():
    progs = [{"program": "a", "unprofiled_ns": 78e6}, {"program": "b", "unprofiled_ns": 10e6}]
    pairs = [{"program": "a", "base_ns": 9e6}, {"program": "a", "base_ns": 9.5e6},
             {"program": "b", "base_ns": 14e6}]          # 8.7x apart; 1.4x: within the band
    (line,) = page.far_baselines(pairs, progs)
    assert line.endswith(": a 9.00 ms against 78.00 ms")
    assert page.far_baselines(pairs[2:], progs) == []

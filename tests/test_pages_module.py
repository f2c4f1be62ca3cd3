"""scripts/pages/_page.py: the write-or-check that every page generator ends with."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("_page", ROOT / "scripts" / "pages" / "_page.py")
page = importlib.util.module_from_spec(spec)
sys.modules["_page"] = page
spec.loader.exec_module(page)

GENERATORS = ("make_analyses.py", "make_kernels_page.py", "make_loop_page.py", "make_run_summaries.py",
              "accuracy.py")


def test_write_mode_writes_every_page(tmp_path, capsys):
    pages = {tmp_path / "a.md": "A\n", tmp_path / "sub" / "b.md": "B\n"}
    assert page.write_or_check(pages, check=False, command="make") == 0
    assert (tmp_path / "a.md").read_text() == "A\n" and (tmp_path / "sub" / "b.md").read_text() == "B\n"
    assert capsys.readouterr().out.count("wrote ") == 2


def test_check_mode_names_each_stale_page_with_a_diff_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "same.md").write_text("x\n")
    (tmp_path / "old.md").write_text("one\ntwo\n")
    pages = {tmp_path / "same.md": "x\n", tmp_path / "old.md": "one\nthree\n", tmp_path / "new.md": "n\n"}
    assert page.write_or_check(pages, check=True, command="python make_x.py") == 1
    err = capsys.readouterr().err
    assert "old.md: differs from a fresh run" in err and "-two" in err and "+three" in err
    assert "new.md: not committed" in err and "+n" in err
    assert "same.md" not in err
    assert "2 of 3 page(s) stale: run `python make_x.py` and commit" in err
    assert (tmp_path / "old.md").read_text() == "one\ntwo\n" and not (tmp_path / "new.md").exists()


def test_check_mode_passes_when_every_page_matches(tmp_path, capsys):
    (tmp_path / "a.md").write_text("a\n")
    assert page.write_or_check({tmp_path / "a.md": "a\n"}, check=True, command="make") == 0
    assert "1 page(s) checked, no drift" in capsys.readouterr().out


def test_paths_under_the_repository_are_shown_relative():
    assert page.shown(ROOT / "analyses" / "x.md") == "analyses/x.md"
    assert page.shown("/elsewhere/x.md") == "/elsewhere/x.md"


def test_every_generator_writes_and_checks_through_it():
    for name in GENERATORS:
        text = (ROOT / "scripts" / "pages" / name).read_text()
        assert "from _page import write_or_check" in text, name
        assert "difflib" not in text and ".write_text(" not in text, f"{name} writes or diffs on its own"

"""analyses/run_summaries.md is what scripts/pages/make_run_summaries.py makes from traces/real now."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("make_run_summaries",
                                                  ROOT / "scripts" / "pages" / "make_run_summaries.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_run_summaries"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_run_summaries_page_is_current(capsys):
    mrs = _load()
    status = mrs.main(["--check"])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    assert "no drift" in out.out

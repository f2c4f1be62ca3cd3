"""analyses/closing_the_loop.md must equal a fresh run of scripts/pages/make_loop_page.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("make_loop_page", ROOT / "scripts" / "pages" / "make_loop_page.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_loop_page"] = mod
    spec.loader.exec_module(mod)
    return mod


mlp = _load()


@pytest.fixture(scope="module")
def fresh() -> str:
    return mlp.render()


@pytest.mark.long
def test_committed_page_matches_a_fresh_run(fresh):
    assert mlp.PAGE.read_text() == fresh, \
        "analyses/closing_the_loop.md is stale: run `python scripts/pages/make_loop_page.py`"


def test_check_mode(fresh, capsys, monkeypatch):
    monkeypatch.setattr(mlp, "render", lambda: fresh)  # the page rendered once for the module
    assert mlp.main(["--check"]) == 0
    assert "no drift" in capsys.readouterr().out
    monkeypatch.setattr(mlp, "render", lambda: fresh + "one more line\n")
    assert mlp.main(["--check"]) == 1
    assert "+one more line" in capsys.readouterr().err


def test_page_states_what_was_not_recaptured_and_where_advice_was_wrong():
    text = mlp.PAGE.read_text()
    assert "ResNet-50 inference" in text and "2-GPU DDP step" in text and "CUDA graphs" in text
    assert "The advice was wrong before" in text
    # A pair whose AFTER trace is absent shows the prediction and "not captured", nothing made up.
    for p in mlp.PAIRS:
        if not (mlp.ROOT / p.after).exists():
            row = next(l for l in text.splitlines() if l.startswith(f"| {p.name} |"))
            assert "| not captured |" in row and f"| {p.rule} |" in row
    # Every pair's predicted and measured numbers are in the table.
    assert text.count("| PK") >= len(mlp.PAIRS)

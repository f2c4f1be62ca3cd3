"""analyses/kernels_h200.md must equal a fresh run of scripts/pages/make_kernels_page.py on the committed data."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "analyses" / "data" / "bench_kernels_h200.csv.xz"

pytestmark = pytest.mark.skipif(not DATA.exists(), reason="no committed kernel benchmark data")


def _load():
    spec = importlib.util.spec_from_file_location("make_kernels_page", ROOT / "scripts" / "pages" / "make_kernels_page.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_kernels_page"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mkp():
    return _load()


@pytest.fixture(scope="module")
def fresh(mkp) -> str:
    return mkp.render_all(DATA)


def test_check_mode(mkp, fresh, capsys, monkeypatch):
    monkeypatch.setattr(mkp, "render_all", lambda path: fresh)  # the page rendered once for the module
    assert mkp.main(["--check"]) == 0, "analyses/kernels_h200.md is stale: run `python scripts/pages/make_kernels_page.py`"
    assert "no drift" in capsys.readouterr().out


def test_page_is_driven_by_the_data(mkp, fresh):
    text = fresh
    assert "torch 2.11.0+cu130" in text and "triton 3.6.0" in text and "2026-11-30" in text
    assert "## Scorecard against the issue's targets" in text
    # every op x shape of the CSV has its ratio row
    rows, _, _ = mkp.load(DATA)
    for op, shape in {(r["op"], r["shape"]) for r in rows}:
        assert f"| {op} | {shape} |" in text
    assert "Pending" not in text

"""The committed case-study pages (analyses/*.md) must equal a fresh run of scripts/pages/make_analyses.py.

A case whose trace is not in traces/ yet (not captured) is skipped, not failed.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("make_analyses", ROOT / "scripts" / "pages" / "make_analyses.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_analyses"] = mod
    spec.loader.exec_module(mod)
    return mod


ma = _load_script()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    """Every page and the index, rendered once for the module ({path: text})."""
    pages, _ = ma.render_pages(ma.CASES, ROOT / "analyses", index=True,
                               img_root=tmp_path_factory.mktemp("img"))
    return pages


@pytest.mark.parametrize("case", ma.CASES, ids=[c.name for c in ma.CASES])
def test_committed_page_matches_a_fresh_run(case, fresh):
    missing = [t for t in case.traces() if not (ROOT / t).exists()]
    if missing:
        pytest.skip(f"trace {missing[0]} not captured yet")
    committed = ROOT / "analyses" / f"{case.name}.md"
    assert committed.exists(), f"{committed} is not committed: run python scripts/pages/make_analyses.py"
    assert fresh[committed] == committed.read_text(), (
        f"{committed.name} is stale: run `python scripts/pages/make_analyses.py --only {case.name}`")


def test_committed_index_matches_a_fresh_run(fresh):
    index = ROOT / "analyses" / "README.md"
    assert fresh[index] == index.read_text(), \
        "analyses/README.md is stale: run `python scripts/pages/make_analyses.py`"


def test_check_mode_passes_on_the_committed_pages(fresh, capsys, monkeypatch):
    monkeypatch.setattr(ma, "render_pages", lambda *a, **k: (fresh, []))  # rendered once for the module
    assert ma.main(["--check"]) == 0
    assert f"{len(fresh)} page(s) checked, no drift" in capsys.readouterr().out


def test_check_mode_reports_drift(tmp_path, capsys):
    case = next(c for c in ma.CASES if all((ROOT / t).exists() for t in c.traces()))
    (tmp_path / f"{case.name}.md").write_text("stale\n")
    assert ma.main(["--check", "--only", case.name, "--out", str(tmp_path)]) == 1
    assert "differs from a fresh run" in capsys.readouterr().err


def test_a_large_disagreement_without_notes_fails_loudly(tmp_path):
    graph = next(c for c in ma.CASES if c.before_range == "eager_chain")
    bare = dataclasses.replace(graph, notes="")
    with pytest.raises(ma.CaseError, match=r"disagree by more than 20% .*eager_chain op speedup .*no notes"):
        ma.render_case(bare, tmp_path)
    assert ma.main(["--name", "bare", "--before", graph.before, "--after", graph.after,
                    "--before-range", "eager_chain", "--after-range", "graph_replay",
                    "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "bare.md").exists()


def test_notes_go_under_the_why_heading(tmp_path):
    graph = next(c for c in ma.CASES if c.before_range == "eager_chain")
    page = ma.render_case(dataclasses.replace(graph, notes="BECAUSE-XYZ"), tmp_path)
    why = page.split("## Why the prediction and the measurement differ", 1)[1]
    assert "Disagreements over 20%: eager_chain op speedup" in why
    assert "BECAUSE-XYZ" in why


def test_single_trace_case_has_no_diff(tmp_path):
    case = ma.Case(name="t", before="traces/micro_hinted.sqlite.xz", after=None, by="range",
                   ops=("my_matmul",), title="T")
    page = ma.render_case(case, tmp_path)
    assert "Leave it" in page and "## Before → after" not in page and "No AFTER trace" in page


def test_missing_trace_is_skipped_not_failed(tmp_path):
    case = ma.Case(name="later", before="traces/fused_x_torch.sqlite", after="traces/fused_x_triton.sqlite",
                   by="range", title="later")
    pages, skipped = ma.write_pages([case], tmp_path)
    assert pages == [] and skipped and "not captured yet" in skipped[0]


def test_rename_needs_both_sides(tmp_path):
    case = ma.Case(name="half", before="traces/micro_graph.sqlite.xz", after="traces/micro_graph.sqlite.xz",
                   by="range", title="half", before_range="eager_chain")
    with pytest.raises(ma.CaseError, match="both before_range and after_range"):
        ma.render_case(case, tmp_path)

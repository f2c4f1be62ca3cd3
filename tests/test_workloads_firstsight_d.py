"""The first-sight what-if programs of set D (scripts/whatif/programs_firstsight_d.py) on the
CPU: each program's own loop and one --interleave run on its --small model, and the registry's
entries checked against the programs they name."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_d import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_accum_resnet_train", "baseline,bigger_micro,one_batch")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_the_same_images_a_step_in_every_variant():
    # fewer micro-batches of more images: the effective batch is the same, as the fix must keep it
    pytest.importorskip("torch")
    mod = importlib.import_module("w_accum_resnet_train")
    src = (WORKLOADS / "w_accum_resnet_train.py").read_text()
    assert "micro = effective // accum" in src and mod.EFFECTIVE == 128


def test_registry_names_each_program_and_only_its_fixes():
    assert sorted(Path(p["script"]).stem for p in PROGRAMS) == sorted(c[0] for c in CASES)
    for prog in PROGRAMS:
        shared.check_first_sight_entry(prog, ROOT)
        assert f'nvtx("{prog["step_range"]}")' in (ROOT / prog["script"]).read_text()   # opened by name
    import whatif.registry as registry
    assert all(registry.select(p["name"])[0].get("first_sight") is True for p in PROGRAMS)

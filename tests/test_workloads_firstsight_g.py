"""The first-sight what-if programs of set G (scripts/whatif/programs_firstsight_g.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same loss without the debugging mode, the same answers batched, the same update with
the table on either device), and the registry's entries checked against the programs they name."""
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
from whatif.programs_firstsight_g import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_anomaly_debug_train", "baseline,anomaly_off,check_nan_off"),
         ("w_request_loop_infer", "baseline,batched,no_item"),
         ("w_cpu_embedding_train", "baseline,gpu_table,fused_adam")]


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small(**kw):
    import argparse
    return argparse.Namespace(small=True, **kw)


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_anomaly_fixes_keep_the_loss_and_only_the_defect_checks(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_anomaly_debug_train")
    dev = torch.device("cpu")
    losses = {}
    for fixes in (frozenset(), frozenset({"anomaly_off"}), frozenset({"check_nan_off"})):
        step = mod.build(small(), set(fixes), dev)
        torch.manual_seed(1)
        losses[fixes] = [step() for _ in range(2)]
    base = losses[frozenset()]
    for fixes, got in losses.items():
        assert all(torch.allclose(a, b, rtol=1e-5) for a, b in zip(base, got)), fixes
    # the block: anomaly mode on, with NaN checks, only where no fix took them out
    for fixes, on, checks in ((set(), True, True), ({"check_nan_off"}, True, False), ({"anomaly_off"}, False, False)):
        with mod.anomaly(fixes)():
            assert torch.is_anomaly_enabled() == on, fixes
            assert (torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()) == checks, fixes


def test_requests_get_the_same_answers_one_at_a_time_and_batched(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_request_loop_infer")
    dev = torch.device("cpu")
    # the model's answers depend on the random ids; the same seed draws the same ids for one
    # request at a time as for the batch only if the batch is one request: compare logits instead
    model = mod.Encoder(1000, 64, 4, 2, 256, 64, 3).eval()
    lens = [5, 12, 9]
    ids, mask = mod.tokenize(lens, 1000, 16)
    with torch.inference_mode():
        batched = model(ids, mask)
        each = torch.cat([model(ids[i:i + 1, :n], mask[i:i + 1, :n]) for i, n in enumerate(lens)])
    assert torch.allclose(batched, each, atol=1e-5)
    # every variant answers each of the queue's requests
    for fixes in (set(), {"batched"}, {"no_item"}):
        answers = mod.build(small(), fixes, dev)()
        assert len(answers) == 4 and all(isinstance(a, int) and 0 <= a < 3 for a in answers), fixes


def test_table_on_either_device_makes_the_same_step(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_cpu_embedding_train")
    dev = torch.device("cpu")
    # on a CPU-only machine gpu_table keeps the table on the CPU: the same numbers either way
    a, b = mod.build(small(), set(), dev), mod.build(small(), {"gpu_table"}, dev)
    assert all(torch.allclose(a(), b(), rtol=1e-6) for _ in range(3))


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "g", ROOT)

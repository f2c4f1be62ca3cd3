"""The first-sight what-if programs of set J (scripts/whatif/programs_firstsight_j.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same nearest ids ranked on the host or the device, the same forecast from the cells or
from cuDNN's GRU, the same loss with the schedule on either side), and the registry's entries
checked against the programs they name."""
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
from whatif.programs_firstsight_j import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_knn_retrieval_infer", "baseline,gpu_topk,bf16"),
         ("w_gru_rollout_infer", "baseline,cudnn_encoder,bf16"),
         ("w_ddpm_cpu_schedule_train", "baseline,gpu_schedule,channels_last")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small(**kw):
    import argparse
    return argparse.Namespace(small=True, **kw)


def test_the_nearest_ids_are_the_same_ranked_on_the_host_or_the_device(one_thread):
    torch = one_thread
    np = pytest.importorskip("numpy")
    mod = importlib.import_module("w_knn_retrieval_infer")
    sims = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    v, i = mod.host_topk(sims, 7)
    tv, ti = torch.topk(torch.from_numpy(sims).double(), 7, dim=1)
    assert (i == ti.numpy()).all() and np.allclose(v, tv.numpy())
    dev = torch.device("cpu")
    got = {}
    for fixes in (frozenset(), frozenset({"gpu_topk"})):
        step = mod.build(small(), set(fixes), dev)
        torch.manual_seed(5)
        got[fixes] = [step() for _ in range(2)]
    assert got[frozenset()][0].shape == (8, mod.K)
    assert all((a == b).all() for a, b in zip(got[frozenset()], got[frozenset({"gpu_topk"})]))


def test_the_cudnn_encoder_forecasts_what_the_cells_do(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_gru_rollout_infer")
    torch.manual_seed(0)
    cells = mod.Forecaster(3, 16, 5).double().eval()
    history = torch.randn(9, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        want = cells(history)
        cells.use_cudnn_encoder()
        cells.gru.double()
        got = cells(history)
    assert want.shape == (5, 4, 3) and torch.allclose(got, want, atol=1e-12)
    # each decoder step feeds its prediction back: changing the last observation changes every step
    h2 = history.clone()
    h2[-1] += 1.0
    with torch.no_grad():
        moved = (cells(h2) - got).abs().amax(dim=(1, 2))
    assert (moved > 1e-6).all()


def test_the_schedule_on_either_side_gives_the_same_loss(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_ddpm_cpu_schedule_train")
    dev = torch.device("cpu")
    losses = {}
    for fixes in (frozenset(), frozenset({"gpu_schedule"}), frozenset({"channels_last"})):
        step = mod.build(small(), set(fixes), dev)
        torch.manual_seed(3)
        losses[fixes] = torch.stack([step().detach() for _ in range(3)])
    base = losses[frozenset()]
    assert not torch.allclose(base[0], base[-1])
    for fixes, got in losses.items():
        assert torch.allclose(got, base, rtol=1e-4), fixes


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "j", ROOT)

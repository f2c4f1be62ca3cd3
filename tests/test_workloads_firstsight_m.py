"""The first-sight what-if programs of set M (scripts/whatif/programs_firstsight_m.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same audio from weights normalised at every call or folded once, the same embeddings
with autograd on or in inference mode, the same colours from small chunks or large ones), and
the registry's entries checked against the programs they name."""
from __future__ import annotations

import argparse
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
from whatif.programs_firstsight_m import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_vocoder_weightnorm_infer", "baseline,fold_weight_norm"),
         ("w_encoder_grad_on_infer", "baseline,inference_mode"),
         ("w_nerf_chunks_infer", "baseline,big_chunks")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_folding_the_weight_norm_keeps_the_audio(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_vocoder_weightnorm_infer")
    g = mod.Generator(ch=32).double().eval()
    mel = torch.randn(2, 80, 5, dtype=torch.float64)
    with torch.no_grad():
        before = g(mel)
        normed = sum(mod.parametrize.is_parametrized(m, "weight") for m in g.modules())
        mod.fold(g)
        after = g(mel)
    assert normed == 1 + 4 + 4 * 3 * 3 + 1
    assert not any(mod.parametrize.is_parametrized(m, "weight") for m in g.modules())
    assert before.shape == (2, 1, 5 * 256) and before.abs().max() > 0
    assert torch.allclose(before, after, rtol=1e-10, atol=1e-12)


def test_inference_mode_gives_the_same_embeddings(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_encoder_grad_on_infer")
    out = {}
    for fixes in (set(), {"inference_mode"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        out[frozenset(fixes)] = [step() for _ in range(4)]
    base, inf = out[frozenset()], out[frozenset({"inference_mode"})]
    assert not base[0].requires_grad and base[0].abs().mean() > 0
    for b, i in zip(base, inf):
        assert torch.allclose(b, i, rtol=1e-4, atol=1e-5)
    # the padding is left out of the mean: a padded token's value does not move an embedding
    m = mod.Embedder(50, 16, 2, 32, 1, 6).double().eval()
    ids = torch.randint(1, 50, (2, 6))
    pad = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    with torch.no_grad():
        a = m(ids, pad)
        ids2 = ids.clone()
        ids2[0, 4:] = 7
        b = m(ids2, pad)
    assert torch.allclose(a, b)


def test_the_chunk_size_does_not_change_the_colours(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_nerf_chunks_infer")
    out = {}
    for fixes in (set(), {"big_chunks"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        out[frozenset(fixes)] = step()
    small_c, big_c = out[frozenset()], out[frozenset({"big_chunks"})]
    assert small_c.shape == (8, 3) and small_c.abs().max() > 0
    assert torch.allclose(small_c, big_c, rtol=1e-5, atol=1e-6)
    # compositing: an opaque first sample gives its own colour
    raw = torch.zeros(1, 3, 4, dtype=torch.float64)
    raw[0, 0] = torch.tensor([0.2, 0.4, 0.6, 1e6])
    t = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    assert torch.allclose(mod.composite(raw, t), torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64))


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "m", ROOT)

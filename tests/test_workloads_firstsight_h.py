"""The first-sight what-if programs of set H (scripts/whatif/programs_firstsight_h.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same ensemble update stacked or joined, the same attention with the mask or causal, the
same augmented pixels batched), and the registry's entries checked against the programs they name."""
from __future__ import annotations

import importlib
import random
import sys
from pathlib import Path

import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_h import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_ensemble_loop_train", "baseline,vmapped,one_backward"),
         ("w_masked_sdpa_train", "baseline,is_causal,fused_adamw"),
         ("w_gpu_augment_loop_train", "baseline,batched_augment,channels_last")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small(**kw):
    import argparse
    return argparse.Namespace(small=True, **kw)


def test_ensemble_members_get_the_same_updates_looped_stacked_or_joined(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_ensemble_loop_train")
    dev = torch.device("cpu")
    losses = {}
    for fixes in (frozenset(), frozenset({"vmapped"}), frozenset({"one_backward"}), frozenset({"fused_adamw"})):
        step = mod.build(small(), set(fixes), dev)
        torch.manual_seed(3)
        losses[fixes] = torch.stack([step() for _ in range(4)])
    # the same members' losses after three updates: each member's gradient is its own loss's
    base = losses[frozenset()]
    assert not torch.allclose(base[0], base[-1])
    for fixes, got in losses.items():
        assert torch.allclose(got, base, rtol=1e-4), fixes


def test_a_causal_mask_tensor_and_is_causal_give_the_same_attention(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_masked_sdpa_train")
    torch.manual_seed(0)
    masked, causal = mod.Attention(32, 4, 16, False), mod.Attention(32, 4, 16, True)
    causal.load_state_dict(masked.state_dict())
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    masked, causal = masked.double(), causal.double()
    assert torch.allclose(masked(x), causal(x), atol=1e-12)
    # and the token at t sees nothing after t: changing the last token leaves the others alone
    y = x.clone()
    y[:, -1] = torch.randn(2, 32, dtype=torch.float64)
    assert torch.allclose(masked(x)[:, :-1], masked(y)[:, :-1], atol=1e-12)


def test_batched_augmentation_samples_the_pixels_the_loop_does(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_gpu_augment_loop_train")
    torch.manual_seed(3)
    imgs = torch.randint(0, 256, (12, 3, 40, 40), dtype=torch.uint8)
    params = mod.draws(random.Random(2), 12, 40, 24)
    assert {p[3] for p in params} == {True, False}      # both flipped and plain images drawn
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (mod.MEAN, mod.STD))
    looped = mod.augment_loop(imgs, params, 24, mean, std)
    batched = mod.augment_batched(imgs, params, 24, mean, std)
    assert batched.shape == looped.shape == (12, 3, 24, 24)
    assert torch.allclose(batched, looped, atol=1e-4)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "h", ROOT)

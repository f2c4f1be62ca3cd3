"""The first-sight what-if programs of set K (scripts/whatif/programs_firstsight_k.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same loss with the masks built on either side, the same ELBO with or without the
distributions' checks, the same critic estimates logged or summed), and the registry's entries
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
from whatif.programs_firstsight_k import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_seq2seq_transformer_train", "baseline,gpu_masks,fused_adam"),
         ("w_vae_distributions_train", "baseline,no_validate"),
         ("w_wgan_gp_train", "baseline,no_item")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small(**kw):
    import argparse
    return argparse.Namespace(small=True, **kw)


def losses(mod, fixes: set[str], n: int, dev) -> "object":
    torch = pytest.importorskip("torch")
    step = mod.build(small(), set(fixes), dev)
    torch.manual_seed(3)
    return torch.stack([step().detach().double() for _ in range(n)])


def test_the_masks_built_on_either_side_give_the_same_loss(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_seq2seq_transformer_train")
    dev = torch.device("cpu")
    mask = mod.pad_mask([2, 4], 4)
    assert mask.tolist() == [[False, False, True, True], [False, False, False, False]]
    base = losses(mod, set(), 3, dev)
    assert not torch.allclose(base[0], base[-1])
    assert torch.allclose(losses(mod, {"gpu_masks"}, 3, dev), base, rtol=1e-5)


def test_the_elbo_is_the_same_with_or_without_the_checks(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_vae_distributions_train")
    torch.manual_seed(0)
    vae = mod.VAE(6, 5, 2).double()
    x = torch.bernoulli(torch.rand(4, 6, dtype=torch.float64))
    got = []
    for validate in (True, False):
        torch.manual_seed(1)
        got.append(vae.loss(x, validate))
    # the negative ELBO by hand: KL of N(mu, sigma) to N(0, 1) plus the Bernoulli's cross-entropy
    torch.manual_seed(1)
    mu, log_sigma = vae.enc(x).chunk(2, dim=1)
    sigma = log_sigma.exp()
    z = mu + sigma * torch.randn_like(mu)
    logits = vae.dec(z)
    kl = (0.5 * (sigma ** 2 + mu ** 2 - 1) - log_sigma).sum(1)
    nll = torch.nn.functional.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1)
    assert torch.allclose(got[0], got[1]) and torch.allclose(got[0], (kl + nll).mean())
    dev = torch.device("cpu")
    assert torch.allclose(losses(mod, {"no_validate"}, 3, dev), losses(mod, set(), 3, dev), rtol=1e-6)


def test_the_estimates_logged_or_summed_train_the_same(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_wgan_gp_train")
    dev = torch.device("cpu")
    base = losses(mod, set(), 2, dev)
    assert torch.isfinite(base).all() and not torch.allclose(base[0], base[1])
    assert torch.allclose(losses(mod, {"no_item"}, 2, dev), base, rtol=1e-5)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "k", ROOT)

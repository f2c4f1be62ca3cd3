"""The first-sight what-if programs of set L (scripts/whatif/programs_firstsight_l.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same beams selected on the host or on the GPU, the same loss with the attention's
weights returned or not, the same logits from weights dequantized once or at every call), and
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
from whatif.programs_firstsight_l import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_beam_search_decode", "baseline,gpu_beams"),
         ("w_mae_pretrain_train", "baseline,sdpa,fused_adamw"),
         ("w_int8_dequant_infer", "baseline,bf16_weights")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_the_beams_selected_on_the_gpu_are_the_host_walks(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_beam_search_decode")
    vocab, k = 7, mod.BEAMS
    gen = torch.Generator().manual_seed(0)
    hit = 0
    for _ in range(30):
        cand = torch.randn(3, k * vocab, generator=gen, dtype=torch.float64)
        scores, idx = torch.topk(cand, 2 * k, dim=1)
        done: list[list] = [[] for _ in range(3)]
        o, t, s = mod.host_select(scores, idx, vocab, 5, done)
        best = torch.full((3,), -torch.inf, dtype=torch.float64)
        go, gt, gs = mod.gpu_select(scores, idx, vocab, 5, best)
        assert go.tolist() == o and gt.tolist() == t and gs.tolist() == s
        want = [max((h[0] for h in f), default=-float("inf")) for f in done]
        assert best.tolist() == want
        hit += sum(bool(f) for f in done)
    assert hit > 5          # EOS candidates were reached, and counted alike
    # a whole search: the same best scores either way
    got = {}
    for fixes in (set(), {"gpu_beams"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        got[frozenset(fixes)] = [step().clone() for _ in range(14)][-1]
    assert torch.isfinite(got[frozenset()]).all()
    assert torch.allclose(got[frozenset()], got[frozenset({"gpu_beams"})])


def test_the_attention_weights_returned_or_not_give_the_same_loss(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_mae_pretrain_train")
    losses = {}
    for fixes in (set(), {"sdpa"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        torch.manual_seed(3)
        losses[frozenset(fixes)] = torch.stack([step().detach() for _ in range(3)])
    base = losses[frozenset()]
    assert not torch.allclose(base[0], base[-1])
    assert torch.allclose(losses[frozenset({"sdpa"})], base, rtol=1e-4)
    # patchify keeps every pixel once
    m = mod.MAE(4, 4, 8, 1, 2, 8, 1, 2, True)
    img = torch.randn(2, 3, 8, 8)
    assert torch.equal(m.patchify(img).sort(-1).values.flatten().sort().values, img.flatten().sort().values)


def test_weights_dequantized_once_or_per_call_give_the_same_logits(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_int8_dequant_infer")
    lin = mod.QLinear(16, 8, dequantized=False).double()
    w = lin.q.double() * lin.scale.double()[:, None]
    x = torch.randn(3, 16, dtype=torch.float64)
    assert torch.allclose(lin.forward(x.to(lin.scale.dtype)).double(), x @ w.T, atol=1e-2)
    assert lin.q.dtype == torch.int8 and lin.q.abs().max() <= 127
    out = {}
    for fixes in (set(), {"bf16_weights"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        out[frozenset(fixes)] = step()
    assert torch.equal(out[frozenset()], out[frozenset({"bf16_weights"})])


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "l", ROOT)

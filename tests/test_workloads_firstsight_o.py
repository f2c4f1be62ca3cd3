"""The first-sight what-if programs of set O (scripts/whatif/programs_firstsight_o.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same gradients offloaded or not, the same corruption of a triple however it is drawn,
the same LBFGS iterates with its recursion on the device), and the registry's entries checked
against the programs they name."""
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
from whatif.programs_firstsight_o import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_activation_offload_train", "baseline,no_offload"),
         ("w_kge_negative_sampling_train", "baseline,gpu_sampling"),
         ("w_lbfgs_style_transfer", "baseline,gpu_two_loop")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_offloading_or_checkpointing_keeps_the_training(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_activation_offload_train")
    losses = {}
    for fixes in (set(), {"no_offload"}, {"checkpoint"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses[frozenset(fixes)] = [step().item() for _ in range(4)]
    base = losses[frozenset()]
    assert all(3.5 < x < 5.0 for x in base) and len(set(base)) == 4  # ~ln 64 on fresh random tokens
    for other in losses.values():  # where the saved tensors live does not change a gradient
        assert other == pytest.approx(base, rel=1e-5)
    # the offload is what the baseline runs: every saved tensor packed to the host
    packed = []
    model = mod.Decoder(64, 32, 4, 2, 16)
    idx = torch.randint(0, 64, (2, 17))
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        with mod.offload(set())():
            model(idx[:, :-1], idx[:, 1:])
    assert not packed  # save_on_cpu's own hooks are innermost and took them
    assert mod.offload({"no_offload"}) is mod.offload({"checkpoint"})


def test_every_way_of_drawing_corrupts_one_end_of_each_triple(one_thread):
    torch = one_thread
    import random
    mod = importlib.import_module("w_kge_negative_sampling_train")
    pos = torch.tensor([[3, 1, 7], [5, 2, 9], [0, 0, 4]])
    neg = mod.corrupt_python([tuple(t) for t in pos.tolist()], 50, 1000, random.Random(0))
    assert neg.shape == (3, 50, 3)
    ents = torch.randint(0, 1000, (3, 50))
    coins = torch.rand(3, 50)
    neg2 = mod.corrupt_tensor(pos, 50, 1000, ents, coins)
    for n in (neg, neg2):
        same_head = (n[..., 0] == pos[:, None, 0]).float().mean()
        same_tail = (n[..., 2] == pos[:, None, 2]).float().mean()
        assert (n[..., 1] == pos[:, None, 1]).all()  # the relation is kept
        assert ((n[..., 0] == pos[:, None, 0]) | (n[..., 2] == pos[:, None, 2])).all()  # one end kept
        assert 0.3 < same_head < 0.7 and 0.3 < same_tail < 0.7  # either end, by a fair coin
    # the tensor version follows its coins exactly
    head = coins < 0.5
    assert torch.equal(neg2[..., 0][head], ents[head]) and torch.equal(neg2[..., 2][~head], ents[~head])
    for fixes in (set(), {"numpy_sampling"}, {"gpu_sampling"}, {"fused_adam"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses = [step().item() for _ in range(5)]
        assert all(0.5 < x < 2.0 for x in losses)  # softplus of small scores: about 2 ln 2


def test_the_recursion_on_the_device_gives_lbfgs_iterates(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_lbfgs_style_transfer")
    torch.manual_seed(0)
    a_mat = torch.randn(30, 30, dtype=torch.float64)
    hess = a_mat @ a_mat.t() / 30 + torch.eye(30, dtype=torch.float64)
    target = torch.randn(30, dtype=torch.float64)

    def fit(cls, history: int) -> list[torch.Tensor]:
        x = torch.zeros(30, dtype=torch.float64, requires_grad=True)
        opt = cls([x], history_size=history, max_iter=7)

        def closure():
            opt.zero_grad()
            d = x - target
            loss = 0.5 * d @ hess @ d + (x ** 4).sum() * 0.01  # not quadratic: the history matters
            loss.backward()
            return loss
        out = []
        for _ in range(4):
            opt.step(closure)
            out.append(x.detach().clone())
        return out

    for history in (100, 3):  # a full history and one that drops its oldest entries
        ref, ours = fit(torch.optim.LBFGS, history), fit(mod.TwoLoopOnGPU, history)
        assert (ref[-1] - ref[0]).abs().max() > 1e-3
        for r, o in zip(ref, ours):
            assert torch.allclose(r, o, rtol=1e-10, atol=1e-12)


def test_the_style_transfer_step_lowers_its_loss(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_lbfgs_style_transfer")
    for fixes in (set(), {"gpu_two_loop"}, {"history10"}, {"channels_last"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses = [step().item() for _ in range(3)]
        assert losses[0] > 0 and losses[-1] < losses[0]
    assert len(mod.features(mod.vgg_head(), torch.rand(1, 3, 32, 32))) == 5  # conv_1 .. conv_5


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "o", ROOT)

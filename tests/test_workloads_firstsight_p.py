"""The first-sight what-if programs of set P (scripts/whatif/programs_firstsight_p.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same attention output with the weights asked for or not, the same sums however the
mesh's rows are gathered and summed, the same learning rates and decay however the parameters
are grouped), and the registry's entries checked against the programs they name."""
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
from whatif.programs_firstsight_p import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_vit_mha_weights_train", "baseline,need_weights_false"),
         ("w_deterministic_mesh_train", "baseline,sorted_segments,nondeterministic"),
         ("w_llrd_param_groups_finetune", "baseline,grouped")]


@pytest.fixture
def deterministic_restored():
    """The mesh program turns the process's determinism on; put it back for the tests after."""
    import torch
    was = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
           torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(was[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = was[1], was[2]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, deterministic_restored, monkeypatch, tmp_path,
                                                  capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_attention_without_its_weights_is_the_same_attention(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_vit_mha_weights_train")
    torch.manual_seed(0)
    slow, fast = mod.Block(32, 4, need_weights=True), mod.Block(32, 4, need_weights=False)
    fast.load_state_dict(slow.state_dict())
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    slow, fast = slow.double(), fast.double()
    assert torch.allclose(slow(x), fast(x), rtol=1e-10, atol=1e-12)
    for fixes in (set(), {"need_weights_false"}, {"fused_adamw"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses = [step().item() for _ in range(3)]
        assert all(1.0 < x < 4.5 for x in losses)  # ~ln 10 on fresh random labels


def test_sorted_segments_sum_as_index_add_does(one_thread, deterministic_restored):
    torch = one_thread
    mod = importlib.import_module("w_deterministic_mesh_train")
    senders, receivers = mod.grid_mesh(5, 6)
    n = 30
    assert senders.shape == receivers.shape == (2 * (5 * 5 + 4 * 6 + 4 * 5),)
    assert set(zip(senders.tolist(), receivers.tolist())) == set(zip(receivers.tolist(), senders.tolist()))
    torch.manual_seed(0)
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    rows = torch.randn(senders.shape[0], 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n, 8, dtype=torch.float64)
    we = torch.randn(senders.shape[0], 8, dtype=torch.float64)
    ref_sum = torch.zeros(n, 8, dtype=torch.float64).index_add_(0, receivers, rows)
    ref_gather = x[senders]
    ((ref_sum * w).sum() + (ref_gather * we).sum()).backward()
    ref_grads = x.grad.clone(), rows.grad.clone()
    x.grad = rows.grad = None
    seg_s, seg_r = mod.Segments(senders, n), mod.Segments(receivers, n)
    got_sum, got_gather = mod._Scatter.apply(rows, seg_r), mod._Gather.apply(x, seg_s)
    ((got_sum * w).sum() + (got_gather * we).sum()).backward()
    assert torch.allclose(got_sum, ref_sum, rtol=1e-12) and torch.equal(got_gather, ref_gather)
    assert torch.allclose(x.grad, ref_grads[0], rtol=1e-12) and torch.allclose(rows.grad, ref_grads[1], rtol=1e-12)
    # the whole model: the same loss and gradients whichever way it sums
    model = mod.MeshGraphNet(12, 7, 16, 2, 3).double()
    nodes = torch.randn(n, 12, dtype=torch.float64)
    edges = torch.randn(senders.shape[0], 7, dtype=torch.float64)
    out = [model(nodes, edges, senders, receivers, segs) for segs in (None, (seg_s, seg_r))]
    assert torch.allclose(out[0], out[1], rtol=1e-10, atol=1e-12)
    for fixes, on in ((set(), True), ({"nondeterministic"}, False), ({"sorted_segments"}, True), ({"tf32"}, True)):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses = [step().item() for _ in range(3)]
        assert torch.are_deterministic_algorithms_enabled() is on  # each variant runs with its own setting
        assert all(0.5 < x < 3.0 for x in losses)  # MSE against fresh unit-variance targets


def test_grouping_keeps_each_parameters_learning_rate_and_decay(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_llrd_param_groups_finetune")
    model = mod.Encoder(100, 32, 4, 2, 16, 2)
    settings = {}
    for per_parameter in (True, False):
        groups = mod.param_groups(model, 2, 2e-5, 0.9, per_parameter)
        got = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
        assert len(got) == len(list(model.parameters()))  # every parameter once
        settings[per_parameter] = (got, len(groups))
    assert settings[True][0] == settings[False][0]
    assert settings[True][1] == len(list(model.parameters())) and settings[False][1] == 2 * (2 + 2)  # (depth, decay or not)
    # decayed with depth: the head at the base rate, the embeddings 0.9^3 of it, no decay on biases
    named = dict(model.named_parameters())
    lr = {n: settings[True][0][id(p)] for n, p in named.items()}
    assert lr["head.weight"] == (2e-5, 0.01) and lr["head.bias"] == (2e-5, 0.0)
    assert lr["word.weight"][0] == pytest.approx(2e-5 * 0.9 ** 3)
    assert lr["layers.1.linear1.weight"][0] == pytest.approx(2e-5 * 0.9)
    # the same training whichever way it is grouped or stepped: same losses after the same steps
    losses = []
    for fixes in (set(), {"grouped"}, {"fused_adamw"}, {"grouped_fused"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        torch.manual_seed(5)
        losses.append([step().item() for _ in range(3)])
    for other in losses[1:]:
        assert other == pytest.approx(losses[0], rel=1e-5)
    assert len(set(losses[0])) == 3


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "p", ROOT)

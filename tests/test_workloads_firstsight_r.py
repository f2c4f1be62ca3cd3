"""The first-sight what-if programs of set R (scripts/whatif/programs_firstsight_r.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (k-means' centroids whichever way they are summed, against a float64 reference; the stacked
heads' loss and gradients the loop's; the GP's likelihood against a direct float64 evaluation,
with or without the status check, and close in float32), and the registry's entries checked
against the programs they name."""
from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path

import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_r import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_kmeans_lloyd_loop", "baseline,check_every_10,matmul_update"),
         ("w_multitask_heads_train", "baseline,stacked_heads"),
         ("w_gp_cholesky_train", "baseline,fp32,cholesky_ex")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_lloyd_iteration_against_a_float64_reference(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_kmeans_lloyd_loop")
    torch.manual_seed(0)
    points = torch.randn(300, 5, dtype=torch.float64)
    centroids = torch.cat([points[:6].clone(), torch.full((1, 5), 50.0, dtype=torch.float64)])  # the last one empty
    ref_assign = torch.stack([((points[i] - centroids) ** 2).sum(1).argmin() for i in range(300)])
    for matmul in (False, True):
        new, assign = mod.lloyd(points, centroids, matmul)
        assert torch.equal(assign, ref_assign)
        for c in range(6):
            assert torch.allclose(new[c], points[ref_assign == c].mean(0), rtol=1e-12)
        assert torch.equal(new[6], centroids[6])  # an empty cluster keeps its centroid
    # the loop restarts once converged and goes on; read every 10th iteration, it restarts only there
    counts = {}
    for fixes in (set(), {"check_every_10"}, {"tf32"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        counts[frozenset(fixes)] = [step() for _ in range(40)]
    every, each = counts[frozenset({"check_every_10"})], counts[frozenset()]
    assert 0 in each and each == counts[frozenset({"tf32"})]
    restarts = [i for i in range(1, 40) if every[i] == 0]
    assert restarts and all(every[i - 1] % 10 == 9 for i in restarts)


def test_stacked_heads_are_the_loops_heads(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_multitask_heads_train")
    torch.manual_seed(0)
    model = mod.MultiTask((4,), 6, 5, stacked=False).double().eval()
    images = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    labels = torch.randint(0, 2, (3, 5)).double()
    loop_loss = model(images, labels)
    loop_loss.backward()
    grads = [h.weight.grad.clone() for h in model.heads]
    stacked = mod.stack_heads(model.heads).double()
    for t, h in enumerate(model.heads):
        assert torch.equal(stacked.weight[t], h.weight[0]) and torch.equal(stacked.bias[t], h.bias[0])
    model.stacked, model.heads = True, stacked
    model.zero_grad()
    stacked_loss = model(images, labels)
    stacked_loss.backward()
    assert torch.allclose(stacked_loss, loop_loss, rtol=1e-12)
    assert torch.allclose(stacked.weight.grad, torch.cat(grads), rtol=1e-10)
    losses = []
    for fixes in (set(), {"stacked_heads"}, {"fused_adamw"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses.append([step().item() for _ in range(3)])
    # (bf16 autocast: the two sum the same 40 losses in another order)
    assert losses[1] == pytest.approx(losses[0], rel=1e-3) and losses[2] == pytest.approx(losses[0], rel=1e-5)


def test_gp_likelihood_against_a_direct_evaluation(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_gp_cholesky_train")
    torch.manual_seed(0)
    gp = mod.ExactGP(3).double()
    x, y = torch.rand(40, 3, dtype=torch.float64) * 4, torch.randn(40, dtype=torch.float64)
    ls = torch.nn.functional.softplus(gp.raw_lengthscale)
    d2 = (((x[:, None, :] - x[None, :, :]) / ls) ** 2).sum(-1)
    k = torch.nn.functional.softplus(gp.raw_outputscale) * torch.exp(-0.5 * d2)
    k = k + torch.nn.functional.softplus(gp.raw_noise) * torch.eye(40, dtype=torch.float64)
    ref = (0.5 * y @ torch.linalg.solve(k, y) + 0.5 * torch.logdet(k) + 20 * math.log(2 * math.pi)) / 40
    for ex in (False, True):
        assert torch.allclose(gp(x, y, 0.0, ex), ref, rtol=1e-10)
    assert torch.allclose(gp.float()(x.float(), y.float(), 1e-4, False).double(), ref, rtol=1e-3)
    losses = {}
    for fixes in (set(), {"cholesky_ex"}, {"fp32"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses[frozenset(fixes)] = [step().item() for _ in range(3)]
    assert losses[frozenset({"cholesky_ex"})] == losses[frozenset()]
    assert losses[frozenset({"fp32"})] == pytest.approx(losses[frozenset()], rel=2e-3)
    assert losses[frozenset()][2] < losses[frozenset()][0]  # the fit improves


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "r", ROOT)

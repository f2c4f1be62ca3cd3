"""The first-sight what-if programs of set Y (scripts/whatif/programs_firstsight_y.py) on the
CPU: each program's own loop and one --interleave run on its --small model, the compiling fixes
through Dynamo with an eager backend, what each fix must keep against float64 references (the
R-GCN's batched relations against its loop and against the layer written out; DP-SGD's vmapped
per-sample gradients against the loop's and against each sample's own; Adam's weight decay
against the penalty's gradient), and the registry's entries checked against the programs."""
from __future__ import annotations

import argparse
import contextlib
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
from whatif.programs_firstsight_y import PROGRAMS  # noqa: E402

RGCN, DPSGD, L2 = "w_rgcn_relations_train", "w_dpsgd_loop_train", "w_explicit_l2_train"
CASES = [(RGCN, "baseline,batched_relations,bf16,fused_adam"),
         (DPSGD, "baseline,vmap_grads,bf16"),
         (L2, "baseline,adam_weight_decay,fused_adam")]


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


@pytest.mark.parametrize("script", [RGCN, L2])
def test_compile_fixes_run_through_dynamo(one_thread, monkeypatch, capsys, script):
    """The compile fixes traced by Dynamo and run through AOTAutograd, eagerly (no Inductor build)."""
    shared.compile_through_dynamo(one_thread, importlib.import_module(script), script, monkeypatch, capsys)


def test_batched_relations_are_the_relation_loop_and_the_layer_written_out(one_thread):
    torch = one_thread
    mod = importlib.import_module(RGCN)
    dev = torch.device("cpu")
    src, dst, rel, norm, _ = mod.make_graph(25, 90, 4, 3, dev, seed=3)
    norm = norm.double()
    torch.manual_seed(1)
    layer = mod.RGCNLayer(6, 5, 4).double()
    h = torch.randn(25, 6, dtype=torch.float64)
    loop, batched = layer(h, src, dst, rel, norm), layer.forward_batched(h, src, dst, rel, norm)
    torch.testing.assert_close(batched, loop, rtol=1e-12, atol=1e-12)
    want = layer.self_loop(h).detach().clone()
    for e in range(len(src)):
        want[dst[e]] += (h[src[e]] @ layer.weight[rel[e]]).detach() * norm[e]
    torch.testing.assert_close(loop.detach(), want, rtol=1e-12, atol=1e-12)
    # each destination's messages of one relation average: the norms of a (relation, node) sum to 1
    key = rel * 25 + dst
    for k in key.unique():
        assert float(norm[key == k].sum()) == pytest.approx(1.0)


def test_vmapped_per_sample_gradients_are_the_loops(one_thread):
    torch = one_thread
    mod = importlib.import_module(DPSGD)
    torch.manual_seed(2)
    model = mod.Net((8, 8, 8), 3).double()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 3, 8, 8, dtype=torch.float64, generator=g)
    y = torch.randint(0, 3, (5,), generator=g)
    none = contextlib.nullcontext
    loop, vm = mod.loop_grads(model, x, y, none), mod.vmap_grads(model, x, y, none)
    for a, b in zip(loop, vm):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    # written out: each sample's own gradient, clipped to norm CLIP, summed
    params = list(model.parameters())
    want = [torch.zeros_like(p) for p in params]
    for i in range(5):
        gr = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), params)
        n = torch.sqrt(sum((t ** 2).sum() for t in gr))
        for w, t in zip(want, gr):
            w += t * min(1.0, mod.CLIP / (float(n) + 1e-6))
    for a, b in zip(loop, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_adam_weight_decay_is_the_penalty_gradient(one_thread):
    """In float64, the penalty in the loss and Adam's weight decay of twice its factor take the
    parameters along the same path."""
    torch = one_thread
    mod = importlib.import_module(L2)
    runs = []
    for decay in (False, True):
        torch.manual_seed(3)
        model = mod.ViT(8, 4, 8, 1, 2, 3).double()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=2 * mod.LAM if decay else 0.0)
        g = torch.Generator().manual_seed(6)
        x = torch.randn(4, 3, 8, 8, dtype=torch.float64, generator=g)
        y = torch.randint(0, 3, (4,), generator=g)
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if not decay:
                loss = loss + mod.l2_penalty(model)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "y", ROOT)

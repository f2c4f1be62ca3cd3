"""The first-sight what-if programs of set X (scripts/whatif/programs_firstsight_x.py) on the
CPU: each program's own loop and one --interleave run on its --small model, the compiling fixes
through Dynamo with an eager backend (Inductor's CPU builds take minutes), what each fix must keep
against float64 references (SAM's foreach steps against its loops and against the update written
out; the sorted threshold against kthvalue and the pruned share; the masked convolutions'
causality and the sampler's pixel order), and the registry's entries checked against the
programs they name."""
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
from whatif.programs_firstsight_x import PROGRAMS  # noqa: E402

SAM, PRUNE, PIXEL = "w_sam_wrn_train", "w_global_prune_train", "w_pixelcnn_sample_infer"
CASES = [(SAM, "baseline,foreach_sam,channels_last_bf16,fused_sgd"),
         (PRUNE, "baseline,sort_threshold,every_100,fused_adamw"),
         (PIXEL, "baseline,bf16")]


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


@pytest.mark.parametrize("script", [SAM, PRUNE])
def test_compile_fixes_run_through_dynamo(one_thread, monkeypatch, capsys, script):
    """The compile fixes traced by Dynamo and run through AOTAutograd, eagerly (no Inductor build)."""
    shared.compile_through_dynamo(one_thread, importlib.import_module(script), script, monkeypatch, capsys)


# --- SAM -----------------------------------------------------------------------------------------

def _sam_run(torch, mod, foreach: bool, steps: int = 3):
    """Three SAM steps in float64 on fresh random parameters and gradients of a fixed quadratic,
    with the loops or the foreach ops: the parameters after each step."""
    g = torch.Generator().manual_seed(11)
    params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64, generator=g)) for s in ((3, 4), (5,), (2, 2, 2))]
    targets = [torch.randn(p.shape, dtype=torch.float64, generator=g) for p in params]
    base = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sam = mod.SAM(params, base, rho=0.05, foreach=foreach)
    out = []
    for _ in range(steps):
        sum(((p - t) ** 4).sum() for p, t in zip(params, targets)).backward()
        sam.first_step()
        sum(((p - t) ** 4).sum() for p, t in zip(params, targets)).backward()
        sam.second_step()
        out.append([p.detach().clone() for p in params])
    return params, targets, out


def test_foreach_sam_is_the_looped_sam(one_thread):
    torch = one_thread
    mod = importlib.import_module(SAM)
    _, _, loop = _sam_run(torch, mod, False)
    _, _, fe = _sam_run(torch, mod, True)
    for a, b in zip(loop, fe):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_sam_step_against_the_update_written_out(one_thread):
    """One step: the gradient at w + rho g / |g| taken at the perturbed weights, applied to w by
    plain SGD (no momentum yet on a first step: the buffer is that gradient)."""
    torch = one_thread
    mod = importlib.import_module(SAM)
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(6, dtype=torch.float64, generator=g)
    t = torch.randn(6, dtype=torch.float64, generator=g)
    for foreach in (False, True):
        w = torch.nn.Parameter(w0.clone())
        sam = mod.SAM([w], torch.optim.SGD([w], lr=0.1), rho=0.05, foreach=foreach)
        ((w - t) ** 4).sum().backward()
        sam.first_step()
        ((w - t) ** 4).sum().backward()
        sam.second_step()
        g1 = 4 * (w0 - t) ** 3
        e = 0.05 * g1 / (g1.norm() + 1e-12)
        g2 = 4 * (w0 + e - t) ** 3
        torch.testing.assert_close(w.detach(), w0 - 0.1 * g2, rtol=1e-12, atol=1e-12)


def test_sam_fixes_keep_the_training(one_thread):
    torch = one_thread
    mod = importlib.import_module(SAM)
    base = mod.build(small(), set(), torch.device("cpu"))
    first = [base().item() for _ in range(3)]
    for fixes in ({"foreach_sam"}, {"fused_sgd"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        got = [step().item() for _ in range(3)]
        assert got == pytest.approx(first, rel=1e-4), fixes


# --- global pruning ------------------------------------------------------------------------------

def test_sorted_threshold_is_kthvalue_and_prunes_half(one_thread):
    torch = one_thread
    mod = importlib.import_module(PRUNE)
    g = torch.Generator().manual_seed(8)
    ws = [torch.randn(s, dtype=torch.float64, generator=g) for s in ((17, 9), (33,), (4, 4, 5))]
    a, b = mod.threshold(ws, False), mod.threshold(ws, True)
    assert a.item() == b.item()
    mags = torch.cat([w.abs().flatten() for w in ws])
    assert int((mags <= a).sum()) == int(mod.SPARSITY * mags.numel())


def test_pruning_leaves_the_target_sparsity_and_every_100_keeps_the_mask(one_thread):
    torch = one_thread
    mod = importlib.import_module(PRUNE)
    for fixes in (set(), {"sort_threshold"}, {"every_100"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        for _ in range(3):
            step()
        zero = sum(int((w == 0).sum()) for w in step.weights)
        total = sum(w.numel() for w in step.weights)
        assert zero >= int(mod.SPARSITY * total), fixes
    step = mod.build(small(), {"every_100"}, torch.device("cpu"))
    step()
    masks = [m.clone() for m in step.state["masks"]]
    step()
    assert all(torch.equal(a, b) for a, b in zip(masks, step.state["masks"]))


def test_prune_fixes_keep_the_training(one_thread):
    torch = one_thread
    mod = importlib.import_module(PRUNE)
    base = mod.build(small(), set(), torch.device("cpu"))
    first = [base().item() for _ in range(3)]
    for fixes in ({"sort_threshold"}, {"fused_adamw"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        assert [step().item() for _ in range(3)] == pytest.approx(first, rel=1e-4), fixes


# --- PixelCNN ------------------------------------------------------------------------------------

def test_masked_convolutions_see_only_earlier_pixels(one_thread):
    """The network's output at each pixel, in float64, does not move when any later pixel (in
    raster order) or the pixel itself changes: mask A hides the centre, mask B only later ones."""
    torch = one_thread
    mod = importlib.import_module(PIXEL)
    torch.manual_seed(0)
    net = mod.PixelCNN(8, 2).double().eval()
    size = 6
    g = torch.Generator().manual_seed(4)
    x = torch.rand(1, 1, size, size, dtype=torch.float64, generator=g)
    with torch.no_grad():
        y = net(x)
        for k in range(size * size):
            x2 = x.clone()
            x2.view(-1)[k:] = torch.rand(size * size - k, dtype=torch.float64, generator=g)
            y2 = net(x2)
            # positions up to k (raster order) see nothing changed at k or later
            torch.testing.assert_close(y2.view(-1)[:k + 1], y.view(-1)[:k + 1], rtol=0, atol=0)
            if k + 1 < size * size:
                assert not torch.equal(y2.view(-1)[k + 1:], y.view(-1)[k + 1:])


def test_sampler_draws_binary_images(one_thread):
    torch = one_thread
    mod = importlib.import_module(PIXEL)
    step = mod.build(small(), set(), torch.device("cpu"))
    img = step()
    assert set(img.unique().tolist()) <= {0.0, 1.0}
    assert img.shape == step.img.shape


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "x", ROOT)

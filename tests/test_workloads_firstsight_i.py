"""The first-sight what-if programs of set I (scripts/whatif/programs_firstsight_i.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the PINN's residual the equation's, the same LAMB update looped, without waits or at once,
the same labels accumulated on the host or the device), and the registry's entries checked
against the programs they name."""
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
from whatif.programs_firstsight_i import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_pinn_burgers_train", "baseline,fused_adam,tf32"),
         ("w_lamb_python_optim_train", "baseline,no_sync,foreach"),
         ("w_sliding_window_infer", "baseline,gpu_accumulate,batched")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small(**kw):
    import argparse
    return argparse.Namespace(small=True, **kw)


def test_the_pinn_residual_is_burgers_equation_by_autograd(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_pinn_burgers_train")

    def u(xt):  # u = x^2 t: u_x = 2xt, u_t = x^2, u_xx = 2t
        return (xt[:, :1] ** 2 * xt[:, 1:]).sin().asin()   # a graph of several ops, the same function
    xt = torch.rand(64, 2, dtype=torch.float64) * 0.8
    x, t = xt[:, :1].clone(), xt[:, 1:].clone()
    want = x ** 2 + x ** 2 * t * 2 * x * t - mod.NU * 2 * t
    assert torch.allclose(mod.residual(u, xt), want, atol=1e-10)


def test_lamb_updates_the_same_looped_without_waits_or_at_once(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_lamb_python_optim_train")
    torch.manual_seed(1)
    shapes = [(6, 5), (5,), (3, 3)]
    start = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(3)]
    after = {}
    for mode in ("loop", "no_sync", "foreach"):
        ps = [p.clone().requires_grad_(True) for p in start]
        opt = mod.Lamb(ps, lr=0.1, mode=mode)
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        after[mode] = [p.detach() for p in ps]
    # the float64 reference of LAMB's three steps for the first parameter
    p, m, v = start[0].clone(), torch.zeros(shapes[0], dtype=torch.float64), torch.zeros(shapes[0], dtype=torch.float64)
    for t, gs in enumerate(grads, 1):
        m = 0.9 * m + 0.1 * gs[0]
        v = 0.999 * v + 0.001 * gs[0] ** 2
        upd = (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-6) + 0.01 * p
        p = p - 0.1 * (p.norm() / upd.norm()) * upd
    assert not torch.allclose(after["loop"][0], start[0])
    assert torch.allclose(after["loop"][0], p, atol=1e-12)
    for mode in ("no_sync", "foreach"):
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(after[mode], after["loop"])), mode


def test_windows_cover_the_volume_and_host_and_device_accumulation_agree(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_sliding_window_infer")
    for size, window in ((160, 96), (24, 16), (100, 96), (96, 96)):
        at = mod.starts(size, window, 0.25)
        covered = torch.zeros(size, dtype=torch.bool)
        for a in at:
            covered[a:a + window] = True
        assert covered.all() and at[-1] == size - window and at == sorted(set(at)), (size, at)
    dev = torch.device("cpu")
    labels = {}
    for fixes in (frozenset(), frozenset({"gpu_accumulate"}), frozenset({"batched"})):
        step = mod.build(small(), set(fixes), dev)
        labels[fixes] = [step() for _ in range(2)]
    base = labels[frozenset()]
    assert base[0].shape == (24, 24, 24) and len(set(base[0].ravel().tolist())) > 1
    for fixes, got in labels.items():
        assert all((a == b).mean() > 0.999 for a, b in zip(got, base)), fixes


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "i", ROOT)

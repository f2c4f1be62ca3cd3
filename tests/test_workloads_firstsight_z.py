"""The first-sight what-if programs of set Z (scripts/whatif/programs_firstsight_z.py) on the
CPU: each program's own loop and one --interleave run on its --small model, the compiling fix
through Dynamo with an eager backend, what each fix must keep against float64 references (the
cached orthogonal weight's loss and gradients against the uncached, and its orthogonality; the
frozen probe's classifier gradient against the unfrozen; DINO's grouped crops against one crop
at a time, and its loss against the pairs written out), and the registry's entries checked."""
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
from whatif.programs_firstsight_z import PROGRAMS  # noqa: E402

ORTHO, PROBE, DINO = "w_orthogonal_rnn_train", "w_linear_probe_train", "w_multicrop_dino_train"
CASES = [(ORTHO, "baseline,cached,bf16,fused_adam"),
         (PROBE, "baseline,frozen,channels_last"),
         (DINO, "baseline,grouped,bf16,channels_last")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_compile_fix_runs_through_dynamo(one_thread, monkeypatch, capsys):
    shared.compile_through_dynamo(one_thread, importlib.import_module(PROBE), PROBE, monkeypatch, capsys)


def test_cached_orthogonal_weight_is_the_uncached_one(one_thread):
    torch = one_thread
    from torch.nn.utils import parametrize
    mod = importlib.import_module(ORTHO)
    torch.manual_seed(1)
    model = mod.OrthoRNN(3, 5, 2).double()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 3, dtype=torch.float64, generator=g)
    y = torch.randint(0, 2, (4,), generator=g)
    runs = []
    for cached in (False, True):
        model.zero_grad(set_to_none=True)
        if cached:
            with parametrize.cached():
                loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        runs.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    # orthogonal to the float32 precision its base was made in (before .double())
    w = model.rec.weight.detach()
    torch.testing.assert_close(w.T @ w, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-6)


def test_frozen_probe_trains_the_classifier_alike(one_thread):
    """The classifier's gradient is the same with the backbone frozen; the backbone gets none."""
    torch = one_thread
    mod = importlib.import_module(PROBE)
    grads = []
    for frozen in (False, True):
        torch.manual_seed(3)
        model = mod.Probe((4, 8), 3).double()
        if frozen:
            model.backbone.requires_grad_(False)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(5, 3, 16, 16, dtype=torch.float64, generator=g)
        y = torch.randint(0, 3, (5,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.head.parameters()])
        assert all((p.grad is None) == frozen for p in model.backbone.parameters())
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_grouped_crops_are_one_crop_at_a_time_and_the_loss_its_pairs(one_thread):
    """With BatchNorm on its running statistics (eval), a resolution's crops through the network
    together give each crop's own outputs; the loss is the mean of its 2 x 7 pair terms."""
    torch = one_thread
    F = torch.nn.functional
    mod = importlib.import_module(DINO)
    torch.manual_seed(5)
    net = mod.Net((4, 8), 8, 4, 6).double().eval()
    g = torch.Generator().manual_seed(6)
    glob = torch.randn(2 * 3, 3, 16, 16, dtype=torch.float64, generator=g)
    loc = torch.randn(6 * 3, 3, 8, 8, dtype=torch.float64, generator=g)
    with torch.no_grad():
        together = list(net(glob).chunk(2)) + list(net(loc).chunk(6))
        apart = [net(c) for c in (*glob.chunk(2), *loc.chunk(6))]
        for a, b in zip(apart, together):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
        center = torch.randn(6, dtype=torch.float64, generator=g)
        teacher = [net(c).detach() for c in glob.chunk(2)]
        want, n = 0.0, 0
        for i in range(2):
            q = F.softmax((teacher[i] - center) / mod.T_TEACHER, dim=-1)
            for v in range(8):
                if v != i:
                    want += float(-(q * F.log_softmax(apart[v] / mod.T_STUDENT, dim=-1)).sum(-1).mean())
                    n += 1
        assert n == 14
        assert float(mod.dino_loss(apart, teacher, center)) == pytest.approx(want / n, rel=1e-12)


def test_compile_reduce_overhead_fix_runs_through_dynamo(one_thread, monkeypatch, capsys):
    shared.compile_through_dynamo(one_thread, importlib.import_module(DINO), DINO, monkeypatch, capsys,
                                  fix="compile_reduce_overhead")


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "z", ROOT)

"""The first-sight what-if programs of set Q (scripts/whatif/programs_firstsight_q.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same training whatever cuDNN's benchmark mode, lengths padded up to whole buckets; the same exact
divergence from one batched backward as from a loop of them, and Hutchinson's estimate the
quadratic form it stands for; DGCNN's neighbours the true nearest ones), and the registry's
entries checked against the programs they name."""
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
from whatif.programs_firstsight_q import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_cnf_exact_divergence_train", "baseline,batched_grads,hutchinson"),
         ("w_dgcnn_knn_train", "baseline,tf32")]


@pytest.fixture
def benchmark_restored():
    """The audio program sets cuDNN's benchmark mode for the process; put it back after."""
    import torch
    was = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = was


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, benchmark_restored, monkeypatch, tmp_path, capsys,
                                                  script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_audio_program_loops_but_refuses_to_interleave(one_thread, benchmark_restored, monkeypatch, capsys, tmp_path):
    # cuDNN's benchmark cache is the process's: variants in one process would time each other's
    # benchmarking (interleaved on an H100, the baseline ran 8.2 ms an iteration; alone 784 ms)
    import sys
    mod = importlib.import_module("w_varlen_conv_benchmark_train")
    base = ["prog", "--device", "cpu", "--small", "--steps", "2"]
    monkeypatch.setattr(sys, "argv", base)
    mod.main()
    assert "w_varlen_conv_benchmark_train: 2 " in capsys.readouterr().out
    for variants in ("baseline,no_benchmark", "baseline,bucketed", "baseline,bf16"):
        monkeypatch.setattr(sys, "argv", [*base, "--interleave", str(tmp_path / "ab.json"), "--variants", variants])
        with pytest.raises(SystemExit, match="benchmark cache"):
            mod.main()
    assert not next(e for e in PROGRAMS if e["name"] == "varlen_conv_benchmark_train").get("interleave")


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_benchmark_mode_and_buckets_keep_the_training(one_thread, benchmark_restored):
    torch = one_thread
    mod = importlib.import_module("w_varlen_conv_benchmark_train")
    assert mod.padded_length([31_999, 40_000], 0) == 40_000
    assert mod.padded_length([31_999, 40_000], 16_000) == 48_000 and mod.padded_length([32_000], 16_000) == 32_000
    # each variant sets its own mode at every step (the mode is the process's)
    for fixes, mode in ((set(), True), ({"no_benchmark"}, False), ({"bucketed"}, True)):
        step = mod.build(small(), fixes, torch.device("cpu"))
        torch.backends.cudnn.benchmark = not mode
        step()
        assert torch.backends.cudnn.benchmark is mode
    # benchmark mode does not change the arithmetic: the same losses without it (on the CPU, exactly)
    runs = [[mod.build(small(), fx, torch.device("cpu"))() for _ in range(1)] for fx in (set(), {"no_benchmark"})]
    assert runs[0][0].item() == runs[1][0].item()
    assert mod.Encoder(8, 4, 3)(torch.randn(2, 1000)).shape == (2, 3)


def test_batched_divergence_is_the_loops_and_hutchinson_its_quadratic_form(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_cnf_exact_divergence_train")
    torch.manual_seed(0)
    model = mod.Dynamics(5, 16).double()
    z = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    f = model(z, 0.25)
    loop, batched = mod.divergence_loop(f, z), mod.divergence_batched(f, z)
    jac = torch.autograd.functional.jacobian(lambda v: model(v, 0.25), z.detach())  # [b, i, b', j]
    exact = torch.stack([jac[b, :, b, :].trace() for b in range(7)])
    assert torch.allclose(loop, exact, rtol=1e-12) and torch.allclose(batched, exact, rtol=1e-12)
    e = torch.randn(7, 5, dtype=torch.float64)
    quad = torch.stack([e[b] @ jac[b, :, b, :] @ e[b] for b in range(7)])
    assert torch.allclose(mod.divergence_hutchinson(f, z, e), quad, rtol=1e-12)
    # the loss's own gradients (a double backward) agree between the loop and the batched call
    grads = []
    for div in ("loop", "batched"):
        model.zero_grad()
        mod.negative_log_likelihood(model, torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3)),
                                    3, div).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(*grads))
    # the exact variants train alike; the estimate trains on its own objective
    losses = []
    for fixes in (set(), {"batched_grads"}, {"tf32"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses.append([step().item() for _ in range(3)])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[2] == losses[0]
    step = mod.build(small(), {"hutchinson"}, torch.device("cpu"))
    assert all(x == x and abs(x) < 1e4 for x in (step().item() for _ in range(3)))


def test_dgcnn_neighbours_are_the_nearest_points(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_dgcnn_knn_train")
    torch.manual_seed(0)
    x = torch.randn(3, 4, 50, dtype=torch.float64)
    idx = mod.knn(x, 6)
    dist = torch.cdist(x.transpose(1, 2), x.transpose(1, 2))
    ref = dist.topk(6, dim=-1, largest=False)[1]
    assert torch.equal(idx.sort(-1)[0], ref.sort(-1)[0]) and torch.equal(idx[..., 0], torch.arange(50).expand(3, 50))
    feat = mod.graph_feature(x, 6)
    assert feat.shape == (3, 8, 50, 6)
    b, p, j = 1, 17, 3
    n = idx[b, p, j]
    assert torch.equal(feat[b, :4, p, j], x[b, :, n] - x[b, :, p]) and torch.equal(feat[b, 4:, p, j], x[b, :, p])
    for fixes in (set(), {"bf16"}, {"tf32"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses = [step().item() for _ in range(3)]
        assert all(0.0 < x < 6.0 for x in losses)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, ["w_varlen_conv_benchmark_train", *(c[0] for c in CASES)], "q", ROOT)

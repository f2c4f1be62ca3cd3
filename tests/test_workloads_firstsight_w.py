"""The first-sight what-if programs of set W (scripts/whatif/programs_firstsight_w.py) on the
CPU: each program's own loop and one --interleave run on its --small model, the compiling fixes
through Dynamo with an eager backend (Inductor's CPU builds take minutes), what each fix must keep
against float64 references (the Dormand-Prince step against its stability function and its
orders, the adaptive solvers against known solutions with the control on either side, RK4's
steps; the matchers' assignments against every permutation, the greedy one on the GPU's side
against NumPy's, the batched cost against the per-image one, the GIoU against its definition;
the vectorised batch-hard triplet loss and its gradient against the loop's), and the registry's
entries checked against the programs they name."""
from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_w import PROGRAMS  # noqa: E402

ODE, DETR, METRIC = "w_neural_ode_adaptive_train", "w_detr_matching_train", "w_metric_mining_train"
CASES = [(ODE, "baseline,fixed_rk4,gpu_control,bf16"),
         (DETR, "baseline,batched_cost,gpu_greedy,bf16,fused_adamw"),
         (METRIC, "baseline,vectorised_mining,channels_last_bf16,fused_adamw")]


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def _train(mod, fixes, steps=3):
    """A program built small on the CPU with ``fixes`` and its first ``steps`` losses."""
    step = mod.build(small(), fixes, mod.torch.device("cpu"))
    return step, [step().item() for _ in range(steps)]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


@pytest.mark.parametrize("script", [ODE, METRIC])
def test_compile_fixes_run_through_dynamo(one_thread, monkeypatch, capsys, script):
    """The compile fixes traced by Dynamo and run through AOTAutograd, eagerly (no Inductor build)."""
    shared.compile_through_dynamo(one_thread, importlib.import_module(script), script, monkeypatch, capsys)


# --- the neural ODE ------------------------------------------------------------------------------

def _tableau(mod) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dormand-Prince's 7-stage matrix (its last row the 5th-order weights: first same as last),
    its 5th-order weights and its error weights, as arrays."""
    a = np.zeros((7, 7))
    for i, row in enumerate(mod.A):
        a[i + 1, :len(row)] = row
    a[6, :6] = mod.B
    return a, np.array([*mod.B, 0.0]), np.array(mod.E)


def test_dormand_prince_step_against_its_stability_function_and_orders(one_thread):
    torch = one_thread
    mod = importlib.import_module(ODE)
    a, b, e = _tableau(mod)
    # the tableau is the method: consistent rows, weights of a 5th-order and a 4th-order solution
    assert np.allclose(a.sum(1), [0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1, 1], atol=1e-15)
    assert b.sum() == pytest.approx(1.0, abs=1e-15) and e.sum() == pytest.approx(0.0, abs=1e-15)
    torch.manual_seed(0)
    for lam in (-1.0, -3.7, 0.8):
        y0 = torch.randn(5, 3, dtype=torch.float64)
        f = functools.partial(torch.mul, other=lam)          # dy/dt = lam y
        for h in (0.3, 0.05):
            # on a linear ODE each stage is a fixed multiple of y: (I - zA)^-1 1 lam y, z = h lam
            z = h * lam
            stages = np.linalg.solve(np.eye(7) - z * a, np.ones(7))
            y_new, err, k7 = mod.dopri5_step(f, y0, f(y0), h)
            assert torch.allclose(y_new, (1 + z * b @ stages) * y0, rtol=1e-13, atol=0)
            assert torch.allclose(err, (z * e @ stages) * y0, rtol=1e-10, atol=1e-18)
            assert torch.allclose(k7, lam * y_new, rtol=1e-15, atol=0)
    # the local error of the 5th-order solution falls as h^6, the estimate as h^5
    f = torch.neg
    y0 = torch.ones(1, dtype=torch.float64)
    local, est = [], []
    for h in (0.2, 0.1, 0.05):
        y_new, err, _ = mod.dopri5_step(f, y0, f(y0), h)
        local.append(abs(y_new.item() - math.exp(-h)))
        est.append(abs(err.item()))
    assert 50 < local[0] / local[1] < 80 and 50 < local[1] / local[2] < 80
    assert 28 < est[0] / est[1] < 36 and 28 < est[1] / est[2] < 36


def test_adaptive_solvers_reach_known_solutions_with_the_control_on_either_side(one_thread):
    torch = one_thread
    mod = importlib.import_module(ODE)
    torch.manual_seed(0)
    y0 = torch.randn(6, 2, dtype=torch.float64)
    t1 = 3.0

    def rotation(y):   # dy/dt = [[0, -1], [1, 0]] y on each row: y(t) is y(0) rotated by t
        return torch.stack([-y[:, 1], y[:, 0]], 1)

    c, s = math.cos(t1), math.sin(t1)
    exact = {torch.neg: math.exp(-t1) * y0,
             rotation: torch.stack([c * y0[:, 0] - s * y0[:, 1], s * y0[:, 0] + c * y0[:, 1]], 1)}
    for f, want in exact.items():
        for tol, err_max in ((1e-6, 2e-5), (1e-9, 2e-8)):
            stats = mod.Stats()
            host = mod.odeint_host(f, y0, t1, tol, tol, stats=stats)
            assert (host - want).abs().max().item() < err_max, (f, tol)
            attempts = stats.attempts
            assert attempts >= 3 and stats.nfe == 1 + 6 * attempts
            # the same attempts decided on the "GPU": the same state, the end reached; the attempts
            # past the end change nothing
            for n in (attempts, attempts + 5):
                got, reached = mod.odeint_gpu(f, y0, t1, tol, tol, attempts=n)
                assert reached.item() == pytest.approx(t1, abs=1e-12), (f, tol, n)
                assert torch.allclose(got, host, rtol=1e-12, atol=1e-14), (f, tol, n)
            # too few attempts: short of the end, the state of an earlier time
            got, reached = mod.odeint_gpu(f, y0, t1, tol, tol, attempts=attempts - 2)
            assert reached.item() < t1 and (got - want).abs().max().item() > 10 * err_max
    # a first step far too long is rejected, then shrunk: the solution is kept to the tolerance
    stats = mod.Stats()
    got = mod.odeint_host(torch.neg, y0, t1, 1e-8, 1e-8, h0=2.5, stats=stats)
    assert stats.accepted < stats.attempts and (got - exact[torch.neg]).abs().max().item() < 1e-6
    got_gpu, _ = mod.odeint_gpu(torch.neg, y0, t1, 1e-8, 1e-8, h0=2.5, attempts=stats.attempts)
    assert torch.allclose(got_gpu, got, rtol=1e-12, atol=1e-14)


def test_rk4_steps_are_the_classical_method(one_thread):
    torch = one_thread
    mod = importlib.import_module(ODE)
    y0 = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    for steps in (4, 19):
        z = -3.0 / steps
        r4 = 1 + z + z ** 2 / 2 + z ** 3 / 6 + z ** 4 / 24     # RK4's stability function
        stats = mod.Stats()
        got = mod.odeint_rk4(torch.neg, y0, 3.0, steps, stats=stats)
        assert torch.allclose(got, r4 ** steps * y0, rtol=1e-13, atol=0)
        assert stats.nfe == 4 * steps
    # fourth order: halving the step cuts the error ~16 times
    e1 = (mod.odeint_rk4(torch.neg, y0, 3.0, 20) - math.exp(-3) * y0).abs().max().item()
    e2 = (mod.odeint_rk4(torch.neg, y0, 3.0, 40) - math.exp(-3) * y0).abs().max().item()
    assert 13 < e1 / e2 < 19


def test_ode_fixes_keep_the_training(one_thread):
    mod = importlib.import_module(ODE)

    base, base_losses = _train(mod, set())
    attempts, accepted, nfe = base.block.stats.per_solve()
    assert all(math.isfinite(v) for v in base_losses) and 3 <= attempts <= mod.MAX_ATTEMPTS and accepted <= attempts
    # the GPU's control takes the host's decisions: the same losses, the end reached
    step, losses = _train(mod, {"gpu_control"})
    assert losses == pytest.approx(base_losses, rel=1e-5) and step.block.reached.item() == pytest.approx(3.0)
    assert step.block.stats.nfe == 3 * (1 + 6 * mod.MAX_ATTEMPTS)
    # RK4 of about as many evaluations: the same losses to the solvers' tolerance
    step, losses = _train(mod, {"fixed_rk4"})
    assert losses == pytest.approx(base_losses, rel=1e-3) and step.block.stats.nfe == 3 * 4 * mod.RK4_STEPS
    # bf16: its rounding is far above the tolerance, so the solver takes many more attempts
    step, losses = _train(mod, {"bf16"}, steps=1)
    assert losses[0] == pytest.approx(base_losses[0], rel=0.02)
    assert step.block.stats.per_solve()[0] > 3 * attempts


# --- DETR ----------------------------------------------------------------------------------------

def _brute_force(c: np.ndarray) -> float:
    """The least total cost of matching every column of ``c`` [Q, T] (Q >= T) to its own row."""
    q, t = c.shape
    return min(sum(c[rows[j], j] for j in range(t)) for rows in itertools.permutations(range(q), t))


def _check_matching(rows, cols, q: int, t: int) -> None:
    rows, cols = np.asarray(rows), np.asarray(cols)
    assert len(rows) == len(cols) == t and sorted(cols.tolist()) == list(range(t))
    assert len(set(rows.tolist())) == t and all(0 <= r < q for r in rows)


def test_hungarian_matching_is_the_optimum():
    pytest.importorskip("scipy")
    mod = importlib.import_module(DETR)
    assert mod.MATCHER == "hungarian"
    rng = np.random.default_rng(0)
    for q, t in ((5, 3), (6, 4), (7, 7), (8, 2)):
        for _ in range(5):
            c = rng.normal(size=(q, t))
            rows, cols = mod.solve(c)
            _check_matching(rows, cols, q, t)
            assert c[rows, cols].sum() == pytest.approx(_brute_force(c), abs=1e-12)


def test_greedy_matchers_agree_and_are_valid_matchings(one_thread):
    torch = one_thread
    mod = importlib.import_module(DETR)
    rng = np.random.default_rng(1)
    worse = 0
    for q, t in ((5, 3), (6, 4), (7, 7), (8, 2)):
        for _ in range(8):
            c = rng.normal(size=(q, t))
            rows, cols = mod.greedy_numpy(c)
            _check_matching(rows, cols, q, t)
            best = _brute_force(c)
            total = c[rows, cols].sum()
            assert total >= best - 1e-12
            worse += total > best + 1e-12
            if mod.MATCHER == "greedy":
                assert np.array_equal(mod.solve(c)[0], rows) and np.array_equal(mod.solve(c)[1], cols)
    assert worse > 0                       # greedy is an approximation: it misses the optimum at times
    # on the GPU's side: all matrices at once, padded columns at inf, the same pairs as NumPy's
    n, q, t = 6, 9, 5
    counts = [5, 1, 3, 4, 2, 5]
    cost = torch.from_numpy(rng.normal(size=(n, q, t)))
    for i, k in enumerate(counts):
        cost[i, :, k:] = math.inf
    assign = mod.greedy_torch(cost, max(counts))
    for i, k in enumerate(counts):
        rows, cols = mod.greedy_numpy(cost[i, :, :k].numpy())
        assert assign[i, k:].eq(-1).all() and assign[i, cols].tolist() == rows.tolist(), i
    # a matrix whose diagonal is far cheapest: greedy finds the optimum
    c = rng.uniform(1, 2, size=(6, 6)) - 10 * np.eye(6)
    assert mod.greedy_torch(torch.from_numpy(c)[None], 6)[0].tolist() == list(range(6))


def _giou(a, b) -> float:
    """GIoU of two (x0, y0, x1, y1) boxes by its definition."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    hull = (max(a[2], b[2]) - min(a[0], b[0])) * (max(a[3], b[3]) - min(a[1], b[1]))
    return inter / union - (hull - union) / hull


def test_generalized_box_iou_against_its_definition(one_thread):
    torch = one_thread
    mod = importlib.import_module(DETR)
    torch.manual_seed(0)
    f64 = torch.float64
    cxcywh = torch.cat([torch.rand(2, 7, 2, dtype=f64), torch.rand(2, 7, 2, dtype=f64) * 0.5 + 0.01], -1)
    xyxy = mod.box_cxcywh_to_xyxy(cxcywh)
    assert torch.allclose(xyxy[..., 2:] - xyxy[..., :2], cxcywh[..., 2:], atol=1e-15)
    got = mod.generalized_box_iou(xyxy[:, :4], xyxy[:, 4:])          # batched: [2, 4, 3]
    for bi in range(2):
        for i in range(4):
            for j in range(3):
                want = _giou(xyxy[bi, i].tolist(), xyxy[bi, 4 + j].tolist())
                assert got[bi, i, j].item() == pytest.approx(want, abs=1e-12)
    same = mod.generalized_box_iou(xyxy[0], xyxy[0]).diagonal()
    assert torch.allclose(same, torch.ones(7, dtype=torch.float64))


def _outputs(torch, mod, layers, batch, q, classes, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, batch, q, classes + 1, generator=g)
    boxes = torch.rand(layers, batch, q, 4, generator=g) * 0.5 + 0.25
    targets = mod.to_device(mod.random_targets(batch, classes, 1, 6, g), torch.device("cpu"))
    return logits, boxes, targets


def test_batched_cost_and_matchers_against_the_per_image_ones(one_thread):
    torch = one_thread
    mod = importlib.import_module(DETR)
    logits, boxes, targets = _outputs(torch, mod, 2, 4, 10, 5, seed=3)
    labels, tboxes, counts = mod.pad_targets(targets)
    batched = mod.match_cost(logits, boxes, labels[None], tboxes[None])
    assert batched.shape == (2, 4, 10, max(counts))
    for li in range(2):
        for b, t in enumerate(targets):
            one = mod.match_cost(logits[li, b], boxes[li, b], t["labels"], t["boxes"])
            assert torch.allclose(batched[li, b, :, :counts[b]], one, atol=1e-6)
            # the cost's terms: -p(class) + 5 * L1 + 2 * -GIoU
            p = logits[li, b].softmax(-1)
            j = 0
            want = (-p[:, t["labels"][j]] + 5 * (boxes[li, b] - t["boxes"][j]).abs().sum(-1)
                    - 2 * mod.generalized_box_iou(mod.box_cxcywh_to_xyxy(boxes[li, b]),
                                                  mod.box_cxcywh_to_xyxy(t["boxes"][j:j + 1]))[:, 0])
            assert torch.allclose(one[:, j], want, atol=1e-5)
    per_image = mod.Matcher("per_image")(logits, boxes, targets)
    batched_idx = mod.Matcher("batched")(logits, boxes, targets)
    greedy = mod.Matcher("gpu_greedy")(logits, boxes, targets)
    for li in range(2):
        for b, t in enumerate(targets):
            (r1, c1), (r2, c2) = per_image[li][b], batched_idx[li][b]
            assert torch.equal(r1, r2) and torch.equal(c1, c2)
            _check_matching(r1, c1, 10, counts[b])
            # the GPU's greedy: the query of each target, as NumPy's greedy matches them
            rows, cols = mod.greedy_numpy(batched[li, b, :, :counts[b]].numpy())
            src, tgt = greedy[li][b]
            assert tgt.tolist() == list(range(counts[b]))
            assert sorted(zip(src.tolist(), tgt.tolist())) == sorted(zip(rows.tolist(), cols.tolist()))


def test_detr_fixes_keep_the_training(one_thread):
    mod = importlib.import_module(DETR)

    base, base_losses = _train(mod, set())
    assert all(math.isfinite(v) and v > 0 for v in base_losses)
    step, losses = _train(mod, {"batched_cost"})
    assert losses == pytest.approx(base_losses, rel=1e-5)
    step, losses = _train(mod, {"fused_adamw"})
    assert losses == pytest.approx(base_losses, rel=1e-4)
    step, losses = _train(mod, {"gpu_greedy"})
    assert all(math.isfinite(v) for v in losses)
    if mod.MATCHER == "greedy":            # the same matching on either side
        assert losses == pytest.approx(base_losses, rel=1e-5)
    else:                                  # another matching of the same predictions: a loss near
        assert losses[0] == pytest.approx(base_losses[0], rel=0.05)
    step, losses = _train(mod, {"bf16"}, steps=1)
    assert losses[0] == pytest.approx(base_losses[0], rel=0.03)


# --- metric learning -----------------------------------------------------------------------------

def test_vectorised_batch_hard_loss_is_the_looped_one(one_thread):
    torch = one_thread
    mod = importlib.import_module(METRIC)
    f = torch.nn.functional
    for trial in range(6):
        torch.manual_seed(trial)
        if trial % 2:   # P x K
            labels = torch.arange(8).repeat_interleave(4)[torch.randperm(32)]
        else:           # groups of uneven sizes, two or more each
            labels = torch.cat([torch.full((n,), i) for i, n in enumerate((2, 5, 3, 2, 4))])
        emb = f.normalize(torch.randn(len(labels), 6, dtype=torch.float64), dim=1).requires_grad_()
        margin = 0.2 if trial < 3 else 1.5       # a margin past every gap: every anchor's hinge active
        loop = mod.batch_hard_loop(emb, labels, margin)
        vec = mod.batch_hard_vectorised(emb, labels, margin)
        assert vec.item() == pytest.approx(loop.item(), abs=1e-12), trial
        (g_loop,) = torch.autograd.grad(loop, emb)
        (g_vec,) = torch.autograd.grad(vec, emb)
        assert torch.allclose(g_vec, g_loop, atol=1e-10), trial
        # the loss by its definition, from the distances one pair at a time
        d = [[math.dist(a, b) for b in emb.tolist()] for a in emb.tolist()]
        lab = labels.tolist()
        want = sum(max(0.0, max(d[i][j] for j in range(len(lab)) if lab[j] == lab[i] and j != i)
                       - min(d[i][j] for j in range(len(lab)) if lab[j] != lab[i]) + margin)
                   for i in range(len(lab))) / len(lab)
        assert loop.item() == pytest.approx(want, abs=1e-12), trial


def test_metric_fixes_keep_the_training(one_thread):
    torch = one_thread
    mod = importlib.import_module(METRIC)
    cpu = torch.device("cpu")

    base, base_losses = _train(mod, set())
    assert all(math.isfinite(v) for v in base_losses)
    x, labels = mod.build(small(), set(), cpu).data.next(torch.contiguous_format)
    assert x.shape == (12, 3, 16, 16) and labels.tolist() == [v for v in labels[::3].tolist() for _ in range(3)]
    step, losses = _train(mod, {"vectorised_mining"})
    assert losses == pytest.approx(base_losses, rel=1e-5)
    step, losses = _train(mod, {"fused_adamw"})
    assert losses == pytest.approx(base_losses, rel=1e-4)
    step, losses = _train(mod, {"channels_last_bf16"}, steps=1)
    assert losses[0] == pytest.approx(base_losses[0], abs=0.05)
    assert step.model.body[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "w", ROOT)

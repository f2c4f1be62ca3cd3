"""The first-sight what-if programs of set U (scripts/whatif/programs_firstsight_u.py) on the
CPU: each program's own loop and one --interleave run on its --small model (Faster R-CNN through a
stand-in for torchvision, absent in CI), what each fix must keep against float64 references
(Shampoo's inverse fourth roots one by one or batched, and its step; the CRF's negative
log-likelihood against enumerating every tag path; the detector's random boxes), and the
registry's entries checked against the programs they name."""
from __future__ import annotations

import argparse
import importlib
import itertools
import sys
import types
from pathlib import Path

import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_u import PROGRAMS  # noqa: E402

DET = "w_fasterrcnn_train"
CASES = [("w_shampoo_precond_train", "baseline,every_10,batched_eigh,tf32"),
         ("w_bilstm_crf_train", "baseline,bf16"),
         (DET, "baseline,tf32,bf16,fewer_proposals")]


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


@pytest.fixture()
def det(one_thread, monkeypatch):
    """The detection program imported with a stand-in for torchvision: its
    ``fasterrcnn_mobilenet_v3_large_fpn`` a tiny module that takes the images and targets as
    torchvision's does and returns four losses; it refuses pretrained weights and keeps the
    sizes it was given (``made``)."""
    torch = one_thread
    made: list[dict] = []

    class TinyDetector(torch.nn.Module):
        def __init__(self, classes: int) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, 2, 1)
            self.head = torch.nn.Linear(4, classes)

        def forward(self, images, targets):
            assert len(images) == len(targets) and all(im.dim() == 3 for im in images)
            feats = torch.stack([self.conv(im[None]).mean((2, 3))[0] for im in images])
            logits = self.head(feats)
            labels = torch.stack([t["labels"][0] for t in targets])
            boxes = torch.cat([t["boxes"] for t in targets])
            return {"loss_classifier": torch.nn.functional.cross_entropy(logits, labels),
                    "loss_box_reg": 1e-3 * boxes.mean() * feats.mean(),
                    "loss_objectness": feats.pow(2).mean(), "loss_rpn_box_reg": feats.abs().mean()}

    def fasterrcnn_mobilenet_v3_large_fpn(*, weights=None, weights_backbone=None, num_classes=91, **kw):
        assert weights is None and weights_backbone is None
        made.append(kw)
        return TinyDetector(num_classes)

    detection = types.SimpleNamespace(fasterrcnn_mobilenet_v3_large_fpn=fasterrcnn_mobilenet_v3_large_fpn)
    vision = types.SimpleNamespace(models=types.SimpleNamespace(detection=detection))
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    monkeypatch.setitem(sys.modules, "torchvision.models", vision.models)
    monkeypatch.setitem(sys.modules, "torchvision.models.detection", detection)
    sys.modules.pop(DET, None)
    mod = importlib.import_module(DET)
    mod.made = made
    yield mod
    sys.modules.pop(DET, None)


@pytest.mark.parametrize("script,variants", CASES[:2], ids=[c[0] for c in CASES[:2]])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_detection_program_loops_and_interleaves_on_a_stand_in(det, monkeypatch, tmp_path, capsys):
    shared.loop_and_interleave(det, DET, CASES[2][1], monkeypatch, tmp_path, capsys)


def test_detection_sizes_and_random_boxes(det):
    torch = pytest.importorskip("torch")
    det.build(small(), set(), torch.device("cpu"))
    det.build(small(), {"fewer_proposals"}, torch.device("cpu"))
    # the images kept at their size; the recipe's sizes cut only by fewer_proposals
    assert det.made[0] == {"min_size": 128, "max_size": 128}
    assert det.made[1] == {"min_size": 128, "max_size": 128, "rpn_pre_nms_top_n_train": 600,
                           "rpn_post_nms_top_n_train": 600, "box_batch_size_per_image": 128}
    targets = det.random_targets(200, 512, torch.device("cpu"), torch.Generator().manual_seed(0))
    counts = [len(t["boxes"]) for t in targets]
    assert min(counts) == 2 and max(counts) == 8
    boxes = torch.cat([t["boxes"] for t in targets])
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert boxes.min() >= 0 and boxes.max() <= 512 and w.min() >= 16 and h.max() <= 256
    labels = torch.cat([t["labels"] for t in targets])
    assert labels.min() >= 1 and labels.max() <= det.CLASSES - 1


def test_the_real_fasterrcnn_trains_a_small_step(one_thread):
    pytest.importorskip("torchvision")
    torch = one_thread
    sys.modules.pop(DET, None)
    mod = importlib.import_module(DET)
    try:
        for fixes in (set(), {"fewer_proposals"}):
            step = mod.build(small(), fixes, torch.device("cpu"))
            losses = [step().item() for _ in range(2)]
            assert all(0.0 < v < 50.0 for v in losses), losses
    finally:
        sys.modules.pop(DET, None)


def test_shampoo_roots_and_step_against_float64(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_shampoo_precond_train")
    torch.manual_seed(0)
    factors = []
    for _ in range(3):
        g = torch.randn(6, 9, dtype=torch.float64)
        factors.append(g @ g.T)          # symmetric, positive semi-definite
    for batched in (False, True):
        roots = mod.inverse_roots(factors, batched, eps=1e-3)
        for a, r in zip(factors, roots, strict=True):
            # r^-4 is A + eps I: r @ r @ r @ r @ (A + eps I) = I
            prod = r @ r @ r @ r @ (a + 1e-3 * torch.eye(6, dtype=torch.float64))
            assert torch.allclose(prod, torch.eye(6, dtype=torch.float64), atol=1e-8)
            assert torch.allclose(r, r.T, atol=1e-12)
    # one optimizer step by hand: statistics, roots, grafted update with momentum (the first step: the update)
    w = torch.nn.Parameter(torch.randn(5, 4, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    w0, b0 = w.detach().clone(), b.detach().clone()
    w.grad, b.grad = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    opt = mod.Shampoo([w, b], lr=0.1)
    opt.step()
    g = w.grad
    eye = lambda n: torch.eye(n, dtype=torch.float64)  # noqa: E731
    # (L + eps I)^-1/4 by another route: the fourth root of the inverse, by its own eigendecomposition
    ev, vec = torch.linalg.eigh(torch.linalg.inv(g @ g.T + mod.EPS * eye(5)))
    l_inv4 = (vec * ev.pow(0.25)) @ vec.T
    ev, vec = torch.linalg.eigh(torch.linalg.inv(g.T @ g + mod.EPS * eye(4)))
    r_inv4 = (vec * ev.pow(0.25)) @ vec.T
    pre = l_inv4 @ g @ r_inv4
    want = w0 - 0.1 * pre * (g.norm() / pre.norm())
    assert torch.allclose(w.detach(), want, rtol=1e-6, atol=1e-9)
    assert torch.allclose(b.detach(), b0 - 0.1 * b.grad)


def test_shampoo_recomputes_the_roots_every_tenth_step(one_thread, monkeypatch):
    torch = one_thread
    mod = importlib.import_module("w_shampoo_precond_train")
    calls = []
    real = mod.inverse_roots
    monkeypatch.setattr(mod, "inverse_roots", lambda f, batched, **kw: calls.append(batched) or real(f, batched, **kw))
    for every, batched, want in ((1, False, 12), (10, True, 2)):
        calls.clear()
        w = torch.nn.Parameter(torch.randn(3, 3))
        opt = mod.Shampoo([w], every=every, batched=batched)
        for _ in range(12):
            w.grad = torch.randn(3, 3)
            opt.step()
        assert calls == [batched] * want


def _crf_by_enumeration(em, tags, lengths, trans, start, end):
    """The CRF's mean negative log-likelihood in float64 by enumerating every tag path of each
    sentence's real positions."""
    import torch
    out = []
    k = em.shape[2]
    for i, n in enumerate(lengths):
        def score(path):
            s = start[path[0]] + em[i, 0, path[0]]
            for t in range(1, n):
                s = s + trans[path[t - 1], path[t]] + em[i, t, path[t]]
            return s + end[path[n - 1]]
        log_z = torch.logsumexp(torch.stack([score(p) for p in itertools.product(range(k), repeat=n)]), 0)
        out.append(log_z - score(tags[i, :n].tolist()))
    return torch.stack(out).mean()


def test_crf_loss_against_every_path(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_bilstm_crf_train")
    torch.manual_seed(0)
    b, n, k = 3, 5, 3
    lengths = [5, 2, 4]
    mask = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    em = torch.randn(b, n, k, dtype=torch.float64, requires_grad=True)
    tags = torch.randint(0, k, (b, n)) * mask
    trans, start, end = (torch.randn(k, k, dtype=torch.float64), torch.randn(k, dtype=torch.float64),
                         torch.randn(k, dtype=torch.float64))
    got = mod.crf_nll(em, tags, mask, trans, start, end)
    want = _crf_by_enumeration(em, tags, lengths, trans, start, end)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    # the padded positions move nothing
    moved = em.detach().clone()
    moved[~mask] += 7.0
    assert mod.crf_nll(moved, tags, mask, trans, start, end).item() == pytest.approx(got.item(), rel=1e-12)
    # the gradient of the emissions: the marginals less the gold path's one-hot, over the batch
    (g,) = torch.autograd.grad(got, em)
    (gw,) = torch.autograd.grad(want, em)
    assert torch.allclose(g, gw, atol=1e-12)
    assert torch.all(g[~mask] == 0)


def test_crf_batches_are_padded_prefixes(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_bilstm_crf_train")
    torch.manual_seed(0)
    tokens, tags, mask = mod.random_batch(500, 16, 50, torch.device("cpu"), 4)
    lengths = mask.sum(1)
    assert int(lengths.min()) == 4 and int(lengths.max()) == 16
    # a prefix of each row, tokens 1.. and tags 0..16 within it, 0 past it
    assert torch.equal(mask, torch.arange(16)[None, :] < lengths[:, None])
    assert torch.all(tokens[mask] >= 1) and torch.all(tokens[~mask] == 0) and torch.all(tags[~mask] == 0)
    assert int(tags.max()) == mod.TAGS - 1


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "u", ROOT)

"""The first-sight what-if programs of set V (scripts/whatif/programs_firstsight_v.py) on the
CPU: each program's own loop and one --interleave run on its --small model (not the compile
variants: Inductor's CPU builds take minutes), what each fix must keep against float64 references
(speculative decoding token for token plain greedy decoding of its target, whichever draft,
acceptance and cache; RAFT's correlation pyramid and its lookup against bilinear sampling by
loops, its loss going down, each fix's flow against the baseline's; MoCo's moving average by loop
and by foreach, InfoNCE against its definition, the queue as it wraps around, the pointer on
either side), and the registry's entries checked against the programs they name."""
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
from whatif.programs_firstsight_v import PROGRAMS  # noqa: E402

SPEC, RAFT, MOCO = "w_speculative_decode_infer", "w_raft_flow_train", "w_moco_queue_train"
CASES = [(SPEC, "baseline,accept_on_gpu,static_cache,draft_k8"),
         (RAFT, "baseline,fewer_iters,channels_last_bf16"),
         (MOCO, "baseline,foreach_momentum,host_pointer,channels_last_bf16,fused_sgd")]


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


# --- speculative decoding ----------------------------------------------------------------------

def test_acceptance_counts_the_agreeing_prefix_on_either_side(one_thread):
    torch = one_thread
    mod = importlib.import_module(SPEC)
    drafts = torch.tensor([[5, 7, 9, 11]])
    for preds, want in (([[5, 7, 3, 11, 2]], 2), ([[5, 7, 9, 11, 2]], 4), ([[6, 7, 9, 11, 2]], 0),
                        ([[5, 8, 9, 11, 2]], 1)):
        for on_gpu in (False, True):
            assert mod.accepted(drafts, torch.tensor(preds), on_gpu) == want, (preds, on_gpu)


def test_speculative_decoding_is_greedy_decoding_of_the_target(one_thread):
    torch = one_thread
    mod = importlib.import_module(SPEC)
    vocab, d, heads, layers, prompt_len, new = 97, 32, 4, 2, 8, 12
    max_len = prompt_len + new + mod.MAX_K
    cpu, f64 = torch.device("cpu"), torch.float64
    torch.manual_seed(0)
    target = mod.Decoder(vocab, d, heads, layers, max_len).to(f64).eval()
    drafts = {
        "shared": mod.Decoder(vocab, d, heads, 1, max_len, shared=target),
        # the target's own blocks: every proposal is the target's token
        "same": mod.Decoder(vocab, d, heads, layers, max_len, shared=target),
        # nothing shared: hardly a proposal agrees
        "apart": mod.Decoder(vocab, d, heads, 1, max_len),
    }
    drafts["same"].blocks.load_state_dict(target.blocks.state_dict())
    for name, draft in drafts.items():
        draft.to(f64).eval()
        for trial in range(3):
            prompt = torch.randint(0, vocab, (1, prompt_len))
            want = mod.greedy(target, mod.CatCache(layers), prompt, new)
            for k in (4, 8):
                for on_gpu in (False, True):
                    for static in (False, True):
                        caches = [mod.make_cache(static, m, heads, max_len, cpu, f64) for m in (target, draft)]
                        spec = mod.Speculator(target, draft, *caches, k, on_gpu)
                        got = spec.generate(prompt, new)
                        assert torch.equal(got, want), (name, trial, k, on_gpu, static)
                        if name == "same":
                            assert spec.kept == spec.proposed and spec.rounds == math.ceil((new - 1) / (k + 1))
                        if name == "shared" and trial == 0:
                            assert 0 < spec.kept < spec.proposed   # both of the round's endings are taken


def test_speculative_fixes_reach_the_generation(one_thread):
    torch = one_thread
    mod = importlib.import_module(SPEC)
    cpu = torch.device("cpu")
    base_outs: list = []
    for fixes, k, on_gpu, static in ((set(), 4, False, False), ({"accept_on_gpu"}, 4, True, False),
                                     ({"static_cache"}, 4, False, True), ({"draft_k8"}, 8, False, False)):
        step = mod.build(small(), fixes, cpu)
        spec = step.spec
        assert (spec.k, spec.on_gpu, isinstance(spec.tc, mod.StaticCache), isinstance(spec.dc, mod.StaticCache)) \
            == (k, on_gpu, static, static), fixes
        # the draft shares the target's embeddings and head, not its blocks
        assert spec.draft.tok is spec.target.tok and spec.draft.head is spec.target.head
        assert len(spec.draft.blocks) == 1 and len(spec.target.blocks) == 2
        # every variant decodes the same prompts to the same tokens (the target's greedy ones)
        outs = [step() for _ in range(3)]
        assert all(o.shape == (1, 12) for o in outs)
        if not fixes:
            base_outs = outs
        assert all(torch.equal(a, b) for a, b in zip(outs, base_outs)), fixes


# --- RAFT ----------------------------------------------------------------------------------------

def _bilinear(img: list[list[float]], x: float, y: float) -> float:
    """``img`` at (x, y) by its four neighbours, zero outside."""
    x0, y0 = math.floor(x), math.floor(y)
    out = 0.0
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < len(img) and 0 <= xx < len(img[0]):
                out += wy * wx * img[yy][xx]
    return out


def test_correlation_pyramid_and_lookup_against_loops(one_thread):
    torch = one_thread
    mod = importlib.import_module(RAFT)
    torch.manual_seed(0)
    b, d, h, w, r, levels = 2, 5, 4, 6, 2, 2
    f1, f2 = torch.randn(b, d, h, w, dtype=torch.float64), torch.randn(b, d, h, w, dtype=torch.float64)
    pyramid = mod.corr_pyramid(f1, f2, levels)
    corr = torch.einsum("bdyx,bdvu->byxvu", f1, f2) / math.sqrt(d)
    assert torch.allclose(pyramid[0].view(b, h, w, h, w), corr, atol=1e-12)
    pooled = corr.reshape(b, h, w, h // 2, 2, w // 2, 2).mean((4, 6))
    assert torch.allclose(pyramid[1].view(b, h, w, h // 2, w // 2), pooled, atol=1e-12)
    # positions inside, between pixels and past the edges
    coords = torch.stack([torch.empty(b, h, w, dtype=torch.float64).uniform_(-2, w + 1),
                          torch.empty(b, h, w, dtype=torch.float64).uniform_(-2, h + 1)], 1)
    got = mod.lookup(pyramid, coords, radius=r)
    n = 2 * r + 1
    assert got.shape == (b, levels * n * n, h, w)
    imgs = [p.view(b, h, w, *p.shape[-2:]).tolist() for p in pyramid]
    for bi in range(b):
        for y in range(h):
            for x in range(w):
                cx, cy = coords[bi, 0, y, x].item(), coords[bi, 1, y, x].item()
                for lvl in range(levels):
                    for i in range(n):          # rows: dy
                        for j in range(n):      # columns: dx
                            want = _bilinear(imgs[lvl][bi][y][x], cx / 2 ** lvl + j - r, cy / 2 ** lvl + i - r)
                            assert got[bi, lvl * n * n + i * n + j, y, x].item() == pytest.approx(want, abs=1e-12)


def test_raft_loss_is_finite_and_falls(one_thread):
    torch = one_thread
    mod = importlib.import_module(RAFT)
    step = mod.build(small(), set(), torch.device("cpu"))
    torch.manual_seed(1)
    im1, im2, target = mod.random_batch(2, 128, 128, torch.device("cpu"))
    assert target.abs().mean() > 1.0       # a flow of pixels, not a rounding error
    losses = []
    for _ in range(5):
        loss = mod.sequence_loss(step.model(im1, im2, 12), target)
        loss.backward()
        step.opt.step()
        step.opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    # the weights: the last iteration's error counts most, 0.8 less each one before it
    flows = [torch.full_like(target, float(i)) for i in range(3)]
    want = sum(0.8 ** (2 - i) * (float(i) - target).abs().mean() for i in range(3))
    assert mod.sequence_loss(flows, target).item() == pytest.approx(want.item(), rel=1e-12)


def test_raft_fixes_keep_the_flow(one_thread):
    torch = one_thread
    mod = importlib.import_module(RAFT)
    cpu = torch.device("cpu")
    torch.manual_seed(2)
    im1, im2, _ = mod.random_batch(2, 128, 128, cpu)

    def flows(fixes):
        step = mod.build(small(), fixes, cpu)
        with torch.no_grad():
            return [f.float() for f in step.predict(im1, im2)]

    base = flows(set())
    assert len(base) == 12 and base[-1].shape == (2, 2, 128, 128) and base[-1].abs().mean() > 0
    fewer = flows({"fewer_iters"})
    assert len(fewer) == 8 and all(torch.equal(a, b) for a, b in zip(fewer, base))
    for fixes in ({"bf16"}, {"channels_last_bf16"}):
        got = flows(fixes)
        assert len(got) == 12
        for a, b in zip(got, base):
            assert (a - b).norm() <= 0.05 * b.norm(), fixes


# --- MoCo ----------------------------------------------------------------------------------------

def test_momentum_update_by_loop_and_by_foreach_are_identical(one_thread):
    torch = one_thread
    mod = importlib.import_module(MOCO)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        shapes = [(8, 3, 3, 3), (8,), (16, 8), (1,), (5, 7)]
        query = [torch.randn(s, dtype=dtype) for s in shapes]
        key = [torch.randn(s, dtype=dtype) for s in shapes]
        loop, each = [k.clone() for k in key], [k.clone() for k in key]
        for _ in range(3):
            mod.momentum_update(loop, query, 0.99, foreach=False)
            mod.momentum_update(each, query, 0.99, foreach=True)
        assert all(torch.equal(a, b) for a, b in zip(loop, each))
        # k_3 = m^3 k_0 + (1 - m^3) q, for a fixed q
        want = [0.99 ** 3 * k.double() + (1 - 0.99 ** 3) * q.double() for k, q in zip(key, query)]
        tol = 1e-6 if dtype == torch.float32 else 1e-13
        assert all(torch.allclose(a.double(), b, atol=tol) for a, b in zip(loop, want))


def test_info_nce_against_its_definition(one_thread):
    torch = one_thread
    mod = importlib.import_module(MOCO)
    torch.manual_seed(0)
    n, c, size, t = 5, 4, 7, 0.2
    f = torch.nn.functional
    q = f.normalize(torch.randn(n, c, dtype=torch.float64), dim=1).requires_grad_()
    k = f.normalize(torch.randn(n, c, dtype=torch.float64), dim=1)
    queue = f.normalize(torch.randn(c, size, dtype=torch.float64), dim=0)
    got = mod.info_nce(q, k, queue, t)
    # -log of the positive's share: exp(q.k / t) over itself plus every exp(q.queue_j / t)
    terms = []
    for i in range(n):
        pos = sum(q[i, a] * k[i, a] for a in range(c)) / t
        negs = [sum(q[i, a] * queue[a, j] for a in range(c)) / t for j in range(size)]
        terms.append(-pos + torch.log(torch.exp(pos) + sum(torch.exp(v) for v in negs)))
    want = sum(terms) / n
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    (g,) = torch.autograd.grad(got, q)
    (gw,) = torch.autograd.grad(want, q)
    assert torch.allclose(g, gw, atol=1e-12)


def test_queue_wraps_around_with_the_pointer_on_either_side(one_thread):
    torch = one_thread
    mod = importlib.import_module(MOCO)
    dim, size, batch = 3, 10, 4
    for on_host in (False, True):
        torch.manual_seed(0)
        queue = mod.KeyQueue(dim, size, torch.device("cpu"), on_host)
        want = queue.keys.clone()
        assert torch.allclose(want.norm(dim=0), torch.ones(size, dtype=want.dtype))
        written = 0
        for _ in range(4):
            k = torch.randn(batch, dim)
            queue.push(k)
            for row in range(batch):                 # key i goes to column i mod size, oldest first
                want[:, (written + row) % size] = k[row]
            written += batch
            assert torch.equal(queue.keys, want), (on_host, written)
            assert (queue.at if on_host else int(queue.ptr)) == written % size
        assert (int(queue.ptr) if on_host else queue.at) == 0   # the other pointer never moved


def test_moco_fixes_keep_the_training(one_thread):
    torch = one_thread
    mod = importlib.import_module(MOCO)
    cpu = torch.device("cpu")

    def train(fixes, steps=6):   # 6 x 8 keys: the queue of 36 wraps around
        step = mod.build(small(), fixes, cpu)
        assert all(torch.equal(a, b) for a, b in zip(step.enc_k.parameters(), step.enc_q.parameters()))
        assert not any(p.requires_grad for p in step.enc_k.parameters())
        losses = [step().item() for _ in range(steps)]
        return step, losses

    base, base_losses = train(set())
    assert all(math.isfinite(v) for v in base_losses) and int(base.queue.ptr) == 6 * 8 % 36
    for fixes in ({"foreach_momentum"}, {"host_pointer"}):
        step, losses = train(fixes)
        assert losses == base_losses and torch.equal(step.queue.keys, base.queue.keys), fixes
        assert all(torch.equal(a, b) for a, b in zip(step.enc_k.parameters(), base.enc_k.parameters()))
    step, losses = train({"fused_sgd"})
    assert losses == pytest.approx(base_losses, rel=1e-4)
    # bf16 drifts apart as the steps compound it: the first loss (the weights as built) is compared
    step, losses = train({"channels_last_bf16"})
    assert losses[0] == pytest.approx(base_losses[0], rel=0.02) and all(math.isfinite(v) for v in losses)
    assert step.enc_q[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "v", ROOT)

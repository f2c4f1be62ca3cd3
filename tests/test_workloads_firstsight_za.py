"""The first-sight what-if programs of set ZA (scripts/whatif/programs_firstsight_za.py) on the
CPU: each program's own loop and one --interleave run on its --small model (the CPU's variants),
what each fix must keep against float64 references (MAML's meta-gradient against finite
differences, the tasks batched by vmap against the loop, first order against the query gradient
at the adapted weights; greedy decoding with a KV cache against the whole sequence run again, the
last position's logits alone, bf16 within bf16's error; the streamed layers, pinned or
prefetched, against the resident ones, and the prefetch's order of copies, waits and layers), a
GPU check of the CUDA-only fixes where a GPU is present, and the registry's entries checked."""
from __future__ import annotations

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
from whatif.programs_firstsight_za import PROGRAMS  # noqa: E402

MAML, DECODE, STREAM = "w_maml_inner_loop_train", "w_nocache_decode_infer", "w_weight_streaming_infer"
CASES = [(MAML, "baseline,vmap_tasks,first_order,bf16"),
         (DECODE, "baseline,kv_cache,last_logits,bf16"),
         (STREAM, "baseline,resident")]          # pinned and prefetch need CUDA (pinned memory, streams)


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


# --- maml_inner_loop_train ----------------------------------------------------------------------

def _tasks(torch, ways: int = 3, shots: int = 2, queries: int = 2, tasks: int = 2, size: int = 8):
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(tasks, ways * shots, 3, size, size, dtype=torch.float64, generator=g)
    xq = torch.randn(tasks, ways * queries, 3, size, size, dtype=torch.float64, generator=g)
    return (xs, torch.arange(ways).repeat_interleave(shots), xq, torch.arange(ways).repeat_interleave(queries))


def _meta_grads(net, fn, batch, second_order: bool):
    net.zero_grad(set_to_none=True)
    loss = fn(net, *batch, 2, second_order)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.parameters()]


def test_maml_meta_gradient_is_second_order_and_vmap_gives_the_loops(one_thread):
    """The loop's meta-gradient matches finite differences of the meta-loss (so it holds the
    second-order terms), the vmapped tasks give the same loss and gradient, and the first-order
    one differs from it."""
    torch = one_thread
    mod = importlib.import_module(MAML)
    torch.manual_seed(1)
    net = mod.Conv4(4, 2, 8, 3).double().train()
    batch = _tasks(torch)
    loss, grads = _meta_grads(net, mod.meta_loss_loop, batch, True)
    # the directional derivative along a random direction, by central differences
    g = torch.Generator().manual_seed(3)
    params = list(net.parameters())
    direction = [torch.randn(p.shape, dtype=torch.float64, generator=g) for p in params]
    eps, values = 1e-6, []
    for sign in (1, -1):
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(sign * eps * d)
        values.append(float(mod.meta_loss_loop(net, *batch, 2, True).detach()))
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.sub_(sign * eps * d)
    numeric = (values[0] - values[1]) / (2 * eps)
    analytic = float(sum((gr * d).sum() for gr, d in zip(grads, direction)))
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8)
    # the vmap fix's network: BatchNorm's affine after F.batch_norm, the same weights
    batched = mod.Conv4(4, 2, 8, 3, affine_after=True).double().train()
    batched.load_state_dict(net.state_dict())
    v_loss, v_grads = _meta_grads(batched, mod.meta_loss_vmap, batch, True)
    torch.testing.assert_close(v_loss, loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, v_grads):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)
    _, fo = _meta_grads(net, mod.meta_loss_loop, batch, False)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, fo)) > 1e-6


def test_first_order_maml_is_the_query_gradient_at_the_adapted_weights(one_thread):
    """First-order MAML's meta-gradient, looped or vmapped, is the mean over the tasks of the
    query loss's gradient at each task's adapted weights (inner steps written out here)."""
    torch = one_thread
    F = torch.nn.functional
    mod = importlib.import_module(MAML)
    torch.manual_seed(4)
    net = mod.Conv4(4, 2, 8, 3).double().train()
    xs, ys, xq, yq = batch = _tasks(torch)
    names = [n for n, _ in net.named_parameters()]
    want = [torch.zeros_like(p) for p in net.parameters()]
    for t in range(xs.shape[0]):
        fast = {n: p.detach().clone() for n, p in net.named_parameters()}
        for _ in range(2):
            fast = {n: p.requires_grad_(True) for n, p in fast.items()}
            loss = F.cross_entropy(torch.func.functional_call(net, fast, (xs[t],)), ys)
            gr = torch.autograd.grad(loss, [fast[n] for n in names])
            fast = {n: (fast[n] - mod.INNER_LR * gi).detach() for n, gi in zip(names, gr)}
        fast = {n: p.requires_grad_(True) for n, p in fast.items()}
        q = F.cross_entropy(torch.func.functional_call(net, fast, (xq[t],)), yq)
        for w, gi in zip(want, torch.autograd.grad(q, [fast[n] for n in names])):
            w.add_(gi / xs.shape[0])
    batched = mod.Conv4(4, 2, 8, 3, affine_after=True).double().train()
    batched.load_state_dict(net.state_dict())
    for model, fn in ((net, mod.meta_loss_loop), (batched, mod.meta_loss_vmap)):
        _, got = _meta_grads(model, fn, batch, False)
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_bf16_maml_meta_loss_and_gradient_are_the_float64_ones_within_bf16s_error(one_thread):
    """Under bf16 autocast (the inner loops' gradients included) the meta-loss is the float64
    one to 1% and the meta-gradient points the same way (bf16's rounding, through BatchNorm over
    six tiny images and a double backward, moves it by 2-30% of its norm from seed to seed; 8%
    with this one)."""
    torch = one_thread
    mod = importlib.import_module(MAML)
    torch.manual_seed(3)
    net = mod.Conv4(4, 2, 8, 3).train()
    ref = mod.Conv4(4, 2, 8, 3).double().train()
    ref.load_state_dict(net.state_dict())
    xs, ys, xq, yq = _tasks(torch)
    want_loss, want = _meta_grads(ref, mod.meta_loss_loop, (xs, ys, xq, yq), True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net.zero_grad(set_to_none=True)
        loss = mod.meta_loss_loop(net, xs.float(), ys, xq.float(), yq, 2, True)
    loss.backward()
    got = torch.cat([p.grad.flatten() for p in net.parameters()]).double()
    want = torch.cat([w.flatten() for w in want])
    assert float(loss.detach()) == pytest.approx(float(want_loss), rel=1e-2)
    assert float(torch.nn.functional.cosine_similarity(got, want, dim=0)) > 0.95
    assert 0 < float((got - want).norm() / want.norm()) < 0.25


# --- nocache_decode_infer -----------------------------------------------------------------------

def _gpt(torch, mod):
    torch.manual_seed(5)
    return mod.GPT(50, 16, 2, 2, 12).double().eval()


def test_kv_cache_logits_and_tokens_are_the_recomputed_ones(one_thread):
    """Prefill and one-token forwards through the cache give, at every position, the logits of
    the whole sequence run again; the greedy tokens, cached or not, last logits or all, agree."""
    torch = one_thread
    mod = importlib.import_module(DECODE)
    model = _gpt(torch, mod)
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 50, (3, 5), generator=g)
    with torch.no_grad():
        ids = mod.generate(model, prompt, 6, kv_cache=False, last_only=False)
        full = model(ids)
        cache = model.cache(3)
        got = [model(prompt, cache, 0)]
        for t in range(5, ids.shape[1]):
            got.append(model(ids[:, t:t + 1], cache, t))
        torch.testing.assert_close(torch.cat(got, dim=1), full, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(model(ids, last_only=True), full[:, -1:], rtol=1e-12, atol=1e-12)
        assert ids.shape == (3, 11) and torch.equal(ids[:, :5], prompt)
        assert torch.equal(ids[:, 5:], full[:, 4:-1].argmax(-1))   # each token the argmax before it
        for kv_cache in (False, True):
            for last_only in (False, True):
                assert torch.equal(mod.generate(model, prompt, 6, kv_cache, last_only), ids)


def test_bf16_decoder_logits_are_the_float64_ones_within_bf16s_error(one_thread):
    torch = one_thread
    mod = importlib.import_module(DECODE)
    model = _gpt(torch, mod)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = model(ids)
        got = model.to(torch.bfloat16)(ids).double()
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.03 * scale)
    assert float((got - want).abs().max()) > 0       # bf16 indeed


# --- weight_streaming_infer ---------------------------------------------------------------------

def _layers(torch, mod):
    torch.manual_seed(8)
    blocks = mod.make_blocks(3, 16, 2, 32, torch.device("cpu"))
    x = torch.randn(2, 6, 16, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(9))
    return blocks, x


def test_streamed_layers_compute_what_resident_ones_do(one_thread):
    torch = one_thread
    mod = importlib.import_module(STREAM)
    blocks, x = _layers(torch, mod)
    assert all(p.dtype == torch.bfloat16 and p.device.type == "cpu" for p in blocks.parameters())
    with torch.no_grad():
        want = mod.resident(blocks)(x)
        for pinned in (False, True):
            assert torch.equal(mod.streamed(blocks, torch.device("cpu"), pinned)(x), want)
        # against float64 layers: the same network (bf16's error aside)
        ref = x.double()
        for blk in blocks:
            wide = mod.Block(16, 2, 32).double().eval()
            wide.load_state_dict(blk.state_dict())
            ref = wide(ref)
    torch.testing.assert_close(want.double(), ref, rtol=0.05, atol=0.05 * float(ref.abs().max()))


class _Stream:
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def wait_event(self, event: "_Event") -> None:
        self.log.append(("wait", event.n))


class _Event:
    count = 0

    def __init__(self) -> None:
        self.n = None

    def record(self, stream: _Stream) -> None:
        self.n, _Event.count = _Event.count, _Event.count + 1
        stream.log.append(("copied", self.n))


def test_prefetch_copies_the_next_layer_before_this_one_computes(one_thread, monkeypatch):
    """With CUDA's streams and events stood in for, the prefetching forward gives the resident
    output, and its order is: layer 0 copied; then for each layer, a wait for its copy, the next
    layer's copy queued, the layer computed."""
    torch = one_thread
    mod = importlib.import_module(STREAM)
    blocks, x = _layers(torch, mod)
    log: list = []
    side, main = _Stream(log, "side"), _Stream(log, "main")
    _Event.count = 0
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: side)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: main)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: log.append(("kept", s.name)) if s is main
                        else pytest.fail("record_stream on the side stream"), raising=False)
    call = mod.functional_call

    def logged(blk, w, args):
        log.append(("compute", list(blocks).index(blk)))
        return call(blk, w, args)
    monkeypatch.setattr(mod, "functional_call", logged)
    with torch.no_grad():
        got = mod.prefetched(blocks, torch.device("cpu"))(x)
        assert torch.equal(got, mod.resident(blocks)(x))
    order = [e for e in log if e[0] != "kept"]
    assert order == [("copied", 0), ("wait", 0), ("copied", 1), ("compute", 0), ("wait", 1), ("copied", 2),
                     ("compute", 1), ("wait", 2), ("compute", 2)]
    assert log.count(("kept", "main")) == 3 * len(list(blocks[0].parameters()))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA (pinned memory, streams)")
def test_every_streaming_variant_gives_the_resident_output_on_the_gpu(monkeypatch):
    import argparse

    import torch
    mod = importlib.import_module(STREAM)
    args = argparse.Namespace(small=True)
    outs = {}
    for name, fixes in (("baseline", set()), ("pinned", {"pinned"}), ("prefetch", {"prefetch"}),
                        ("resident", {"resident"})):
        step = mod.build(args, fixes, torch.device("cuda"))
        outs[name] = [step() for _ in range(3)]
    for name, got in outs.items():
        for a, b in zip(outs["resident"], got):
            assert torch.equal(b, a), name


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "za", ROOT)

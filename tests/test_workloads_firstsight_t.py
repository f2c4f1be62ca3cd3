"""The first-sight what-if programs of set T (scripts/whatif/programs_firstsight_t.py) on the
CPU: each program's own loop and one --interleave run on its --small model (DeepLabV3 through a
stand-in for torchvision, absent in CI; the LLM where transformers is installed), what each fix
must keep against float64 references (the segmentation loss over the labelled pixels only; the
LSTM's loss over the real tokens, packed or run over the padding; the LLM's shifted loss on the
logits as they are or a chunk of tokens at a time), and the registry's entries checked against
the programs they name."""
from __future__ import annotations

import argparse
import importlib
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
from whatif.programs_firstsight_t import PROGRAMS  # noqa: E402

SEG = "w_segmentation_deeplab_train"
# (script, modules it needs beyond torch, the variants interleaved); the segmentation program runs
# on a stand-in for torchvision (test_segmentation_program_...)
CASES = [(SEG, (), "baseline,bf16,channels_last_bf16,tf32"),
         ("w_packed_lstm_lm_train", (), "baseline,cpu_lengths,sorted_buckets,no_pack,bf16"),
         ("w_llama_bigvocab_loss_train", ("transformers",), "baseline,bf16_loss,chunked_loss,fused_adamw")]


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


@pytest.fixture()
def seg(one_thread, monkeypatch):
    """The segmentation program imported with a stand-in for torchvision: its
    ``deeplabv3_mobilenet_v3_large`` a tiny conv net (stride 4, BatchNorm, hardswish, a depthwise
    layer) whose logits are bilinearly upsampled to the input's size, as DeepLabV3's are; it
    refuses pretrained weights (the program must download none)."""
    torch = one_thread
    nn, F = torch.nn, torch.nn.functional

    class TinySeg(nn.Module):
        def __init__(self, classes: int) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.Hardswish(),
                                      nn.Conv2d(8, 8, 3, 2, 1, groups=8), nn.BatchNorm2d(8), nn.ReLU())
            self.classifier = nn.Conv2d(8, classes, 1)

        def forward(self, x):
            out = self.classifier(self.body(x))
            return {"out": F.interpolate(out, size=x.shape[-2:], mode="bilinear", align_corners=False)}

    def deeplabv3_mobilenet_v3_large(*, weights=None, weights_backbone=None, num_classes=21, aux_loss=None):
        assert weights is None and weights_backbone is None and not aux_loss
        return TinySeg(num_classes)

    vision = types.SimpleNamespace(models=types.SimpleNamespace(segmentation=types.SimpleNamespace(
        deeplabv3_mobilenet_v3_large=deeplabv3_mobilenet_v3_large)))
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    sys.modules.pop(SEG, None)  # bind the stand-in
    yield importlib.import_module(SEG)
    sys.modules.pop(SEG, None)


@pytest.mark.parametrize("script,needs,variants", CASES[1:], ids=[c[0] for c in CASES[1:]])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, needs,
                                                  variants):
    for mod in needs:
        pytest.importorskip(mod)
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_segmentation_program_loops_and_interleaves_on_a_stand_in(seg, monkeypatch, tmp_path, capsys):
    shared.loop_and_interleave(seg, SEG, CASES[0][2], monkeypatch, tmp_path, capsys)


def test_segmentation_loss_counts_the_labelled_pixels_only(seg):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    logits = torch.randn(2, seg.CLASSES, 5, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, seg.CLASSES, (2, 5, 7))
    void = torch.rand(2, 5, 7) < 0.3
    labels[void] = seg.IGNORE
    assert 0 < int(void.sum()) < void.numel()
    got = seg.pixel_loss(logits, labels)
    # by hand: each labelled pixel's negative log-softmax of its class, averaged over those pixels
    logp = logits.detach() - logits.detach().exp().sum(1, keepdim=True).log()
    terms = [-logp[n, labels[n, i, j], i, j] for n in range(2) for i in range(5) for j in range(7)
             if labels[n, i, j] != seg.IGNORE]
    assert got.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-12)
    # the void pixels take no part: their logits move nothing, and get no gradient
    got.backward()
    assert torch.all(logits.grad.permute(0, 2, 3, 1)[void] == 0)
    assert logits.grad.permute(0, 2, 3, 1)[~void].abs().sum() > 0
    moved = logits.detach().clone()
    moved.permute(0, 2, 3, 1)[void] += 5 * torch.randn(int(void.sum()), seg.CLASSES, dtype=torch.float64)
    assert seg.pixel_loss(moved, labels).item() == pytest.approx(got.item(), rel=1e-12)
    # the program's labels: classes and void, about a tenth void
    drawn = seg.random_labels(4, 64, torch.device("cpu"))
    share = (drawn == seg.IGNORE).float().mean().item()
    assert drawn.shape == (4, 64, 64) and 0.07 < share < 0.13
    assert drawn[drawn != seg.IGNORE].max() < seg.CLASSES and drawn.min() >= 0
    # a step of the full-resolution model: logits upsampled to the images' size, a finite loss
    step = seg.build(small(), {"channels_last_bf16"}, torch.device("cpu"))
    assert torch.isfinite(step())


def test_the_real_deeplab_trains_a_small_step(one_thread):
    pytest.importorskip("torchvision")
    torch = one_thread
    sys.modules.pop(SEG, None)
    mod = importlib.import_module(SEG)
    try:
        step = mod.build(small(), set(), torch.device("cpu"))
        losses = [step().item() for _ in range(2)]
        # 21 classes from random weights: a loss near log(21)
        assert all(1.0 < v < 10.0 for v in losses)
    finally:
        sys.modules.pop(SEG, None)


def test_lstm_loss_is_over_the_real_tokens_packed_or_padded(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_packed_lstm_lm_train")
    vocab = 13
    torch.manual_seed(0)
    lengths = torch.tensor([3, 7, 5, 2])
    tokens, targets, on_dev = mod.make_batch(lengths, vocab, torch.device("cpu"))
    # padded to the longest; inputs PAD and targets IGNORE past each length; the targets the next inputs
    assert tokens.shape == targets.shape == (4, 7) and torch.equal(on_dev, lengths)
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(tokens[b, n:] == mod.PAD) and torch.all(targets[b, n:] == mod.IGNORE)
        assert torch.all(tokens[b, :n] > 0) and torch.equal(targets[b, :n - 1], tokens[b, 1:n])
    # the loss against a float64 one by hand over the real positions only
    logits = torch.randn(4, 7, vocab, dtype=torch.float64)
    logp = torch.log_softmax(logits, -1)
    ref = torch.stack([-logp[b, t, targets[b, t]] for b in range(4) for t in range(lengths[b])]).mean()
    assert mod.lm_loss(logits, targets).item() == pytest.approx(ref.item(), rel=1e-12)
    # packed (unsorted, or sorted with enforce_sorted) or run over the padding: one loss and one
    # gradient in float64, the unidirectional LSTM's outputs at the real tokens being the same
    results = []
    runs = ((True, False, None), (False, False, None), (True, True, lengths.argsort(descending=True)))
    for pack, presorted, order in runs:
        torch.manual_seed(1)
        model = mod.LSTMLM(vocab, 6, 5, 2, pack=pack, presorted=presorted).double()
        t, y, n = (tokens, targets, lengths) if order is None else (tokens[order], targets[order], lengths[order])
        loss = mod.lm_loss(model(t, n), y)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    for loss, grads in results[1:]:
        assert loss.item() == pytest.approx(results[0][0].item(), rel=1e-10)
        assert all(torch.allclose(g, g0, rtol=1e-8, atol=1e-12) for g, g0 in zip(grads, results[0][1], strict=True))
    assert results[0][0].item() > 0


def test_bucketed_lengths_lie_in_one_bucket_sorted(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_packed_lstm_lm_train")
    gen = torch.Generator().manual_seed(0)
    starts, everything = set(), []
    for _ in range(2000):
        got = mod.draw_lengths(64, 16, 256, 16, True, gen)
        start = 16 + (int(got.min()) - 16) // 16 * 16
        assert int(got.max()) <= min(start + 15, 256) and torch.equal(got, got.sort(descending=True).values)
        starts.add(start)
        everything.append(got)
    # every bucket of 16 drawn (the last, 256 alone, is one length in 241), and the lengths overall
    # those of the plain draw (uniform on 16-256: mean 136)
    assert set(range(16, 241, 16)) <= starts <= set(range(16, 257, 16))
    assert torch.cat(everything).float().mean().item() == pytest.approx(136, rel=0.03)
    plain = mod.draw_lengths(4096, 16, 256, 16, False, gen)
    assert int(plain.min()) >= 16 and int(plain.max()) <= 256
    assert plain.float().mean().item() == pytest.approx(136, rel=0.03)


def _reference_hf_loss(logits, ids):
    """HF's causal LM loss in float64, by hand: each position but the last scores the next token."""
    import torch
    logp = torch.log_softmax(logits.double(), -1)
    b, t, _ = logits.shape
    return torch.stack([-logp[i, j, ids[i, j + 1]] for i in range(b) for j in range(t - 1)]).mean()


def test_llm_losses_are_hfs_shifted_loss(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_llama_bigvocab_loss_train")
    torch.manual_seed(0)
    b, t, hidden, vocab = 2, 9, 6, 31
    ids = torch.randint(0, vocab, (b, t))
    labels = mod.shifted_labels(ids)
    assert torch.equal(labels[:, :-1], ids[:, 1:]) and torch.all(labels[:, -1] == mod.IGNORE)
    # bf16_loss: the loss on the logits as given, float64 to float64, and on bf16 logits within bf16's error
    logits = 3 * torch.randn(b, t, vocab, dtype=torch.float64)
    ref = _reference_hf_loss(logits, ids)
    assert mod.causal_lm_loss(logits, ids).item() == pytest.approx(ref.item(), rel=1e-12)
    low = mod.causal_lm_loss(logits.to(torch.bfloat16), ids)
    assert low.dtype == torch.bfloat16 and low.item() == pytest.approx(ref.item(), rel=2e-2)
    # chunked_loss: from the hidden states and the head, in chunks that do not divide the tokens,
    # the same loss and the same gradients as the whole logits'
    h = torch.randn(b, t, hidden, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, hidden, dtype=torch.float64, requires_grad=True)
    whole = _reference_hf_loss(h @ w.T, ids)
    gh, gw = torch.autograd.grad(whole, (h, w))
    for chunk in (4, 7, b * t):
        got = mod.chunked_lm_loss(h, lambda x: x @ w.T, ids, chunk)
        assert got.item() == pytest.approx(whole.item(), rel=1e-12)
        ch, cw = torch.autograd.grad(got, (h, w))
        assert torch.allclose(ch, gh, rtol=1e-10) and torch.allclose(cw, gw, rtol=1e-10)


def test_llm_loss_helpers_match_hfs_own(one_thread):
    pytest.importorskip("transformers")
    torch = one_thread
    mod = importlib.import_module("w_llama_bigvocab_loss_train")
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()    # float32: HF's loss upcasts to float32, whatever the logits
    ids = torch.randint(0, 97, (3, 11))
    theirs = model(input_ids=ids, labels=ids).loss
    mine = mod.causal_lm_loss(model(input_ids=ids).logits, ids)
    chunked = mod.chunked_lm_loss(model.model(input_ids=ids).last_hidden_state, model.lm_head, ids, 5)
    assert mine.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert chunked.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert abs(theirs.item() - _reference_hf_loss(model(input_ids=ids).logits, ids).item()) < 1e-5


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "t", ROOT)

"""The --fused swap of scripts/workloads/generate_llama.py computes what HF's eager Llama does.

Runs on the CPU (kernels' float reference path) with a 2-layer float32 model; skipped where
transformers is not installed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
try:
    from transformers import LlamaConfig, LlamaForCausalLM
except Exception as e:  # a transformers that cannot load its Llama here (e.g. a mismatched torchvision)
    pytest.skip(f"transformers' Llama does not import: {e}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]


def _workload():
    spec = importlib.util.spec_from_file_location("generate_llama", ROOT / "scripts/workloads/generate_llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model(seed: int):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights, so a swapped weight would show
        for layer in m.model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        m.model.norm.weight.uniform_(0.5, 1.5)
    return m


def test_fused_swap_matches_eager_logits_and_tokens():
    wl = _workload()
    ref, fused = _model(0), _model(0)
    assert wl.fuse_add_rmsnorm(fused, "auto") == 5
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ref(ids).logits, fused(ids).logits
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(ref.generate(ids[:1], **kw), fused.generate(ids[:1], **kw))

"""The first-sight what-if programs of set F (scripts/whatif/programs_firstsight_f.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the teacher's logits, the adapters alone trainable, every row once an epoch), and the
registry's entries checked against the programs they name."""
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
from whatif.programs_firstsight_f import PROGRAMS  # noqa: E402

# (script, modules it needs beyond torch, the variants interleaved)
CASES = [("w_distill_teacher_train", (), "baseline,teacher_no_grad,fused_adamw"),
         ("w_lora_finetune_train", ("transformers",), "baseline,bf16_base,fused_adamw"),
         ("w_tabular_mlp_train", (), "baseline,batched_fetch,gpu_resident")]


@pytest.mark.parametrize("script,needs,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, needs,
                                                  variants):
    for mod in needs:
        pytest.importorskip(mod)
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small(**kw):
    import argparse
    return argparse.Namespace(small=True, **kw)


def test_teacher_no_grad_keeps_the_loss_and_drops_the_teachers_backward(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_distill_teacher_train")
    dev = torch.device("cpu")
    base, fixed = mod.build(small(), set(), dev), mod.build(small(), {"teacher_no_grad"}, dev)
    # the same first step's loss (the teacher's logits are the same numbers either way) ...
    torch.manual_seed(1)
    loss = base()
    torch.manual_seed(1)
    assert torch.allclose(loss, fixed(), rtol=1e-5)
    # ... but only the defect computes gradients for the teacher's tensors
    assert base.teacher_grads() > 0 and fixed.teacher_grads() == 0


def test_lora_trains_only_the_adapters_and_bf16_base_keeps_them_fp32(one_thread):
    pytest.importorskip("transformers")
    torch = one_thread
    mod = importlib.import_module("w_lora_finetune_train")
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    params = mod.add_adapters(model)
    assert len(params) == 2 * len(mod.TARGETS) * cfg.num_hidden_layers
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in params}
    assert all(p.dtype == torch.float32 for p in params)
    # B starts at zero: the adapted model computes what the base one does
    lora = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    assert torch.equal(lora.eval()(x), lora.base(x))


def test_every_loader_variant_reads_each_row_once_an_epoch(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_tabular_mlp_train")
    rows, batch = 256, 32
    x = torch.arange(rows, dtype=torch.float32)[:, None].repeat(1, 3)
    y = torch.zeros(rows, 1)
    for fixes in (set(), {"batched_fetch"}, {"gpu_resident"}):
        stream = mod.batches(x, y, batch, fixes, torch.device("cpu"))
        seen = torch.cat([next(stream)[0][:, 0] for _ in range(rows // batch)])
        assert seen.shape == (rows,) and torch.equal(seen.sort().values, x[:, 0]), fixes
        assert not torch.equal(seen, x[:, 0]), fixes     # shuffled


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "f", ROOT)

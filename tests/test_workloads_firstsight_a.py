"""The first-sight what-if programs of set A (scripts/whatif/programs_firstsight_a.py) on the
CPU: each program's own loop and one --interleave run on its --small model, in this process,
and the registry's entries checked against the programs they name."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_a import PROGRAMS  # noqa: E402

# (script, the libraries it needs besides torch, the variants interleaved)
CASES = [
    ("w_recsys_embbag_train", (), "baseline,sparse"),
    ("w_moe_routing_train", (), "baseline,capacity"),
    ("w_kv_decode_sampling", (), "baseline,prealloc"),
    ("w_handwritten_attention_train", (), "baseline,sdpa"),
    ("w_eval_metrics_host", ("numpy", "sklearn"), "baseline,metrics_gpu"),
    ("w_per_sample_loss_train", (), "baseline,vectorized"),
    ("w_grad_accum_fp16_train", ("transformers",), "baseline,bigger_micro"),
    ("w_grad_checkpoint_train", ("transformers",), "baseline,no_checkpointing"),
    ("w_cpu_tokenize_infer", ("tokenizers", "transformers"), "baseline,encode_batch"),
    ("w_tuned_gpt_train", ("transformers",), "baseline,tf32"),
]


@pytest.mark.parametrize("script,needs,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, needs, variants):
    for lib in needs:
        if importlib.util.find_spec(lib) is None:
            pytest.skip(f"{script} needs {lib}, which is not installed")
    if script == "w_tuned_gpt_train":  # its model is always compiled: Inductor on the CPU takes minutes
        monkeypatch.setattr(one_thread, "compile", lambda model, **_: model)
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_registry_names_each_program_and_only_its_fixes():
    assert sorted(Path(p["script"]).stem for p in PROGRAMS) == sorted(c[0] for c in CASES)
    assert len({p["name"] for p in PROGRAMS}) == len(PROGRAMS)
    for prog in PROGRAMS:
        shared.check_first_sight_entry(prog, ROOT)

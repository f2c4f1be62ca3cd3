"""The first-sight what-if programs of set A (scripts/whatif/programs_firstsight_a.py) on the
CPU: each program's own loop and one --interleave run on its --small model, in this process,
and the registry's entries checked against the programs they name."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import shared

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


@pytest.fixture()
def one_thread():
    """One intra-op thread: these tiny models only lose time to more on a shared machine."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)


@pytest.mark.parametrize("script,needs,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, needs, variants):
    for lib in needs:
        if importlib.util.find_spec(lib) is None:
            pytest.skip(f"{script} needs {lib}, which is not installed")
    if script == "w_tuned_gpt_train":  # its model is always compiled: Inductor on the CPU takes minutes
        monkeypatch.setattr(one_thread, "compile", lambda model, **_: model)
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def _module_constant(path: Path, name: str) -> tuple:
    """A tuple constant of a program (FIXES, CUDA_ONLY), read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no {name}")


def test_registry_names_each_program_and_only_its_fixes():
    assert sorted(Path(p["script"]).stem for p in PROGRAMS) == sorted(c[0] for c in CASES)
    assert len({p["name"] for p in PROGRAMS}) == len(PROGRAMS)
    for prog in PROGRAMS:
        path = ROOT / prog["script"]
        src = path.read_text()
        fixes = set(_module_constant(path, "FIXES"))
        assert set(_module_constant(path, "CUDA_ONLY")) <= fixes, prog["name"]
        assert 2 <= len(prog["fixes"]) <= 4 and set(prog["fixes"]) <= fixes, prog["name"]
        for name, fix in prog["fixes"].items():
            assert fix["args"] == ["--fix", name] and fix["pays"] in (True, False, None), (prog["name"], name)
        assert set(prog["expect"]) == {"baseline", *prog["fixes"]}, prog["name"]
        # the program's iteration range is the one named (_corpus.train_step opens "train_step"),
        # and a capture runs 30-60 iterations
        opens = f'nvtx("{prog["step_range"]}")' in src
        assert opens or (prog["step_range"] == "train_step" and "train_step(" in src), prog["name"]
        assert prog["capture_args"][:1] == ["--steps"] and 30 <= int(prog["capture_args"][1]) <= 60
        # compiling variants are marked so (the harness gives them longer): a program compiled
        # in every variant at the program's level, else the fixes that compile
        always = "torch.compile(model" in src and "compile" not in fixes
        assert prog.get("compiles", False) == always, prog["name"]
        for name, fix in prog["fixes"].items():
            assert fix.get("compiles", always) == (always or "compile" in name), (prog["name"], name)
        # a fix the program refuses to interleave is never listed for it
        refused = set(re.findall(r'not_interleaved=\{"(\w+)"', src))
        listed = fixes if prog["interleave"] == "all" else set(prog["interleave"])
        assert not refused & listed and listed <= set(prog["fixes"]), prog["name"]

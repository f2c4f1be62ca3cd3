"""The first-sight what-if programs of set E (scripts/whatif/programs_firstsight_e.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the samples of an iteration, the texts of a pool), and the registry's entries checked
against the programs they name."""
from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

import pytest
import shared
from shared import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "scripts" / "workloads"
sys.path.insert(0, str(WORKLOADS))
sys.path.insert(0, str(WORKLOADS.parent))
from whatif.programs_firstsight_e import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_rl_rollout_train", "baseline,gpu_env,more_envs,fused_adam"),
         ("w_padded_encoder_infer", "baseline,pad_to_longest,sort_by_length,bf16,tf32")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def test_more_envs_keeps_the_samples_of_an_iteration_and_gpu_env_the_dynamics():
    # more_envs: 4x the environments for a quarter of the steps, the same samples and minibatches
    pytest.importorskip("torch")
    import numpy as np
    import torch
    mod = importlib.import_module("w_rl_rollout_train")
    src = (WORKLOADS / "w_rl_rollout_train.py").read_text()
    assert "n_envs, horizon = 4 * n_envs, horizon // 4" in src and "samples = n_envs * horizon" in src
    # the torch environment steps the numpy one's chains as numpy does
    cpu, gpu = mod.ChainEnv(4, 0), mod.TorchChainEnv(4, 0, torch.device("cpu"))
    gpu.x = torch.from_numpy(cpu.x.copy())
    for a in ([0, 1, 2, 4], [4, 4, 3, 0], [2, 2, 2, 2]):
        o_np, r_np, d_np = cpu.step(np.array(a))
        o_t, r_t, d_t = gpu.step(torch.tensor(a))
        assert np.allclose(o_np, o_t.numpy(), atol=1e-6) and np.allclose(r_np, r_t.numpy(), atol=1e-6)
        assert (d_np == d_t.numpy()).all()


def test_every_padding_variant_sees_the_same_texts():
    # the lengths come from one seeded generator: the same texts in every variant, sort_by_length
    # only reorders each pool of 8 batches
    pytest.importorskip("torch")
    import numpy as np
    mod = importlib.import_module("w_padded_encoder_infer")
    drawn = list(itertools.islice(mod.lengths_stream(32, 90, 16, 512, False), 2 * mod.POOL))
    again = list(itertools.islice(mod.lengths_stream(32, 90, 16, 512, False), 2 * mod.POOL))
    sorted_ = list(itertools.islice(mod.lengths_stream(32, 90, 16, 512, True), 2 * mod.POOL))
    assert all((a == b).all() for a, b in zip(drawn, again))
    for p in range(2):
        pool = slice(p * mod.POOL, (p + 1) * mod.POOL)
        assert (np.sort(np.concatenate(drawn[pool])) == np.concatenate(sorted_[pool])).all()
    lens = np.concatenate(drawn)
    assert 16 <= lens.min() and lens.max() <= 512 and 70 < lens.mean() < 110


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "e", ROOT)
    for prog in PROGRAMS:
        assert f'nvtx("{prog["step_range"]}")' in (ROOT / prog["script"]).read_text()   # opened by name

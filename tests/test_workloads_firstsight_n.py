"""The first-sight what-if programs of set N (scripts/whatif/programs_firstsight_n.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the same guided noise from two calls or one, the same loss in float32 as in float64 to
float32's precision, the same scan token by token or in chunks), and the registry's entries
checked against the programs they name."""
from __future__ import annotations

import argparse
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
from whatif.programs_firstsight_n import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_cfg_two_pass_sample", "baseline,batched_cfg"),
         ("w_fp64_surrogate_train", "baseline,fp32"),
         ("w_ssm_scan_infer", "baseline,chunked_scan")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_one_call_on_both_halves_gives_the_same_guidance(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_cfg_two_pass_sample")
    model = mod.DiT(16, 2, 2, 10, 4, 8).double().eval()
    x = torch.randn(3, 4, 8, 8, dtype=torch.float64)
    t = torch.tensor([999, 500, 3])
    y, null = torch.tensor([1, 7, 2]), torch.full((3,), 10)
    with torch.no_grad():
        two = mod.guidance(model, False, 4.0)(x, t, y, null)
        one = mod.guidance(model, True, 4.0)(x, t, y, null)
        uncond = model(x, t, null)
    assert two.shape == x.shape and (two - uncond).abs().max() > 1e-3  # the label moves the prediction
    assert torch.allclose(two, one, rtol=1e-10, atol=1e-12)
    # the schedule: 50 steps from t=999 down, each alpha-bar rising to 1 after the last
    sched = mod.ddim_schedule(50)
    assert len(sched) == 50 and sched[0][0] == 999 and sched[-1][2] == 1.0
    assert all(a < b for _, a, b in sched)


def test_the_sampler_runs_the_same_with_one_call(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_cfg_two_pass_sample")
    out = {}
    for fixes in (set(), {"batched_cfg"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        out[frozenset(fixes)] = [step().clone() for _ in range(5)]
    for a, b in zip(out[frozenset()], out[frozenset({"batched_cfg"})]):
        assert torch.isfinite(a).all()
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)


def test_float32_fits_the_same_function(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_fp64_surrogate_train")
    losses, dtypes = {}, {}
    for fixes in (set(), {"fp32"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        losses[frozenset(fixes)] = [step().item() for _ in range(3)]
        dtypes[frozenset(fixes)] = step().dtype
    assert dtypes[frozenset()] == torch.float64 and dtypes[frozenset({"fp32"})] == torch.float32
    base, f32 = losses[frozenset()], losses[frozenset({"fp32"})]
    assert base[0] > 0.01
    for a, b in zip(base, f32):
        assert abs(a - b) <= 1e-4 * abs(a)
    # TF32 does not reach float64 GEMMs: the control's loss is the baseline's to the last bit
    step = mod.build(small(), {"tf32"}, torch.device("cpu"))
    assert [step().item() for _ in range(3)] == base
    assert mod.ALTERNATIVES and all(set(a) <= set(mod.FIXES) for a in mod.ALTERNATIVES)


def test_the_chunked_scan_is_the_token_loop(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_ssm_scan_infer")
    b, n, d, s = 2, 37, 5, 4  # a length that is not a multiple of the chunk
    log_da = -torch.rand(b, n, d, s, dtype=torch.float64) * 1.5
    dbu = torch.randn(b, n, d, s, dtype=torch.float64)
    c = torch.randn(b, n, s, dtype=torch.float64)
    loop = mod.scan_loop(torch.exp(log_da), dbu, c)
    assert loop.shape == (b, n, d) and loop.abs().max() > 0.1
    assert torch.allclose(mod.scan_chunked(log_da, dbu, c), loop, rtol=1e-9, atol=1e-10)
    assert torch.allclose(mod.scan_chunked(log_da, dbu, c, chunk=5), loop, rtol=1e-9, atol=1e-10)
    # the whole model, same weights, either scan
    torch.manual_seed(0)
    a = mod.MambaLM(50, 16, 2, chunked=False).double().eval()
    m = mod.MambaLM(50, 16, 2, chunked=True).double().eval()
    m.load_state_dict(a.state_dict())
    ids = torch.randint(0, 50, (2, 40))
    with torch.no_grad():
        assert torch.allclose(a(ids), m(ids), rtol=1e-8, atol=1e-9)


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "n", ROOT)

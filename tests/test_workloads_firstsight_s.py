"""The first-sight what-if programs of set S (scripts/whatif/programs_firstsight_s.py) on the
CPU: each program's own loop and one --interleave run on its --small model, what each fix must
keep (the FNO's spectral layer against a float64 reference of its retained modes; the scripted
encoder's output the eager one's; the QAT model's fake-quantized layers, fused or frozen), and the registry's entries checked against the
programs they name."""
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
from whatif.programs_firstsight_s import PROGRAMS  # noqa: E402

# (script, the variants interleaved)
CASES = [("w_fno_spectral_train", "baseline,tf32,bf16"),
         ("w_torchscript_mlp_infer", "baseline,eager"),
         ("w_qat_fakequant_train", "baseline,fused_modules,freeze_observers")]


@pytest.mark.parametrize("script,variants", CASES, ids=[c[0] for c in CASES])
def test_program_loops_and_interleaves_on_the_cpu(one_thread, monkeypatch, tmp_path, capsys, script, variants):
    shared.loop_and_interleave(importlib.import_module(script), script, variants, monkeypatch, tmp_path, capsys)


def small() -> argparse.Namespace:
    return argparse.Namespace(small=True)


def test_spectral_layer_against_a_float64_reference(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_fno_spectral_train")
    torch.manual_seed(0)
    layer = mod.SpectralConv2d(3, 2)
    x = torch.randn(2, 3, 8, 8)
    got = layer(x).double()
    # the reference: the full spectrum in complex128, every frequency outside the two retained
    # corners zeroed, each retained one mixed across channels by its own matrix
    spec = torch.fft.rfft2(x.double())
    out = torch.zeros_like(spec)
    for rows, w in ((slice(0, 2), layer.w1), (slice(-2, None), layer.w2)):
        w = w.detach().to(torch.complex128)
        for i in range(2):
            for j in range(2):
                ri = range(8)[rows][i]
                out[:, :, ri, j] = spec[:, :, ri, j] @ w[:, :, i, j]
    ref = torch.fft.irfft2(out, s=(8, 8))
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5)
    # the loss is a relative L2 error: zero for a perfect prediction, one for a zero one
    t = torch.rand(2, 1, 4, 4) + 0.5
    assert mod.relative_l2(t, t).item() == 0.0 and mod.relative_l2(torch.zeros_like(t), t).item() == pytest.approx(1.0)
    # a training step runs through the complex weights and returns a finite relative error
    step = mod.build(small(), set(), torch.device("cpu"))
    loss = step()
    assert torch.isfinite(loss) and loss.item() > 0


def test_the_scripted_encoder_is_the_eager_one(one_thread):
    torch = one_thread
    mod = importlib.import_module("w_torchscript_mlp_infer")
    outs = {}
    for fixes in (set(), {"eager"}):
        torch.manual_seed(1)
        step = mod.build(small(), fixes, torch.device("cpu"))
        torch.manual_seed(2)
        outs[frozenset(fixes)] = [step() for _ in range(3)]
    for a, b in zip(outs[frozenset()], outs[frozenset({"eager"})]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    # each block is a pre-norm SwiGLU MLP with a residual, in float64 by hand
    torch.manual_seed(0)
    block = mod.Block(6, 10).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    h = torch.nn.functional.layer_norm(x, (6,), block.norm.weight, block.norm.bias)
    gate = h @ block.gate.weight.T + block.gate.bias
    ref = x + (gate * torch.sigmoid(gate) * (h @ block.up.weight.T + block.up.bias)) @ block.down.weight.T + block.down.bias
    assert torch.allclose(block(x), ref, rtol=1e-12)


def test_qat_fixes_change_where_the_fake_quantize_sits_not_the_model(one_thread):
    torch = one_thread
    import torch.ao.quantization as tq
    mod = importlib.import_module("w_qat_fakequant_train")

    def fake_quants(model):
        return [n for n, m in model.named_modules() if isinstance(m, tq.FakeQuantizeBase)]
    torch.manual_seed(0)
    plain = mod.Net((4, 8), 5).train()
    fused = mod.Net((4, 8), 5).train()
    fused.load_state_dict(plain.state_dict())
    fused.fuse()
    for m in (plain, fused):
        m.qconfig = tq.get_default_qat_qconfig("x86")
    plain, fused = tq.prepare_qat(plain), tq.prepare_qat(fused)
    # fused: one module a layer, its weights and its output fake-quantized (after the ReLU)
    assert type(fused.features[0]).__name__ == "ConvBnReLU2d"
    assert len(fake_quants(fused)) < len(fake_quants(plain))
    x = torch.randn(2, 3, 8, 8)
    # the same float model under both: their outputs close (quantized to 8 bits, BN folded)
    a, b = plain(x), fused(x)
    assert torch.allclose(a, b, atol=0.05 * a.abs().max().item())
    # frozen observers keep their scales: a batch of another range leaves them as they were
    plain.apply(tq.disable_observer)
    scales = [m.scale.clone() for m in plain.modules() if isinstance(m, tq.FakeQuantizeBase)]
    plain(10 * x)
    assert all(torch.equal(s, m.scale) for s, m in
               zip(scales, [m for m in plain.modules() if isinstance(m, tq.FakeQuantizeBase)]))
    for fixes in (set(), {"fused_modules"}, {"freeze_observers"}):
        step = mod.build(small(), fixes, torch.device("cpu"))
        assert torch.isfinite(step())


def test_registry_names_each_program_and_only_its_fixes():
    shared.check_first_sight_set(PROGRAMS, [c[0] for c in CASES], "s", ROOT)

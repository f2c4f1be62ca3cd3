"""profkit's aten recorder: what it writes, how it reads back, and what judging does with it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profkit.read import aten_record

from profkit.judge import evidence as ev
from profkit.run.attribution import aten_key
from profkit.judge.dtypes import op_dtype, recorded_dtype
from synth import TID, make_trace

ROOT = Path(__file__).resolve().parent.parent


# --- the format, without torch ----------------------------------------------------------------------
def test_payload_round_trip():
    text = ("aten::_scaled_dot_product_flash_attention, sizes = [[8, 16, 512, 64], [8, 16, 512, 64], "
            "[8, 16, 512, 64], [], [], [], []], pk = in=bf16*3,-*4 c=110---- p=0.1 causal=1 "
            "scale=0.125 out=bf16[8,16,512,64];fp32[8,16,512]")
    r = aten_record.parse(text)
    assert r.op == "aten::_scaled_dot_product_flash_attention"
    assert r.sizes[:3] == [[8, 16, 512, 64]] * 3 and len(r.sizes) == 7
    assert r.in_dtypes == ("bf16",) * 3 + (None,) * 4
    assert r.contiguous[:4] == (True, True, False, None)
    assert (r.causal, r.dropout_p, r.scale) == (True, 0.1, 0.125)
    assert r.outputs == (("bf16", [8, 16, 512, 64]), ("fp32", [8, 16, 512]))
    key = aten_key(text)
    assert key == ("aten::_scaled_dot_product_flash_attention [[8, 16, 512, 64], [8, 16, 512, 64], "
                   "[8, 16, 512, 64], [], [], [], []] | in=bf16*3,-*4 c=110---- p=0.1 causal=1 "
                   "scale=0.125")
    # the key parses back to the same record, outputs aside (the first call has none)
    again = aten_record.parse(key)
    assert (again.in_dtypes, again.causal, again.outputs) == (r.in_dtypes, True, None)
    # emit_nvtx text is not a record, and its key is unchanged
    old = "aten::mm, seq = 3, op_id = 7, sizes = [[8, 16], [16, 4]], input_op_ids = [(1,0)]"
    assert aten_record.parse(old) is None and aten_key(old) == "aten::mm [[8, 16], [16, 4]]"
    # damaged text: no record, never an exception
    for bad in ("aten::mm, sizes = [[8, 16], pk = in=bf16", "aten::mm, pk = in=x", "x | y"):
        aten_record.parse(bad)


def test_records_by_key_prefers_a_call_with_outputs():
    first = "aten::mm, sizes = [[8, 16], [16, 4]], pk = in=bf16*2 c=11"
    later = first + " out=bf16[8,4]"
    assert aten_key(first) == aten_key(later)
    recs = aten_record.records_by_key([first, later, later], aten_key)
    assert recs[aten_key(first)].outputs == (("bf16", [8, 4]),)


def test_recorded_dtype_outranks_and_casts():
    mm = aten_record.parse("aten::mm, sizes = [[8, 16], [16, 4]], pk = in=bf16*2 c=11")
    d = recorded_dtype(mm)
    assert d.precision == "bf16" and d.basis.startswith("recorded")
    cast = aten_record.parse("aten::_to_copy, sizes = [[8, 4], [], [], [], [], [], []], "
                             "pk = in=bf16,-*6 c=1------ dtype=fp32 out=fp32[8,4]")
    d = recorded_dtype(cast)
    assert (d.src, d.dst) == ("bf16", "fp32")
    w = ev.from_shapes(aten_key("aten::_to_copy, sizes = [[8, 4], [], [], [], [], [], []], "
                                "pk = in=bf16,-*6 c=1------ dtype=fp32"), d)
    assert w.bytes == 8 * 4 * 2 + 8 * 4 * 4 and w.confidence_cap is None
    copy = aten_record.parse("aten::copy_, sizes = [[8, 4], [8, 4], []], pk = in=bf16,fp32,- c=11-")
    assert (recorded_dtype(copy).src, recorded_dtype(copy).dst) == ("fp32", "bf16")
    cmp_ = aten_record.parse("aten::lt.Tensor, sizes = [[64], [64]], pk = in=fp32*2 c=11 out=bool[64]")
    w = ev.from_shapes(aten_key("aten::lt.Tensor, sizes = [[64], [64]], pk = in=fp32*2 c=11"),
                       recorded_dtype(cmp_))
    assert w.bytes == 64 * 4 * 2 + 64 * 1


def test_reduction_output_from_dim():
    text = "aten::sum.dim_IntList, sizes = [[8, 4096], [], [], []], pk = in=fp32,-*3 c=1--- dim=-1 keepdim=0"
    rec = aten_record.parse(text)
    w = ev.from_shapes(aten_key(text), recorded_dtype(rec), record=rec)
    assert w.bytes == 8 * 4096 * 4 + 8 * 4
    # the same op from emit_nvtx: output assumed small, as before
    w0 = ev.from_shapes("aten::sum [[8, 4096], [], [], []]", op_dtype(["void k<float>()"]))
    assert w0.bytes == 8 * 4096 * 4


# --- the recorder on CPU ----------------------------------------------------------------------------
def _record(fn):
    torch = pytest.importorskip("torch")
    from profkit.capture.recorder import recorder
    texts = []
    with recorder(texts.append, lambda: None, count_threads=True) as rec:
        fn(torch)
    return texts, rec


def _step(torch, autocast: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(8, 16)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _ops(texts):
    return [aten_record.parse(t) for t in texts]


def test_training_step_bf16_records_types_forward_backward_optimizer():
    texts, rec = _record(lambda torch: _step(torch, autocast=True))
    recs = _ops(texts)
    assert all(r is not None for r in recs)
    names = [r.op for r in recs]
    # forward GEMMs (addmm, after autograd) in bf16, with autocast's casts
    addmm = [r for r in recs if r.op == "aten::addmm"]
    assert addmm and all(r.tensor_dtypes == ["bf16"] * 3 for r in addmm)
    assert any(r.op == "aten::_to_copy" and r.dtype == "bf16" and r.tensor_dtypes == ["fp32"]
               for r in recs)
    # backward GEMMs: grad_input and grad_weight mm, bf16, some on transposed inputs
    mm = [r for r in recs if r.op == "aten::mm"]
    assert len(mm) >= 6 and all(r.tensor_dtypes == ["bf16", "bf16"] for r in mm)
    assert any(False in r.contiguous for r in mm)
    assert "aten::gelu_backward" in names
    # the optimizer in fp32 (master weights), tensor lists kept
    fe = [r for r in recs if r.op.startswith("aten::_foreach_")]
    assert fe and all(set(r.tensor_dtypes) == {"fp32"} for r in fe)
    # outputs arrive from the second call of an input signature on
    assert any(r.op == "aten::addmm" and r.outputs == (("bf16", [8, 32]),) for r in recs)
    assert not any(r.op in ("aten::t", "aten::view") for r in recs)  # views: no range
    assert "aten::linear" not in names  # a CompositeImplicit wrapper: decomposed before the mode


def test_fp32_step_records_fp32():
    texts, _ = _record(lambda torch: _step(torch, autocast=False))
    recs = _ops(texts)
    gemms = [r for r in recs if r.op in ("aten::addmm", "aten::mm")]
    assert gemms and all(set(r.tensor_dtypes) == {"fp32"} for r in gemms)
    assert not any(r.op == "aten::_to_copy" and r.dtype == "bf16" for r in recs)


def test_sdpa_causal_and_out_argument():
    def body(torch):
        q = torch.randn(2, 4, 16, 8, requires_grad=True)
        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        o.sum().backward()
        torch.nn.functional.scaled_dot_product_attention(q.detach(), q.detach(), q.detach())
        x = torch.randn(8, 16)
        out = torch.empty(8, 16)
        torch.add(x, x, alpha=2, out=out)
        x.sum(dim=-1, keepdim=True)

    texts, _ = _record(body)
    recs = _ops(texts)
    attn = [r for r in recs if "_scaled_dot_product" in r.op and "backward" not in r.op]
    assert [r.causal for r in attn] == [True, False]
    bwd = [r for r in recs if "_scaled_dot_product" in r.op and "backward" in r.op]
    assert bwd and bwd[0].causal is True
    add = next(r for r in recs if r.op == "aten::add.out")
    assert add.out_arg and add.alpha == 2.0 and add.in_dtypes == ("fp32", "fp32", None, "fp32")
    s = next(r for r in recs if r.op == "aten::sum.dim_IntList")
    assert (s.dim, s.keepdim) == ((-1,), True)


def test_repeated_arguments_are_read_once():
    def body(torch):
        x = torch.randn(64, 32)
        y = torch.randn(64, 32)
        x * x
        x * y
        vs, gs = [torch.randn(8, 4), torch.randn(4)], [torch.randn(8, 4), torch.randn(4)]
        torch._foreach_addcmul_(vs, gs, gs, value=0.5)   # AdamW's second moment

    texts = _record(body)[0]
    recs = _ops(texts)
    (i_sq, sq), (_, xy) = [(i, r) for i, r in enumerate(recs) if r.op == "aten::mul.Tensor"]
    assert sq.same == ((1, 0),) and xy.same == ()
    i_fe, fe = next((i, r) for i, r in enumerate(recs) if r.op.startswith("aten::_foreach_addcmul_"))
    assert fe.same == ((2, 1),)
    fp32 = op_dtype(["void k<float>()"])
    w = ev.from_shapes(aten_record.group_key(texts[i_fe]), fp32, record=fe)
    # v and g read, v written: 3 x 36 floats, not 4 x 36
    assert w.bytes == 3 * 36 * 4 and "argument 2 is argument 1: read once" in w.detail
    assert ev.from_shapes(aten_record.group_key(texts[i_sq]), fp32, record=sq).bytes == 2 * 64 * 32 * 4


# --- the analyzer on a recorded trace, without torch -------------------------------------------------
def _recorded_trace(path: Path, recorded: bool) -> Path:
    """Two ops under one thread: a causal flash attention and an add, whose kernels name no type."""
    q = "[8, 16, 1024, 64]"
    attn = (f"aten::_scaled_dot_product_flash_attention, sizes = [{q}, {q}, {q}, [], [], [], []]"
            + (", pk = in=bf16*3,-*4 c=111---- p=0 causal=1" if recorded else ""))
    add = ("aten::add.Tensor, sizes = [[4096, 4096], [4096, 4096], []]"
           + (", pk = in=bf16*2,- c=11- alpha=1 out=bf16[4096,4096]" if recorded else ""))
    strings = {1: "attn_fwd_kernel", 2: "triton_poi_fused_add_0", 9: "cudaLaunchKernel"}
    kernels, runtime, nvtx = [], [], []
    t = 1_000_000
    for i in range(4):
        for j, (text, name, dur) in enumerate(((attn, 1, 900_000), (add, 2, 60_000))):
            corr = 10 * i + j + 1
            nvtx.append((t, t + 10_000, text, TID))
            runtime.append((t + 1000, t + 5000, corr))
            kernels.append((t + 6000, t + 6000 + dur, corr, name))
            t += dur + 50_000
    return make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings)


def _classify_json(path: Path, block_torch: bool) -> dict:
    code = ("import sys\n"
            + ("sys.modules['torch'] = None\n" if block_torch else "")
            + "from profkit.cli import main\n"
            "main(['classify', sys.argv[1], '--by', 'aten', '--format', 'json'])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_analyzer_reads_records_without_torch(tmp_path):
    rep = _classify_json(_recorded_trace(tmp_path / "rec.sqlite", True), block_torch=True)
    ops = {o["name"].split(" ")[0]: o for o in rep["ops"]}
    attn, add = ops["aten::_scaled_dot_product_flash_attention"], ops["aten::add.Tensor"]
    assert attn["evidence"]["element_type"] == add["evidence"]["element_type"] == "bf16"
    assert add["evidence"]["element_type_basis"].startswith("recorded")
    b, h, lq, d = 8, 16, 1024, 64
    flops = attn["evidence"].get("flops_per_call")
    assert flops == pytest.approx(4 * b * h * lq * lq * d / 2)  # causal, from the record
    assert add["evidence"].get("bytes_per_call") == pytest.approx(3 * 4096 * 4096 * 2)
    assert add["confidence"] != "low"
    base = _classify_json(_recorded_trace(tmp_path / "plain.sqlite", False), block_torch=True)
    plain = {o["name"].split(" ")[0]: o for o in base["ops"]}
    # no record, no type in the kernel name: both bounds, low confidence, as before
    assert plain["aten::add.Tensor"]["evidence"]["element_type"] == "unknown"
    assert plain["aten::add.Tensor"]["confidence"] == "low"


def test_recorded_pairs_point_to_the_bundled_kernel(tmp_path):
    """The recorder writes emit_nvtx's op_id/input_op_ids on producers and consumers, so an add
    feeding a layer norm is found as a pair the bundled add+LayerNorm fuses."""
    def step(torch):
        x, r, w, b = (torch.randn(*s) for s in ((64, 4096), (64, 4096), (4096,), (4096,)))
        for _ in range(3):
            torch.nn.functional.layer_norm(x + r, (4096,), w, b)
    texts, _ = _record(step)
    assert any("input_op_ids = [(" in t and t.startswith("aten::native_layer_norm") for t in texts)
    # the same texts as NVTX ranges around kernels of a synthetic trace, read without torch
    strings = {1: "vectorized_elementwise_kernel", 2: "vectorized_layer_norm_kernel", 9: "cudaLaunchKernel"}
    kernels, runtime, nvtx, t = [], [], [], 1_000_000
    for i, text in enumerate(texts):
        name = 2 if text.startswith("aten::native_layer_norm") else 1
        nvtx.append((t, t + 10_000, text, TID))
        runtime.append((t + 1000, t + 5000, i + 1))
        kernels.append((t + 6000, t + 30_000, i + 1, name))
        t += 80_000
    path = make_trace(tmp_path / "pairs.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx,
                      strings=strings)
    rep = _classify_json(path, block_torch=True)
    norm = next(o for o in rep["ops"] if o["name"].startswith("aten::native_layer_norm"))
    assert "kernels.add_layernorm" in norm["suggestion"]["action"]
    assert "aten::add.Tensor that feeds it" in norm["suggestion"]["action"]

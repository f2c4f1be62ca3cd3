"""Replacements timed at the program's shapes: the op record of one calibration iteration
(profkit/capture/oprecord.py), the timings made from it (profkit/capture/replacements.py, run here
on the CPU: the code path is the GPU's, the numbers are not), their reading
(profkit/run/replacements.py) and the rules that price from them (PK301, PK201, PK104, PK106,
PK302), each on a temporary copy of a committed trace with a ``replacements`` meta written into it
(the committed traces are never written). The GPU tests skip without CUDA."""
from __future__ import annotations

import collections
import json
import lzma
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import profkit  # noqa: E402
from profkit.capture import replacements as timing  # noqa: E402
from profkit.capture.oprecord import OpRecord  # noqa: E402
from profkit.capture.runner import CaptureResult, replacement_pass  # noqa: E402
from profkit.judge.flops import flash_attention_work  # noqa: E402
from profkit.judge.rules import evaluate  # noqa: E402
from profkit.judge.rules import pk301_attention_path as pk301  # noqa: E402
from profkit.judge.rules.base import RuleContext  # noqa: E402
from profkit.run.replacements import Replacements, parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()

PROGRAM = """
import nvtx, torch, torch.nn.functional as F
torch.manual_seed(0)
B, H, S, D = 2, 4, 16, 8
lin = torch.nn.Linear(D * H, D * H)
cell = torch.nn.LSTMCell(12, 20)
opt = torch.optim.AdamW(list(lin.parameters()) + list(cell.parameters()), lr=1e-3, foreach=True)
mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
for it in range(6):
    with nvtx.annotate("step"):
        x = torch.randn(B, S, D * H)
        h = lin(x).view(B, S, H, D).transpose(1, 2)
        q, k, v = h, h * 0.5, h + 1
        s = (q @ k.transpose(-2, -1)) / D ** 0.5
        s = s.masked_fill(mask, float("-inf"))
        p = F.softmax(s.float(), dim=-1).to(q.dtype)
        o = p @ v
        hx, cx = torch.zeros(3, 20), torch.zeros(3, 20)
        for t in range(5):
            hx, cx = cell(torch.randn(3, 12), (hx, cx))
        x.to("meta")   # a copy off the host (the CPU's stand-in for a host-to-device copy)
        loss = o.sum() + hx.sum()
        opt.zero_grad(); loss.backward(); opt.step()
print("done", float(loss))
"""


def _record(fn, pushes: int = 3, uncompiled: bool = True) -> dict:
    """The op record of ``fn()`` run as the watched iteration (the third start of `step`)."""
    # A compile test earlier in this process leaves Dynamo's frame count up, and the record
    # would take this test's program for a compiled one (it records nothing then, by design)
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None and uncompiled:
        utils.counters["frames"].clear()
    rec = OpRecord()
    for _ in range(pushes):
        rec.on_push("step")
    fn()
    rec.on_push("step")
    return rec.finish()


def test_the_record_marks_host_to_device_copies_of_weights():
    """Weights streamed from host memory (a CPU offload: each layer's parameters copied to the
    device before its forward) are marked ``weights``; an input batch copied the same way is not.
    ("meta" stands in for the device on the CPU.)"""
    layer = torch.nn.Linear(16, 8)
    batch = torch.randn(4, 16)

    def step():
        w = {n: p.to("meta") for n, p in layer.named_parameters()}
        batch.to("meta")
        return w

    rec = _record(step)
    assert sorted(rec["copy"], key=lambda c: c["bytes"]) == [
        {"direction": "h2d", "bytes": 8 * 4, "pinned": False, "non_blocking": False, "count": 1, "weights": True},
        {"direction": "h2d", "bytes": 4 * 16 * 4, "pinned": False, "non_blocking": False, "count": 1},
        {"direction": "h2d", "bytes": 8 * 16 * 4, "pinned": False, "non_blocking": False, "count": 1,
         "weights": True}]


def test_the_record_names_the_parameters_no_optimizer_steps():
    """A distillation step whose teacher was never frozen: at the optimizer's step the teacher's
    parameters hold gradients no optimizer steps; the student's are stepped."""
    teacher = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    student = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    x = torch.randn(16, 8)

    def step():
        loss = torch.nn.functional.mse_loss(student(x), teacher(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert _record(step)["unstepped"] == [{"module": "Sequential", "tensors": 4, "elements": 8 * 32 + 32 + 32 * 4 + 4}]
    with torch.no_grad():                      # the fix: nothing of the teacher's is left to report
        for p in teacher.parameters():
            p.grad = None
    teacher.requires_grad_(False)
    assert _record(step)["unstepped"] == []


def _attention(mask: str):
    q = torch.randn(6, 32, 16)
    k = torch.randn(6, 32, 16)
    v = torch.randn(6, 32, 24)
    s = q @ k.transpose(-2, -1)
    if mask == "additive":
        s = s + torch.triu(torch.full((32, 32), float("-inf")), diagonal=1)
    elif mask == "where":
        keep = torch.tril(torch.ones(32, 32, dtype=torch.bool))
        s = torch.where(keep, s, torch.tensor(float("-inf")))
    elif mask == "padding":
        pad = torch.zeros(32, 32, dtype=torch.bool)
        pad[:, -4:] = True
        s = s.masked_fill(pad, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# -- the op record ---------------------------------------------------------------------------------
def test_bootstrap_records_one_iteration_of_a_cpu_program(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    res = subprocess.run([sys.executable, "-m", "profkit.capture.bootstrap", "--calibrate",
                          str(tmp_path / "cal.json"), "--record-ops", str(tmp_path / "ops.json"),
                          "--", "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("done")
    cal = json.loads((tmp_path / "cal.json").read_text())
    assert [r["name"] for r in cal["ranges"]] == ["step"] * 6       # the calibration is as before
    text = (tmp_path / "ops.json").read_text()
    rec = json.loads(text)
    assert rec["format"] == "profkit-oprecord/1" and rec["range"] == "step" and rec["iteration"] == 3
    assert rec["notes"] == []
    assert rec["attention"] == [{"batch": 8, "sq": 16, "sk": 16, "d": 8, "dv": 8, "dtype": "fp32",
                                 "mask": "causal", "grad": True, "count": 1}]
    (opt,) = rec["optimizer"]
    n_params = 32 * 32 + 32 + 4 * 20 * 12 + 4 * 20 * 20 + 2 * 4 * 20
    assert (opt["class"], opt["foreach"], opt["params"], opt["numel"]) == ("AdamW", True, 6, n_params)
    assert opt["device"] == "cpu" and opt["dtype"] == "fp32"
    assert rec["rnn_cell"] == [{"cell": "LSTMCell", "input": 12, "hidden": 20, "batch": 3, "bias": True,
                                "dtype": "fp32", "grad": True, "calls": 5}]
    assert rec["copy"] == [{"direction": "h2d", "bytes": 2 * 16 * 32 * 4, "pinned": False,
                            "non_blocking": False, "count": 1}]
    gemms = collections.Counter()
    for g in rec["gemm"]:   # one shape in several layouts (the backward's transposed views)
        gemms[(g["op"], g["batch"], g["m"], g["n"], g["k"])] += g["count"]
    assert gemms[("bmm", 8, 16, 16, 8)] == 2 and gemms[("bmm", 8, 16, 8, 16)] >= 1   # forward and backward
    assert gemms[("addmm", 1, 3, 80, 12)] == 5           # the cell's input projection, each step
    # small and cheap: a few KB, a few microseconds of bookkeeping an op
    assert len(text) < 8000
    assert rec["ops_seen"] > 100 and rec["cost_ns"] / rec["ops_seen"] < 200_000


@pytest.mark.parametrize("mask,kind", [("none", "none"), ("additive", "causal"), ("where", "causal"),
                                       ("padding", "masked")])
def test_the_mask_between_the_gemm_and_the_softmax(mask, kind):
    rec = _record(lambda: _attention(mask))
    assert rec["attention"] == [{"batch": 6, "sq": 32, "sk": 32, "d": 16, "dv": 24, "dtype": "fp32",
                                 "mask": kind, "grad": False, "count": 1}]


def test_casts_around_the_softmax_keep_the_pattern():
    """Autocast runs the softmax in fp32: a cast before it and one back to bf16 after it (the way a
    hand-written causal attention runs under autocast on a GPU) are steps like the mask's."""
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    keep = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)

    def attention():
        s = (q @ k.transpose(-2, -1)) * 8 ** -0.5
        s = s.masked_fill(keep[:, :, :16, :16] == 0, float("-inf"))
        p = torch.nn.functional.softmax(s.float(), dim=-1).to(torch.bfloat16)
        return torch.nn.functional.dropout(p, 0.1, training=True) @ v
    rec = _record(attention)
    assert rec["attention"] == [{"batch": 6, "sq": 16, "sk": 16, "d": 8, "dv": 8, "dtype": "bf16",
                                 "mask": "causal", "grad": False, "count": 1}]


def test_dropout_on_the_probabilities_is_recorded_and_timed():
    """A training attention drops probabilities (native_dropout on a GPU); SDPA draws that dropout
    in its own kernels, at a cost of its own: the record keeps p, and the timing passes it on."""
    q, k, v = (torch.randn(2, 16, 8, requires_grad=True) for _ in range(3))

    def attention():
        p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return torch.native_dropout(p, 0.1, True)[0] @ v
    rec = _record(attention)
    assert rec["attention"] == [{"batch": 2, "sq": 16, "sk": 16, "d": 8, "dv": 8, "dtype": "fp32",
                                 "mask": "none", "grad": True, "count": 1, "dropout": 0.1}]
    e = timing.time_attention(torch, timing.Timer(torch, torch.device("cpu"), 1), rec["attention"][0])
    assert e["error"] is None and e["key"].endswith("grad dropout=0.1"), e


def test_the_gemms_of_fused_attention_and_encoder_layers_are_recorded():
    """nn.MultiheadAttention and nn.TransformerEncoderLayer run as one op in inference (their fast
    paths): their projections and feed-forward are GEMMs the dispatch never shows alone."""
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    layer = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=80, batch_first=True).eval()
    x, y = torch.randn(2, 10, 64), torch.randn(3, 7, 32)

    def step():
        with torch.no_grad():
            mha(x, x, x, need_weights=False)
            layer(y)
    rec = _record(step)
    got = {(g["m"], g["n"], g["k"]): g["count"] for g in rec["gemm"] if g["op"] == "addmm"}
    assert got == {(20, 192, 64): 1, (20, 64, 64): 1,             # MHA: Q/K/V in one GEMM, the output
                   (21, 96, 32): 1, (21, 32, 32): 1, (21, 80, 32): 1, (21, 32, 80): 1}, got   # encoder: + feed-forward
    assert rec["attention"] == []


def test_the_heaviest_unaligned_gemms_are_timed_beside_the_aligned_ones():
    """A Conformer's attention GEMMs over 399 frames run on unaligned kernels in bf16: their gain is
    not the aligned projections', so the heaviest of them are timed even where six aligned shapes
    carry more work; a tiny unaligned GEMM is not."""
    aligned = [{"op": "mm", "batch": 1, "m": 4096, "n": 1024 + 64 * i, "k": 1024, "dtype": "fp32", "count": 4}
               for i in range(8)]
    odd = [{"op": "bmm", "batch": 256, "m": 399, "n": 399, "k": 64, "dtype": "fp32", "count": 4},
           {"op": "mm", "batch": 1, "m": 3, "n": 5, "k": 7, "dtype": "fp32", "count": 1}]
    shapes = timing.gemm_shapes(aligned + odd)
    assert len(shapes) == timing.MAX_PER_KIND and odd[0] in shapes and odd[1] not in shapes
    assert shapes[:4] == sorted(aligned, key=lambda g: -g["n"])[:4]     # heaviest first
    assert timing.gemm_shapes(aligned)[:6] == sorted(aligned, key=lambda g: -g["n"])[:6]


def test_unaligned_gemms_each_small_but_many_are_timed_together():
    """A Conformer's six attention GEMM shapes over 399 frames hold 2% of the FLOPs each (12%
    together): the heaviest two are timed, while unaligned shapes under 0.5% each are not."""
    aligned = [{"op": "mm", "batch": 1, "m": 25536, "n": 1024, "k": 256 + 64 * i, "dtype": "fp32", "count": 16}
               for i in range(8)]
    attn = [{"op": "bmm", "batch": 256, "m": 399, "n": 399 - i, "k": 64, "dtype": "fp32", "count": 8}
            for i in range(6)]
    total = sum(timing._work("gemm", g) for g in aligned + attn)
    assert all(timing._work("gemm", g) < timing.UNALIGNED_SHARE * total for g in attn)
    shapes = timing.gemm_shapes(aligned + attn)
    assert [g for g in shapes if g in attn] == attn[:2] and len(shapes) == timing.MAX_PER_KIND
    crumbs = [{"op": "mm", "batch": 1, "m": 3, "n": 5 + i, "k": 7, "dtype": "fp32", "count": 1} for i in range(6)]
    assert not [g for g in timing.gemm_shapes(aligned + crumbs) if g in crumbs]


def _gemm_entry(shape: dict, fp32_ns: float, bf16_ns: float):
    from profkit.run.replacements import Replacement
    return Replacement("gemm_bf16", timing.gemm_key(shape), shape, int(shape["count"]), fp32_ns, bf16_ns,
                       "bf16", 10, None)


def test_the_gemm_gain_weighs_aligned_and_unaligned_shapes_by_their_flops():
    """Aligned shapes timed 10x faster in bf16 and unaligned ones slower than fp32 (0.7x): each
    group stands for its share of the recorded FLOPs (88% and 12%), at its own fp32 time per
    FLOP; one ratio over the timed shapes would weigh the unaligned group by the two shapes timed."""
    big = {"op": "mm", "batch": 1, "m": 4096, "n": 4096, "k": 1024, "dtype": "fp32", "count": 4}
    odd = {"op": "bmm", "batch": 64, "m": 399, "n": 399, "k": 64, "dtype": "fp32", "count": 8}
    f_big, f_odd = 4096 * 4096 * 1024, 64 * 399 * 399 * 64
    # the record: the big shape and five more like it; the odd one and nine more like it
    record = {"gemm": [dict(big)] * 6 + [dict(odd)] * 10}
    entries = (_gemm_entry(big, 1000.0, 100.0), _gemm_entry(odd, 300.0, 300.0 / 0.7))
    r = Replacements(entries=entries, record=record)
    per_big, per_odd = 1000.0 / f_big, 300.0 / f_odd          # fp32 ns per multiply-add
    w_big, w_odd = 6 * 4 * f_big, 10 * 8 * f_odd
    want = (w_big * per_big + w_odd * per_odd) / (w_big * per_big / 10 + w_odd * per_odd / 0.7)
    assert r.gemm_gain("gemm_bf16") == pytest.approx(want, rel=1e-9)
    plain = (4 * 1000.0 + 8 * 300.0) / (4 * 100.0 + 8 * 300.0 / 0.7)
    assert want < plain
    # one group timed: the plain ratio of the timed shapes; nothing timed: None
    assert Replacements(entries=entries[:1], record=record).gemm_gain("gemm_bf16") == pytest.approx(10.0)
    assert Replacements(record=record).gemm_gain("gemm_bf16") is None


def test_stacked_cells_are_recorded_and_timed_as_one_multi_layer_rnn():
    """Layer 2 steps on layer 1's h: nn.LSTM(num_layers=2) runs both (cuDNN overlaps its layers);
    an independent cell of the same sizes, fed by data, stays a layer of its own."""
    c1, c2, c3 = torch.nn.LSTMCell(6, 8), torch.nn.LSTMCell(8, 8), torch.nn.LSTMCell(8, 8)

    def step():
        s1 = s2 = s3 = (torch.zeros(2, 8), torch.zeros(2, 8))
        for _ in range(4):
            s1 = c1(torch.randn(2, 6), s1)
            s2 = c2(s1[0], s2)
            s3 = c3(torch.randn(2, 8), s3)
    rec = _record(step)
    assert [c.get("fed_by") for c in rec["rnn_cell"]] == [None, 0, None]
    assert [[c["input"] for c in s] for s in timing.stacks(rec["rnn_cell"])] == [[6, 8], [8]]
    e = timing.time_rnn(torch, timing.Timer(torch, torch.device("cpu"), 1), timing.stacks(rec["rnn_cell"])[0])
    assert e["error"] is None and e["key"] == "LSTMCell x2 I=6 H=8 B=2 T=4 fp32 grad", e
    assert e["shape"]["layers"] == 2 and e["original_ns"] > 0 and e["replacement_ns"] > 0


def test_the_record_names_the_lines_that_make_the_host_wait(monkeypatch):
    """The ops that wait for the GPU, each at the program's line and the torch API it went
    through (on the CPU, its tensors standing in for a device's)."""
    import sys
    import profkit.capture.syncsites as syncsites
    from torch.distributions import Categorical
    monkeypatch.setattr(syncsites, "on_device", lambda t: isinstance(t, torch.Tensor))
    at = {}

    def body():
        x = torch.randn(64, 5)
        for _ in range(3):
            at["item"] = sys._getframe().f_lineno; x.sum().item()  # noqa: E702
        at["dist"] = sys._getframe().f_lineno; Categorical(logits=x, validate_args=True).sample()  # noqa: E702
        at["mask"] = sys._getframe().f_lineno; x[x > 0]  # noqa: E702
        at["cpu"] = sys._getframe().f_lineno; x.to("meta")  # noqa: E702  (not a copy to the host)

    rec = _record(body)
    here = "tests/test_replacements.py" if not __file__.startswith("/") else None
    by = {(s["op"], s["line"]): s for s in rec["sync"]}
    item = by[("item", at["item"])]
    assert item["count"] == 3 and item["function"] == "body" and item["via"] is None
    assert item["file"].endswith("test_replacements.py") and (here is None or item["file"] == here)
    # Categorical's argument validation reads its check back: the program's line, torch's API
    dist = [s for s in rec["sync"] if s["line"] == at["dist"]]
    assert dist and all(s["op"] == "item" for s in dist)
    assert all(s["via"].startswith("torch/distributions/") for s in dist), dist
    assert by[("boolean index", at["mask"])]["count"] == 1
    assert not [s for s in rec["sync"] if s["line"] == at["cpu"]]
    # without a device the CPU's values never wait: nothing recorded
    monkeypatch.undo()
    assert _record(body)["sync"] == []


def test_inference_mode_waits_and_copies_are_recorded_as_in_grad_mode(monkeypatch):
    """Under inference mode the dispatch shows ``item``, ``is_nonzero`` and ``to`` (autograd does
    not lower them to ``_local_scalar_dense`` and ``_to_copy``): the same waits as in grad mode."""
    import sys
    import profkit.capture.syncsites as syncsites
    monkeypatch.setattr(syncsites, "on_device", lambda t: isinstance(t, torch.Tensor))
    at = {}

    def body():
        x = torch.randn(64, 5)
        at["item"] = sys._getframe().f_lineno; float(x.sum())  # noqa: E702
        at["bool"] = sys._getframe().f_lineno; bool(x.max() > 0)  # noqa: E702
        at["mask"] = sys._getframe().f_lineno; x[x > 0]  # noqa: E702

    def inference():
        with torch.inference_mode():
            body()
    rec = _record(inference)
    by = {(s["op"], s["line"]) for s in rec["sync"]}
    assert {("item", at["item"]), ("item", at["bool"]), ("boolean index", at["mask"])} <= by, rec["sync"]
    assert rec["sync_watch"] is False   # no CUDA: the waits are told by the ops' names


class _OnDevice:
    """A device tensor's face, as the copy record reads it (the CPU cannot hold one)."""
    device = type("Device", (), {"type": "cuda"})()

    def numel(self):
        return 1000

    def element_size(self):
        return 4


@pytest.mark.parametrize("func, args, kwargs, non_blocking", [
    ("to.dtype_layout", (), {"device": "cpu", "non_blocking": True}, True),
    ("to.dtype_layout", (), {"device": "cpu"}, False),
    ("to.device", ("cpu", torch.float32, True), {}, True),
    ("_to_copy.default", (), {"device": "cpu"}, False)])
def test_a_copy_to_the_host_through_to_is_a_copy_and_a_wait(func, args, kwargs, non_blocking):
    """``.cpu()`` under inference mode is ``to``: a device-to-host copy, blocking unless
    ``non_blocking`` (positional or keyword, read by the op's schema) into pinned memory."""
    op = torch.ops.aten
    for part in func.split("."):
        op = getattr(op, part)
    from profkit.capture.syncsites import SyncSites
    rec = OpRecord()
    rec.syncs = SyncSites()
    rec._copy(op, (_OnDevice(), *args), kwargs, torch.empty(1000))
    (key, count), = rec.copy.items()
    assert key == ("d2h", 4000, False, non_blocking, False) and count == 1
    # pageable host memory: the copy waits either way
    assert [s["op"] for s in rec.syncs.as_list()] == ["copy to host"]


@pytest.fixture
def sync_warning_op():
    """An op whose implementation raises CUDA's sync warning, as an op that reads a value back
    inside itself does under the sync debug mode (a Python op on the CPU stands in)."""
    from profkit.capture.syncsites import SYNC_WARNING
    import warnings
    lib = torch.library.Library("profkit_synctest", "FRAGMENT")
    lib.define("reads_back(Tensor x) -> Tensor")

    def impl(x):
        warnings.warn(SYNC_WARNING)
        return x * 2
    lib.impl("reads_back", impl, "CompositeExplicitAutograd")
    yield torch.ops.profkit_synctest.reads_back
    lib._destroy()


def test_the_sync_watch_names_waits_inside_ops_and_outside_them(monkeypatch, sync_warning_op, recwarn):
    """With CUDA's sync debug mode on (a stand-in here), a wait inside an op's own implementation is
    ``in op`` with the op's name, one outside any op (``torch.cuda.synchronize()``) is
    ``synchronize`` at the program's line, an op that did not wait is no wait even where its name
    says it may (a CPU ``.item()``: on a GPU it waits, and is ``item`` by its name with or without
    the watch), and the program's other warnings pass as before; the debug
    mode is set back after the iteration."""
    import sys
    import warnings
    from profkit.capture.syncsites import SYNC_WARNING
    modes = ["off"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: modes.append(m))
    at = {}

    def body():
        x = torch.randn(8)
        for _ in range(2):
            at["op"] = sys._getframe().f_lineno; sync_warning_op(x)  # noqa: E702
        at["sync"] = sys._getframe().f_lineno; warnings.warn(SYNC_WARNING)  # noqa: E702
        x.sum().item()
        warnings.warn("the program's own warning")
    rec = _record(body)
    got = {(s["op"], s["line"]): s for s in rec["sync"]}
    assert set(got) == {("in op", at["op"]), ("synchronize", at["sync"])}, rec["sync"]
    assert got[("in op", at["op"])]["inside"] == "reads_back" and got[("in op", at["op"])]["count"] == 2
    assert "inside" not in got[("synchronize", at["sync"])]
    assert rec["sync_watch"] is True and modes == ["off", "warn", 0]
    assert [str(w.message) for w in recwarn.list] == ["the program's own warning"]


def test_a_wait_its_op_noted_is_not_counted_again_when_cuda_warns_after_the_op(monkeypatch, recwarn):
    """On a GPU, CUDA's warning for ``.item()``'s read reaches Python when the program's call
    returns, after the aten op the record noted it by (an H100, 2026-12-07: four waits each
    counted twice, once as ``synchronize``): the warning at the op's line claims that note; a
    second warning at the line, with nothing left to claim, is a wait of its own."""
    import sys
    import warnings
    from profkit.capture import syncsites
    from profkit.capture.syncsites import SYNC_WARNING
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: None)
    monkeypatch.setattr(syncsites, "on_device", lambda t: True)   # the CPU tensor as a GPU's
    at = {}

    def body():
        x = torch.randn(8)
        at["item"] = sys._getframe().f_lineno; x.sum().item(); warnings.warn(SYNC_WARNING)  # noqa: E702
        at["two"] = sys._getframe().f_lineno; x.sum().item(); [warnings.warn(SYNC_WARNING) for _ in "ab"]  # noqa: E702,E501
    rec = _record(body)
    got = {(s["op"], s["line"]): s["count"] for s in rec["sync"]}
    assert got == {("item", at["item"]): 1, ("item", at["two"]): 1, ("synchronize", at["two"]): 1}, rec["sync"]


def test_only_one_iteration_is_watched_and_a_named_step_waits_for_its_range():
    rec = OpRecord(step="train")
    for _ in range(5):
        rec.on_push("data")
    assert not rec.active
    for _ in range(3):
        rec.on_push("train")
    assert rec.active and rec.range == "train"
    rec.on_push("data")                  # another range inside the period: still watched
    assert rec.active
    rec.on_push("train")
    assert not rec.active and rec.done
    _attention("none")                   # after the iteration: not recorded
    out = rec.finish()
    assert out["attention"] == [] and out["range"] == "train"
    assert OpRecord().finish()["notes"] == ["no top-level NVTX range started three times: no "
                                            "iteration to record"]


def test_a_failing_record_never_breaks_the_program(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("recorder bug")
    monkeypatch.setattr(OpRecord, "_gemm", boom)
    got = {}
    rec = _record(lambda: got.setdefault("out", _attention("none")))
    expected = _attention("none")
    assert got["out"].shape == expected.shape                   # the program's result is there
    assert rec["notes"] and rec["notes"][0].startswith("op record failed at bmm.default: RuntimeError: recorder bug")
    assert rec["attention"] == []
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    assert _get_current_dispatch_mode() is None                 # the mode is gone: later ops run plain


def test_a_failing_hook_is_a_note_not_an_error(monkeypatch):
    def boom(*a, **k):
        raise ValueError("hook bug")
    monkeypatch.setattr(OpRecord, "_optimizer_hook", boom)
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.1)

    def step():
        p.grad = torch.ones(4)
        opt.step()
    rec = _record(step)
    assert torch.allclose(p.detach(), torch.full((4,), 0.9))    # the step ran
    assert rec["optimizer"] == []


def test_the_record_keeps_2d_convolutions_as_the_program_ran_them():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)   # a depthwise one
    point = torch.nn.Conv2d(8, 16, 1)
    x = torch.randn(2, 8, 12, 12)

    def it():
        y = point(conv(x))
        y.sum().backward()
        with torch.no_grad():
            point(conv(x.contiguous(memory_format=torch.channels_last)))
        torch.nn.functional.conv1d(torch.randn(1, 2, 9), torch.randn(3, 2, 3))   # 1-D: not kept
    rec = _record(it)
    got = {(tuple(c["weight"]), c["channels_last"], c["grad"]): c for c in rec["conv"]}
    assert set(got) == {((8, 1, 3, 3), False, True), ((16, 8, 1, 1), False, True),
                        ((8, 1, 3, 3), True, False), ((16, 8, 1, 1), True, False)}
    dw = got[((8, 1, 3, 3), False, True)]
    assert dw == {"input": [2, 8, 12, 12], "weight": [8, 1, 3, 3], "stride": [1, 1], "padding": [1, 1],
                  "dilation": [1, 1], "groups": 8, "dtype": "fp32", "channels_last": False, "grad": True,
                  "tf32": torch.backends.cudnn.allow_tf32, "count": 1}



def test_the_record_keeps_3d_convolutions_and_their_channels_last_3d():
    conv = torch.nn.Conv3d(4, 8, (3, 3, 3), stride=(1, 2, 2), padding=1)   # a video model's stem
    x = torch.randn(2, 4, 4, 8, 8)

    def it():
        conv(x).sum().backward()
        with torch.no_grad():
            conv(x.contiguous(memory_format=torch.channels_last_3d))
    rec = _record(it)
    got = {c["channels_last"]: c for c in rec["conv"]}
    assert set(got) == {False, True}
    assert got[False] == {"input": [2, 4, 4, 8, 8], "weight": [8, 4, 3, 3, 3], "stride": [1, 2, 2],
                          "padding": [1, 1, 1], "dilation": [1, 1, 1], "groups": 1, "dtype": "fp32",
                          "channels_last": False, "grad": True, "tf32": torch.backends.cudnn.allow_tf32,
                          "count": 1}
    assert got[True]["grad"] is False


def test_a_3d_convolution_is_timed_as_conv3d_on_channels_last_3d():
    c = {"input": [2, 4, 4, 8, 8], "weight": [8, 4, 3, 3, 3], "stride": [1, 2, 2], "padding": [1, 1, 1],
         "dilation": [1, 1, 1], "groups": 1, "dtype": "fp32", "channels_last": False, "grad": True,
         "tf32": True, "count": 3}
    out = timing.time_record({**RECORD, "attention": [], "optimizer": [], "rnn_cell": [], "copy": [],
                              "gemm": [], "conv": [c]}, device="cpu", reps=1)
    e, cl = out["entries"]
    assert e["error"] is None, e
    assert e["key"] == "x=2x4x4x8x8 w=8x4x3x3x3 s=1x2x2 fp32 grad" and e["count"] == 3
    assert e["original"] == "TF32, NCDHW" and e["backend"] == "bf16, channels_last_3d"
    assert e["forward"]["original_ns"] > 0 and e["original_ns"] > 0   # timed; their order is noise here
    # and the layout alone: the same shape in its own precision on channels_last_3d tensors
    assert cl["kind"] == "conv_cl" and cl["error"] is None and cl["key"] == e["key"]
    assert cl["original"] == "TF32, NCDHW" and cl["backend"] == "TF32, channels_last_3d"
    # the heavier of two 3-D shapes is timed first: multiply-adds over the output's volume
    big = {**c, "input": [2, 4, 8, 16, 16]}
    assert timing._work("conv", big) == 8 * timing._work("conv", c)


def test_a_compiled_program_is_not_recorded(monkeypatch):
    """Its compiled frames would recompile or run eagerly under the record's dispatch mode and
    hooks (an HF Llama step: 57 ms an iteration in the recording calibration run, 30 ms without)."""
    from torch._dynamo.utils import counters
    monkeypatch.setitem(counters["frames"], "ok", counters["frames"].get("ok", 0) + 1)
    lin = torch.nn.Linear(4, 4)
    rec = _record(lambda: lin(torch.randn(2, 4)).sum().backward(), uncompiled=False)
    assert rec["gemm"] == [] and rec["ops_seen"] == 0
    assert rec["notes"] == ["the script runs torch.compile'd code: its ops are not recorded (recording "
                            "them would make its compiled frames recompile or run eagerly in the "
                            "calibration run)"]

# -- the timings, on the CPU -----------------------------------------------------------------------
RECORD = {
    "format": "profkit-oprecord/1", "range": "step", "iteration": 3, "device": "cuda",
    "attention": [{"batch": 4, "sq": 32, "sk": 32, "d": 16, "dv": 16, "dtype": "fp32", "mask": "causal",
                   "grad": True, "count": 2}],
    "optimizer": [{"class": "AdamW", "foreach": None, "fused": None, "dtype": "fp32", "device": "cuda",
                   "params": 3, "numel": 1000 * 2 + 64, "sizes": [[1000, 2], [64, 1]], "options": {}}],
    "rnn_cell": [{"cell": "LSTMCell", "input": 8, "hidden": 16, "batch": 4, "bias": True, "dtype": "fp32",
                  "grad": False, "calls": 6}],
    "copy": [{"direction": "h2d", "bytes": 4096, "pinned": False, "non_blocking": False, "count": 3}],
    "gemm": [{"op": "mm", "batch": 1, "m": 24, "n": 40, "k": 16, "dtype": "fp32", "count": 4},
             {"op": "mm", "batch": 1, "m": 24, "n": 40, "k": 16, "dtype": "bf16", "count": 4}],
    "conv": [{"input": [2, 8, 12, 12], "weight": [8, 1, 3, 3], "stride": [1, 1], "padding": [1, 1],
              "dilation": [1, 1], "groups": 8, "dtype": "fp32", "channels_last": False, "grad": True,
              "tf32": True, "count": 2},
             {"input": [2, 8, 12, 12], "weight": [8, 8, 1, 1], "stride": [1, 1], "padding": [0, 0],
              "dilation": [1, 1], "groups": 1, "dtype": "bf16", "channels_last": True, "grad": False,
              "tf32": True, "count": 1}]}


@pytest.fixture(scope="module")
def timed_on_cpu() -> dict:
    return timing.time_record(RECORD, device="cpu", reps=2)


def test_the_timings_are_well_formed_on_the_cpu(timed_on_cpu):
    out = timed_on_cpu
    assert out["format"] == "profkit-replacements/1" and out["device"] == "cpu"
    kinds = [e["kind"] for e in out["entries"]]
    # the bf16 GEMM and the bf16 convolution are not timed: only fp32 ones are PK302's and PK305's
    assert kinds == ["attention", "optimizer", "rnn", "copy", "gemm_tf32", "gemm_bf16", "conv_bf16", "conv_cl"]
    for e in out["entries"]:
        assert set(e) >= {"kind", "key", "shape", "count", "original_ns", "replacement_ns", "backend",
                          "repetitions", "spread", "error", "seconds"}
        if e["kind"] == "copy":
            assert e["error"] == "pinned memory needs CUDA" and e["original_ns"] is None
            continue
        assert e["error"] is None, e
        assert e["original_ns"] > 0 and e["replacement_ns"] > 0 and e["repetitions"] == 2
        for side in ("original_ns", "replacement_ns"):
            lo, hi = e["spread"][side]
            assert lo <= e[side] <= hi
    attn = out["entries"][0]
    # SDPA as the program would call it, no backend chosen; each backend beside it
    assert attn["key"] == "b=4 sq=32 sk=32 d=16 dv=16 fp32 causal grad" and attn["backend"] == "default"
    assert set(attn["backends"]) == {"default", "flash"}
    assert attn["count"] == 2 and set(attn["forward"]) == {"original_ns", "replacement_ns"}
    opt = out["entries"][1]
    assert opt["backend"] == "fused" and opt["original"] == "for-loop"   # foreach=None on the CPU
    assert opt["host"]["original_ns"] > 0
    assert out["entries"][2]["backend"] == "nn.LSTM"
    assert out["entries"][2]["original"] == "the cell loop"              # no CUDA graph on the CPU
    conv = out["entries"][6]
    assert conv["key"] == "x=2x8x12x12 w=8x1x3x3 s=1x1 g=8 fp32 grad" and conv["count"] == 2
    assert conv["backend"] == "bf16, channels_last" and conv["original"] == "TF32, NCHW"
    # forward and backward timed, the forward alone beside it (both timed: which is shorter is a
    # timing on a shared CPU, 2 repetitions of microseconds, and no test of the code)
    assert conv["forward"]["original_ns"] > 0 and conv["forward"]["replacement_ns"] > 0
    assert conv["original_ns"] > 0
    layout = out["entries"][7]   # the same shape in TF32 on channels_last tensors: the layout alone
    assert layout["key"] == conv["key"] and layout["backend"] == "TF32, channels_last"
    assert layout["original"] == "TF32, NCHW" and layout["original_ns"] > 0 and layout["replacement_ns"] > 0


def test_the_timing_command_and_no_cuda(tmp_path):
    rec = tmp_path / "ops.json"
    rec.write_text(json.dumps({**RECORD, "gemm": [], "copy": [], "rnn_cell": [], "optimizer": [], "conv": []}))
    out = tmp_path / "out.json"
    assert timing.main([str(rec), str(out), "--device", "cpu", "--reps", "1"]) == 0
    data = json.loads(out.read_text())
    assert [e["kind"] for e in data["entries"]] == ["attention"]
    if not CUDA:
        assert timing.time_record(RECORD)["notes"] == ["no CUDA device: the replacements were not timed"]


def test_one_failing_shape_is_that_entrys_error(monkeypatch):
    def boom(torch, timer, a):
        raise MemoryError("CUDA out of memory. Tried to allocate 80 GiB\nmore")
    monkeypatch.setattr(timing, "time_attention", boom)
    out = timing.time_record({"attention": RECORD["attention"]}, device="cpu", reps=1)
    (e,) = out["entries"]
    assert e["error"] == "MemoryError: CUDA out of memory. Tried to allocate 80 GiB"
    # a class torch.optim lacks is timed as a fused step's floor; too many elements, not at all
    assert timing.time_optimizer(torch, timing.Timer(torch, torch.device("cpu"), 1),
                                 {**RECORD["optimizer"][0], "numel": 10 ** 12})["error"].endswith(
        "elements: more than this timing allocates")


def test_the_budget_stops_the_timing():
    out = timing.time_record(RECORD, device="cpu", reps=1, budget_s=0.0)
    assert out["entries"] == [] and out["notes"][0].startswith("the timing budget of 0 s was spent: 8 shape(s)")


# -- reading ---------------------------------------------------------------------------------------
def test_parsing_round_trip(timed_on_cpu):
    meta = {**timed_on_cpu, "record": RECORD, "notes": ["a note"]}
    got = parse(json.dumps(meta))
    assert len(got.entries) == 8 and got.notes == ("a note",)
    assert got.measured("conv_bf16")[0].forward is not None and got.recorded("conv") == RECORD["conv"]
    attn = got.measured("attention")[0]
    raw = timed_on_cpu["entries"][0]
    assert (attn.original_ns, attn.replacement_ns) == (raw["original_ns"], raw["replacement_ns"])
    assert attn.ratio == pytest.approx(raw["original_ns"] / raw["replacement_ns"])
    assert attn.forward == (raw["forward"]["original_ns"], raw["forward"]["replacement_ns"])
    assert attn.shape["mask"] == "causal" and attn.count == 2
    assert got.measured("copy") == [] and got.entries[3].error == "pinned memory needs CUDA"
    assert got.recorded("attention") == RECORD["attention"]
    assert attn.text() == f"{raw['replacement_ns'] / 1e3:.1f} us vs {raw['original_ns'] / 1e3:.1f} us"
    assert not parse(None) and not parse("{not json") and not parse('{"format": "other"}')
    broken = json.dumps({"format": "profkit-replacements/1", "entries": [None, {"kind": 3},
                         {"kind": "copy", "count": "x"}, {"kind": "rnn", "original_ns": 5}]})
    assert [e.kind for e in parse(broken).entries] == ["rnn"] and not parse(broken).entries[0].measured


def test_the_capture_step_without_cuda_leaves_a_note(tmp_path):
    res = CaptureResult(trace=None, exit_code=0)
    assert replacement_pass(sys.executable, tmp_path / "none.json", tmp_path / "out.json",
                            lambda m: None, res) is None
    assert res.notes == ["replacements: the calibration run left no op record; the rules that "
                         "replace work price it from the trace alone"]
    rec = tmp_path / "ops.json"
    rec.write_text(json.dumps({**RECORD, "device": "cpu"}))
    res = CaptureResult(trace=None, exit_code=0)
    data = json.loads(replacement_pass(sys.executable, rec, tmp_path / "out.json", lambda m: None, res))
    assert data["format"] == "profkit-replacements/1" and data["entries"] == []
    assert data["record"]["attention"] == RECORD["attention"]
    assert res.notes == ["replacements: the recorded iteration ran no CUDA op: the replacements were not timed"]


@pytest.mark.long
def test_profkit_capture_keeps_the_record_and_says_why_nothing_was_timed(tmp_path, monkeypatch):
    """The whole flow with a fake nsys (tests/test_capture.py's): the first calibration run
    records, the CPU program's record holds no CUDA op, so nothing is timed, and PROFKIT_META
    says so; --no-replacements records nothing."""
    import test_capture as tc
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    monkeypatch.setenv("PROFKIT_NSYS", str(tc._write_exe(bindir / "nsys", tc.FAKE_NSYS)))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = tc._invoke(["-o", "with.sqlite", "prog.py"])
    assert r.exit_code == 0, r.stderr
    assert "profkit: replacements: the recorded iteration ran no CUDA op: the replacements were not timed" in r.stderr
    meta = dict(sqlite3.connect(tmp_path / "with.sqlite").execute("SELECT key, value FROM PROFKIT_META").fetchall())
    got = parse(meta["replacements"])
    assert got.entries == () and got.recorded("attention")[0]["mask"] == "causal"
    assert not list(tmp_path.glob(".*ops.json")) and not list(tmp_path.glob(".*replacements.json"))
    r = tc._invoke(["--no-replacements", "-o", "without.sqlite", "prog.py"])
    assert r.exit_code == 0, r.stderr
    meta = dict(sqlite3.connect(tmp_path / "without.sqlite").execute("SELECT key, value FROM PROFKIT_META").fetchall())
    assert "replacements" not in meta and "--no-replacements" in meta["command"]


def test_pk301_reads_the_shapes_of_an_aten_capture():
    """No committed --aten trace has a math-path attention: the mapping from an attention's
    GEMM kernels to the aten ops that launched them, on a stand-in."""
    import types
    import numpy as np
    import pandas as pd
    from profkit.judge.rules import pk301_attention_path as pk301
    from profkit.read.peaks import Peaks
    a = pd.DataFrame({"name": ["gemm", "softmax", "gemm", "gemm", "gemm", "softmax_backward", "gemm", "gemm"],
                      "dur": [10] * 8}, index=[10, 11, 12, 20, 21, 22, 23, 24])
    ctx = types.SimpleNamespace(aten_acts={
        "aten::bmm [[64, 512, 64], [64, 64, 512]] | in=bf16*2": np.array([10]),
        "aten::bmm [[64, 512, 512], [64, 512, 80]] | in=bf16*2": np.array([12, 20]),
        "aten::_softmax [[64, 512, 512], [], []]": np.array([11])},
        prof=types.SimpleNamespace(peaks=Peaks("H200", 4.8e12, {"bf16": 989.5e12})))
    spans = [(0, 2, False), (3, 7, True)]
    shapes = pk301._aten_shapes(ctx, a, spans)
    assert shapes == [{"batch": 64, "sq": 512, "sk": 512, "d": 64, "dv": 80, "mask": "none", "count": 1}, None]
    # one forward call: 2*64*512*512*(64+80) FLOPs at 989.5 TFLOP/s; bytes at 4.8 TB/s are less
    assert pk301.flash_ns(ctx, shapes[0], False, "bf16") == pytest.approx(
        2 * 64 * 512 * 512 * 144 / 989.5e12 * 1e9)
    # several shapes: the longest attentions get the shapes with the most work
    small = {"batch": 8, "sq": 128, "sk": 128, "d": 64, "dv": 64, "count": 1}
    big = {"batch": 8, "sq": 1024, "sk": 1024, "d": 64, "dv": 64, "count": 1}
    assert pk301._assign(np.array([5.0, 50.0]), [small, big]) == [small, big]


# -- the rules -------------------------------------------------------------------------------------
def _entry(kind: str, shape: dict, orig: float, repl: float, count: int = 1, **more) -> dict:
    return {"kind": kind, "key": kind, "shape": shape, "count": count, "original_ns": orig,
            "replacement_ns": repl, "backend": "x", "repetitions": 10, "spread": {}, "error": None,
            **more}


def _meta(entries: list, record: dict | None = None) -> str:
    return json.dumps({"format": "profkit-replacements/1", "entries": entries, "notes": [],
                       "record": {"format": "profkit-oprecord/1", **(record or {})}})


def _copy_with(tmp_path: Path, trace: str, meta: str) -> Path:
    dst = tmp_path / (Path(trace).name.replace(".xz", ""))
    with lzma.open(ROOT / trace) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out)
    con = sqlite3.connect(dst)
    with con:
        con.execute("CREATE TABLE IF NOT EXISTS PROFKIT_META (key TEXT, value TEXT)")
        con.execute("DELETE FROM PROFKIT_META WHERE key = 'replacements'")
        con.execute("INSERT INTO PROFKIT_META (key, value) VALUES ('replacements', ?)", (meta,))
    con.close()
    return dst


def _priced(prof, code: str, monkeypatch=None, meta: str | None = None):
    """The rule's finding on ``prof``: from the trace's own meta, or from ``meta`` instead
    (``""``: as if the capture had none)."""
    if meta is not None:
        monkeypatch.setattr(RuleContext, "replacements", property(lambda self: parse(meta) if meta else Replacements()))
    found = [f for f in evaluate(prof, prof.run(), {code}) if f.code == code]
    if meta is not None:
        monkeypatch.undo()
    return found[0] if found else None


ATTN = {"batch": 32, "sq": 1024, "sk": 1024, "d": 64, "dv": 64, "dtype": "bf16", "mask": "causal",
        "grad": True, "count": 2}


@pytest.fixture(scope="module")
def eager_attn(tmp_path_factory):
    path = _copy_with(tmp_path_factory.mktemp("pk301"), "traces/real/train_llama_eager_attn.sqlite.xz",
                      _meta([], {"attention": [ATTN]}))
    return profkit.load(path)


def test_pk301_from_the_flash_bound_is_the_hand_computed_number(eager_attn, monkeypatch):
    f = _priced(eager_attn, "PK301")
    assert f.evidence["priced_from"] == "flash_estimate"
    assert f.basis.startswith("estimated: no replacement timed at capture: flash attention's FLOPs and bytes")
    # 11 iterations, each 2 attentions forward and 2 backward, every one at B*H 32, S 1024, D 64,
    # causal, in bf16 at the H200 datasheet's roofs (989.5 TFLOP/s, 4.8 TB/s):
    fwd = max(2 * 32 * 1024 * 1024 * 128 / 2 / 989.5e12, 2 * 32 * 1024 * 64 * 4 / 4.8e12) * 1e9
    bwd = max(2.5 * 2 * 32 * 1024 * 1024 * 128 / 2 / 989.5e12, 2 * 2 * 32 * 1024 * 64 * 4 / 4.8e12) * 1e9
    assert (fwd, bwd) == pytest.approx((4340.5, 10851.4), abs=0.1)
    assert flash_attention_work(32, 1024, 1024, 64, 64, True, True) == (2.5 * 2 ** 32, 2 * 2 * 2 ** 23)
    assert f.evidence["attentions"] == 44
    assert f.evidence["flash_bound_ns"] == pytest.approx(22 * (fwd + bwd), abs=22)
    # the estimate: the FLOPs at the share of the roof flash reached where it was measured (the
    # bytes at 4.8 TB/s take less), no longer than the math path's kernels
    share = pk301.FLASH_ROOF_SHARE
    fwd_e = max(2 * 32 * 1024 * 1024 * 128 / 2 / (989.5e12 * share), 2 * 32 * 1024 * 64 * 4 / 4.8e12) * 1e9
    bwd_e = max(2.5 * 2 * 32 * 1024 * 1024 * 128 / 2 / (989.5e12 * share), 2 * 2 * 32 * 1024 * 64 * 4 / 4.8e12) * 1e9
    assert f.evidence["flash_ns"] <= 22 * (fwd_e + bwd_e) + 22
    assert f.evidence["flash_ns"] >= f.evidence["flash_bound_ns"]
    assert 1.0 <= f.expected_end_to_end_speedup <= f.bound <= f.expected_op_speedup + 1e-9
    assert f.expected_op_speedup == pytest.approx(f.evidence["attention_ns"] / f.evidence["flash_ns"], rel=1e-3)
    # without shapes: the glue alone, said so, and less than with the S x S GEMMs gone
    glue = _priced(eager_attn, "PK301", monkeypatch, "")
    assert glue.evidence["priced_from"] == "glue_only" and "no shapes" in glue.basis
    assert glue.expected_end_to_end_speedup < f.expected_end_to_end_speedup


def test_pk301_timed_ratio_moves_the_price_and_never_beyond_its_own_gain(eager_attn, monkeypatch):
    base = _priced(eager_attn, "PK301")
    prices = []
    for ratio in (1.2, 3.0):
        entry = _entry("attention", ATTN, 2e6 * ratio, 2e6, 2,
                       forward={"original_ns": 0.6e6 * ratio, "replacement_ns": 0.6e6})
        f = _priced(eager_attn, "PK301", monkeypatch, _meta([entry], {"attention": [ATTN]}))
        assert f.evidence["priced_from"] == "timed"
        assert f.basis.startswith("replacement timed at the program's shapes: SDPA vs the math path, "
                                  "2000.0 us vs")
        assert f.evidence["attention_ns"] / f.evidence["flash_ns"] == pytest.approx(ratio, rel=1e-3)
        assert f.expected_end_to_end_speedup <= f.expected_op_speedup + 1e-9
        prices.append(f.expected_end_to_end_speedup)
    assert prices[0] <= prices[1] <= base.expected_end_to_end_speedup + 1e-9
    # a timing faster than flash attention's own bound is held to the bound
    fast = _entry("attention", ATTN, 2e9, 1.0, 2)
    f = _priced(eager_attn, "PK301", monkeypatch, _meta([fast], {"attention": [ATTN]}))
    assert f.evidence["flash_ns"] == f.evidence["flash_bound_ns"]


def test_pk301_flash_bound_stays_below_what_sdpa_measured(tmp_path):
    """The bound at train_llama_eager_attn's real shapes (Llama, batch 8, 16 heads, 512 tokens,
    head size 64, causal, 2 layers) is below the flash kernels SDPA ran in the same program
    (train_llama_sdpa_samerun): a bound, 42 us a step against 160 us measured."""
    from profkit.judge.patterns import FLASH_RE
    from profkit.judge.rules.base import matches
    shape = {**ATTN, "batch": 128, "sq": 512, "sk": 512}
    prof = profkit.load(_copy_with(tmp_path, "traces/real/train_llama_eager_attn.sqlite.xz",
                                   _meta([], {"attention": [shape]})))
    f = _priced(prof, "PK301")
    its = prof.run().window.iterations
    bound = f.evidence["flash_bound_ns"] / its
    assert bound == pytest.approx(41_943, rel=1e-3)
    sdpa = profkit.load(ROOT / "traces/real/train_llama_sdpa_samerun.sqlite.xz")
    ctx = RuleContext(sdpa, sdpa.run())
    k = ctx.kernels
    fused = float(k[matches(k.index.to_series(), FLASH_RE)]["total_ns"].sum()) / ctx.iterations
    assert bound < fused and fused == pytest.approx(158_574, rel=1e-3)
    # the share of the roof the estimate uses is the one measured here; at these shapes the
    # estimate is at most the flash kernels' measured time (an attention whose math-path kernels
    # took less keeps its own time: the fused kernel is never priced slower than what it replaces)
    assert pk301.FLASH_ROOF_SHARE == pytest.approx(bound / fused, rel=2e-3)
    assert bound < f.evidence["flash_ns"] / its <= fused * 1.01
    assert f.evidence["flash_ns"] <= f.evidence["attention_ns"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    opt = {"class": "AdamW", "foreach": None, "fused": None, "params": 20, "numel": 10_000_000}
    path = _copy_with(tmp_path_factory.mktemp("pk201"), "traces/real/train_llama.sqlite.xz",
                      _meta([_entry("optimizer", opt, 5.0e6, 1.0e6)], {"optimizer": [opt]}))
    return profkit.load(path)


def test_pk201_timed_fused_step(llama, monkeypatch):
    timed = _priced(llama, "PK201")
    est = _priced(llama, "PK201", monkeypatch, "")
    assert est.basis.startswith("estimated: no replacement timed at capture: 7 of 21 passes; step model")
    assert timed.basis.startswith("replacement timed at the program's shapes: the fused step vs the "
                                  "program's, 1000.0 us vs 5000.0 us")
    assert timed.evidence["priced_from"] == "timed" and timed.evidence["fused_over_foreach"] == 5.0
    assert timed.expected_end_to_end_speedup >= est.expected_end_to_end_speedup
    assert timed.expected_end_to_end_speedup <= timed.bound == 5.0
    slow = _priced(llama, "PK201", monkeypatch, _meta([_entry("optimizer", {}, 1.5e6, 1.0e6)]))
    assert slow.expected_end_to_end_speedup <= est.expected_end_to_end_speedup <= timed.expected_end_to_end_speedup
    assert slow.bound == pytest.approx(1.5)
    # without host times the foreach path's Python between its launches goes (one fused call runs
    # none); with the steps' host times that CPU time shrinks by the host time measured saved
    assert "the foreach path's Python between its launches" in timed.basis
    host = {"host": {"original_ns": 0.5e6, "replacement_ns": 0.3e6}}
    some = _priced(llama, "PK201", monkeypatch, _meta([_entry("optimizer", {}, 5.0e6, 1.0e6, **host)]))
    lots = {"host": {"original_ns": 30e6, "replacement_ns": 1e6}}
    gone = _priced(llama, "PK201", monkeypatch, _meta([_entry("optimizer", {}, 5.0e6, 1.0e6, **lots)]))
    assert some.expected_end_to_end_speedup < gone.expected_end_to_end_speedup
    assert "less the 200 us the fused step saved on the host" in some.basis
    assert "gone (the fused step saved 29000 us" in gone.basis
    assert gone.expected_end_to_end_speedup <= gone.bound == pytest.approx(30.0)


def test_pk104_timed_pinned_copies(tmp_path, monkeypatch):
    # resnet18_pageable's input copies, 19.3 MB each: pinned at 100 GB/s where 55 GB/s was assumed
    copy = {"direction": "h2d", "bytes": 19_267_584, "pinned": False, "non_blocking": False}
    fast = _entry("copy", copy, 1.5e6, 19_267_584 / 100e9 * 1e9, 1)
    prof = profkit.load(_copy_with(tmp_path, "traces/corpus/resnet18_pageable.sqlite.xz", _meta([fast])))
    timed = _priced(prof, "PK104")
    est = _priced(prof, "PK104", monkeypatch, "")
    assert "55 GB/s, assumed" in est.basis and est.basis.startswith("estimated: no replacement timed at capture")
    assert timed.basis.startswith("replacement timed at the program's shapes: pinned vs pageable, 192.7 us vs 1500.0 us")
    assert "(100 GB/s timed)" in timed.basis and timed.evidence["priced_from"] == "timed"
    assert timed.expected_end_to_end_speedup >= est.expected_end_to_end_speedup
    slow = _entry("copy", copy, 1.5e6, 19_267_584 / 20e9 * 1e9, 1)
    assert _priced(prof, "PK104", monkeypatch, _meta([slow])).expected_end_to_end_speedup \
        <= est.expected_end_to_end_speedup


def test_pk106_timed_cudnn_layer(tmp_path, monkeypatch):
    cell = {"cell": "LSTMCell", "input": 256, "hidden": 512, "batch": 64, "calls": 256}
    graphed = _entry("rnn", cell, 10.1e6, 7.6e6, original="the cell loop as a CUDA graph")
    prof = profkit.load(_copy_with(tmp_path, "traces/corpus/lstm_cell_loop.sqlite.xz", _meta([graphed])))
    timed = _priced(prof, "PK106")
    est = _priced(prof, "PK106", monkeypatch, "")
    assert est.basis.startswith("estimated: no replacement timed at capture; step model")
    assert timed.basis.startswith("replacement timed at the program's shapes: the library layer vs the "
                                  "cell loop, 7600.0 us vs 10100.0 us")
    assert timed.expected_end_to_end_speedup > est.expected_end_to_end_speedup
    # a loop timed with its host time says nothing of its kernels: the floor, and why
    host_paced = _entry("rnn", cell, 30e6, 7.6e6, original="the cell loop")
    f = _priced(prof, "PK106", monkeypatch, _meta([host_paced]))
    assert f.expected_end_to_end_speedup == pytest.approx(est.expected_end_to_end_speedup)
    assert "timed with its host time" in f.basis


def test_pk302_timed_tf32_and_bf16(tmp_path, monkeypatch):
    gemm = {"op": "mm", "batch": 1, "m": 4096, "n": 4096, "k": 4096, "dtype": "fp32"}
    entries = [_entry("gemm_tf32", gemm, 3.0e6, 1.0e6, 4), _entry("gemm_bf16", gemm, 3.0e6, 0.6e6, 4)]
    prof = profkit.load(_copy_with(tmp_path, "traces/probe_h200_addnorm_gemm.sqlite.xz", _meta(entries)))
    timed = _priced(prof, "PK302")
    est = _priced(prof, "PK302", monkeypatch, "")
    assert est.basis.startswith("estimated: no replacement timed at capture; TF32 / fp32 peak = 7.4")
    assert timed.basis.startswith("replacement timed at the program's shapes: TF32 vs fp32 GEMMs, "
                                  "1000.0 us vs 3000.0 us; TF32 / fp32 timed = 3.0")
    # TF32 timed at 3x where the peaks say 7.4x: a lower price, never above the timed 3x
    assert timed.expected_end_to_end_speedup < est.expected_end_to_end_speedup
    assert timed.expected_end_to_end_speedup <= timed.expected_op_speedup == pytest.approx(3.0)
    assert timed.evidence["bf16_timed_gain"] == 5.0
    assert timed.evidence["bf16_speedup"] < est.evidence["bf16_speedup"]


def test_pk305_timed_convolutions(tmp_path, monkeypatch):
    """ema_timm_train (ConvNeXt-Atto, fp32 training): the estimate halves its convolutions and
    puts cuDNN's depthwise weight gradients at their forwards' pace, 2.92x, where its own trial
    of channels_last and bf16 measured 1.92x. Timed at the program's shapes, the convolutions'
    ratio replaces both; timings that do not account for the trace's convolutions are not used."""
    prof = profkit.load(ROOT / "traces" / "corpus" / "ema_timm_train.sqlite.xz")
    est = _priced(prof, "PK305", monkeypatch, "")
    assert est.evidence["priced_from"] == "estimate" and est.basis.startswith("estimated: no replacement")
    assert est.expected_end_to_end_speedup == pytest.approx(2.916, abs=0.005)
    conv = {"input": [128, 40, 56, 56], "weight": [40, 1, 7, 7], "dtype": "fp32", "grad": True}
    # the trace's convolution kernels: 26.2 ms an iteration; timed shapes that account for it,
    # at 1.5x in bf16 channels_last
    meta = _meta([_entry("conv_bf16", conv, 6.5e6, 6.5e6 / 1.5, 4)])
    timed = _priced(prof, "PK305", monkeypatch, meta)
    assert timed.evidence["priced_from"] == "timed" and timed.evidence["conv_timed_ratio"] == 1.5
    assert timed.basis.startswith("replacement timed at the program's shapes: bf16 channels_last vs as "
                                  "the program ran them, 4333.3 us vs 6500.0 us; 1 shapes, 1.50x together")
    assert "/ 1.50 (timed)" in timed.basis and "at their forwards' pace" not in timed.basis
    assert 1.3 < timed.expected_end_to_end_speedup < est.expected_end_to_end_speedup
    # a tenth of the trace's convolution time timed: not what the program ran, the estimate stands
    few = _priced(prof, "PK305", monkeypatch, _meta([_entry("conv_bf16", conv, 1.0e6, 0.5e6, 4)]))
    assert few.evidence["priced_from"] == "estimate"
    assert few.basis.startswith("estimated: the convolutions timed at capture do not account for the trace's")
    assert few.expected_end_to_end_speedup == est.expected_end_to_end_speedup


def test_the_layout_timed_at_capture_prices_channels_last(monkeypatch):
    """RegNetY-800MF fp32 inference: channels_last alone measured 1.31x on an H200 where the
    estimate (cuDNN's transposes gone) priced 1.14x; its grouped convolutions run other kernels on
    NHWC tensors. Timed at the program's shapes in TF32 on channels_last tensors (conv_cl), their
    ratio replaces the estimate for every kernel the layout sets, in PK305's channels_last and in
    PK403's compile with freezing alike; timings that do not account for the trace's convolution
    time (2.67 ms an iteration) are not used."""
    prof = profkit.load(ROOT / "traces" / "corpus" / "regnet_y_800mf_fp32_infer.sqlite.xz")
    conv = {"input": [128, 224, 28, 28], "weight": [224, 8, 3, 3], "groups": 28, "dtype": "fp32", "grad": False}
    est305, est403 = (_priced(prof, code, monkeypatch, "") for code in ("PK305", "PK403"))
    assert est305.evidence["channels_last_speedup"] == pytest.approx(1.142, abs=0.002)
    meta = _meta([_entry("conv_cl", conv, 2.6e6, 2.6e6 / 3.0, 1)])
    t305, t403 = (_priced(prof, code, monkeypatch, meta) for code in ("PK305", "PK403"))
    assert t305.evidence["conv_channels_last_timed_ratio"] == 3.0
    assert t305.evidence["channels_last_speedup"] > est305.evidence["channels_last_speedup"]
    assert "the convolutions' kernels / 3.00, timed at capture" in t403.basis
    # the timed ratio sets PK403's layout: a faster layout timed, no lower a price (the host's
    # launches set the compiled step's pace here past a 3x faster layout)
    faster = _priced(prof, "PK403", monkeypatch, _meta([_entry("conv_cl", conv, 2.6e6, 2.6e6 / 6.0, 1)]))
    assert faster.expected_end_to_end_speedup >= t403.expected_end_to_end_speedup > est403.expected_end_to_end_speedup
    # a tenth of that time timed: the estimate stands in both
    few = _meta([_entry("conv_cl", conv, 0.26e6, 0.13e6, 1)])
    f305, f403 = (_priced(prof, code, monkeypatch, few) for code in ("PK305", "PK403"))
    assert f305.evidence["channels_last_speedup"] == est305.evidence["channels_last_speedup"]
    assert f403.expected_end_to_end_speedup == est403.expected_end_to_end_speedup


# -- on a GPU --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_timings_on_cuda():
    rec = {**RECORD, "attention": [{**RECORD["attention"][0], "dtype": "bf16", "sq": 512, "sk": 512,
                                     "d": 64, "dv": 64}],
           "copy": [{"direction": "h2d", "bytes": 8 << 20, "pinned": False, "non_blocking": False, "count": 1},
                    {"direction": "d2h", "bytes": 8 << 20, "pinned": False, "non_blocking": False, "count": 1}]}
    out = timing.time_record(rec, reps=5)
    assert out["device"].startswith("cuda") and out["gpu"]
    by = {e["kind"]: e for e in out["entries"]}
    attn = by["attention"]
    assert attn["error"] is None and attn["backend"] == "default", attn   # SDPA as the program calls it
    assert set(attn["backends"]) >= {"default", "flash", "cudnn", "efficient"}
    assert attn["replacement_ns"] < attn["original_ns"]          # SDPA beats the math path at 512 tokens
    assert by["copy"]["error"] is None and by["optimizer"]["original"] == "foreach"
    assert by["rnn"]["original"] == "the cell loop as a CUDA graph"
    assert all(e["error"] is None for e in out["entries"]), [e["error"] for e in out["entries"]]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_timer_times_gpu_work_not_the_hosts_launching():
    """A call whose host side is slower than its kernel (an SDPA call of a few microseconds, a
    fused optimizer step over many small tensors) is timed by its GPU work: the GPU is held while
    the runs are queued."""
    import time as clock
    x = torch.randn(1024, device="cuda")

    def slow_host():
        t0 = clock.perf_counter()
        while clock.perf_counter() - t0 < 300e-6:   # 300 us of Python before one tiny kernel
            pass
        x.add_(1.0)
    t = timing.Timer(torch, torch.device("cuda"), reps=5)(slow_host)
    assert max(t) < 100_000, t          # the kernel's few microseconds, not the host's 300


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_record_on_cuda_reads_the_causal_mask_and_the_copies():
    dev = "cuda"

    def step():
        q = torch.randn(8, 128, 64, device=dev, dtype=torch.bfloat16)
        s = q @ q.transpose(-2, -1)
        s = s.masked_fill(torch.triu(torch.ones(128, 128, dtype=torch.bool, device=dev), 1), float("-inf"))
        torch.softmax(s.float(), -1).to(q.dtype) @ q
        torch.randn(1024).to(dev)
        torch.randn(1024).pin_memory().to(dev, non_blocking=True)
    rec = _record(step)
    assert rec["device"] == "cuda" and rec["attention"][0]["mask"] == "causal"
    assert {(c["direction"], c["pinned"], c["non_blocking"]) for c in rec["copy"]} == \
        {("h2d", False, False), ("h2d", True, True)}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_record_on_cuda_names_the_lines_that_wait():
    import sys
    at = {}

    def step():
        x = torch.randn(256, device="cuda")
        at["item"] = sys._getframe().f_lineno; x.sum().item()  # noqa: E702
        at["cpu"] = sys._getframe().f_lineno; x.cpu()  # noqa: E702
        at["mask"] = sys._getframe().f_lineno; x[x > 0]  # noqa: E702
        buf = torch.empty(256, pin_memory=True)
        buf.copy_(x, non_blocking=True)   # no wait: not a site
        with torch.inference_mode():
            at["inf"] = sys._getframe().f_lineno; x.cpu()  # noqa: E702
    rec = _record(step)
    got = {(s["op"], s["line"], s["count"]) for s in rec["sync"]}
    assert got == {("item", at["item"], 1), ("copy to host", at["cpu"], 1), ("boolean index", at["mask"], 1),
                   ("copy to host", at["inf"], 1)}, rec["sync"]
    assert rec["sync_watch"] is True and torch.cuda.get_sync_debug_mode() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_the_record_on_cuda_finds_a_wait_inside_an_op():
    """A wait inside an op's implementation (no program line asks for it) is ``in op``, named."""
    lib = torch.library.Library("profkit_synctest_cuda", "FRAGMENT")
    lib.define("reads_back(Tensor x) -> Tensor")
    lib.impl("reads_back", lambda x: x * float(x.sum()), "CompositeExplicitAutograd")
    try:
        rec = _record(lambda: torch.ops.profkit_synctest_cuda.reads_back(torch.randn(64, device="cuda")))
    finally:
        lib._destroy()
    assert [(s["op"], s.get("inside")) for s in rec["sync"]] == [("in op", "reads_back")], rec["sync"]


def test_no_committed_trace_was_written():
    out = subprocess.run(["git", "status", "--porcelain", "traces"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 or out.stdout.strip() == ""


def test_the_gemms_keep_their_operands_layout():
    """nn.Linear multiplies by its weight's transposed view (NT); a plain x @ y is NN; the timing
    builds the operands in the recorded layout (TF32 on Hopper runs them at different speeds)."""
    lin = torch.nn.Linear(24, 40)
    x, y = torch.randn(16, 24), torch.randn(24, 40)

    def step():
        lin(x)
        x @ y
        x.t().contiguous().t() @ y   # a transposed view on the left
    rec = _record(step)
    lay = {(g["op"], g["m"], g["n"], g["k"], g["layout"]) for g in rec["gemm"]}
    assert ("addmm", 16, 40, 24, "NT") in lay and ("mm", 16, 40, 24, "NN") in lay, lay
    assert ("mm", 16, 40, 24, "TN") in lay, lay
    a, b = timing.gemm_operands(torch, {"op": "addmm", "batch": 1, "m": 16, "n": 40, "k": 24,
                                        "layout": "NT"}, torch.device("cpu"))
    assert a.shape == (16, 24) and a.is_contiguous() and b.shape == (24, 40) and b.stride() == (1, 24)
    a, b = timing.gemm_operands(torch, {"op": "bmm", "batch": 3, "m": 16, "n": 40, "k": 24}, torch.device("cpu"))
    assert a.is_contiguous() and b.is_contiguous() and b.shape == (3, 24, 40)   # no layout: NN
    assert timing.gemm_key({"op": "addmm", "batch": 1, "m": 16, "n": 40, "k": 24, "dtype": "fp32",
                            "layout": "NT"}) == "addmm b=1 m=16 n=40 k=24 fp32 NT"


def test_try_auto_runs_freeze_unstepped_where_the_record_found_such_parameters(tmp_path):
    """`--try auto` adds the freeze_unstepped trial where the capture's op record found parameters
    holding gradients no optimizer steps (no rule prices that fix: its trial is the measurement),
    and not where the record found none."""
    from profkit.judge.trials import auto_trials
    teacher = [{"module": "Encoder", "tensors": 201, "elements": 109_482_240}]
    with_teacher = profkit.load(_copy_with(tmp_path, "traces/corpus/early_exit_sync.sqlite.xz",
                                           _meta([], {"unstepped": teacher})))
    assert "freeze_unstepped" in auto_trials(with_teacher.findings(), with_teacher, with_teacher.run())
    from profkit.show.render import run_lines
    run = with_teacher.run_json()
    assert run["unstepped"] == teacher
    assert ("noticed  109.5M parameters of Encoder (201 tensors) get gradients that no optimizer steps: "
            "if they are meant to be frozen") in "\n".join(run_lines(run))
    (tmp_path / "none").mkdir()
    plain = profkit.load(_copy_with(tmp_path / "none", "traces/corpus/early_exit_sync.sqlite.xz",
                                    _meta([], {"unstepped": []})))
    assert "freeze_unstepped" not in auto_trials(plain.findings(), plain, plain.run())
    assert "unstepped" not in plain.run_json()


def test_the_record_notes_anomaly_detection_and_try_auto_measures_it_off(tmp_path):
    """A step run under torch.autograd.detect_anomaly(): the record counts the ops seen under it
    and whether it checks for NaNs; classify says so on a `noticed` line and `--try auto` adds the
    no_anomaly trial (no rule prices the mode: its trial is the measurement)."""
    import warnings
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def step(check_nan: bool):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=check_nan):
                lin(x).sum().backward()
    on, off = _record(lambda: step(True))["anomaly"], _record(lambda: step(False))["anomaly"]
    assert on[0]["ops"] > 0 and on[0]["check_nan"] is True and off[0]["check_nan"] is False
    assert _record(lambda: lin(x).sum().backward())["anomaly"] == []
    from profkit.judge.trials import auto_trials
    from profkit.show.render import run_lines
    p = profkit.load(_copy_with(tmp_path, "traces/corpus/early_exit_sync.sqlite.xz",
                                _meta([], {"anomaly": [{"ops": 1893, "check_nan": True}]})))
    assert "no_anomaly" in auto_trials(p.findings(), p, p.run())
    assert ("noticed  autograd anomaly detection is on (1893 ops of the recorded iteration ran under it): a "
            "debugging mode that keeps a Python stack per autograd node and reads each backward node's "
            "gradients back") in "\n".join(run_lines(p.run_json()))
    (tmp_path / "none").mkdir()
    plain = profkit.load(_copy_with(tmp_path / "none", "traces/corpus/early_exit_sync.sqlite.xz", _meta([], {})))
    assert "no_anomaly" not in auto_trials(plain.findings(), plain, plain.run())
    assert "anomaly" not in plain.run_json()


def test_the_record_times_a_row_by_row_fetch_and_the_same_rows_in_one_gather():
    """A DataLoader over a TensorDataset reads each batch a row at a time: the record keeps the
    fetch and times the same rows again row by row and as one gather; a dataset that reads a
    batch in one call (__getitems__) is noted as such, with nothing to compare."""
    from torch.utils.data import DataLoader, Dataset, TensorDataset
    x, y = torch.randn(4096, 8), torch.randn(4096, 1)
    rows = iter(DataLoader(TensorDataset(x, y), batch_size=512, shuffle=True))

    class Batched(Dataset):
        def __len__(self):
            return 4096

        def __getitems__(self, idx):
            return [(x[torch.as_tensor(idx)], y[torch.as_tensor(idx)])]

    whole = iter(DataLoader(Batched(), batch_size=512, collate_fn=lambda b: b[0]))
    rec = _record(lambda: (next(rows), next(rows), next(whole)))
    (tab, bat) = sorted(rec["loader"], key=lambda r: r["dataset"] != "TensorDataset")
    assert {k: tab[k] for k in ("dataset", "rows", "per_row", "fetches")} == \
        {"dataset": "TensorDataset", "rows": 512, "per_row": True, "fetches": 2}
    # both timed (how they compare is the machine's: a benchmark's business, not a test's)
    assert tab["row_ns"] > 0 and tab["batched_ns"] > 0 and tab["fetch_ns"] > 0
    assert {k: bat[k] for k in ("dataset", "per_row", "row_ns", "batched_ns")} == \
        {"dataset": "Batched", "per_row": False, "row_ns": None, "batched_ns": None}


def _pk102_with_fetch(tmp_path, row_ns: int, batched_ns: int):
    meta = _meta([], {"loader": [{"dataset": "TensorDataset", "rows": 4096, "per_row": True, "fetches": 1,
                                  "fetch_ns": 4 * row_ns, "row_ns": row_ns, "batched_ns": batched_ns}]})
    return profkit.load(_copy_with(tmp_path, "traces/corpus/tabular_mlp_train.sqlite.xz", meta))


def test_pk102_prices_reading_a_batch_in_one_call_from_the_timed_fetch(tmp_path, monkeypatch):
    """tabular_mlp_train's loader reads 4,096 rows one at a time (10.34 ms of loading an iteration
    at its runs' CPU speed: the profiled run lies within their spread). With the fetch timed at capture (10 ms row by row, 0.3 ms in one call), PK102
    prices the batch read in one call by the step model (the loading's CPU time less the 9.7 ms
    saved) beside the workers, and ranks by the better; the batched_fetch trial measures it."""
    from profkit.judge.rules import pk102_data_loading as pk102
    p = _pk102_with_fetch(tmp_path, 10_000_000, 300_000)
    f = _priced(p, "PK102")
    ev = f.evidence
    assert (ev["fetch_row_ns"], ev["fetch_batched_ns"], ev["loading_ns_per_iteration"]) == (10_000_000, 300_000, 10_337_916)
    assert 1.0 < ev["batched_fetch_speedup"] < ev["workers_speedup"] == pytest.approx(f.expected_end_to_end_speedup, abs=1e-3)
    assert f.switch == "workers" and "10.00 ms a batch row by row, 0.30 ms in one call" in f.action
    # where the workers gain less (2 of them), reading in one call leads, and its trial measures it
    import dataclasses
    monkeypatch.setattr(pk102, "RULE", dataclasses.replace(pk102.RULE, params=tuple(
        pk102.Param(x.name, 2.0, x.help) if x.name == "workers" else x for x in pk102.RULE.params)))
    (tmp_path / "two").mkdir()
    g = _priced(_pk102_with_fetch(tmp_path / "two", 10_000_000, 300_000), "PK102")
    assert g.switch == "batched_fetch" and g.action.startswith("the DataLoader reads each batch of 4096 rows")
    assert g.expected_end_to_end_speedup == pytest.approx(g.evidence["batched_fetch_speedup"], abs=1e-3)
    assert g.evidence["batched_fetch_speedup"] == pytest.approx(ev["batched_fetch_speedup"], abs=1e-3)
    # without the record's timing nothing changes, and the trial that could not apply is not run
    (tmp_path / "none").mkdir()
    plain = profkit.load(_copy_with(tmp_path / "none", "traces/corpus/tabular_mlp_train.sqlite.xz", _meta([], {})))
    h = _priced(plain, "PK102")
    assert h.evidence["trials_refused"] == ["batched_fetch"] and "batched_fetch_speedup" not in h.evidence


def test_pk102_prices_the_table_kept_on_the_gpu_where_the_record_has_its_size(tmp_path):
    """With the table's size in the record (tabular_mlp_train's 1M x 65 fp32: 0.26 GB of an H100's
    85 GB), PK102 says the table kept on the GPU with its price (the loading and the pageable
    copies gone) beside the workers and the batched fetch; a table over a quarter of the GPU's
    memory is not offered."""
    def fetch(size):
        return _meta([], {"loader": [{"dataset": "TensorDataset", "rows": 4096, "per_row": True, "fetches": 1,
                                      "fetch_ns": 40_000_000, "row_ns": 10_000_000, "batched_ns": 300_000,
                                      "table_bytes": size}]})
    f = _priced(profkit.load(_copy_with(tmp_path, "traces/corpus/tabular_mlp_train.sqlite.xz",
                                        fetch(260_000_000))), "PK102")
    ev = f.evidence
    assert ev["gpu_resident_speedup"] == 4.155 and ev["table_bytes"] == 260_000_000
    assert ev["gpu_resident_speedup"] > ev["batched_fetch_speedup"]
    assert "(a TensorDataset is; 3.43x), or keep the table on the GPU and gather each batch there (4.15x: the " \
           "table, 0.26 GB," in f.action
    (tmp_path / "big").mkdir()
    g = _priced(profkit.load(_copy_with(tmp_path / "big", "traces/corpus/tabular_mlp_train.sqlite.xz",
                                        fetch(30_000_000_000))), "PK102")
    assert "gpu_resident_speedup" not in g.evidence


def test_the_record_keeps_a_tensor_datasets_size():
    from torch.utils.data import DataLoader, TensorDataset
    rows = iter(DataLoader(TensorDataset(torch.randn(256, 8), torch.randn(256, 1)), batch_size=32))
    (entry,) = _record(lambda: next(rows))["loader"]
    assert entry["table_bytes"] == 256 * 9 * 4


def test_the_record_is_the_same_under_inference_mode():
    """Under torch.inference_mode() the dispatch shows linear, matmul and conv2d themselves
    (autograd does not lower them): the record keeps the GEMMs, convolutions and math-path
    attention they run, as under torch.no_grad()."""
    lin, head = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32, bias=False)
    conv = torch.nn.Conv2d(3, 8, 3, padding="same")
    x, img = torch.randn(4, 16, 64), torch.randn(2, 3, 16, 16)
    q, k = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)

    def step():
        head(lin(x).relu())
        conv(img)
        torch.softmax(q @ k.transpose(-2, -1), -1) @ k

    def record(ctx):
        def run():
            with ctx():
                step()
        rec = _record(run)
        return {key: rec[key] for key in ("gemm", "conv", "attention")}
    under_no_grad, under_inference = record(torch.no_grad), record(torch.inference_mode)
    assert under_inference == under_no_grad
    assert [(g["op"], g["m"], g["n"], g["k"], g["layout"]) for g in under_inference["gemm"][:2]] == \
        [("addmm", 64, 128, 64, "NT"), ("mm", 64, 32, 128, "NT")]
    assert under_inference["conv"][0]["padding"] == [1, 1] and len(under_inference["attention"]) == 1


def test_the_record_keeps_fused_attention_calls():
    """F.scaled_dot_product_attention as its backend's op (or itself, under inference mode):
    batch x heads, lengths, head sizes, dtype, mask, gradients."""
    import contextlib
    import torch.nn.functional as F
    q = torch.randn(2, 4, 32, 16, requires_grad=True)
    k, v = torch.randn(2, 4, 32, 16), torch.randn(2, 4, 32, 16)
    pad = torch.zeros(2, 1, 1, 32)

    def sdpa(ctx, **kw):
        def run():
            with ctx():
                F.scaled_dot_product_attention(q, k, v, **kw)
        return _record(run)["sdpa"]
    shape = {"batch": 8, "sq": 32, "sk": 32, "d": 16, "dv": 16, "dtype": "fp32", "count": 1}
    assert sdpa(contextlib.nullcontext, is_causal=True) == [{**shape, "mask": "causal", "grad": True}]
    for ctx in (torch.no_grad, torch.inference_mode):
        assert sdpa(ctx, attn_mask=pad) == [{**shape, "mask": "masked", "grad": False}], ctx
    # a mask tensor that says exactly what is_causal does (boolean, or added: 0 kept, -inf hidden,
    # sliced out of a larger buffer) is told from one that hides anything else
    keep = torch.ones(40, 40, dtype=torch.bool).tril()
    added = torch.zeros(32, 32).masked_fill(~keep[:32, :32], float("-inf"))
    almost = keep[:32, :32].clone()
    almost[5, 2] = False
    per_batch = keep[:32, :32].expand(2, 1, 32, 32).clone()
    per_batch[1, 0, 31, :4] = False                      # the second sequence's last token padded
    for mask, kind in ((keep[:32, :32], "causal_mask"), (added, "causal_mask"), (almost, "masked"),
                       (per_batch, "masked"), (keep[:32, :32].expand(2, 1, 32, 32), "causal_mask")):
        assert sdpa(torch.no_grad, attn_mask=mask) == [{**shape, "mask": kind, "grad": False}], kind


def test_pk302_prices_fp32_fused_attention_in_bf16_from_its_shapes(tmp_path):
    """padded_encoder_infer: a BERT-base encoder over 32 texts padded to 512 tokens, fp32, 10.6 ms
    an iteration in fmha_cutlassF_f32. Its capture's record holds the program's SDPA calls (12 of
    B*H 384 x 512 x 512 x 64, an additive padding mask): PK302 prices bf16 at flash attention's
    FLOPs, 6.75x, where it measured 6.48x by hand and 6.52x as profkit's trial. The same capture
    with the record's SDPA entries taken out gets the old estimate, half the attention's time off."""
    trace = "traces/corpus/padded_encoder_infer.sqlite.xz"
    shaped = profkit.load(ROOT / trace)
    assert shaped.replacements().recorded("sdpa") == [
        {"batch": 32 * 12, "sq": 512, "sk": 512, "d": 64, "dv": 64, "dtype": "fp32", "mask": "masked",
         "grad": False, "count": 12}]
    ev = _priced(shaped, "PK302").evidence
    assert (ev["bf16_speedup"], ev["bf16_attention_gain"]) == (6.752, 8.99)
    meta = json.loads(shaped.trace.meta["replacements"])
    del meta["record"]["sdpa"]
    (tmp_path / "plain").mkdir()
    plain = profkit.load(_copy_with(tmp_path / "plain", trace, json.dumps(meta)))
    assert _priced(plain, "PK302").evidence["bf16_speedup"] == 4.847


def test_a_loader_with_its_own_collate_is_noted_not_timed_again():
    """The record times a TensorDataset's rows again only with torch's default_collate: a
    program's own collate_fn (it may count or draw) is never run a second time."""
    from torch.utils.data import DataLoader, TensorDataset
    calls = []

    def mine(rows):
        calls.append(len(rows))
        return torch.stack([r[0] for r in rows])
    loader = iter(DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, collate_fn=mine))
    got = []
    rec = _record(lambda: got.append(next(loader)))
    assert got[0].shape == (8, 4) and calls == [8]
    (entry,) = rec["loader"]
    assert (entry["per_row"], entry["row_ns"], entry["batched_ns"]) == (True, None, None)


def test_the_one_call_gather_is_timed_at_its_fastest_of_several_calls(monkeypatch):
    """The gather's first call in a process pays one-time costs (9.5 ms against 0.2 ms on a
    captured 4,096-row batch): the record keeps the fastest of BATCHED_REPEATS calls, the
    row-by-row read once."""
    import itertools

    from torch.utils.data import DataLoader, TensorDataset

    from profkit.capture import loaders
    fetcher = iter(DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8))._dataset_fetcher
    # clock reads: the row-by-row read (start, end), then each gather's (start, end)
    spans = [(0, 5_000), *[(0, ns) for ns in (9_000, 300, 200, 250, 400)]]
    ticks = iter(itertools.chain.from_iterable(spans))
    monkeypatch.setattr(loaders.time, "perf_counter_ns", lambda: next(ticks))
    assert loaders.BATCHED_REPEATS == 5
    got = loaders.entry(torch, fetcher, list(range(8)), 123)
    assert (got["row_ns"], got["batched_ns"], got["fetch_ns"]) == (5_000, 200, 123)


def test_pk301_prices_a_causal_mask_given_as_a_tensor(monkeypatch):
    """masked_sdpa_train: GPT-2 at 2k tokens whose SDPA gets its causal mask sliced from a buffer
    (cuDNN's fused kernels, 8.1 ms an iteration). Its capture's record tells the mask apart
    (causal_mask) and timed the call with the mask tensor and with is_causal at its shape (742 us
    against 325 us, an H100): PK301 prices is_causal at that ratio, 1.13x (measured 1.15x; the
    fixed program's attention kernels took 3.36 ms an iteration, priced 3.55). Without the
    timing, half the fused kernels' time; another mask, or none, is not this rule's."""
    trace = "traces/corpus/masked_sdpa_train.sqlite.xz"
    prof = profkit.load(ROOT / trace)
    (entry,) = prof.replacements().recorded("sdpa")
    assert entry["mask"] == "causal_mask" and entry["count"] == 12
    f = _priced(prof, "PK301")
    assert "is_causal=True" in f.action and f.evidence["priced_from"] == "timed"
    assert (f.evidence["causal_mask_share"], round(f.expected_op_speedup, 2)) == (1.0, 2.29)
    assert "324.7 us vs 742.4 us" in f.basis and round(f.expected_end_to_end_speedup, 2) == 1.13
    meta = json.loads(prof.trace.meta["replacements"])
    meta["entries"] = [e for e in meta["entries"] if e["kind"] != "attention_causal_mask"]
    est = _priced(prof, "PK301", monkeypatch, json.dumps(meta))
    assert est.evidence["priced_from"] == "estimate" and est.expected_op_speedup == 2.0
    assert 1.0 < est.expected_end_to_end_speedup < f.expected_end_to_end_speedup
    meta["record"]["sdpa"] = [{**entry, "mask": "masked"}]
    assert _priced(prof, "PK301", monkeypatch, json.dumps(meta)) is None


def test_a_hand_written_optimizer_gets_a_fused_steps_time_at_its_sizes():
    """An optimizer torch.optim does not have is not timed as the program ran it (no code of it
    here): a fused AdamW step over the recorded sizes is, the floor a fused implementation
    reaches; a torch.optim class is timed against its fused self as before."""
    lamb = {"class": "Lamb", "foreach": None, "fused": None, "dtype": "fp32", "device": "cpu", "params": 3,
            "numel": 600, "sizes": [[100, 2], [400, 1]], "options": {"weight_decay": 0.01}}
    out = timing.time_record({"optimizer": [lamb]}, device="cpu", reps=3)
    (e,) = out["entries"]
    assert (e["kind"], e["error"], e["original_ns"], e["backend"]) == ("optimizer_fused_floor", None, None,
                                                                       "AdamW(fused=True)")
    assert e["replacement_ns"] > 0 and e["repetitions"] == 3 and "Lamb" in e["original"]
    assert "AdamW(fused=True)" in timing.entry_text(e)
    (r,) = parse(json.dumps(out)).entries
    assert r.kind == "optimizer_fused_floor" and not r.measured and r.replacement_ns == e["replacement_ns"]


def test_pk201_prices_a_hand_written_optimizers_loop_as_one_fused_pass(monkeypatch):
    """lamb_python_optim_train: BERT-base trained with LAMB written as a Python loop over its 153
    parameters (16 kernels each, 6.7 ms of kernels and ~30 ms of host time an iteration). The
    op record names the class (Lamb: not torch.optim's), PK107 finds the loop of 153 copies: PK201
    prices a fused step, its 109M parameters' seven passes at the memory bandwidth (0.91 ms) in
    place of the loop, 2.34x (AdamW fused measured 2.41x beside it, the loop vectorised with
    torch._foreach_* 2.01x); with a fused step's time from the capture, that time. A class of
    torch.optim, or a record without the loop's parameters, is not this finding's."""
    trace = "traces/corpus/lamb_python_optim_train.sqlite.xz"
    prof = profkit.load(ROOT / trace)
    f = _priced(prof, "PK201")
    assert (f.evidence["optimizer_class"], f.evidence["params"], f.evidence["loop_copies"]) == ("Lamb", 153, 153)
    assert (f.evidence["priced_from"], f.evidence["fused_step_ns"]) == ("estimate", 912636)
    assert round(f.expected_end_to_end_speedup, 3) == 2.335 and "FusedLAMB" in f.action
    meta = json.loads(prof.trace.meta["replacements"])
    (rec,) = meta["record"]["optimizer"]
    meta["entries"] = [{"kind": "optimizer_fused_floor", "key": "k", "shape": rec, "count": 1, "original_ns": None,
                        "replacement_ns": 2_000_000, "backend": "AdamW(fused=True)", "repetitions": 9}]
    slow = _priced(prof, "PK201", monkeypatch, json.dumps(meta))
    assert slow.evidence["priced_from"] == "timed" and "2000.0 us" in slow.basis
    assert 1.02 < slow.expected_end_to_end_speedup < f.expected_end_to_end_speedup
    meta["record"]["optimizer"] = [{**rec, "class": "AdamW"}]
    assert _priced(prof, "PK201", monkeypatch, json.dumps(meta)) is None
    meta["record"]["optimizer"] = [{**rec, "params": 40}]
    assert _priced(prof, "PK201", monkeypatch, json.dumps(meta)) is None


def _sync(op: str, count: int, inside: str | None = None, via: str | None = None) -> dict:
    return {"op": op, "file": "qat.py", "line": 41, "function": "forward", "via": via, "count": count,
            **({"inside": inside} if inside else {})}


def test_pk101_offers_no_fix_for_waits_inside_torchs_own_ops(monkeypatch):
    """Where the sync watch finds most of an iteration's waits inside torch's own code (eager
    QAT's fake quantization), no program line asks for them: PK101 names where, says what they
    cost and offers no fix; a minority inside torch is said and the fix stands. A record made
    before the watch that ran a backward (grad mode: the program's own reads are ops it names)
    and found no wait says the same of the trace's waits (the corpus's QAT capture); one of an
    inference-mode iteration does not (the dispatch showed ``item`` there, unread before)."""
    prof = profkit.load(ROOT / "traces/corpus/qat_fakequant_train.sqlite.xz")
    own = _priced(prof, "PK101")
    assert own.expected_end_to_end_speedup == 1.0 and own.evidence["inside_ops_share"] == 1.0
    assert "the op record, which sees every read a program's own ops make in grad mode, found none" in own.action
    cost = own.evidence["without_them_speedup"]
    assert cost > 1.2
    fq = "torch/ao/quantization/fake_quantize.py:forward"
    inside = _meta([], {"sync": [_sync("in op", 54, fq), _sync("item", 1)], "sync_watch": True, "range": "train_step",
                        "backward": True})
    f = _priced(prof, "PK101", monkeypatch, inside)
    assert f.expected_end_to_end_speedup == 1.0 and f.rung.value == "none"
    assert f.action.startswith("leave the per-step synchronisations in ") and "98% of them" in f.action
    assert f"inside torch's own code ({fq} (54 an iteration))" in f.action
    assert f.evidence["without_them_speedup"] == cost == round(f.bound, 3)
    few = _meta([], {"sync": [_sync("in op", 10, fq), _sync("item", 44)], "sync_watch": True})
    f = _priced(prof, "PK101", monkeypatch, few)
    assert round(f.expected_end_to_end_speedup, 3) == cost and "keep the values on the GPU" in f.action
    assert f"19% of the recorded waits are inside torch's own {fq} and stay" in f.action
    # the program's own synchronize through torch.cuda is its wait: the fix stands
    mine = _meta([], {"sync": [_sync("synchronize", 54, via="torch/cuda/__init__.py:synchronize")],
                      "sync_watch": True})
    assert round(_priced(prof, "PK101", monkeypatch, mine).expected_end_to_end_speedup, 3) == cost
    # an inference-mode record (no backward) that found nothing places nothing: the fix stands
    blind = _meta([], {"sync": [], "range": "train_step", "backward": False})
    assert round(_priced(prof, "PK101", monkeypatch, blind).expected_end_to_end_speedup, 3) == cost


def test_a_qat_capture_with_the_sync_watch_is_told_no_fix_for_its_waits():
    """Eager QAT captured with the sync watch (an H100, 2026-12-07; its first 5 steady iterations):
    its 27 waits an iteration were made outside the ops the dispatch shows, under the model's
    module call (the fake-quantize hooks), which that capture's record said as ``synchronize``
    through torch/nn/modules/module.py; PK101 reads them as torch's own and offers no fix, and
    the convolutions' layout leads (channels_last measured 1.18x in the corpus capture's trial)."""
    prof = profkit.load(ROOT / "traces/real/qat_fakequant_syncwatch.sqlite.xz")
    rec = prof.replacements().record
    assert rec["sync_watch"] is True
    assert rec["sync"] == [{"op": "synchronize", "file": "scripts/workloads/w_qat_fakequant_train.py", "line": 53,
                            "function": "forward", "via": "torch/nn/modules/module.py:_wrapped_call_impl",
                            "count": 27}]
    found = {f.code: f for f in evaluate(prof, prof.run())}
    assert found["PK101"].expected_end_to_end_speedup == 1.0 and found["PK101"].evidence["inside_ops_share"] == 1.0
    assert max(found.values(), key=lambda f: f.expected_end_to_end_speedup).code == "PK305"

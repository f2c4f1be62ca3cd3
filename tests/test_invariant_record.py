"""The op record on the CPU: its loop-invariant ops (profkit.capture.invariant), what an iteration
recomputes from parameters and buffers nothing writes (int8 weights dequantized at every call, a
weight normalisation left on at inference, a frozen weight cast under autocast), and what it
must not count (an activation, a trained weight, random numbers, an input's own ops); and its
outermost module calls (profkit.capture.roots): a loop over chunks against a decode loop."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_replacements import _record  # noqa: E402


class QLinear(torch.nn.Module):
    def __init__(self, fin: int, fout: int) -> None:
        super().__init__()
        self.register_buffer("q", torch.randint(-127, 128, (fout, fin), dtype=torch.int8))
        self.register_buffer("scale", torch.rand(fout) / 127)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.q.to(x.dtype) * self.scale[:, None])


def _rows(rec: dict) -> dict:
    return {(r["op"], r["dtype"], r["numel"]): r["count"] for r in rec["invariant"]}


def test_int8_weights_dequantized_every_call_are_invariant():
    m = torch.nn.Sequential(QLinear(16, 32), torch.nn.ReLU(), QLinear(32, 8)).eval()
    x = torch.randn(4, 16)

    def step():
        with torch.inference_mode():
            m(x)
    rec = _record(step)
    # per layer: the cast and the scaling of its weight; the GEMMs take the input: not invariant
    # (inference mode dispatches ``to`` itself, not the ``_to_copy`` it would decompose to)
    assert _rows(rec) == {("to", "float32", 512): 1, ("mul", "float32", 512): 1,
                          ("to", "float32", 256): 1, ("mul", "float32", 256): 1}
    assert all(r["bytes"] == r["numel"] * 4 for r in rec["invariant"])
    assert {r["from"] for r in rec["invariant"] if r["op"] == "to"} == {"int8"}


def test_weight_norm_at_inference_is_invariant():
    from torch.nn.utils.parametrizations import weight_norm
    m = torch.nn.Sequential(weight_norm(torch.nn.Conv1d(4, 8, 3)), torch.nn.ReLU(),
                            weight_norm(torch.nn.Conv1d(8, 8, 3))).eval()
    x = torch.randn(2, 4, 16)

    def step():
        with torch.no_grad():
            m(x)
    rows = _rows(_record(step))
    assert rows and all(n in (96, 192, 8) for (_, _, n) in rows)        # weights and their norms
    assert not any(op == "convolution" for (op, _, _) in rows)


class Cast16(torch.nn.Linear):
    """A linear layer run in bf16 by hand: its weight cast at every call."""

    def forward(self, x):
        noise = torch.randn_like(self.weight) * self.weight   # random: not invariant
        return (x.to(torch.bfloat16) @ self.weight.to(torch.bfloat16).t()).float() + noise.sum()


def test_trained_weights_activations_and_random_numbers_are_not_invariant():
    trained = Cast16(8, 8)
    frozen = Cast16(8, 8).requires_grad_(False)
    opt = torch.optim.SGD(trained.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step():
        y = trained(x) + frozen(x)
        y.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)                        # no gradient left at the end
    # the frozen weight's cast alone: the trained one's changes every step
    assert _rows(_record(step)) == {("_to_copy", "bfloat16", 64): 1}


def test_a_buffer_written_in_the_iteration_takes_back_what_was_computed_from_it():
    class Running(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(8))

        def forward(self, x):
            out = x - self.mean.exp()            # exp(mean): computed from a buffer...
            self.mean.mul_(0.9).add_(x.mean(0) * 0.1)  # ...that this very iteration updates
            return out
    m = Running()
    x = torch.randn(4, 8)

    def step():
        with torch.no_grad():
            m(x)
    assert _rows(_record(step)) == {}


def test_what_was_kept_survives_the_program_ending_before_the_record_is_written():
    # the record is written after the script: by then its model is gone, and the roots with it
    import gc

    from profkit.capture.oprecord import OpRecord
    rec = OpRecord()
    m = QLinear(16, 32).eval()
    x = torch.randn(4, 16)
    for _ in range(3):
        rec.on_push("step")
    with torch.inference_mode():
        m(x)
    rec.on_push("step")     # the watched iteration ends here
    del m
    gc.collect()
    assert _rows(rec.finish()) == {("to", "float32", 512): 1, ("mul", "float32", 512): 1}


def test_the_outermost_calls_tell_a_loop_over_chunks_from_a_decode_loop():
    # a renderer runs its whole model over 8 slices of one tensor; a decoder feeds each call the
    # last one's output; a layer stack calls its model once
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()
    pts = torch.randn(64, 3)

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(6, 4)

        def forward(self, x, z):
            return self.lin(torch.cat([x, z], -1))[:, :3]
    two = Two().eval()

    def chunks():
        with torch.no_grad():
            torch.cat([mlp(pts[i:i + 8]) for i in range(0, 64, 8)])

    def decode():
        with torch.no_grad():
            x = pts[:8]
            for _ in range(8):
                x = mlp(x)

    def once():
        with torch.no_grad():
            mlp(pts)
    def guided():
        # classifier-free guidance: the same latents twice, the label changed
        with torch.no_grad():
            mlp(pts[:8]) - mlp(pts[:8]) * 0.5

    def guided_same_view():
        with torch.no_grad():
            x = pts[:8]
            mlp(x) - mlp(x) * 0.5

    def static_decode():
        # one input buffer written in place before each call: the same tensor, other data
        with torch.no_grad():
            buf = pts[:8].clone()
            for _ in range(4):
                buf.copy_(mlp(buf))

    def multi_crop():
        # crops of two sizes, each crop its own call: 2 of one, 3 of the other
        with torch.no_grad():
            crops = [torch.randn(n, 3) for n in (16, 16, 8, 8, 8)]
            [mlp(c) for c in crops]

    def train_and_validate():
        # a training batch, then a validation batch of the same shape under no_grad and eval():
        # not calls one call could make
        train, val = torch.randn(8, 3), torch.randn(8, 3)
        mlp(train).sum().backward()
        mlp.eval()
        with torch.no_grad():
            mlp(val)
        mlp.train()

    def chunks_inference():
        with torch.inference_mode():
            torch.cat([mlp(c) for c in pts.split(8)])

    def fixed_point():
        # the same first input, the state fed back: each call needs the last one's output
        with torch.no_grad():
            z = torch.zeros(8, 3)
            for _ in range(4):
                z = two(pts[:8], z)

    def decode_with_source():
        # a greedy decoder given the same source each step and the token made from the last output
        with torch.no_grad():
            tok = torch.zeros(8, 3)
            for _ in range(4):
                tok = two(pts[:8], tok).argmax(-1, keepdim=True).float().expand(8, 3).contiguous()

    def weights_moved():
        # a sharpness-aware step: the same input twice, the weights perturbed between the calls
        with torch.no_grad():
            mlp(pts[:8])
            for p in mlp.parameters():
                p.add_(0.01)
            mlp(pts[:8])
            for p in mlp.parameters():
                p.sub_(0.01)
    runs = (("chunks", chunks), ("decode", decode), ("once", once), ("guided", guided),
            ("guided_same_view", guided_same_view), ("static_decode", static_decode),
            ("chunks_inference", chunks_inference), ("fixed_point", fixed_point),
            ("decode_with_source", decode_with_source), ("weights_moved", weights_moved),
            ("multi_crop", multi_crop), ("train_and_validate", train_and_validate))
    got = {name: _record(fn)["root_calls"] for name, fn in runs}

    def row(calls, sliced=False, same=False, shaped=0):
        return [{"module": "Sequential", "calls": calls, "params": 115, "sliced_input": sliced, "same_input": same,
                 "shape_calls": shaped}]
    assert got["chunks"] == row(8, sliced=True, shaped=8)
    # crops of two sizes: not one tensor's slices, yet 3 independent calls on inputs of one shape
    assert got["multi_crop"] == row(5, shaped=3)
    assert got["train_and_validate"] == row(2)
    assert got["decode"] == row(8)
    assert got["once"] == row(1)
    # two views of one storage at one offset are the same input
    assert got["guided"] == row(2, same=True, shaped=2) and got["guided_same_view"] == row(2, same=True, shaped=2)
    assert got["static_decode"] == row(4)
    assert got["chunks_inference"] == row(8, sliced=True, shaped=8)  # inference tensors: sliced all the same
    assert got["weights_moved"] == row(2)

    def row2(calls):
        return [{"module": "Two", "calls": calls, "params": 28, "sliced_input": False, "same_input": False,
                 "shape_calls": 0}]
    assert got["fixed_point"] == row2(4) and got["decode_with_source"] == row2(4)


class _Storage:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _Device:
    type = "cuda"


class _GpuTensor:
    """What RootCalls reads of a CUDA tensor: its storage, offset, shape, dtype and device."""
    device, dtype, shape = _Device(), "torch.float32", (8, 3)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def untyped_storage(self) -> _Storage:
        return _Storage(self.ptr)

    def storage_offset(self) -> int:
        return 0


class _Param:
    _version = 0

    def numel(self) -> int:
        return 10


class _Model:
    def parameters(self):
        return [_Param()]


@pytest.mark.parametrize("read,shaped", [(False, 2), (True, 0)])
def test_a_call_made_after_the_host_read_an_output_depends_on_it(read, shaped):
    # a decoder that samples its next token on the host (.item()) and makes a new tensor of it:
    # the data cannot be followed, so the calls after the read are taken as chained; without the
    # read, two calls on fresh inputs of one shape are independent (a contrastive step's views)
    from profkit.capture.roots import RootCalls
    rc, model = RootCalls(), _Model()
    rc.pre(model, (_GpuTensor(1),))
    rc.post(model, _GpuTensor(2))
    if read:
        rc.op((_GpuTensor(2),), 7)   # .item() of the output
    rc.pre(model, (_GpuTensor(3),))
    rc.post(model, _GpuTensor(4))
    assert rc.summary()[0]["shape_calls"] == shaped

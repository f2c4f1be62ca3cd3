"""backend="auto" selection, the cheap host-side path, and the benchmark's optional-peer path (CPU)."""
from __future__ import annotations

import importlib.util
import os
import sys
import warnings

import pytest
import torch

import kernels
from kernels import ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeCuda:
    """Stands in for a CUDA tensor in choose_backend (which only reads is_cuda, shape, numel)."""

    is_cuda = True

    def __init__(self, rows, n):
        self.shape = (rows, n)
        self._numel = rows * n

    def numel(self):
        return self._numel


@pytest.fixture
def state(monkeypatch):
    def set_state(cuda, triton=True):
        monkeypatch.setattr(ops, "_CUDA_STATE", cuda)
        monkeypatch.setattr(ops, "_TRITON_OK", triton)

    return set_state


def test_auto_is_the_default_and_matches_reference_on_cpu():
    x, r, w = torch.randn(3, 100), torch.randn(3, 100), torch.randn(100)
    assert ops.choose_backend("add_rmsnorm", x) == "triton"  # CPU: the float reference
    a = kernels.add_rmsnorm(x, r, w)
    b = kernels.add_rmsnorm(x, r, w, backend="triton")
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_auto_prefers_the_extension(state):
    state(True)
    for op in ("add_rmsnorm", "add_rmsnorm_", "softmax", "add_layernorm", "bias_gelu"):
        assert ops.choose_backend(op, FakeCuda(1, 4096)) == "cuda"
        assert ops.choose_backend(op, FakeCuda(4096, 4096)) == "cuda"
    assert ops.choose_backend("bias_gelu", FakeCuda(65536, 8192)) == "cuda"


def test_auto_takes_triton_only_where_faster_and_its_launcher_is_hidden(state):
    state(True)
    for op in ("add_rmsnorm", "add_rmsnorm_", "softmax", "add_layernorm"):
        assert ops.choose_backend(op, FakeCuda(16384, 4096)) == "triton"  # 64 Mi elements
        assert ops.choose_backend(op, FakeCuda(65536, 8192)) == "triton"
        assert ops.choose_backend(op, FakeCuda(4096, 4096)) == "cuda"     # 16 Mi: host-bound


def test_graph_backend_is_the_gpu_faster_one():
    for op in ("add_rmsnorm", "add_rmsnorm_", "softmax", "add_layernorm"):
        for rows, n in ((1, 4096), (16, 4096), (4096, 4096), (65536, 8192)):
            assert ops.graph_backend(op, rows, n) == "triton"
    assert ops.graph_backend("bias_gelu", 64, 8192) == "triton"      # 2^19 elements: the flat kernel
    assert ops.graph_backend("softmax", 4, 32768) == "cuda"          # looping rows: the eager choice
    assert ops.graph_backend("softmax", 2048, 32768) == "triton"     # 64 Mi elements: eager runs Triton too
    assert ops.graph_backend("bias_gelu", 4096, 4096) == "cuda"


def test_auto_choice_is_per_context_only_where_eager_and_graph_differ(state):
    state(True)
    both = ops._auto_choice("softmax", FakeCuda(16, 4096))
    assert isinstance(both, ops._PerContext) and (both.eager, both.graph, both.warm) == ("cuda", "triton", None)
    assert ops._auto_choice("softmax", FakeCuda(16384, 4096)) == "triton"   # triton in both contexts
    assert ops._auto_choice("bias_gelu", FakeCuda(4096, 4096)) == "cuda"    # cuda in both
    state(False)
    assert ops._auto_choice("softmax", FakeCuda(16, 4096)) == "triton"      # one backend: no context
    state(True, triton=False)
    assert ops._auto_choice("softmax", FakeCuda(16, 4096)) == "cuda"


@pytest.fixture
def recorded(monkeypatch):
    """ops._op replaced by recorders of (backend, args); ops._capturing by a switch."""
    calls, ctx = [], {"capturing": False, "fail": False}

    def fake_op(name, backend):
        def run(*args):
            if ctx["fail"] and backend == "triton":
                raise RuntimeError("no kernel image")
            calls.append((backend, args))
            return args[0] * 2
        return run

    monkeypatch.setattr(ops, "_op", fake_op)
    monkeypatch.setattr(ops, "_capturing", lambda: ctx["capturing"])
    return calls, ctx


def test_per_context_eager_runs_eager_and_prepares_the_graph_backend_once_on_copies(recorded):
    calls, ctx = recorded
    choice = ops._PerContext("cuda", "triton")
    x, r, w = torch.randn(16, 64), torch.randn(16, 64), torch.randn(64)
    keep = r.clone()
    args = (x, r, w, 1e-6)
    assert choice.pick("add_rmsnorm_inplace", args) == "cuda"
    assert [b for b, _ in calls] == ["triton"]                           # the warm-up, once
    warm_args = calls[0][1]
    assert all(a is not b for a, b in zip(warm_args[:3], args[:3]))      # copies, not the caller's tensors
    assert torch.equal(warm_args[1], keep) and warm_args[3] == 1e-6
    assert choice.pick("add_rmsnorm_inplace", args) == "cuda" and len(calls) == 1
    assert torch.equal(r, keep)


def test_per_context_capture_runs_the_graph_backend_only_as_prepared(recorded):
    calls, ctx = recorded
    x = torch.randn(16, 64)
    choice = ops._PerContext("cuda", "triton")
    ctx["capturing"] = True
    assert choice.pick("softmax", (x, 1.0)) == "cuda"       # never run outside a capture: not compiled
    assert calls == []                                        # and no warm-up inside the capture
    ctx["capturing"] = False
    choice.pick("softmax", (x, 1.0))
    ctx["capturing"] = True
    assert choice.pick("softmax", (x, 0.5)) == "triton"      # floats are not compile-time constants
    off = torch.empty(16 * 64 + 1)[1:].view(16, 64)           # 4 bytes off 16-byte alignment
    assert choice.pick("softmax", (off, 1.0)) == "cuda"      # another specialisation: not prepared
    assert choice.pick("softmax", (x.double(), 1.0)) == "cuda"
    gelu = ops._PerContext("cuda", "triton")
    ctx["capturing"] = False
    gelu.pick("bias_gelu", (x, x[0], "none"))
    ctx["capturing"] = True
    assert gelu.pick("bias_gelu", (x, x[0], "tanh")) == "cuda"   # the GELU form is compiled in


def test_per_context_failed_preparation_warns_once_and_keeps_the_eager_backend(recorded):
    calls, ctx = recorded
    ctx["fail"] = True
    choice = ops._PerContext("cuda", "triton")
    x = torch.randn(4, 64)
    with pytest.warns(RuntimeWarning, match="graphs will run cuda"):
        assert choice.pick("softmax", (x, 1.0)) == "cuda"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choice.pick("softmax", (x, 1.0)) == "cuda"
        ctx["capturing"] = True
        assert choice.pick("softmax", (x, 1.0)) == "cuda"


def test_resolve_caches_per_shape_and_dtype(state, monkeypatch):
    state(True)
    monkeypatch.setattr(ops, "_CHOICE", {})
    seen = []
    monkeypatch.setattr(ops, "_auto_choice", lambda op, x: seen.append(x.dtype) or "cuda")
    x = torch.randn(2, 8)
    assert ops._resolve("softmax", "auto", x) == ops._resolve("softmax", "auto", x) == "cuda"
    ops._resolve("softmax", "auto", x.half())
    assert seen == [torch.float32, torch.float16]
    ops._resolve("bias_gelu", "auto", x, "none")
    ops._resolve("bias_gelu", "auto", x, "tanh")            # a compile-time form: its own choice
    ops._resolve("bias_gelu", "auto", x, "tanh")
    assert len(seen) == 4


def test_auto_falls_back_without_the_extension(state):
    state(False)
    assert ops.choose_backend("add_rmsnorm", FakeCuda(16, 4096)) == "triton"
    state(False, triton=False)
    assert ops.choose_backend("add_rmsnorm", FakeCuda(16, 4096)) == "torch"
    state(True, triton=False)
    assert ops.choose_backend("add_layernorm", FakeCuda(65536, 8192)) == "cuda"


def test_auto_warns_once_when_the_extension_cannot_build(monkeypatch):
    from kernels import _build

    calls = []

    def fail():
        calls.append(1)
        raise _build.KernelBuildError('backend="cuda" needs a CUDA device\nmore detail')

    monkeypatch.setattr(ops, "_CUDA_STATE", None)
    monkeypatch.setattr(_build, "ensure_loaded", fail)
    with pytest.warns(RuntimeWarning, match="cannot use the CUDA extension"):
        assert ops._cuda_available() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops._cuda_available() is False  # no second build attempt, no second warning
    assert len(calls) == 1


def test_fast_check_agrees_with_the_detailed_checks():
    x, w = torch.randn(4, 64), torch.randn(64)
    assert ops._fast_ok(x, (x,), (w,))
    for bad in ((x.half(),), (torch.randn(4, 32),), ("not a tensor",)):
        assert not ops._fast_ok(x, bad, (w,))
    assert not ops._fast_ok(x, (x,), (torch.randn(32),))
    assert not ops._fast_ok(x.double(), (x.double(),), (w.double(),))  # goes to the detailed path
    assert not ops._fast_ok(torch.tensor(1.0))
    kernels.add_rmsnorm(x.double(), x.double(), w.double())  # float64 on CPU still accepted


def test_no_grad_path_skips_autograd_but_grad_path_keeps_it():
    x = torch.randn(3, 64, requires_grad=True)
    r, w = torch.randn(3, 64), torch.randn(64)
    out, h = kernels.add_rmsnorm(x, r, w)
    assert out.requires_grad
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.no_grad():
        out2, _ = kernels.add_rmsnorm(x, r, w)
    assert not out2.requires_grad
    torch.testing.assert_close(out2, out.detach())


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_kernels", os.path.join(ROOT, "scripts", "bench", "bench_kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_peers_are_optional():
    bench = _load_bench()
    peers = bench.find_peers()
    assert bench.liger_fn("bias_gelu") is None  # no Liger equivalent
    if "liger" not in peers:
        assert bench.liger_fn("add_rmsnorm") is None  # skipped cleanly when absent
    else:
        assert callable(bench.liger_fn("add_rmsnorm"))
    assert bench.make_fn("bias_gelu", "liger") is None
    assert callable(bench.make_fn("softmax", "auto")) and callable(bench.make_fn("softmax", "cuda_v0"))


def test_bench_copy_reference_moves_the_ops_passes():
    # the floor row: one kernel reading and writing the op's tensors once (2 or 4 passes)
    bench = _load_bench()
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    cat = bench.make_fn("add_rmsnorm_", "copy")(dict(x=x, residual=r, weight=torch.randn(8)))
    torch.testing.assert_close(cat, torch.cat([x, r]))
    torch.testing.assert_close(bench.make_fn("bias_gelu", "copy")(dict(x=x, bias=torch.randn(8))), -x)
    assert "copy" in bench.IMPLS and "copy" not in bench.OURS + bench.PEERS


def test_full_choice_cache_gives_the_eager_choice_without_a_warm_up(state, monkeypatch):
    state(True)
    monkeypatch.setattr(ops, "_CHOICE", {i: "cuda" for i in range(4096)})
    monkeypatch.setattr(ops, "_auto_choice", lambda op, x: pytest.fail("a _PerContext nothing would keep"))
    monkeypatch.setattr(ops, "choose_backend", lambda op, x: "cuda")
    assert ops._resolve("softmax", "auto", torch.randn(16, 64)) == "cuda"


def test_auto_graph_switch_off_keeps_the_eager_choice(state, monkeypatch):
    state(True)
    monkeypatch.setenv("PROFKIT_KERNELS_AUTO_GRAPH", "0")
    assert ops._auto_choice("softmax", FakeCuda(16, 4096)) == "cuda"

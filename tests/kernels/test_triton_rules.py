"""The Triton backend's fixed launch rules (CPU: no kernel runs)."""
from __future__ import annotations

import pytest

pytest.importorskip("triton", reason='the Triton backend tests need triton: pip install -e ".[kernels,test]"')

from kernels import triton_kernels as tk  # noqa: E402

CONFIGS = tk._row_configs()


def _warps(named_args, **kwargs):
    return [c.num_warps for c in tk._prune_by_rule(CONFIGS, named_args, **kwargs)]


@pytest.mark.skipif(len(CONFIGS) == 1, reason="the interpreter has a single config")
def test_prune_rules():
    # decode rows: Liger-style warps by row length, never timed
    assert _warps({"ROWS_CLASS": 0}, BLOCK=4096) == [8]
    assert _warps({"ROWS_CLASS": 0}, BLOCK=8192) == [16]
    # add+RMSNorm's decode rows of 8192 and more: 32 warps (measured best there, worst for softmax)
    assert [c.num_warps for c in tk._prune_wide(CONFIGS, {"ROWS_CLASS": 0}, BLOCK=8192)] == [32]
    assert [c.num_warps for c in tk._prune_wide(CONFIGS, {"ROWS_CLASS": 0}, BLOCK=4096)] == [8]
    # add+RMSNorm's reload mode: block // 256 warps (measured best at 4096 and 8192)
    assert _warps({"ROWS_CLASS": 1}, BLOCK=4096, RELOAD=True) == [16]
    assert _warps({"ROWS_CLASS": 1}, BLOCK=8192, RELOAD=True) == [32]
    assert _warps({"ROWS_CLASS": 1}, BLOCK=1024, RELOAD=True) == [4]
    # other prefill rows: every candidate is timed
    assert _warps({"ROWS_CLASS": 1}, BLOCK=4096, RELOAD=False) == [4, 8, 16, 32]
    assert _warps({"ROWS_CLASS": 1}, BLOCK=4096) == [4, 8, 16, 32]


def test_reload_warps_bounds():
    assert [tk._reload_warps(b) for b in (256, 2048, 4096, 8192, 16384)] == [4, 8, 16, 32, 32]


class _Compiled:
    def __init__(self, log):
        self.function, self.packed_metadata = "fn", "meta"
        self.run = lambda *a: log.append(("fast", a))


class _FakeKernel:
    """A JIT function's surface as _launch uses it: kernel[grid](*args, **consts) returns the compiled
    kernel; arg_names lists every parameter, constexprs last."""

    arg_names = ["X", "OUT", "N", "scale", "BLOCK", "TANH"]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def slow(*args, **consts):
            self.log.append(("slow", grid, args, consts))
            return _Compiled(self.log)
        return slow


@pytest.fixture
def fast_path(monkeypatch):
    monkeypatch.setattr(tk, "_INTERPRET", False)
    monkeypatch.setattr(tk, "_FAST", {})
    monkeypatch.setattr(tk, "_raw_stream", lambda dev: 1000 + dev)
    monkeypatch.setattr(tk, "_current_device", lambda: -1)  # CPU tensors: get_device() is -1


def test_launch_reuses_the_compiled_kernel_per_specialisation(fast_path):
    import torch

    k = _FakeKernel()
    x, out = torch.randn(4, 64), torch.empty(4, 64)
    tk._launch(k, (4,), x, out, 64, 0.5, BLOCK=64, TANH=False, num_warps=4)
    assert [e[0] for e in k.log] == ["slow"]
    tk._launch(k, (8,), x, out, 64, 0.7, BLOCK=64, TANH=False, num_warps=4)   # other grid and float
    assert k.log[-1] == ("fast", (8, 1, 1, 999, "fn", "meta", None, None, None, x, out, 64, 0.7, 64, False))
    tk._launch(k, (4,), x, out, 65, 0.5, BLOCK=64, TANH=False, num_warps=4)   # another integer value
    tk._launch(k, (4,), x, out, 64, 0.5, BLOCK=64, TANH=True, num_warps=4)    # another constexpr
    tk._launch(k, (4,), x.double(), out, 64, 0.5, BLOCK=64, TANH=False, num_warps=4)
    off = torch.empty(4 * 64 + 1)[1:].view(4, 64)                              # 4 bytes off alignment
    tk._launch(k, (4,), off, out, 64, 0.5, BLOCK=64, TANH=False, num_warps=4)
    assert [e[0] for e in k.log] == ["slow", "fast", "slow", "slow", "slow", "slow"]


def test_launch_keeps_tritons_path_when_it_cannot_rebuild_the_arguments(fast_path):
    import torch

    k = _FakeKernel()
    x = torch.randn(2, 8)
    for _ in range(3):  # BLOCK given, TANH left to a default this path cannot see: never the fast path
        tk._launch(k, (2,), x, x, 8, 1.0, BLOCK=8)
    assert [e[0] for e in k.log] == ["slow"] * 3


def test_launch_takes_the_autotuners_config_arguments(fast_path):
    import torch

    class Tuned:
        fn = _FakeKernel()
        arg_names = _FakeKernel.arg_names
        best_config = type("Cfg", (), {"kwargs": {"TANH": True}})()

        def __getitem__(self, grid):
            return self.fn[grid]

    k = Tuned()
    x = torch.randn(2, 8)
    tk._launch(k, (2,), x, x, 8, 1.0, BLOCK=8)
    tk._launch(k, (2,), x, x, 8, 1.0, BLOCK=8)
    assert k.fn.log[-1][1][-2:] == (8, True)


def test_launch_with_a_hook_installed_always_takes_tritons_path(fast_path, monkeypatch):
    import torch

    monkeypatch.setattr(tk, "_hooked", lambda: True)
    k = _FakeKernel()
    x = torch.randn(2, 8)
    for _ in range(2):
        tk._launch(k, (2,), x, x, 8, 1.0, BLOCK=8, TANH=False)
    assert [e[0] for e in k.log] == ["slow", "slow"]


def test_launch_falls_back_for_argument_types_it_cannot_key(fast_path):
    import torch

    k = _FakeKernel()
    x = torch.randn(2, 8)
    for _ in range(2):
        tk._launch(k, (2,), x, x, None, 1.0, BLOCK=8, TANH=False)
    assert [e[0] for e in k.log] == ["slow", "slow"]


def test_launch_runs_on_the_tensors_device(fast_path, monkeypatch):
    import torch

    entered = []

    class Guard:
        def __init__(self, dev):
            self.dev = dev

        def __enter__(self):
            entered.append(self.dev)
            monkeypatch.setattr(tk, "_current_device", lambda: self.dev)

        def __exit__(self, *exc):
            monkeypatch.setattr(tk, "_current_device", lambda: 0)

    monkeypatch.setattr(tk, "_current_device", lambda: 0)   # another device is current
    monkeypatch.setattr(torch.cuda, "device", Guard)
    k = _FakeKernel()
    x = torch.randn(2, 8)                                     # get_device() == -1
    tk._launch(k, (2,), x, x, 8, 1.0, BLOCK=8, TANH=False)
    assert entered == [-1] and [e[0] for e in k.log] == ["slow"]


@pytest.mark.skipif(len(CONFIGS) == 1, reason="the interpreter wraps kernels differently")
def test_fast_entry_rebuilds_the_arguments_of_the_real_kernels():
    """On the shipped kernels (a JIT function and an autotuner), not on stand-ins."""
    compiled = _Compiled([])
    flat = tk._fast_entry(tk._bias_gelu_flat_kernel, compiled, 4,
                          dict(N=4096, XBLOCK=256, TANH=False, num_warps=4))
    assert flat and flat[3] == (4096, 256, False)
    cfg = dict(tk._row_config(4096, None, 16), STREAM_STORE=True)
    soft = tk._fast_entry(tk._softmax_kernel, compiled, 5, cfg)
    assert soft and soft[3] == (cfg["BLOCK"], cfg["SINGLE"], cfg["N_ITERS"], cfg["EVICT"], True)
    assert tk._fast_entry(tk._softmax_kernel, compiled, 5, dict(BLOCK=4096)) is False


def test_auto_mirrors_the_triton_launchers_limits():
    from kernels import ops

    assert ops._FLAT_GELU_MAX == tk.FLAT_GELU_MAX and ops._SINGLE_BLOCK_MAX == tk.MAX_SINGLE_BLOCK

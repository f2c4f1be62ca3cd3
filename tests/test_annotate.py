"""profkit.annotate: NVTX ranges named with FLOP/byte hints; works without a GPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import profkit
from profkit.capture import annotate as annotate_mod
from profkit.capture.annotate import annotate
from profkit.read.hints import Hint, parse_range_name

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ranges(monkeypatch):
    """Record nvtx push/pop calls instead of sending them to a profiler."""
    events: list[tuple] = []

    class FakeNvtx:
        @staticmethod
        def push_range(message=None, color=None, domain=None, category=None, payload=None):
            events.append(("push", message, color, domain))

        @staticmethod
        def pop_range(domain=None):
            events.append(("pop", domain))

    monkeypatch.setattr(annotate_mod, "_nvtx", FakeNvtx)
    return events


def test_context_manager_names_the_range(ranges):
    with annotate("attn.qkv", flops=1.2e12, bytes=3.4e9, precision="bf16") as a:
        assert ranges == [("push", "attn.qkv {flops=1.2e+12, bytes=3.4e+09, precision=bf16}",
                           None, None)]
    assert ranges[-1] == ("pop", None)
    assert a.message == "attn.qkv {flops=1.2e+12, bytes=3.4e+09, precision=bf16}"
    name, hint = parse_range_name(a.message)  # what classify reads back
    assert name == "attn.qkv" and hint == Hint(flops=1.2e12, bytes=3.4e9, precision="bf16")


def test_plain_name_without_hints(ranges):
    with annotate("step"):
        pass
    assert ranges == [("push", "step", None, None), ("pop", None)]


def test_decorator_reenters_per_call(ranges):
    @annotate("mlp", flops=100)
    def mlp(x):
        """doc"""
        return x * 2

    assert mlp(3) == 6 and mlp(4) == 8
    assert mlp.__name__ == "mlp" and mlp.__doc__ == "doc"
    assert ranges == [("push", "mlp {flops=100}", None, None), ("pop", None)] * 2


def test_bare_decorator_uses_function_name(ranges):
    @annotate
    def train_step():
        return "ok"

    assert train_step() == "ok"
    assert ranges[0][1] == "test_bare_decorator_uses_function_name.<locals>.train_step"


def test_range_closes_on_exception(ranges):
    with pytest.raises(KeyError):
        with annotate("boom", bytes=8):
            raise KeyError("x")
    assert ranges == [("push", "boom {bytes=8}", None, None), ("pop", None)]


def test_nesting_and_domain(ranges):
    with annotate("outer", domain="mylib", color="red"):
        with annotate("inner", flops=2):
            pass
    assert ranges == [("push", "outer", "red", "mylib"), ("push", "inner {flops=2}", None, None),
                      ("pop", None), ("pop", "mylib")]


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision must be one of"):
        annotate("x", precision="int3")
    with pytest.raises(ValueError, match="flops must be a number >= 0"):
        annotate("x", flops=-1)
    with pytest.raises(TypeError):
        annotate("")


def test_works_with_the_real_nvtx_package_without_gpu():
    """No profiler attached and no GPU: the real nvtx calls are harmless no-ops."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import profkit\n"
         "with profkit.annotate('a', flops=1, bytes=2):\n"
         "    pass\n"
         "@profkit.annotate('f')\n"
         "def f():\n"
         "    return 41 + 1\n"
         "print(f(), repr(profkit.annotate('z', flops=3)))\n"],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin",
                                                       "PYTHONPATH": str(ROOT),
                                                       "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "42 profkit.annotate('z {flops=3}')\n"


def test_without_nvtx_package(monkeypatch):
    monkeypatch.setattr(annotate_mod, "_nvtx", None)
    with annotate("still runs", flops=1):
        value = 1
    assert value == 1


def test_package_level_name(ranges):
    import profkit.capture.annotate as mod  # importing the module must not break profkit.annotate(...)
    with profkit.annotate("p", flops=5) as a:
        pass
    assert isinstance(a, annotate) and a.message == "p {flops=5}"

    @profkit.annotate
    def g():
        return 1
    assert g() == 1 and mod.annotate is annotate

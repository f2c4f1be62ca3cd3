"""The step model's replay loop runs compiled (numba) for large steps and interpreted for small
ones (profkit.run.step.simulate): both give the same times, bit for bit, on committed traces and
on edits that reach every branch of the loop (cross-stream waits, device and stream syncs, work
queued before the window, a full launch queue, DataLoader readiness)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import shared
from profkit.run.step.simulate import simulate
from profkit.run.step.transform import scale_ops

ROOT = Path(__file__).resolve().parents[1]
SIM = sys.modules["profkit.run.step.simulate"]
FIELDS = [f.name for f in dataclasses.fields(SIM.Schedule)]


def _both(g, host: float, monkeypatch) -> tuple:
    with monkeypatch.context() as mp:
        mp.setattr(SIM, "_loops", None)
        mp.setattr(SIM, "COMPILE_FROM", 10 ** 12)
        interpreted = simulate(g, host)
        assert SIM._loops is None
    with monkeypatch.context() as mp:
        mp.setattr(SIM, "COMPILE_FROM", 0)
        compiled = simulate(g, host)
        assert SIM._loops is not None
    return interpreted, compiled


def _variants(g):
    yield "as traced", g
    ops = np.arange(0, g.n_ops, 3)
    yield "a third of the kernels twice as long", scale_ops(g, ops, 2.0)
    # a launch queue of 8 entries: calls wait for the entry 8 places back
    short = g.copy()
    short.queue_depth = 8
    yield "a launch queue of 8", short
    # a DataLoader's batches ready late for every 50th call (NaN: no constraint)
    late = g.copy()
    ready = np.full(g.n_calls, np.nan)
    ready[::50] = (g.c_start[::50] - g.c_start[0]) * 1.3
    late.c_ready = ready
    yield "batches ready late", late


@pytest.mark.parametrize("trace", ["ddp2/rank0.sqlite.xz", "micro_memcpy.sqlite.xz",
                                   "corpus/resnext50_fp32_train.sqlite.xz",
                                   "real/generate_llama_static.sqlite.xz"])
def test_compiled_and_interpreted_replays_agree_bit_for_bit(trace, monkeypatch):
    g = shared.profile(ROOT / "traces" / trace).step_model().graph
    for what, v in _variants(g):
        for host in (1.0, 0.8312):
            a, b = _both(v, host, monkeypatch)
            for f in FIELDS:
                x, y = getattr(a, f), getattr(b, f)
                if isinstance(x, np.ndarray):
                    assert x.dtype == y.dtype and np.array_equal(x, y), (what, host, f)
                else:
                    assert x == y, (what, host, f)


def test_the_variants_reach_the_branches_they_are_for(monkeypatch):
    """A full queue holds some call back, late batches hold some call, and the multi-stream trace
    has operations bound by another stream's event (else the test above proves less)."""
    g = shared.profile(ROOT / "traces" / "ddp2" / "rank0.sqlite.xz").step_model().graph
    by = dict(_variants(g))
    s = simulate(by["a launch queue of 8"], 1.0)
    assert (s.c_end_by == SIM.BY_WAIT).sum() > (simulate(g, 1.0).c_end_by == SIM.BY_WAIT).sum()
    late = by["batches ready late"]
    s = simulate(late, 1.0)
    held = np.flatnonzero(~np.isnan(late.c_ready))
    assert (s.c_start[held] == late.c_start[0] + late.c_ready[held]).any()
    assert (simulate(g, 1.0).g_by == SIM.BY_DEP).any()


def test_without_numba_every_replay_runs_interpreted(monkeypatch):
    g = shared.profile(ROOT / "traces" / "micro_memcpy.sqlite.xz").step_model().graph
    want = simulate(g, 0.9)
    monkeypatch.setattr(SIM, "_loops", None)
    monkeypatch.setattr(SIM, "_no_numba", False)
    monkeypatch.setattr(SIM, "COMPILE_FROM", 0)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    got = simulate(g, 0.9)
    assert SIM._loops is None and SIM._no_numba
    np.testing.assert_array_equal(got.g_end, want.g_end)
    assert got.end_ns == want.end_ns


def test_an_index_out_of_range_raises_in_both(monkeypatch):
    """A graph whose cross-stream dependency points past its operations: IndexError from the
    compiled loop as from the interpreted one, never a read past the array."""
    g = shared.profile(ROOT / "traces" / "ddp2" / "rank0.sqlite.xz").step_model().graph
    bad = g.copy()
    dep = g.g_dep.copy()
    dep[np.flatnonzero(dep >= 0)[0]] = g.n_ops + 10
    bad.g_dep = dep
    for compile_from, loops in ((10 ** 12, None), (0, SIM._loops)):
        with monkeypatch.context() as mp:
            mp.setattr(SIM, "COMPILE_FROM", compile_from)
            mp.setattr(SIM, "_loops", loops)
            with pytest.raises(IndexError):
                simulate(bad, 1.0)
            assert (SIM._loops is None) == (compile_from > 0)


def test_without_a_writable_cache_the_loop_is_compiled_uncached(monkeypatch):
    """numba refuses cache=True where it finds no writable place for the cache (a read-only
    install and home): the loop is then compiled in the process, not given up."""
    caching = pytest.importorskip("numba.core.caching")
    if not hasattr(caching, "CacheImpl"):
        pytest.skip("this numba keeps its cache locators elsewhere")
    g = shared.profile(ROOT / "traces" / "micro_memcpy.sqlite.xz").step_model().graph
    want = simulate(g, 0.9)
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    monkeypatch.setattr(SIM, "_loops", None)
    monkeypatch.setattr(SIM, "COMPILE_FROM", 0)
    got = simulate(g, 0.9)
    assert SIM._loops is not None and type(SIM._loops[1]._cache).__name__ == "NullCache"
    np.testing.assert_array_equal(got.g_end, want.g_end)


def test_a_compiled_loop_that_cannot_load_gives_way_to_the_interpreted_one(monkeypatch):
    """numba loads a cached compilation at the first call; one it cannot load (made for this file
    under another module's name) raises ImportError there: the replay runs interpreted instead,
    with the same times, and the process compiles no more."""
    g = shared.profile(ROOT / "traces" / "micro_memcpy.sqlite.xz").step_model().graph
    want = simulate(g, 0.9)

    def broken(*_):
        raise ModuleNotFoundError("No module named 'elsewhere'")
    monkeypatch.setattr(SIM, "_loops", (broken, broken))
    monkeypatch.setattr(SIM, "_no_numba", False)
    monkeypatch.setattr(SIM, "COMPILE_FROM", 0)
    got = simulate(g, 0.9)
    assert SIM._loops is None and SIM._no_numba
    np.testing.assert_array_equal(got.g_end, want.g_end)
    np.testing.assert_array_equal(got.c_end, want.c_end)

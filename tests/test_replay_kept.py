"""The step model's replays are kept by what they depend on (profkit.run.step.simulate.replay):
the same edit asked for again is not replayed again, any change to what the replay reads is, and
what is shared cannot be written."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import shared
from profkit.run.step.simulate import replay, simulate
from profkit.run.step.transform import scale_ops

SIM = sys.modules["profkit.run.step.simulate"]


@pytest.fixture
def graph():
    return shared.corpus("sync_loop").step_model().graph


def test_the_same_edit_is_replayed_once_and_a_different_one_again(graph, monkeypatch):
    calls = []
    monkeypatch.setattr(SIM, "simulate", lambda g, h: calls.append(h) or simulate(g, h))
    ops = np.arange(0, graph.n_ops, 3)
    a = replay(scale_ops(graph, ops, 2.0), 0.8)
    b = replay(scale_ops(graph, ops, 2.0), 0.8)          # another copy, the same contents
    assert b is a and len(calls) == 1
    c = replay(scale_ops(graph, ops, 2.0), 0.9)          # another CPU scale
    d = replay(scale_ops(graph, ops[1:], 2.0), 0.8)      # one operation fewer
    e = scale_ops(graph, ops, 2.0)
    e.c_gap[5] += 1000.0                                 # an edit after the transformation
    f = replay(e, 0.8)
    assert len(calls) == 4 and len({id(x) for x in (a, c, d, f)}) == 4
    fresh = simulate(e, 0.8)
    assert f.mean_iteration_ns == fresh.mean_iteration_ns != a.mean_iteration_ns
    np.testing.assert_array_equal(f.g_end, fresh.g_end)


def test_a_kept_replay_and_the_shared_structure_are_read_only(graph):
    edited = scale_ops(graph, np.arange(graph.n_ops), 2.0)
    sched = replay(edited, 1.0)
    with pytest.raises(ValueError):
        sched.g_end[0] = 0.0
    assert edited.g_start is graph.g_start              # the structure is shared, not copied
    with pytest.raises(ValueError):
        edited.g_start[0] = 0
    before = float(graph.g_dur[0])
    edited.g_dur[0] = before + 1.0                       # what a transformation edits is its own
    assert graph.g_dur[0] == before


def test_the_oldest_replays_go_past_the_budget(graph, monkeypatch):
    monkeypatch.setattr(SIM, "_kept", type(SIM._kept)())
    monkeypatch.setattr(SIM, "_kept_bytes", 0)
    one = replay(scale_ops(graph, [0], 2.0), 1.0)
    size = SIM._kept_bytes
    monkeypatch.setattr(SIM, "KEPT_REPLAYS_BYTES", 2 * size)
    for k in (1, 2, 3):
        replay(scale_ops(graph, [k], 2.0), 1.0)
    assert len(SIM._kept) == 2 and SIM._kept_bytes <= 2 * size
    assert replay(scale_ops(graph, [0], 2.0), 1.0) is not one   # the first went, so it ran again

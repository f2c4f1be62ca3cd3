"""A trace whose end lost the GPU work of its last iterations (the program ended without waiting
for the GPU, or a tool cut the trace by the GPU's clock): the window stops before them and says so."""
from __future__ import annotations

import profkit
from synth import make_trace

STEP_CPU, STEP_GPU = 1_000_000, 10_000_000  # the CPU queues a step in 1 ms, the GPU runs it in 10


def _loop(tmp_path, steps: int, kept_kernels: int):
    """A GPU-bound loop of ``steps`` NVTX steps, each launching one kernel, with no sync: step i
    is launched at i ms and runs at 10*i ms on the GPU; only the first ``kept_kernels`` kernels
    are in the trace."""
    kernels, runtime, nvtx = [], [], []
    for i in range(steps):
        t = 1_000 + i * STEP_CPU
        nvtx.append((t, t + STEP_CPU - 1_000, "step", None))
        runtime.append((t + 100, t + 200, i))
        if i < kept_kernels:
            kernels.append((1_300 + i * STEP_GPU, 1_300 + (i + 1) * STEP_GPU - 1_000, i, 1))
    return make_trace(tmp_path / "t.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx)


def test_the_window_ends_before_iterations_whose_kernels_are_missing(tmp_path):
    prof = profkit.load(_loop(tmp_path, steps=12, kept_kernels=9))
    w = prof.window
    assert (w.lost_launches, w.lost_iterations, w.lost_kept) == (3, 3, False)
    assert w.iterations == 8  # steps 1..8: the first is set-up, 9..11 lost their kernels
    assert w.iteration_median_ns == STEP_GPU  # the GPU's pace, not the CPU's 1 ms
    assert any("the trace ends before the GPU finished: 3 kernel launch(es)" in m for m in prof.warnings)


def test_too_few_whole_iterations_are_kept_and_the_undercount_is_said(tmp_path):
    prof = profkit.load(_loop(tmp_path, steps=12, kept_kernels=3))
    w = prof.window
    assert (w.lost_launches, w.lost_kept) == (9, True)
    assert any("the GPU's time per iteration is undercounted" in m for m in prof.warnings)


def test_a_whole_trace_loses_nothing(tmp_path):
    prof = profkit.load(_loop(tmp_path, steps=12, kept_kernels=12))
    assert prof.window.lost_launches == 0
    assert not any("the trace ends before" in m for m in prof.warnings)

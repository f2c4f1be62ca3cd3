"""A nearly GPU-paced step timed a little slower than its replay: the GPU's own variation, not a
slower CPU (profkit.run.step.calibrate.fit_host)."""
from __future__ import annotations

import pytest

import shared
from profkit.run.step.calibrate import GPU_SLACK, MIN_HOST, fit_host


@pytest.fixture
def clip():
    return shared.corpus("contrastive_clip_train")


def test_a_slightly_slower_gpu_paced_run_keeps_the_cpu_scale(clip):
    model = clip.step_model()
    sim = lambda h: model.simulate(host=h)  # noqa: E731
    prior = model.host
    at, floor = sim(prior).iteration_ns, sim(MIN_HOST).iteration_ns
    # the replay: 0.9% above its floor (a sync per step exposes a little CPU)
    assert floor < at <= floor * (1 + GPU_SLACK)
    # the step timed beside its fixes took 67.39 ms, 1% over the replay: kept, not fitted at 1.5
    host, unreachable = fit_host(sim, 67.39e6, prior)
    assert host == pytest.approx(prior) and unreachable
    # a faster run is fitted (the exposed CPU says how fast the CPU ran)
    host, _ = fit_host(sim, at * 0.994, prior)
    assert host < prior


def test_the_bf16_price_at_the_timed_baseline(clip):
    (pk302,), host = clip.findings_at(67.39e6, codes=["PK302"])
    assert host == pytest.approx(clip.step_model().host)
    # 2.39x at capture and at the timed baseline (measured 2.58x); it was 1.80x at a CPU scale of 1.5
    assert pk302.evidence["bf16_speedup"] == pytest.approx(2.389, abs=0.002)

"""Calibration: the CPU scale at which the replay runs like the program without a profiler.

Under Nsight Systems the host side of a step runs 1.2-1.7x slower (measured on the H200: about
6-8 us more per traced CUDA call with cuBLAS/cuDNN tracing, most of it in the CPU time between
calls), the GPU side not at all. So the model keeps every GPU duration and scales every CPU
duration by one factor ``host``:

* **measured**: ``profkit capture`` ran the script once without a profiler and timed its
  top-level NVTX ranges (profkit.capture.calibrate). The steady-state period of the range that
  marks iterations is the target; ``host`` is the scale at which the replay's median iteration
  equals it (bisection: the replay's iteration grows with ``host``). When the GPU sets the pace
  both with and without the profiler, any scale below some bound fits the target; the estimate
  below is then used, within that bound. When the target is below what any CPU scale reaches
  (the GPU itself ran a little faster in the calibration run), the scale is the largest at which
  the replay comes within TOLERANCE of its floor, never the floor MIN_HOST itself: that would
  erase the CPU from the model.
* **estimated**: without calibration data (a trace exported elsewhere, a script with no NVTX
  range), or when the run without the profiler was slower on the CPU side than the profiled one
  (the profiler only adds host time: the machine changed speed between the runs), each traced
  call is taken to have cost ``TRACE_COST_NS`` more than it does unprofiled, and each op profkit's
  aten recorder recorded (``capture --aten``) the cost per op the recorder measured itself when
  it started (StepGraph.recorded_ns), capped so the CPU keeps at least MIN_HOST of its measured
  time. The same estimate bounds the scale where the GPU sets the pace (below). Said to be an estimate (and, for a slower run,
  warned about).
* **issue time** (``Profile.findings_at``'s ``issue_ns``, given by a harness that times it, such
  as the what-if corpus's): where the GPU sets the run's period, the CPU's time to issue one
  iteration gives the scale (host_from_issue); ``profkit capture`` does not time it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import numpy as np

from profkit.run import trials
from profkit.run.iterations import range_starts, warm_up_count
from profkit.run.step.graph import CallKind, StepGraph, Wait
from profkit.run.step.simulate import Schedule, replay
from profkit.run.step.transform import scale_ops
from profkit.run.window import leading_setup

# Measured on the H200 with `profkit capture`'s nsys flags (docs/step-model.md): 6.5 us per
# traced call on a Llama training step, 8 on an LSTMCell loop and a ResNet-18 inference.
TRACE_COST_NS = 6_500.0
MIN_HOST, MAX_HOST = 0.05, 1.5
TOLERANCE = 0.005          # the fit is good when the replay is within 0.5% of the target
# How much a GPU-bound step's iteration varies between runs of the same program without a change
# on the CPU side (measured on the H200 corpus: -2.0% to +0.9% between the profiled and the
# unprofiled run of the GPU-bound programs).
GPU_SLACK = 0.03
# An issue time whose replay (issued_in) runs this much longer than the CPU's own path: the launch
# queue filled while it was timed
ISSUE_QUEUE_SLACK = 1.05
MAX_STEPS = 14


@dataclass
class Calibration:
    """How the profiled run relates to the program without a profiler."""
    source: str                        # "measured", "estimated"
    host: float                        # CPU scale of the unprofiled program
    profiled_iteration_ns: float       # the window's measured median iteration
    replay_iteration_ns: float         # the replay at host=1
    unprofiled_iteration_ns: float     # measured (source measured) or predicted (estimated)
    predicted_iteration_ns: float      # the replay at ``host``
    detail: str = ""
    measured_iterations: int = 0       # unprofiled iterations the target is the median of
    # Whether ``host`` was fitted to the unprofiled run; False when the GPU set the pace and the
    # scale is the per-call estimate (a GPU-bound run does not show its CPU's speed).
    host_fitted: bool = False
    # Said to the user: why the calibration run was not used, or how far several runs disagreed.
    warning: str = ""
    # Each run without the profiler: its median iteration (ns), lowest first; and whether the runs
    # disagree by more than RUN_SPREAD or were refused (slower than the profiled run): the
    # program's own speed varies, and its prices are given over every run's speed
    # (Profile.calibration_ranges).
    run_medians: tuple = ()
    unstable: bool = False
    # The runs without the profiler slower than the profiled one, but within NOISE_SLACK ("noise"),
    # or the fastest of several within it ("spread": the profiled run lies within their spread):
    # the scale is 1.0, the profiler's cost taken as none.
    within_noise: str = ""
    # The ranges inside the step whose host time was measured with and without the profiler: the
    # CPU scale of each (profkit.run.step.inner); ``host`` is the rest's.
    range_scales: dict = field(default_factory=dict)

    def with_ranges(self, scales: dict, replay_iteration_ns: float, predicted_iteration_ns: float) -> "Calibration":
        """This calibration with the measured ranges' scales (``host`` the scale of the rest)."""
        return replace(self, range_scales=dict(scales), replay_iteration_ns=replay_iteration_ns,
                       predicted_iteration_ns=predicted_iteration_ns,
                       detail=f"{self.detail}; host time added by the profiler, measured in the ranges inside "
                              f"the step: {scales_text(scales)} (the rest at the CPU scale {self.host:.2f})")

    @property
    def host_inflation(self) -> float:
        """How much more CPU time the profiled run took: 1/host - 1 (0.57 = +57%)."""
        return 1.0 / self.host - 1.0 if self.host > 0 else 0.0

    def as_dict(self) -> dict:
        return {"source": self.source, "host_scale": round(self.host, 4),
                "profiled_iteration_ns": int(round(self.profiled_iteration_ns)),
                "unprofiled_iteration_ns": int(round(self.unprofiled_iteration_ns)),
                "predicted_iteration_ns": int(round(self.predicted_iteration_ns)),
                "host_time_added_by_profiler": round(self.host_inflation, 4),
                "unprofiled_iterations": int(self.measured_iterations),
                "host_scale_from": self.within_noise or ("fit" if self.host_fitted else "estimate"),
                "detail": self.detail,
                **({"warning": self.warning} if self.warning else {}),
                **({"run_medians_ns": [int(round(m)) for m in self.run_medians], "unstable": True}
                   if self.unstable else {}),
                **({"range_scales": {k: round(v, 4) for k, v in sorted(self.range_scales.items())}}
                   if self.range_scales else {})}


def scales_text(scales: dict) -> str:
    """The host time the profiler added in each measured range (``{name: CPU scale}``), the
    largest first: "`forward` +81%, `argmax` +3%"."""
    return ", ".join(f"`{k}` {1 / v - 1:+.0%}" for k, v in sorted(scales.items(), key=lambda kv: kv[1]))


def steady_ranges(run: dict, delimiter: str, least: int) -> list[dict]:
    """The instances of the top-level range ``delimiter`` one calibration run recorded, less the
    first iterations and set-up that the window leaves out (profkit.run.window.leading_setup);
    none where the run recorded fewer than ``least`` of them."""
    inst = [r for r in run.get("ranges") or [] if isinstance(r, dict) and r.get("name") == delimiter]
    starts = range_starts(run, delimiter)
    if len(inst) != len(starts) or len(inst) < least:
        return []
    return inst[leading_setup(np.array(starts, dtype=np.int64)):]


def unprofiled_runs(meta_text: Optional[str], delimiter: Optional[str]) -> list[np.ndarray]:
    """The steady-state iteration periods (ns) of each calibration run (``profkit capture
    --calibrate-runs N`` keeps N, as ``{"runs": [...]}``); runs that timed too few iterations of
    the range are left out.

    Periods of the range ``delimiter`` (the one the window's iterations come from): GPU-side when
    every instance has a GPU time, else host-side; the first iterations and set-up outliers are
    left out as the window leaves them out (profkit.run.window.leading_setup)."""
    if not delimiter:
        return []
    out = []
    for run in calibration_runs(meta_text):
        starts = np.array(range_starts(run, delimiter), dtype=float)
        if len(starts) < 3:
            continue
        first = leading_setup(starts.astype(np.int64))
        periods = np.diff(starts[first:])
        periods = periods[periods > 0]
        if len(periods):
            out.append(periods)
    return out


def calibration_runs(meta_text: Optional[str]) -> list[dict]:
    """The runs of a trace's PROFKIT_META ``calibration``: one, or the N of ``--calibrate-runs N``
    (``{"runs": [...]}``)."""
    try:
        data = json.loads(meta_text) if meta_text else None
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    return data["runs"] if isinstance(data.get("runs"), list) else [data]


def trial_baseline_runs(trials_text: Optional[str], n_calibration: int) -> list[np.ndarray]:
    """The steady periods (ns) of the runs ``profkit capture --try`` made of the program unchanged:
    its baseline runs after the calibration runs (whose ``seq`` come first: the first
    ``n_calibration`` baseline runs are the calibration runs themselves) and the runs of trials
    whose switch did not apply (profkit.run.trials.unapplied_runs). Unprofiled and timed by the
    same clock, they are calibration runs made later: a compiled ViT step's one calibration run
    took 30.3 ms an iteration (its ops were being recorded), its two unapplied compile trials
    23.9 ms, its steps timed by hand 24.1 ms. So are the blocks of an alternated trial with its
    switch off (profkit.run.trials.unchanged_blocks), one run per trial run."""
    data = trials.parse(trials_text)
    if data is None:
        return []
    runs = [r for r in (data.get("baseline") or {}).get("runs", [])
            if int(r.get("seq", -1)) >= n_calibration and not r.get("exit_code")]
    out = []
    for r in runs + trials.unapplied_runs(data):
        periods = [p for p in r.get("iteration_ns") or [] if p and p > 0]
        if not periods:
            continue
        steady = np.array(periods[warm_up_count(len(periods)):], dtype=float)
        if len(steady):
            out.append(steady)
    # an alternated trial's blocks with the switch off: their warm-up is the blocks it left out
    out += [np.array(off, dtype=float) for off in trials.unchanged_blocks(data)]
    return out


# A run without the profiler slower than the profiled run by no more than this is the profiled
# speed within a run's noise (a GPU-paced period, a host's clock vary by a few percent between
# runs; the capture's second calibration run uses the same band): the profiler's cost is taken as
# none, the nearest the measurement allows, instead of discarding the run for an estimate.
NOISE_SLACK = 1.03

# Calibration runs whose medians lie further apart than this: the machine's speed changed between
# them, and the predictions of a host-bound step carry that spread (said in a warning).
RUN_SPREAD = 1.10


def calibrate(graph: StepGraph, meta_text: Optional[str] = None,
              sim: Callable[[float], Schedule] | None = None,
              trials_text: Optional[str] = None) -> tuple[Calibration, Schedule]:
    """The calibration of ``graph`` (``meta_text``: the trace's PROFKIT_META ``calibration``;
    ``trials_text``: its ``trials``, whose runs of the program unchanged count as calibration runs
    too: trial_baseline_runs) and the replay at the calibrated CPU scale."""
    sim = sim or (lambda h: replay(graph, h))
    profiled = float(np.median(graph.measured_periods))
    at1 = sim(1.0)
    prior = estimated_host(graph)
    runs = unprofiled_runs(meta_text, graph.window.delimiter)
    if runs:
        runs += trial_baseline_runs(trials_text, len(calibration_runs(meta_text)))
    target_periods = np.concatenate(runs) if runs else None
    if target_periods is None:
        s = sim(prior) if prior != 1.0 else at1
        why = ("no calibration run in the trace (capture with `profkit capture`)" if not meta_text
               else "the calibration run timed no iteration of the window's range")
        return Calibration("estimated", prior, profiled, at1.iteration_ns, s.iteration_ns,
                           s.iteration_ns,
                           f"{why}: {TRACE_COST_NS / 1e3:.1f} us of tracing cost per CUDA call "
                           "taken off the CPU time"), s
    # One run: its median iteration. Several: the median of their medians (the run whose speed is
    # the middle one), not the median of their pooled periods.
    medians = sorted(float(np.median(r)) for r in runs)
    target = float(np.median(medians))
    spread = ""
    if len(runs) > 1 and medians[-1] > RUN_SPREAD * medians[0]:
        spread = (f"the {len(runs)} runs without the profiler took {medians[0] / 1e6:.2f}-"
                  f"{medians[-1] / 1e6:.2f} ms an iteration ({medians[-1] / medians[0]:.2f}x): this "
                  "machine's speed changes from run to run, and a host-bound step's predictions "
                  "carry that spread")
    cache: dict[float, Schedule] = {1.0: at1}
    h, unreachable = fit_host(sim, target, prior, cache)
    f = _iteration_at(sim, cache)
    # Several runs without the profiler whose fastest is as fast as the profiled run: the profiled
    # run lies within the program's own spread (an offloading decoder's runs took 190.6 and 214.4 ms
    # a step, the profiled one 187.5 ms; refused, the per-call estimate took 27% off, to 136.6 ms,
    # where the program ran 185 ms beside its fixes).
    within = target <= profiled * NOISE_SLACK
    # ... its spread the runs' own: the fastest within as much of the profiled run as the runs lie
    # apart from each other (a program whose runs took 28.2 and 31.4 ms a step, the profiled one
    # 27.1 ms: refused at a 3% band, the per-call estimate predicted 12.8 ms; it ran 26.1 ms)
    among = len(runs) > 1 and medians[0] <= profiled * max(NOISE_SLACK, medians[-1] / medians[0])
    if h > 1.0 + TOLERANCE and not unreachable and (within or among):
        # Slower than the profiled run, but within a run's noise: tracing cost nothing measurable.
        # (The per-call estimate is no better here: on a step of thousands of syncs and copies it
        # took 60% off a run that took as long without the profiler.)
        s = cache.setdefault(1.0, at1)
        noise = ("within a run's noise" if within else
                 f"and the fastest of the {len(runs)} runs {medians[0] / profiled - 1:+.1%}: the profiled "
                 "run lies within the program's own spread")
        detail = (f"median of {len(target_periods)} iterations of `{graph.window.delimiter}` timed "
                  f"without a profiler: {target / profiled - 1:.1%} longer than the profiled run, {noise}, "
                  "so the profiler's cost is taken as none (CPU scale 1.00)")
        return Calibration("measured", 1.0, profiled, at1.iteration_ns, target, s.iteration_ns, detail,
                           len(target_periods), False, warning=spread, run_medians=tuple(medians),
                           unstable=bool(spread),
                           within_noise="noise" if within else "spread"), s
    if h > 1.0 + TOLERANCE and not unreachable:
        # The CPU would have to run slower without the profiler than under it, which tracing
        # cannot cause: the machine ran at another speed between the two runs (a busy or
        # throttled host), and the run is no measure of the program. Fall back to the estimate.
        s = cache.setdefault(prior, sim(prior))
        took = (f"the run without the profiler took {target / 1e6:.2f} ms an iteration" if len(runs) == 1 else
                f"the {len(runs)} runs without the profiler took {medians[0] / 1e6:.2f}-{medians[-1] / 1e6:.2f} "
                f"ms an iteration (median {target / 1e6:.2f} ms)")
        why = (f"{took}, longer than "
               f"the profiled run's {profiled / 1e6:.2f} ms on the CPU side, which the profiler "
               "cannot cause: the machine's speed changed between the runs, or the program's own "
               "speed varies (capture again on a quiet machine, with --calibrate-runs 3)")
        return Calibration("estimated", prior, profiled, at1.iteration_ns, s.iteration_ns,
                           s.iteration_ns, f"{why}; {TRACE_COST_NS / 1e3:.1f} us of tracing cost per "
                           "CUDA call taken off the CPU time instead, and the prices also given at "
                           "the speed of each run without the profiler", len(target_periods),
                           warning=f"calibration not used for the main price: {why}",
                           run_medians=tuple(medians), unstable=True), s
    detail = (f"median of {len(target_periods)} iterations of `{graph.window.delimiter}` timed "
              "without a profiler" if len(runs) == 1 else
              f"median of {len(runs)} runs without a profiler ({len(target_periods)} iterations of "
              f"`{graph.window.delimiter}`; run medians {medians[0] / 1e6:.2f}-{medians[-1] / 1e6:.2f} ms)")
    miss = f(h) / target - 1
    if unreachable and miss < 0:
        detail += (f"; the GPU sets the replay's pace and the run without the profiler took "
                   f"{-miss:.1%} longer (its GPU side ran slower, or the run varied): the CPU scale "
                   f"{h:.2f} is the per-call estimate, not slowed to make up the difference")
    elif unreachable:
        detail += (f"; the GPU sets the pace with and without the profiler ({miss:+.1%} left that a "
                   f"faster CPU cannot take off): the CPU scale {h:.2f} is the largest at which the "
                   "replay comes closest, at most the per-call estimate")
    elif abs(miss) > 0.05:
        detail += (f"; the replay cannot reach it by scaling the CPU alone ({miss:+.0%} left: the "
                   "GPU side also ran at another speed, or the run varied)")
    # The scale is the program's own only where the CPU is on the replay's path at it: in a
    # GPU-paced replay any scale up to some bound fits, and the estimate stands.
    fitted = not unreachable and f(h) > f(MIN_HOST) * (1 + TOLERANCE)
    return Calibration("measured", h, profiled, at1.iteration_ns, target, f(h), detail,
                       len(target_periods), fitted, warning=spread, run_medians=tuple(medians),
                       unstable=bool(spread)), cache[h]


def fit_host(sim: Callable[[float], Schedule], target: float, prior: float,
             cache: Optional[dict] = None) -> tuple[float, bool]:
    """The CPU scale at which the replay ``sim`` runs an iteration in ``target`` ns (bisection
    from ``prior``), and whether the target is out of reach: below the replay's floor (the GPU
    sets the pace: then the largest scale within TOLERANCE of the floor, at most ``prior``), or
    above a replay that the GPU paces at ``prior`` by no more than GPU_SLACK (``prior`` is kept:
    a GPU side that ran a little slower is not a slower CPU)."""
    f = _iteration_at(sim, {} if cache is None else cache)
    h = prior
    floor = f(MIN_HOST)
    unreachable = f(h) > target * (1 + TOLERANCE) and floor > target * (1 + TOLERANCE)
    gpu_paced = f(h) <= floor * (1 + TOLERANCE)
    # Nearly GPU-paced (the CPU's exposed part, after a sync or at the refill, adds no more than a
    # GPU-bound step varies between runs) and a little slower than the replay: the GPU's own
    # variation, not a slower CPU. Fitted, the CPU would have to run up to twice as slow to add
    # those few percent (a CLIP step timed 1% slower than its capture's run was fitted at 1.5,
    # and its bf16 price, a CPU-bound step after the fix, fell from 2.38x to 1.80x against 2.58x
    # measured). A faster target is fitted: there the exposed part says how fast the CPU ran.
    nearly = f(h) <= floor * (1 + GPU_SLACK) and f(h) < target <= f(h) * (1 + GPU_SLACK)
    if (gpu_paced or nearly) and target <= f(h) * (1 + GPU_SLACK):
        # The GPU sets the replay's pace and the run took about as long, or a little longer, as
        # much as a GPU-bound step varies between runs (clocks, another machine of the kind):
        # slowing the CPU until it becomes the pace would put that difference where it was not
        # and make a GPU-bound step host-bound in the model, and speeding it up changes nothing
        # (a target a hair below the floor would send the search down to MIN_HOST). Keep the
        # estimate. (Further off, the CPU was slower than estimated, and the fit below finds by
        # how much.)
        return h, True
    if unreachable:
        # Out of reach: even a CPU many times faster leaves the replay above the target, so the
        # GPU side ran faster in the calibration run (or the run varied). Scaling the CPU down to
        # MIN_HOST would only erase the CPU from the model; keep the CPU as fast as the replay
        # needs to come closest (the largest scale within TOLERANCE of the floor), at most prior.
        if f(h) > floor * (1 + TOLERANCE):
            h = largest_within(f, h, floor * (1 + TOLERANCE))
    elif abs(f(h) / target - 1) > TOLERANCE:
        lo, hi = (MIN_HOST, h) if f(h) > target else (h, MAX_HOST)
        for _ in range(MAX_STEPS):
            mid = 0.5 * (lo + hi)
            if f(mid) > target:
                hi = mid
            else:
                lo = mid
            if abs(f(mid) / target - 1) <= TOLERANCE:
                break
        h = min((lo, hi, mid), key=lambda x: abs(f(x) / target - 1))
    return h, unreachable


def _iteration_at(sim: Callable[[float], Schedule], cache: dict) -> Callable[[float], float]:
    """The replay's median iteration at a CPU scale, each scale replayed once (into ``cache``)."""
    def f(h: float) -> float:
        if h not in cache:
            cache[h] = sim(h)
        return cache[h].iteration_ns
    return f


def estimated_host(graph: StepGraph) -> float:
    """The CPU scale that takes TRACE_COST_NS per traced call off the CPU time, and the aten
    recorder's measured cost (StepGraph.recorded_ns) where it recorded the run."""
    cpu = float(graph.c_gap.sum() + graph.c_own.sum())
    if cpu <= 0 or graph.n_calls == 0:
        return 1.0
    added = graph.n_calls * TRACE_COST_NS + graph.recorded_ns
    return float(np.clip(1.0 - added / cpu, MIN_HOST * 2, 1.0))


def host_from_issue(graph: StepGraph, issue_ns: float, period_ns: float,
                    sim: Callable[[float], Schedule]) -> Optional[float]:
    """The CPU scale read from the host's issue time of one iteration (``issue_ns``: the CPU's
    time to issue an iteration while nothing blocks it, not waited for), for a run whose period
    ``period_ns`` the GPU sets and so shows nothing of the CPU's speed. The scale is the one at
    which the replay with every GPU operation taking no time (the CPU's own path) runs an
    iteration in ``issue_ns``; never above the largest at which the replay still runs at the
    period (a CPU that slow would have set the pace). None when the iteration waits for the GPU
    inside (a sync, a blocking copy: its issue time holds that wait), when the launch queue would
    have filled while it was timed at that speed or a faster one (issued_in), or when the replay
    has no CPU."""
    its = max(len(graph.iter_call) - 1, 1)
    waits = (graph.c_wait != int(Wait.NONE)) & ~np.isin(graph.c_kind, [int(CallKind.LAUNCH),
                                                                       int(CallKind.GRAPH_LAUNCH)])
    if waits.sum() >= 0.5 * its or issue_ns <= 0:
        return None
    cpu = replay(scale_ops(graph, np.arange(graph.n_ops), np.inf), 1.0).iteration_ns
    if cpu <= 0:
        return None
    h = float(np.clip(issue_ns / cpu, MIN_HOST, MAX_HOST))
    if issued_in(graph, h) > ISSUE_QUEUE_SLACK * h * cpu or \
            issued_in(graph, h / 4) * ISSUE_QUEUE_SLACK >= issue_ns:
        # The launch queue filled while the CPU issued at that speed, or would have at a CPU
        # four times faster and shown about the same time (GPT-2 fp32 training, 88 ms of GPU
        # work an iteration: 73 ms of issue time fits a slow CPU and a fast one alike): the
        # time is the GPU's as much as the CPU's, and says nothing sure of the CPU's speed
        return None
    f = _iteration_at(sim, {})
    if f(h) > period_ns * (1 + GPU_SLACK):
        h = largest_within(f, h, period_ns * (1 + TOLERANCE))
    return h


def issued_in(graph: StepGraph, h: float) -> float:
    """The issue-time measurement replayed at CPU scale ``h``: from an idle GPU (the work queued
    before the window taking no time), the CPU issues one iteration, then two more; their mean
    issue time. The GPU's work runs as measured, so a step with more GPU work queued than the
    launch queue holds blocks the CPU as it did (GPT-2 training in fp32: 1,809 launches and 88 ms
    of GPU work an iteration, the queue full within the first timed one); where the queue never
    fills it is the CPU's own time. With fewer than four iterations in the graph: 0 (not known)."""
    ic = graph.iter_call
    if len(ic) < 5:
        return 0.0
    s = replay(scale_ops(graph, np.flatnonzero(graph.g_call < 0), np.inf), h)
    return float(s.c_end[ic[3] - 1] - s.c_end[ic[1] - 1]) / 2


def largest_within(f: Callable[[float], float], hi: float, bound_ns: float) -> float:
    """About the largest CPU scale below ``hi`` at which the replay's iteration ``f`` stays
    within ``bound_ns`` (bisection down to MIN_HOST; the iteration grows with the scale)."""
    lo = MIN_HOST
    for _ in range(MAX_STEPS):
        mid = 0.5 * (lo + hi)
        if f(mid) > bound_ns:
            hi = mid
        else:
            lo = mid
    return lo

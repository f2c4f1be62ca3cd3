"""One model of the step: the graph, its calibration to the unprofiled program, the replay and
its critical path, built once per trace and shared by the run summary and the rules."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

import numpy as np
import pandas as pd

from profkit.run.step import inner
from profkit.run.step.calibrate import Calibration, calibrate, calibration_runs
from profkit.run.step.critical import CriticalPath, critical_path
from profkit.run.step.graph import StepGraph, build
from profkit.run.step.simulate import Schedule, replay
from profkit.run.window import Window

REPLAY_TOLERANCE = 0.03   # the unmodified replay must land within 3% of the measured iteration


@dataclass
class StepModel:
    """The step graph of a window, calibrated (see profkit.run.step)."""
    graph: StepGraph
    calibration: Calibration
    baseline: Schedule                 # the replay at the calibrated CPU scale
    critical: CriticalPath             # of the baseline
    warnings: list[str] = field(default_factory=list)
    # Replays of the unmodified graph by CPU scale, made once (the calibration's among them):
    # the run summary, the rules and the combinations ask for the same ones again.
    replays: dict[float, Schedule] = field(default_factory=dict, repr=False, compare=False)

    @property
    def host(self) -> float:
        return self.calibration.host

    @property
    def iteration_ns(self) -> float:
        """The predicted iteration of the program without a profiler."""
        return self.baseline.iteration_ns

    def simulate(self, graph: Optional[StepGraph] = None, host: Optional[float] = None) -> Schedule:
        """Replay ``graph`` (a transformed copy; default: the unmodified one) at ``host`` (default:
        the calibrated scale)."""
        host = self.host if host is None else host
        if graph is not None:
            return replay(graph, host)
        if host not in self.replays:
            self.replays[host] = replay(self.graph, host)
        return self.replays[host]

    def speedup(self, graph: StepGraph) -> float:
        """The predicted gain of a transformed graph: baseline iteration over the new one."""
        new = self.simulate(graph).iteration_ns
        return self.iteration_ns / new if new > 0 else 1.0

    @cached_property
    def _op_index(self) -> tuple[pd.MultiIndex, np.ndarray]:
        """The graph's operations by (start, correlation id); the last of equal keys wins. Edits
        keep every operation's index, so this serves every edited copy of the graph too."""
        g = self.graph
        keys = pd.DataFrame({"start": g.g_start, "corr": g.g_corr, "op": np.arange(g.n_ops)})
        keys = keys.drop_duplicates(["start", "corr"], keep="last")
        return pd.MultiIndex.from_arrays([keys["start"], keys["corr"]]), keys["op"].to_numpy(np.int64)

    def ops_of(self, starts: np.ndarray, corr: np.ndarray, aligned: bool = False) -> np.ndarray:
        """The graph's operations with these (start, correlation id) pairs, the key of a row of
        the trace's activities; with ``aligned``, one entry per pair (-1 where the graph does not
        hold it), else only those it holds."""
        key, op = self._op_index
        if not len(op) or not len(starts):
            return np.full(len(starts), -1, dtype=np.int64) if aligned else np.empty(0, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        # The graph holds a few iterations of a window that can hold a million activities: only
        # the rows whose start is one of the graph's are looked up by the pair.
        known = self._op_starts
        # (rows outside the graph's stretch first left out by two comparisons, not searched)
        near = np.flatnonzero((starts >= known[0]) & (starts <= known[-1]))
        at_start = np.minimum(np.searchsorted(known, starts[near]), len(known) - 1)
        cand = near[known[at_start] == starts[near]]
        idx = np.full(len(starts), -1, dtype=np.int64)
        if len(cand):
            at = key.get_indexer(pd.MultiIndex.from_arrays([starts[cand],
                                                            np.asarray(corr, dtype=np.int64)[cand]]))
            idx[cand] = np.where(at >= 0, op[at], -1)
        return idx if aligned else idx[idx >= 0]

    @cached_property
    def _op_starts(self) -> np.ndarray:
        """The distinct start times of the graph's operations, sorted."""
        return np.sort(self._op_index[0].get_level_values(0).unique().to_numpy(np.int64))

    def sync_cost_ns(self, iterations: int) -> float:
        """What the syncs (stream/device syncs, device-to-host copies) cost the profiled run over
        ``iterations`` iterations: the replay at the profiled CPU speed against the same replay
        with their waits dropped (profkit.run.step.transform.drop_waits)."""
        if self._sync_free_ns is None:
            return 0.0
        base = self.simulate(host=1.0).mean_iteration_ns
        return max(base - self._sync_free_ns, 0.0) * iterations

    @cached_property
    def _sync_free_ns(self) -> Optional[float]:
        """The mean iteration of the replay at the profiled CPU speed without the syncs' waits
        (None: the graph has no sync)."""
        from profkit.run.step.transform import drop_waits, sync_calls
        calls = sync_calls(self.graph)
        if not len(calls):
            return None
        return replay(drop_waits(self.graph, calls), 1.0).mean_iteration_ns

    @property
    def replay_error(self) -> float:
        """The unmodified replay against the measured iteration (profiled)."""
        c = self.calibration
        return c.replay_iteration_ns / c.profiled_iteration_ns - 1 if c.profiled_iteration_ns else 0.0

    def as_dict(self) -> dict:
        c = self.calibration
        return {
            "replay": {"measured_iteration_ns": int(round(c.profiled_iteration_ns)),
                       "simulated_iteration_ns": int(round(c.replay_iteration_ns))},
            "calibration": c.as_dict(),
            "critical_path": self.critical.per_iteration(),
        }


def model_of(trace, window: Window, launch_floor_ns: float) -> StepModel:
    """Build, calibrate and replay the step model of ``window`` in ``trace`` (the full trace)."""
    g = build(trace, window, launch_floor_ns)
    replays: dict[float, Schedule] = {}
    meta = trace.meta.get("calibration")
    # The ranges inside the step whose host time the calibration run measured run at their own
    # scale at every CPU scale the calibration tries (profkit.run.step.inner)
    ranges = inner.measure(trace, g, calibration_runs(meta))

    def at(host: float) -> Schedule:
        if host not in replays:
            replays[host] = replay(ranges.graph_at(g, host) if ranges else g, host)
        return replays[host]

    cal, sched = calibrate(g, meta, sim=at, trials_text=trace.meta.get("trials"))
    if ranges:
        # the model's graph: the measured ranges at their scale when replayed at the calibrated
        # one; the replay of the trace itself stays the unscaled graph's
        trace_replay = replay(g, 1.0).iteration_ns
        sched = at(cal.host)
        g = ranges.graph_at(g, cal.host)
        replays = {cal.host: sched}
        cal = cal.with_ranges(ranges.scales, trace_replay, sched.iteration_ns)
    warnings = list(g.notes) + ([cal.warning] if cal.warning else [])
    err = cal.replay_iteration_ns / cal.profiled_iteration_ns - 1 if cal.profiled_iteration_ns else 0
    if abs(err) > REPLAY_TOLERANCE:
        warnings.append(f"the step model replays the measured iteration {err:+.1%} off "
                        f"({cal.replay_iteration_ns / 1e6:.2f} ms against "
                        f"{cal.profiled_iteration_ns / 1e6:.2f} ms): its predictions are less sure")
    if not np.isfinite(sched.iteration_ns) or sched.iteration_ns <= 0:
        warnings.append("the step model could not replay this window")
    return StepModel(g, cal, sched, critical_path(g, sched, cal.host), warnings, replays)

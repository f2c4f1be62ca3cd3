"""One model of the step: the graph, its calibration to the unprofiled program, the replay and
its critical path, built once per trace and shared by the run summary and the rules."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from profkit.run.step.calibrate import Calibration, calibrate
from profkit.run.step.critical import CriticalPath, critical_path
from profkit.run.step.graph import StepGraph, build
from profkit.run.step.simulate import Schedule, simulate
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
        return simulate(self.graph if graph is None else graph, self.host if host is None else host)

    def speedup(self, graph: StepGraph) -> float:
        """The predicted gain of a transformed graph: baseline iteration over the new one."""
        new = self.simulate(graph).iteration_ns
        return self.iteration_ns / new if new > 0 else 1.0

    def sync_cost_ns(self, iterations: int) -> float:
        """What the syncs (stream/device syncs, device-to-host copies) cost the profiled run over
        ``iterations`` iterations: the replay at the profiled CPU speed against the same replay
        with their waits dropped (profkit.run.step.transform.drop_waits)."""
        from profkit.run.step.transform import drop_waits, sync_calls
        calls = sync_calls(self.graph)
        if not len(calls):
            return 0.0
        base = simulate(self.graph, 1.0).mean_iteration_ns
        new = simulate(drop_waits(self.graph, calls), 1.0).mean_iteration_ns
        return max(base - new, 0.0) * iterations

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
    cal, sched = calibrate(g, trace.meta.get("calibration"))
    warnings = list(g.notes)
    err = cal.replay_iteration_ns / cal.profiled_iteration_ns - 1 if cal.profiled_iteration_ns else 0
    if abs(err) > REPLAY_TOLERANCE:
        warnings.append(f"the step model replays the measured iteration {err:+.1%} off "
                        f"({cal.replay_iteration_ns / 1e6:.2f} ms against "
                        f"{cal.profiled_iteration_ns / 1e6:.2f} ms): its predictions are less sure")
    if not np.isfinite(sched.iteration_ns) or sched.iteration_ns <= 0:
        warnings.append("the step model could not replay this window")
    return StepModel(g, cal, sched, critical_path(g, sched, cal.host), warnings)

"""The step model: the judged window as a dependency graph of CPU and GPU work, replayed.

    graph = build(trace, window)       # profkit.run.step.graph: nodes and edges from the trace
    sched = simulate(graph, host=0.7)  # profkit.run.step.simulate: the replay, CPU time scaled

Replaying the unmodified graph reproduces the measured iterations; the calibration
(profkit.run.step.calibrate) finds the CPU scale at which it reproduces the program run without
a profiler; the critical path (profkit.run.step.critical) says what set each iteration's length.
"""
from profkit.run.step.graph import CallKind, StepGraph, Wait, build
from profkit.run.step.simulate import Schedule, simulate

__all__ = ["CallKind", "StepGraph", "Wait", "build", "Schedule", "simulate"]

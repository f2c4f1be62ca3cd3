"""Graph edits: what a fix changes in the step, as a change to a copy of the step graph.

Each function takes a StepGraph and returns an edited copy; the model prices it by replaying
both (profkit.run.step.model.StepModel.speedup). Daydream's primitives: select nodes, shrink or
remove them, add or remove a dependency.
"""
from __future__ import annotations

import numpy as np

from profkit.run.step.graph import StepGraph, Wait


def drop_waits(g: StepGraph, calls: np.ndarray) -> StepGraph:
    """The selected calls no longer wait for the GPU (a sync kept off the step's path: the value
    is read later, or never); their own CPU time stays."""
    out = g.copy()
    sel = np.asarray(calls)
    out.c_wait[sel] = int(Wait.NONE)
    out.c_wake[sel] = 0.0
    return out

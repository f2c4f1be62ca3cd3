"""What a step's memory allows: its activations, from the calibration run.

``profkit capture``'s calibration run reads PyTorch's caching allocator at the start of every
step (``torch.cuda.memory_allocated``: the weights, the optimizer's state, what the step keeps
between steps) and, after the script, the run's peak (``max_memory_allocated``) and the GPU's size
(profkit.capture.calibrate, ``mem_bytes`` and ``memory``). The peak less what a step starts with is
what one step (one micro-batch, where it accumulates) adds: its activations, its gradients, its
workspaces. A micro-batch ``f`` times the size adds about ``f`` times that, so it fits where what
the step starts with plus ``f`` times the rest stays within FIT_SHARE of the GPU (the allocator's
fragmentation and the CUDA context take the remainder). The estimate errs on the safe side: the
gradients, counted with the activations, do not grow with the micro-batch, and the peak is the
whole run's (its warm-up's workspaces too). A capture without these figures (older, or of a
program that never used CUDA) gives none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from profkit.run.step.calibrate import calibration_runs, steady_ranges

FIT_SHARE = 0.9


@dataclass(frozen=True)
class StepMemory:
    """A step's memory (bytes) in the calibration run."""
    resident_bytes: float      # allocated at a step's start (median over the steady steps)
    peak_bytes: float          # the run's peak of allocated memory
    device_bytes: float        # the GPU's memory

    @property
    def step_bytes(self) -> float:
        """What one step adds at its peak: activations, gradients, workspaces."""
        return max(self.peak_bytes - self.resident_bytes, 0.0)

    def need(self, factor: float) -> float:
        """The peak with the step's own memory ``factor`` times as large."""
        return self.resident_bytes + factor * self.step_bytes

    def fits(self, factor: float) -> bool:
        return self.need(factor) <= FIT_SHARE * self.device_bytes


def step_memory(meta_text: Optional[str], delimiter: Optional[str]) -> Optional[StepMemory]:
    """The memory of the steps of ``delimiter`` in the calibration runs of a trace's PROFKIT_META
    ``calibration``; None where they were not recorded."""
    if not delimiter:
        return None
    resident, peak, device = [], [], []
    for run in calibration_runs(meta_text):
        mem = run.get("memory")
        if not isinstance(mem, dict) or not all(isinstance(mem.get(k), (int, float)) and mem[k] > 0
                                                for k in ("peak_bytes", "device_bytes")):
            continue   # not recorded, or not numbers: a file written by hand or damaged is read
        held = [float(r["mem_bytes"]) for r in steady_ranges(run, delimiter, 3)
                if isinstance(r.get("mem_bytes"), (int, float))]
        if not held:
            continue
        resident.append(float(np.median(held)))
        peak.append(float(mem["peak_bytes"]))
        device.append(float(mem["device_bytes"]))
    if not resident:
        return None
    return StepMemory(float(np.median(resident)), max(peak), min(device))

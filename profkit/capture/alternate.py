"""A trial that alternates with the program unchanged inside one run.

Separate runs of one program differ in host speed: a guided sampler's step took 10.3 ms in one
process and 16.3 ms in the next, a tokenizer-bound loop 13.4 to 27.3 ms in six runs. A trial timed
in one process against a baseline timed in another carries that difference into its gain (a TF32
trial read 0.50x where the same fix, applied by hand and timed beside the baseline, measured 1.03x).
Where every switch of a trial can be turned off and on while the program runs (``Trial.toggles``),
``--alternate K`` times the trial and the program unchanged in blocks that take turns in the same
run, as the corpus's interleaved harness does with the variants of a program: on, off, on, off...

* A block is at least ``K`` iterations of the step range (and, in a run not cut at a number of
  iterations, at least ``MIN_BLOCK_S``); it ends at the start of an iteration (the step range's
  push), where the switches are turned over.
* Before turning them over the GPU's queue is drained, so that each block's time (from the host's
  clock at its first iteration's start to the drain after its last) is its own work: a block of a
  GPU-paced program whose host runs ahead would otherwise be charged with the previous block's
  queued kernels, or leave its own to the next.
* The first two blocks (the switches on, then off) are warm-up: compilation, cuDNN's algorithm
  search, the allocator's first growth. The block still open when the run ends is left out.

The record (``Alternation.as_dict``: ``{"k": K, "blocks": [{"on", "iterations", "ns"}, ...]}``)
goes into the run's calibration file; profkit.run.trials turns it into the trial's gain.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from profkit.capture.calibrate import wait_for_gpu

MIN_BLOCK_S = 0.05
WARM_BLOCKS = 2


def block_iterations(max_iterations: Optional[int]) -> int:
    """Iterations a block (``--alternate K``): a run cut at ``max_iterations`` (twice a plain
    trial's, as it times the program unchanged too) holds about twelve blocks, so that ten follow
    the warm-up; at least 3. Without a cut, 10."""
    if not max_iterations:
        return 10
    return max(3, max_iterations // 12)


class Alternation:
    """Turns a trial's switches off and on every block of ``k`` iterations of ``step``; a
    listener of profkit.capture.calibrate.RangeClock's top-level pushes."""

    def __init__(self, trial: Any, step: str, k: int, min_block_s: Optional[float] = None) -> None:
        self.trial = trial
        self.step = step
        self.k = max(1, int(k))
        self.min_block_ns = int((MIN_BLOCK_S if min_block_s is None else min_block_s) * 1e9)
        self.on = True            # the switches as installed
        self.blocks: list[dict] = []
        self._n = 0               # iterations in the open block
        self._t0: Optional[int] = None

    def on_push(self, name: str) -> None:
        if name != self.step:
            return
        now = time.perf_counter_ns()
        if self._t0 is None:
            self._t0 = now
        elif self._n >= self.k and now - self._t0 >= self.min_block_ns:
            wait_for_gpu()
            end = time.perf_counter_ns()
            self.blocks.append({"on": self.on, "iterations": self._n, "ns": end - self._t0})
            if self.on:
                self.trial.check_holds()
            self.on = not self.on
            self.trial.toggle(self.on)
            self._n = 0
            self._t0 = time.perf_counter_ns()
        self._n += 1

    def as_dict(self) -> dict:
        return {"k": self.k, "warm_blocks": WARM_BLOCKS, "blocks": list(self.blocks)}

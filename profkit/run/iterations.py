"""Iteration times of a run timed without a profiler (``profkit capture``'s calibration run and
its trials, the what-if harness's runs).

A run's record (profkit.capture.calibrate) lists its top-level NVTX ranges with the host clock at
their start and, where CUDA was in use, where the GPU was in its stream when each began. An
iteration's time is the period between consecutive starts of the range that marks iterations: on
the GPU timeline when every instance has a GPU time (a CPU that runs ahead of the GPU queues work
early; the GPU's period stays right), else on the host clock. n instances give n - 1 periods.

The steady state (``steady_median``): the first 20% of the periods, and at least 3, are warm-up
(compilation, autotuning, CUDA-graph recording, the caching allocator growing); the median of the
rest is the run's iteration time. The step model's calibration reads the same periods
(``range_starts``) but leaves out what the window leaves out (profkit.run.window.leading_setup),
so that it compares like with like against the profiled window.

Standard library only: the what-if harness imports it on machines with nothing else installed.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Optional, Sequence

WARM_UP_SHARE = 0.2
MIN_WARM_UP = 3


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def range_starts(run: dict, name: str) -> list[int]:
    """Starts (ns) of the top-level range ``name`` in ``run``: GPU-side when every instance has
    a GPU time, else host-side."""
    inst = [r for r in run.get("ranges", []) if r.get("name") == name]
    key = "gpu_ns" if all(_number(r.get("gpu_ns")) for r in inst) else "start_ns"
    return [int(r[key]) for r in inst if _number(r.get(key))]


def iteration_times(run: dict, name: str) -> list[int]:
    """Periods (ns) between consecutive starts of the top-level range ``name`` (see the module
    docstring)."""
    starts = range_starts(run, name)
    return [b - a for a, b in zip(starts, starts[1:])]


def warm_up_count(n_periods: int) -> int:
    """How many of ``n_periods`` periods are warm-up: 20%, at least 3."""
    return max(MIN_WARM_UP, math.ceil(WARM_UP_SHARE * n_periods))


def steady_median(periods: Sequence[int]) -> tuple[Optional[int], int]:
    """(median of the steady periods in ns, how many were used): the warm-up periods
    (``warm_up_count``) left out. (None, 0) when nothing is left."""
    rest = list(periods)[warm_up_count(len(periods)):]
    if not rest:
        return None, 0
    return int(statistics.median(rest)), len(rest)


def most_frequent_range(run: dict) -> Optional[str]:
    """The top-level range the run repeated most often (the first of a tie): its iterations when
    nothing else names them."""
    counts = Counter(str(r.get("name")) for r in run.get("ranges", []))
    if not counts:
        return None
    return counts.most_common(1)[0][0]


def inner_counts(run: dict, name: str) -> Optional[list[int]]:
    """Per instance of the top-level range ``name``: the nested ranges it opened (calibration
    files record them as ``inner``), or None where the run recorded none (a file from before the
    count, or a program with no nested range)."""
    inst = [r for r in run.get("ranges", []) if r.get("name") == name]
    if not any("inner" in r for r in inst):
        return None
    return [int(r.get("inner", 0)) for r in inst]

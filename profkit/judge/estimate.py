"""The small decision calculations behind the advisor (and `profkit estimate`).

Each is one formula; the advisor, the case studies and the command line use these same functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def amdahl(p: float, s: float) -> float:
    """Whole-run speedup when a share ``p`` of the time gets ``s`` times faster: 1/((1-p) + p/s).

    >>> round(amdahl(0.25, 4.0), 2)   # an op at 25% of the step made 4x faster
    1.23
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"share p must be within 0..1, not {p}")
    if s <= 0:
        raise ValueError(f"speedup s must be positive, not {s}")
    return 1.0 / ((1.0 - p) + p / s)


def fusion_ceiling(kernel_us: list[float], launch_us: float, fused_us: float) -> float:
    """Upper bound of fusing kernels into one: (sum of kernels + one launch each) / (fused + one launch).

    >>> round(fusion_ceiling([40, 40, 40], 5, 70), 2)   # three 40 us kernels -> one 70 us kernel
    1.8
    """
    if not kernel_us or fused_us <= 0 or launch_us < 0:
        raise ValueError("need at least one kernel time, a positive fused time and launch >= 0")
    return (sum(kernel_us) + launch_us * len(kernel_us)) / (fused_us + launch_us)


@dataclass(frozen=True)
class ProgramCount:
    programs: int
    last_program_lanes: int
    masked_lanes: int


def triton_programs(n: int, block: int) -> ProgramCount:
    """Programs a 1-D Triton launch needs: ceil(n / block); the last one is partly masked.

    >>> triton_programs(1_000_000, 1024)
    ProgramCount(programs=977, last_program_lanes=576, masked_lanes=448)
    """
    if n <= 0 or block <= 0:
        raise ValueError("n and block must be positive")
    programs = math.ceil(n / block)
    last = n - (programs - 1) * block
    return ProgramCount(programs, last, block - last)


@dataclass(frozen=True)
class Autotune:
    tuning_ms: float
    saved_ms: float
    break_even_calls: int
    worth_it: bool


def autotune_amortisation(configs: int, runs_per_config: int, ms_per_run: float,
                          saved_us_per_call: float, calls: int) -> Autotune:
    """Is autotuning worth it? Tuning costs configs x runs x time; it pays back per call.

    >>> a = autotune_amortisation(12, 20, 0.2, 5.0, 1_000_000); (a.tuning_ms, a.saved_ms, a.worth_it)
    (48.0, 5000.0, True)
    >>> autotune_amortisation(12, 20, 0.2, 5.0, 100).worth_it
    False
    """
    if min(configs, runs_per_config, calls) < 0 or ms_per_run < 0 or saved_us_per_call <= 0:
        raise ValueError("counts and times must be non-negative and the saving positive")
    tuning = configs * runs_per_config * ms_per_run
    saved = saved_us_per_call * calls / 1000.0
    return Autotune(tuning, saved, math.ceil(tuning * 1000.0 / saved_us_per_call), saved > tuning)

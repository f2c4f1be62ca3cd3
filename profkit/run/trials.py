"""Trials: fixes applied to the program and timed beside it (``profkit capture --try``).

The capture keeps its measurements in the trace's PROFKIT_META under ``trials``::

    {"format": "profkit-trials/1", "step_range": NAME, "max_iterations": N or null,
     "runs_per_trial": K, "interrupted": false, ["budget_s": S, "budget_spent": true,]
     "baseline": {"runs": [RUN, ...]},
     "trials": [{"switch": "tf32", "applied": true, "note": "...", "error": null,
                 "runs": [RUN, ...]}, ...]}
    RUN = {"seq": i, "iteration_ns": [period, ...], "seconds": s, "exit_code": c
           [, "alternation": {"k": K, "warm_blocks": 2, "blocks": [{"on": b, "iterations": n, "ns": t}, ...]}]
           [, "inner": [nested ranges each iteration opened, ...]]}

``seq`` is the run's place in the order the runs were made (the calibration runs first, then the
trials and the baselines taking turns, a baseline amid each round's trials: B T1 B T2 T1 B T2). A run's iteration time is the median of
its steady periods (profkit.run.iterations.steady_median). A trial's speedup is the median of the
baseline runs' iteration times over the median of its own runs'; its spread (``lo``-``hi``) pairs
each of its runs with the baseline run made nearest to it (the earlier one of two as near), so a
machine whose speed drifts between runs shows as a wide range rather than a wrong number (the
range is widened to hold the speedup itself where a median falls outside the pairs). A trial whose
switch did not apply has no speedup: its runs were the program unchanged, and they count as
baseline runs.

A trial whose switches can be turned off and on while the program runs alternated with the
program unchanged inside its own runs (profkit.capture.alternate: blocks of iterations, the
switches on, then off, ...). Its gain comes from its own blocks, not from other processes: each
block's iteration time (its wall time, the GPU drained at its end, over its iterations); for each
block with the switches on, the blocks off beside it (the mean of the one before and the one
after, which cancels a drift of the machine's speed) over it; the trial's speedup is the median of
those ratios over its runs, ``lo``-``hi`` their range; the first blocks (``warm_blocks``) are
warm-up, their extra time beyond a steady block's its ``warm_up_s``.

A trial must time the same work: where the runs count the nested ranges each iteration opens
(``inner``), a trial whose steady iterations open more than ``WORK_CHANGED`` more or fewer than the
program's unchanged (its blocks off, for a trial that alternated) changed the work of an iteration
(an LBFGS step that stopped after fewer evaluations under bf16 read 4.43x): it keeps its speedup,
said with that (``work_changed``), and is not a measured gain to rank by.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Optional

from profkit.run.iterations import steady_median, warm_up_count

FORMAT = "profkit-trials/1"
# Warm-up (the first iterations' time beyond steady ones) said beside a trial's gain from here on
WARM_UP_SHOWN_S = 1.0


@dataclass(frozen=True)
class TrialResult:
    """One trial's measurement against the baseline."""
    switch: str
    applied: bool
    note: str
    error: Optional[str]
    runs: int                       # the trial's runs that timed a steady iteration
    speedup: Optional[float]        # baseline iteration / trial iteration (medians of the runs)
    lo: Optional[float]             # the run-by-run pairs' range
    hi: Optional[float]
    iteration_ns: Optional[int]     # the trial's iteration (median of its runs)
    baseline_ns: Optional[int]      # the baseline's (median of its runs)
    warm_up_s: Optional[float]      # time its warm-up iterations took beyond steady ones (compiling;
                                    # the median over its runs)
    not_run: Optional[str] = None   # why it never ran (interrupted, or the --try-budget spent, before its turn)
    left_out: str = ""              # what of the program the switch did not reach (part of the fix measured)
    baseline_runs: int = 0          # the runs of the program unchanged it was timed against
    alternated: int = 0             # blocks with its switches on, each beside blocks without, in its own runs
    work: Optional[tuple[float, float]] = None  # (its, the program unchanged's) nested ranges an
                                                # iteration, where they differ (WORK_CHANGED)

    @property
    def work_changed(self) -> bool:
        return self.work is not None

    @property
    def failed(self) -> bool:
        """The program failed under the switch and no small edit of the program is known to
        make it run (``remedy``): it raised or exited non-zero (a timeout, or too few
        iterations for a steady time, says nothing of the fix). torch.compile of a model on
        complex tensors (InductorError KeyError 'complex64'), a double backward under
        aot_autograd, a Cholesky that bf16 left not positive-definite."""
        return bool(self.error) and not str(self.error).startswith(INCONCLUSIVE) and not self.remedy

    @property
    def remedy(self) -> str:
        """The edit that makes the program run under the fix, for a failure of a kind that has
        one (EDITS); empty otherwise."""
        err = str(self.error or "")
        return next((edit for marks, edit in EDITS if any(m in err for m in marks)), "")

    @property
    def measured(self) -> bool:
        """A gain to rank by: the switch applied, the runs finished, a speedup was timed, and its
        iterations did the work the program's do."""
        return self.applied and self.error is None and self.speedup is not None and not self.work_changed

    def as_dict(self) -> dict:
        r = lambda x: None if x is None else round(float(x), 3)  # noqa: E731
        return {"switch": self.switch, "speedup": r(self.speedup), "runs": self.runs,
                "lo": r(self.lo), "hi": r(self.hi), "applied": bool(self.applied),
                "error": self.error, "note": self.note,
                **({"remedy": self.remedy} if self.error and self.remedy else {}),
                "warm_up_s": None if self.warm_up_s is None else round(float(self.warm_up_s), 1),
                "baseline_runs": self.baseline_runs,
                **({"alternated": self.alternated} if self.alternated else {}),
                **({"work_changed": {"trial": round(self.work[0], 1), "baseline": round(self.work[1], 1)}}
                   if self.work else {}),
                **({"not_run": self.not_run} if self.not_run else {}),
                **({"left_out": self.left_out} if self.left_out else {})}

    def text(self) -> str:
        return trial_text(self.as_dict())


def trial_text(t: dict) -> str:
    """A trial as profkit says it (``TrialResult.as_dict()``, ``run.actions[].tried``,
    ``run.trials[]``): ``2.05x (2 runs, 1.92-2.19x)``, ``failed (OutOfMemoryError: ...)``,
    ``not applied (no DataLoader)``."""
    if t.get("error"):
        return f"failed ({t['error']})" + (f": {t['remedy']}" if t.get("remedy") else "")
    if t.get("not_run"):
        return f"not run ({t['not_run']})"
    if not t.get("applied"):
        return f"not applied ({t['note']})" if t.get("note") else "not applied"
    if t.get("speedup") is None:
        return "no steady iteration timed"
    runs = t.get("runs") or 0
    # One run has a range too where the baseline's runs disagree: it pairs with the nearest of
    # them (a MoE step's baselines 101.5 and 120.2 ms: one fused-AdamW run read 1.20-1.30x)
    lo, hi = t.get("lo"), t.get("hi")
    spread = (f", {lo:.2f}-{hi:.2f}x" if lo is not None and hi is not None
              and (runs > 1 or f"{lo:.2f}" != f"{hi:.2f}") else "")
    # compilation, autotuning: said apart from the step's time, where it is worth saying
    warm = f"; {t['warm_up_s']:.0f} s of warm-up" if (t.get("warm_up_s") or 0) >= WARM_UP_SHOWN_S else ""
    # the baseline runs beside the trials cut (an interrupted capture): one run unchanged, the
    # calibration run, made before every trial in another process whose host may have run at
    # another speed (a guided sampler: 10.3 ms a step there, 16.3 ms beside its fixes)
    alone = ("; against a single run of the program unchanged"
             if t.get("baseline_runs") == 1 and not t.get("alternated") else "")
    beside = (f"; {t['alternated']} blocks, each beside the program unchanged in the same run"
              if t.get("alternated") else "")
    work = t.get("work_changed")
    other = (f"; not the switch's speed alone: its iterations opened {work['trial']:g} nested ranges, the "
             f"program's unchanged {work['baseline']:g} (the switch changed an iteration's work), not ranked"
             if work else "")
    return f"{t['speedup']:.2f}x ({runs} run{'s' if runs != 1 else ''}{spread}{warm}{alone}{beside}{other})"


# Errors that say nothing of whether the fix runs the program (profkit.capture.trials' wording)
INCONCLUSIVE = ("timed out after", "too few iterations of")
# Failures a small edit of the program mends, by their message, and the edit: the fix runs once
# it is made (a gradient-accumulating ResNet step failed under reduce-overhead and ran 3.70x
# faster with its CUDA graph by hand)
EDITS = (
    (("accessing tensor output of CUDAGraphs that has been overwritten",),
     "reduce-overhead's CUDA graphs reuse their outputs' memory at the next call, and the program "
     "keeps outputs past it (gradients accumulated over micro-batches, results gathered across "
     "calls): clone what it keeps, or capture the step in a CUDA graph by hand (torch.cuda.graph)"),
    (("expected scalar type", "should be the same", "expected both inputs to have same dtype",
      "expected mat1 and mat2 to have the same dtype"),
     "the program mixes its own fp32 tensors with autocast's: cast them (or keep that op out of "
     "autocast)"),
)

# A trial whose iterations open this much more or fewer nested ranges than the program's unchanged
# did other work: an LBFGS step that stopped after fewer evaluations under bf16 read 4.43x
WORK_CHANGED = 0.10


def run_work(run: dict) -> Optional[float]:
    """The nested ranges a steady iteration of ``run`` opened (the median; ``inner``), or None."""
    inner = run.get("inner")
    if not inner:
        return None
    rest = inner[warm_up_count(len(inner)):] or inner
    return float(statistics.median(rest))


def _changed(trial: Optional[float], base: Optional[float]) -> Optional[tuple[float, float]]:
    if trial is None or base is None or max(trial, base) <= 0:
        return None
    return (trial, base) if abs(trial - base) > WORK_CHANGED * max(base, 1.0) else None


def alternated_gain(run: dict) -> Optional[dict]:
    """A run that alternated (``run["alternation"]``): {"speedup", "ratios", "on_ns", "off_ns",
    "warm_up_s", "work"} from its blocks (see the module docstring; ``work``: the nested ranges an
    iteration of its steady blocks on and off opened, where the run counted them), or None where it
    has none, or too few blocks past the warm-up to pair (one on, one off)."""
    got = _blocks(run)
    if got is None:
        return None
    blocks, warm = got
    inner = run.get("inner") or []
    # per timed block: (on, ns an iteration, its iterations, their nested ranges)
    per = [(on, ns / n, n, inner[at:at + n]) for on, ns, n, at in blocks if n and ns is not None]
    steady, first = per[warm:], per[:warm]
    ratios = []
    for i, (on, t, _, _) in enumerate(steady):
        if not on:
            continue
        off = [steady[j][1] for j in (i - 1, i + 1) if 0 <= j < len(steady) and not steady[j][0]]
        if off and t > 0:
            ratios.append(statistics.mean(off) / t)
    if not ratios:
        return None
    on_ns = statistics.median(t for on, t, _, _ in steady if on)
    off_ns = statistics.median(t for on, t, _, _ in steady if not on)
    warm_s = sum(max(t - (on_ns if on else off_ns), 0) * n for on, t, n, _ in first) / 1e9
    on_work = [c for on, _, _, cs in steady if on for c in cs]
    off_work = [c for on, _, _, cs in steady if not on for c in cs]
    work = ((float(statistics.median(on_work)), float(statistics.median(off_work)))
            if on_work and off_work else None)
    return {"speedup": statistics.median(ratios), "ratios": ratios, "on_ns": on_ns, "off_ns": off_ns,
            "warm_up_s": warm_s, "work": work}


def run_median(run: dict) -> Optional[int]:
    med, _ = steady_median(run.get("iteration_ns") or [])
    return med


def _warm_up_s(run: dict) -> Optional[float]:
    periods = run.get("iteration_ns") or []
    med = run_median(run)
    if med is None:
        return None
    warm = periods[:warm_up_count(len(periods))]
    return sum(max(p - med, 0) for p in warm) / 1e9


def parse(meta_text: Optional[str]) -> Optional[dict]:
    """A trace's PROFKIT_META ``trials`` as a dict, or None without it, or when it is not a
    profkit-trials/1 record."""
    if not meta_text:
        return None
    try:
        data = json.loads(meta_text)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def unapplied_runs(data: dict) -> list[dict]:
    """The runs of the trials whose switch did not apply, that ended cleanly: the program
    unchanged, made among the trials (a compiled ViT step's only baseline run was its
    calibration run, 30.3 ms, slowed by the op record; its two unapplied compile trials ran it in
    23.9 ms, and its fused AdamW trial had read 1.38x against 1.07x by hand). The trials count
    them as baseline runs, the step model as calibration runs."""
    return [r for t in data.get("trials") or [] if not t.get("applied") and not t.get("error")
            for r in t.get("runs", []) if not r.get("exit_code")]


def unchanged_blocks(data: dict) -> list[list[int]]:
    """For each run of an applied trial that alternated, the iterations (ns) of its blocks with the
    switch off past the warm-up blocks: the program unchanged, timed in the trial's own process
    beside it (a multi-task step: 27.4 and 29.0 ms an iteration off, its calibration run 31.4 ms,
    the profiled run 27.1 ms). The step model counts each such run as a calibration run."""
    out = []
    for t in data.get("trials") or []:
        if not t.get("applied") or t.get("error"):
            continue
        for r in t.get("runs", []):
            got = None if r.get("exit_code") else _blocks(r)
            if got is None:
                continue
            blocks, warm = got
            periods = r.get("iteration_ns") or []
            off = [p for i, (on, _, n, at) in enumerate(blocks) if i >= warm and not on
                   for p in periods[at:at + n] if p and p > 0]
            if off:
                out.append(off)
    return out


def _blocks(run: dict) -> Optional[tuple[list[tuple[bool, Optional[int], int, int]], int]]:
    """An alternated run's blocks as (on, ns, iterations, index of its first iteration in the run),
    in order, and how many of them are warm-up; None where the run did not alternate."""
    alt = run.get("alternation")
    if not isinstance(alt, dict):
        return None
    out, at = [], 0
    for b in alt.get("blocks") or []:
        n = int(b.get("iterations") or 0)
        out.append((bool(b.get("on")), b.get("ns"), n, at))
        at += n
    return out, int(alt.get("warm_blocks", 2))


def summarize(meta_text: Optional[str]) -> list[TrialResult]:
    """The trials of a trace's PROFKIT_META ``trials`` (empty without it, or when it is not a
    profkit-trials/1 record), in the order they were run."""
    data = parse(meta_text)
    if data is None:
        return []
    unchanged = (data.get("baseline") or {}).get("runs", []) + unapplied_runs(data)
    base = [(int(r.get("seq", -1)), m) for r in unchanged if (m := run_median(r)) is not None]
    base_ns = statistics.median(m for _, m in base) if base else None
    works = [w for r in unchanged if (w := run_work(r)) is not None]
    base_work = statistics.median(works) if works else None
    out = []
    for t in data.get("trials") or []:
        alt = [g for r in t.get("runs", []) if (g := alternated_gain(r)) is not None]
        if alt and t.get("applied"):
            out.append(_alternated(t, alt))
            continue
        runs = [(int(r.get("seq", -1)), m, r) for r in t.get("runs", []) if (m := run_median(r)) is not None]
        speedup = lo = hi = it = None
        if runs:
            it = statistics.median(m for _, m, _ in runs)
            if base_ns:
                speedup = base_ns / it
                # the range holds the speedup itself too: a median can fall outside the pairs
                pairs = [_nearest(base, seq) / m for seq, m, _ in runs] + [speedup]
                lo, hi = min(pairs), max(pairs)
        warm = [w for _, _, r in runs if (w := _warm_up_s(r)) is not None]
        if not t.get("applied"):
            # the program ran unchanged: its time is no measure of the switch
            speedup = lo = hi = None
        # never started: no run, no error, nothing the bootstrap said about it
        never = not (t.get("runs") or t.get("error") or t.get("note") or t.get("applied"))
        not_run = ("the trials were interrupted before it" if never and data.get("interrupted") else
                   f"the --try-budget of {data.get('budget_s'):g} s was spent before it"
                   if never and data.get("budget_spent") and isinstance(data.get("budget_s"), (int, float))
                   else None)
        mine = [w for _, _, r in runs if (w := run_work(r)) is not None]
        work = _changed(statistics.median(mine), base_work) if mine and t.get("applied") else None
        out.append(TrialResult(str(t.get("switch", "")), bool(t.get("applied")), str(t.get("note") or ""),
                               t.get("error") or None, len(runs), speedup, lo, hi,
                               None if it is None else int(it), None if base_ns is None else int(base_ns),
                               statistics.median(warm) if warm else None, not_run,
                               str(t.get("left_out") or ""), len(base), work=work))
    return out


def _alternated(t: dict, gains: list[dict]) -> TrialResult:
    """A trial timed against the program unchanged in its own runs (``alternated_gain`` of each)."""
    ratios = [x for g in gains for x in g["ratios"]]
    speedup = statistics.median(g["speedup"] for g in gains)
    works = [g["work"] for g in gains if g["work"] is not None]
    work = (_changed(statistics.median(w[0] for w in works), statistics.median(w[1] for w in works))
            if works else None)
    return TrialResult(str(t.get("switch", "")), True, str(t.get("note") or ""), t.get("error") or None,
                       len(gains), speedup, min(ratios + [speedup]), max(ratios + [speedup]),
                       int(statistics.median(g["on_ns"] for g in gains)),
                       int(statistics.median(g["off_ns"] for g in gains)),
                       statistics.median(g["warm_up_s"] for g in gains), None,
                       str(t.get("left_out") or ""), len(gains), len(ratios), work)


def _nearest(base: list[tuple[int, int]], seq: int) -> int:
    """The iteration time of the baseline run made nearest to run ``seq`` (the earlier of two)."""
    return min(base, key=lambda b: (abs(b[0] - seq), b[0]))[1]

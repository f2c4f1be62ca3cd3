"""``profkit capture --try``: each trial's switch applied to the script by the bootstrap and
timed without a profiler, the trials and the unchanged script taking turns.

After the calibration run(s) and the profiled run, for ``runs`` rounds: each trial once
(``python -m profkit.capture.bootstrap --try SWITCH --calibrate FILE [--max-iterations N --step
NAME] -- script.py args``), and the script unchanged once, amid the round's trials (after the
first half of them); with the calibration run first, that is B T1 B T2 T1 B T2 for two trials and
two rounds. A capture cut short (its time limit, Ctrl-C) then still has a run unchanged made among
its trials: one placed after them was the one lost, and the trials were timed against the
calibration run alone, in another process (a guided sampler's bf16 trial read 0.53x so, 0.74x
beside its baseline). A trial whose switch did not apply (no optimizer
was constructed, no DataLoader) or that failed (an exception, out of memory, a non-zero exit, the
time limit) is not run again; its one-line reason is kept and the capture goes on. The runs'
output is kept out of the terminal (one line per run is said instead); a failed run's last lines
go into its error. A trial whose switches can be turned off and on while the program runs
alternates with the program unchanged inside its own run (profkit.capture.alternate), twice the
iterations of the others; its gain comes from that run alone, and the baseline runs between the
trials are for the others and for the step model's calibration.

The record (profkit.run.trials has its format and arithmetic) is what this module returns: the
caller writes it into PROFKIT_META as ``trials``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from profkit.run.iterations import inner_counts, iteration_times, steady_median
from profkit.run.trials import FORMAT, alternated_gain

Say = Callable[[str], None]
KILL_GRACE_S = 5.0


@dataclass
class Run:
    """One unprofiled run's record (see profkit.run.trials)."""
    seq: int
    iteration_ns: list[int]
    seconds: float
    exit_code: Optional[int]
    error: Optional[str] = None
    trial: Optional[dict] = None
    cut: bool = False
    alternation: Optional[dict] = None   # the blocks of a run that alternated (profkit.capture.alternate)
    inner: Optional[list[int]] = None    # per iteration, the nested ranges it opened (its work)

    def as_dict(self) -> dict:
        return {"seq": self.seq, "iteration_ns": self.iteration_ns,
                "seconds": round(self.seconds, 3), "exit_code": self.exit_code,
                **({"cut": True} if self.cut else {}),
                **({"alternation": self.alternation} if self.alternation else {}),
                **({"inner": self.inner} if self.inner else {})}


@dataclass
class Plan:
    """What to run: the script, its trials, and how."""
    python: str
    script: Path
    args: Sequence[str]
    trials: Sequence[str]
    step: str
    runs: int = 2
    max_iterations: Optional[int] = None
    timeout_s: float = 600.0
    env: Optional[dict] = None
    workdir: Optional[Path] = None
    first_seq: int = 0
    baseline: list[Run] = field(default_factory=list)   # the calibration runs, already made
    budget_s: Optional[float] = None   # no trial run starts once the trials have taken this long
    alternate: bool = True   # a trial whose switches toggle alternates with the program unchanged in its runs


def alternates(trial: Optional[str]) -> bool:
    """Whether ``trial``'s runs alternate with the program unchanged (every switch of it can be
    turned off and on while the program runs: profkit.capture.alternate)."""
    if not trial:
        return False
    from profkit.capture.switches import Trial
    try:
        return Trial(trial).toggles
    except (KeyError, ValueError):
        return False


def bootstrap_command(plan: Plan, calib_file: Path, trial: Optional[str]) -> list[str]:
    """The run's command line. A trial that alternates (``alternates``) runs twice the iterations
    of the others, half of them the program unchanged, in blocks (``--alternate K``)."""
    from profkit.capture.alternate import block_iterations
    cmd = [plan.python, "-m", "profkit.capture.bootstrap"]
    alt = plan.alternate and alternates(trial)
    if trial:
        cmd += ["--try", trial]
    cmd += ["--calibrate", str(calib_file)]
    n = plan.max_iterations * (2 if alt else 1) if plan.max_iterations else None
    if n:
        cmd += ["--max-iterations", str(n)]
    if n or alt:
        cmd += ["--step", plan.step]
    if alt:
        cmd += ["--alternate", str(block_iterations(n))]
    return [*cmd, "--", str(plan.script), *plan.args]


def run_trials(plan: Plan, say: Say) -> tuple[dict, bool]:
    """Run the trials and the baselines in turn; (the ``trials`` record, interrupted)."""
    record_of = {t: {"switch": t, "applied": False, "note": "", "error": None, "runs": []}
                 for t in plan.trials}
    baseline = list(plan.baseline)
    seq = plan.first_seq
    total = plan.runs * (len(plan.trials) + 1)
    done = 0
    interrupted = spent = False
    label = ""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="profkit-try-", dir=plan.workdir) as tmp:
        try:
            for rnd in range(plan.runs):
                todo = [t for t in plan.trials if _again(record_of[t])]
                if not todo:
                    break
                ran = False
                half = (len(todo) + 1) // 2
                for name in [*todo[:half], None, *todo[half:]]:
                    if name is None and spent and not ran:
                        break   # no trial ran this round: no baseline beside them
                    # (the first run always starts: before it, the trials have taken nothing,
                    # whatever setting up their folder took)
                    if name is not None and (spent or plan.budget_s is not None and done
                                             and time.monotonic() - t0 >= plan.budget_s):
                        spent = True   # --try-budget: the run under way finished, none starts
                        continue
                    ran = ran or name is not None
                    done += 1
                    label = (f"[trial {done}/{total}] " + (f"--try {name}" if name else "baseline")
                             + f" (round {rnd + 1} of {plan.runs}, no profiler)")
                    run = _one_run(plan, Path(tmp), seq, name, label, say)
                    seq += 1
                    if name is None:
                        baseline.append(run)
                        continue
                    rec = record_of[name]
                    if run.trial is not None:
                        rec["applied"] = bool(run.trial.get("applied"))
                        rec["note"] = str(run.trial.get("note") or "")
                        if run.trial.get("left_out"):
                            rec["left_out"] = str(run.trial["left_out"])
                    if run.error:
                        rec["error"] = run.error
                    if run.iteration_ns:
                        rec["runs"].append(run.as_dict())
                if spent:
                    break
        except KeyboardInterrupt:
            # Ctrl-C: the trials stop, the trace keeps what they measured
            say(f"profkit: {label or 'trials'}: interrupted; the trials stop here")
            interrupted = True
    record = {"format": FORMAT, "step_range": plan.step, "max_iterations": plan.max_iterations,
              "runs_per_trial": plan.runs, "interrupted": interrupted,
              "baseline": {"runs": [r.as_dict() for r in baseline if r.iteration_ns]},
              "trials": list(record_of.values())}
    if plan.budget_s is not None:
        record["budget_s"], record["budget_spent"] = plan.budget_s, spent
        if spent:
            left = [t for t, r in record_of.items() if _again(r)]
            never = [t for t in left if not record_of[t]["runs"]]
            again = [t for t in left if record_of[t]["runs"]]
            say(f"profkit: --try-budget: {plan.budget_s:g} s spent after "
                f"{time.monotonic() - t0:.0f} s of trials; "
                + "; ".join([f"not run: {', '.join(never)}"] * bool(never)
                            + [f"not run again: {', '.join(again)}"] * bool(again)))
    return record, interrupted


def _again(rec: dict) -> bool:
    """Whether a trial is worth another run: not failed, and applied (or not run yet)."""
    if rec["error"]:
        return False
    return rec["applied"] or not rec["runs"] and not rec["note"]


def _one_run(plan: Plan, tmp: Path, seq: int, trial: Optional[str], label: str, say: Say) -> Run:
    calib = tmp / f"run{seq}.json"
    log = tmp / f"run{seq}.log"
    cmd = bootstrap_command(plan, calib, trial)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=plan.env, start_new_session=True)
        try:
            rc: Optional[int] = proc.wait(timeout=plan.timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc = None
        except KeyboardInterrupt:
            _stop(proc)
            raise
    seconds = time.monotonic() - t0
    data = _read_json(calib)
    trial_rec = data.get("trial") if data else None
    periods = iteration_times(data, plan.step) if data else []
    med, used = steady_median(periods)
    error = None
    if rc is None:
        error = f"timed out after {plan.timeout_s:.0f} s (--try-timeout)"
    elif data and data.get("error"):
        error = str(data["error"])
    elif rc != 0:
        error = (f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}") + _last_line(log)
    elif med is None and (trial_rec is None or trial_rec.get("applied")):
        error = (f"too few iterations of `{plan.step}` ({len(periods) + 1 if periods else 0}) for a "
                 "steady time: three or more are warm-up (raise --max-iterations)")
    alt = data.get("alternation") if data else None
    run = Run(seq, periods if med is not None else [], seconds, rc, error, trial_rec,
              bool(data and data.get("cut")), alt if isinstance(alt, dict) and alt.get("blocks") else None,
              inner_counts(data, plan.step) if data and med is not None else None)
    if error:
        say(f"profkit: {label}: {error} ({seconds:.1f} s)")
    elif trial_rec is not None and not trial_rec.get("applied"):
        say(f"profkit: {label}: not applied: {trial_rec.get('note') or 'nothing to change'} "
            f"({seconds:.1f} s)")
    elif run.alternation and (g := alternated_gain(run.as_dict())) is not None:
        say(f"profkit: {label}: alternated with the program unchanged in "
            f"{len(run.alternation['blocks'])} blocks: {g['on_ns'] / 1e6:.2f} ms an iteration with the "
            f"switch, {g['off_ns'] / 1e6:.2f} ms without ({g['speedup']:.2f}x), {seconds:.1f} s"
            + (f"; {trial_rec['note']}" if trial_rec and trial_rec.get("note") else ""))
    else:
        say(f"profkit: {label}: {used} steady iterations, {med / 1e6:.2f} ms each (median), "
            f"{seconds:.1f} s" + (f"; {trial_rec['note']}" if trial_rec and trial_rec.get("note") else ""))
    return run


def _stop(proc: subprocess.Popen) -> None:
    """End a run and everything it started (DataLoader workers, compile workers)."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _last_line(log: Path, limit: int = 200) -> str:
    """``: the last line the run printed``, or nothing."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(size - 8192, 0))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return ": " + (last if len(last) <= limit else last[: limit - 3] + "...")


def calibration_run(seq: int, text: Optional[str], seconds: float, step: str) -> Run:
    """A calibration run (made before the profiled one) as a baseline run of the trials."""
    data = None
    with contextlib.suppress(ValueError, TypeError):
        data = json.loads(text) if text else None
    periods = iteration_times(data, step) if isinstance(data, dict) else []
    med, _ = steady_median(periods)
    return Run(seq, periods if med is not None else [], seconds,
               data.get("exit_code") if isinstance(data, dict) else None,
               inner=inner_counts(data, step) if isinstance(data, dict) and med is not None else None)


"""What a switch is: a small patch of the user's program that ``profkit capture --try`` applies
through the bootstrap, and the record of what it touched.

A switch has three moments, each optional:

* ``prepare(trial, report)``: before the script starts (the process environment: an allocator
  setting must be in place before CUDA initialises);
* ``install(torch, trial, report)``: right after the script imports torch (an import hook, as the
  calibration's range hooks are installed: the script's start-up stays the same);
* ``finish(torch, trial, report)``: after the script ended, to say what the switch touched
  ("AdamW(fused=True) x1", "no DataLoader") and whether it applied at all.

A switch that can be turned off and on again while the program runs (a backend setting, a
wrapper's flag) says so with ``toggles`` and does it in ``toggle(torch, trial, on)``: its trial
can then alternate with the program unchanged inside one run (profkit.capture.alternate). One
that converts weights or builds the optimizer differently cannot. A setting the program may set
again itself says in ``holds(torch, trial)`` whether it still stands: the trial checks it after
``finish`` and, where it alternates, at the end of each block of iterations the switch was on for
(turned on again for the next such block, the program's own setting no longer shows at the end).

A switch never raises into the user's program for its own sake: a patch that cannot be made
leaves the program as it is and says so in its report (``applied`` False).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from profkit.model import Switch


@dataclass
class Report:
    """What one switch did in one run."""
    switch: Switch
    applied: bool = False
    notes: list[str] = field(default_factory=list)
    # what the switch did not reach that the program ran (the other modules a compile left
    # eager): the trial measured part of the fix, which ranks nothing below the model's price
    left_out: list[str] = field(default_factory=list)

    def note(self, text: str, applied: Optional[bool] = None) -> None:
        if text and text not in self.notes:
            self.notes.append(text)
        if applied is not None:
            self.applied = applied

    @property
    def text(self) -> str:
        return "; ".join(self.notes)


class Handler:
    """One switch's patch (see the module docstring); the defaults do nothing."""
    switch: Switch
    toggles = False

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        raise NotImplementedError(f"{self.switch.value} cannot be turned off while the program runs")

    def prepare(self, trial: Any, report: Report) -> None:
        pass

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        pass

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        pass

    def holds(self, torch: Any, trial: Any) -> Optional[str]:
        """None while the switch stands; else what the program did to it."""
        return None


class CallCounter(Handler):
    """A switch that stands in for a call of the program and counts the calls it took, kept in
    the trial's shared state under ``key``; its finish says how many (``done`` xN: applied) or
    that none came (``never``: not applied)."""
    key: str
    done: str
    never: str

    def calls(self, trial: Any) -> list[int]:
        """The count, one mutable cell the patched call adds to."""
        return trial.shared.setdefault(self.key, [0])

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        n = trial.shared.get(self.key, [0])[0]
        if n:
            report.note(f"{self.done} x{n}", applied=True)
        else:
            report.note(self.never, applied=False)


def count_params(n: int) -> str:
    """12,345,678 -> '12.3M'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)

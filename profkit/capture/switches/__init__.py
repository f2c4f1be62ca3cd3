"""The switches of ``profkit capture --try``: fixes applied to the user's program by profkit's
bootstrap, with no edit of the user's code, so that each can be timed beside the program as it is.

    python -m profkit.capture.bootstrap --try SWITCH[+SWITCH...] --calibrate FILE -- script.py args

One module per family, each switch a small patch (:mod:`profkit.capture.switches.base` says what a
switch is):

* :mod:`.backends`: ``tf32`` (matmul and cuDNN convolutions in TF32), ``cudnn_benchmark``;
* :mod:`.outermost`: ``bf16`` (autocast), ``channels_last``, ``compile`` and ``compile_graphs``
  (``torch.compile`` of the outermost module, default and ``mode="reduce-overhead"``),
  ``inference_mode`` (its calls under ``torch.inference_mode()``) and ``fp32`` (its float64
  weights and inputs in float32), all applied to the outermost module, found at run time;
* :mod:`.optim`: ``fused_optim`` (``fused=True`` for Adam, AdamW, SGD, Adagrad),
  ``freeze_unstepped`` (parameters whose gradients no optimizer steps stop requiring them);
* :mod:`.data`: ``workers`` (DataLoader worker processes, pinned memory), ``batched_fetch`` (a
  TensorDataset's batches read in one call);
* :mod:`.memory`: ``no_empty_cache``, ``expandable_segments``;
* :mod:`.debug`: ``no_anomaly`` (autograd's anomaly detection, a debugging mode, left off).

A trial is one switch or several joined by ``+`` (``channels_last+bf16``), applied together.
Where every switch of a trial can be turned off and on again while the program runs (``tf32``,
``cudnn_benchmark``, ``bf16``, ``inference_mode``, ``compile``, ``compile_graphs``,
``no_empty_cache``, ``fused_optim``), its run alternates with the program unchanged (``--alternate``:
profkit.capture.alternate).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from profkit.capture.switches.base import Handler, Report
from profkit.model import Switch, parse_trial

# Testing and other compilers: the backend `compile` and `compile_graphs` pass to torch.compile
# (default: Inductor; another backend takes no mode, so compile_graphs is then compile).
COMPILE_BACKEND_ENV = "PROFKIT_TRY_COMPILE_BACKEND"


def handler(switch: Switch) -> Handler:
    """The patch of ``switch``."""
    from profkit.capture.switches import backends, data, debug, memory, optim, outermost
    for family in (backends, data, debug, memory, optim, outermost):
        if switch in family.HANDLERS:
            return family.HANDLERS[switch]
    raise KeyError(switch)


class Trial:
    """The switches of one run: prepared before the script, installed when it imports torch,
    reported after it ends (``record``)."""

    def __init__(self, name: str, options: Optional[dict[str, Any]] = None) -> None:
        self.switches = parse_trial(name)
        self.name = "+".join(s.value for s in self.switches)
        self.options = dict(options if options is not None else
                            {"compile_backend": os.environ.get(COMPILE_BACKEND_ENV) or None})
        self.handlers = {s: handler(s) for s in self.switches}
        self.reports = {s: Report(s) for s in self.switches}
        self.shared: dict[str, Any] = {}   # state switches share (the outermost module's patch)
        # switches the program set back itself in the last block they were on for (alternating runs)
        self.undone: dict[Switch, str] = {}
        self.torch: Any = None
        self._undo: list = []

    def patch(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name`` to ``value``, to be put back by ``restore``."""
        old = getattr(owner, name)
        self._undo.append(lambda: setattr(owner, name, old))
        setattr(owner, name, value)

    def on_restore(self, undo) -> None:
        """Call ``undo`` in ``restore`` (a setting that is not an attribute)."""
        self._undo.append(undo)

    def restore(self) -> None:
        """Undo every patch, last first: the program as it was (for tests, and for callers that
        apply a trial in a process that goes on; the bootstrap's process simply ends)."""
        while self._undo:
            self._undo.pop()()

    @property
    def toggles(self) -> bool:
        """Whether every switch of the trial can be turned off and on again while the program
        runs (its runs can alternate with the program unchanged: profkit.capture.alternate)."""
        return all(h.toggles for h in self.handlers.values())

    def check_holds(self) -> None:
        """At the end of a block the switches were on for: which the program set back itself (a
        script that sets ``allow_tf32 = False`` every step). The last such block decides: a
        program that undoes a switch once, at its start, leaves the later blocks switched."""
        if self.torch is None:
            return
        for s, h in self.handlers.items():
            try:
                undone = h.holds(self.torch, self)
            except Exception:  # noqa: BLE001 - a check that cannot be made says nothing
                undone = None
            if undone:
                self.undone[s] = f"{undone} while it ran (its blocks with the switch ran without it)"
            else:
                self.undone.pop(s, None)

    def toggle(self, on: bool) -> None:
        """Every switch on, or off (the program as it is), between two iterations."""
        if self.torch is None:
            return
        for h in self.handlers.values():
            h.toggle(self.torch, self, on)

    def start(self) -> None:
        """Prepare the process and hook the import of torch (profkit.capture.calibrate.after_import)."""
        from profkit.capture.calibrate import after_import
        for s, h in self.handlers.items():
            self._guard(s, lambda h=h, s=s: h.prepare(self, self.reports[s]))
        after_import({"torch": self.install})

    def install(self, torch: Any) -> None:
        self.torch = torch
        for s, h in self.handlers.items():
            self._guard(s, lambda h=h, s=s: h.install(torch, self, self.reports[s]))

    def _guard(self, s: Switch, step) -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - a switch that cannot be made leaves the program be
            self.reports[s].note(f"could not be applied ({one_line(exc)})", applied=False)

    def _still_holds(self, h: Handler, report: Report) -> None:
        """At the run's end: a switch the script set back itself did not apply."""
        if report.applied and (undone := h.holds(self.torch, self)):
            report.note(undone, applied=False)

    def record(self) -> dict:
        """{"switch", "applied", "note"} (and "left_out" where a switch left part of the program
        as it was): whether every switch applied, and what each touched."""
        if self.torch is None and sys.modules.get("torch") is not None:
            self.torch = sys.modules["torch"]
        for s, h in self.handlers.items():
            if self.torch is None and not self.reports[s].notes:
                self.reports[s].note("the script never imported torch", applied=False)
            elif self.torch is not None:
                self._guard(s, lambda h=h, s=s: h.finish(self.torch, self, self.reports[s]))
                self._guard(s, lambda h=h, s=s: self._still_holds(h, self.reports[s]))
            if s in self.undone:
                self.reports[s].note(self.undone[s], applied=False)
        reps = list(self.reports.values())
        note = (reps[0].text if len(reps) == 1 else
                "; ".join(f"{r.switch.value}: {r.text}" for r in reps if r.text))
        out = {"switch": self.name, "applied": all(r.applied for r in reps), "note": note}
        left = [x for r in reps for x in r.left_out]
        return {**out, "left_out": "; ".join(left)} if left else out


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, at most ``limit`` characters."""
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0]}" if msg and msg[0].strip() else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."

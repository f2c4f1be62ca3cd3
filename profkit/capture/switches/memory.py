"""The caching allocator: ``no_empty_cache`` and ``expandable_segments``.

``no_empty_cache``: ``torch.cuda.empty_cache`` (and ``torch.cuda.memory.empty_cache``) become a
no-op that counts its calls, installed when the script imports torch, so that a later
``from torch.cuda import empty_cache`` gets the no-op too. The freed blocks stay in the cache: a
program that calls it to leave memory to another process keeps that memory.

``expandable_segments``: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` in the process's
environment before the script starts (the allocator reads it when CUDA initialises), added to the
options already there. An explicit ``expandable_segments`` setting in the environment is kept,
and the trial says so.
"""
from __future__ import annotations

import os
from typing import Any

from profkit.capture.switches.base import CallCounter, Handler, Report
from profkit.model import Switch

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


class NoEmptyCache(CallCounter):
    switch = Switch.NO_EMPTY_CACHE
    key, done, never = ("empty_cache_calls", "torch.cuda.empty_cache() skipped",
                        "torch.cuda.empty_cache() was never called")
    toggles = True

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        trial.shared["empty_cache_skipped"] = on

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        calls = self.calls(trial)
        real = torch.cuda.empty_cache

        def empty_cache() -> None:
            if not trial.shared.get("empty_cache_skipped", True):
                return real()   # switched off (an alternating trial's turn of the program unchanged)
            calls[0] += 1
        empty_cache.__doc__ = "profkit --try no_empty_cache: does nothing (the cache is kept)."
        trial.patch(torch.cuda, "empty_cache", empty_cache)
        memory = getattr(torch.cuda, "memory", None)
        if memory is not None and hasattr(memory, "empty_cache"):
            trial.patch(memory, "empty_cache", empty_cache)


class ExpandableSegments(Handler):
    switch = Switch.EXPANDABLE_SEGMENTS

    def prepare(self, trial: Any, report: Report) -> None:
        current = os.environ.get(ALLOC_CONF, "")
        opts = [o.strip() for o in current.replace(";", ",").split(",") if o.strip()]
        if any(o.split(":", 1)[0].strip() == "expandable_segments" for o in opts):
            report.note(f"{ALLOC_CONF} already sets expandable_segments ({current})", applied=False)
            return
        trial.on_restore(lambda: os.environ.__setitem__(ALLOC_CONF, current) if current
                         else os.environ.pop(ALLOC_CONF, None))
        os.environ[ALLOC_CONF] = ",".join([*opts, "expandable_segments:True"])
        report.note(f"{ALLOC_CONF}={os.environ[ALLOC_CONF]}", applied=True)

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        if not report.applied:
            return
        if not torch.cuda.is_initialized():
            report.note("CUDA was never used", applied=False)


HANDLERS = {Switch.NO_EMPTY_CACHE: NoEmptyCache(), Switch.EXPANDABLE_SEGMENTS: ExpandableSegments()}

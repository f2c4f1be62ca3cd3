"""``workers``: DataLoader batches made by worker processes, into pinned memory.

``torch.utils.data.DataLoader``'s constructor is wrapped when the script imports torch. Where the
program passed no ``num_workers`` or 0 (the default: batches made on the main thread), it gets
``min(8, usable CPUs)`` workers; where it passed no ``pin_memory``, ``pin_memory=True`` (with
CUDA available); with workers, ``persistent_workers=True`` and ``prefetch_factor=4`` where it
passed none (``prefetch_factor`` must be None without workers, and ``persistent_workers`` needs
them: they are set together). What the program passed otherwise is kept.

Workers start by fork on Linux: a dataset holding CUDA tensors fails in them, and that error ends
the trial. An IterableDataset that does not split its stream by ``get_worker_info()`` yields it
once per worker; the trial says so (the step's time still measures the loading).
"""
from __future__ import annotations

import inspect
import os
from typing import Any

from profkit.capture.switches.base import Handler, Report
from profkit.model import Switch

MAX_WORKERS = 8
PREFETCH = 4


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


class Workers(Handler):
    switch = Switch.WORKERS

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        state = trial.shared.setdefault("loaders", {"changed": [], "kept": [], "iterable": 0,
                                                    "refused": ""})
        cls = torch.utils.data.DataLoader
        orig = cls.__init__
        sig = inspect.signature(orig)
        workers = int(trial.options.get("workers") or default_workers())
        pin = bool(torch.cuda.is_available())

        def __init__(self, *args, **kwargs):  # noqa: N807
            if getattr(self, "_profkit_loader_seen", False):
                return orig(self, *args, **kwargs)
            object.__setattr__(self, "_profkit_loader_seen", True)
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError:
                return orig(self, *args, **kwargs)
            first = (tuple(bound.args), dict(bound.kwargs))
            given = bound.arguments
            changes = []
            if not given.get("num_workers"):
                given["num_workers"] = workers
                changes.append(f"num_workers 0 -> {workers}")
            if "pin_memory" not in given and pin:
                given["pin_memory"] = True
                changes.append("pin_memory")
            if given["num_workers"] > 0:
                if "persistent_workers" not in given:
                    given["persistent_workers"] = True
                    changes.append("persistent_workers")
                if given.get("prefetch_factor") is None:
                    given["prefetch_factor"] = PREFETCH
                    changes.append(f"prefetch_factor {PREFETCH}")
            if not changes:
                state["kept"].append(f"{given['num_workers']} workers")
                return orig(*first[0], **first[1])
            try:
                result = orig(*bound.args, **bound.kwargs)
            except (ValueError, TypeError, RuntimeError) as exc:
                from profkit.capture.switches import one_line
                state["refused"] = one_line(exc, 160)
                return orig(*first[0], **first[1])
            state["changed"].append(", ".join(changes))
            dataset = given.get("dataset")
            if isinstance(dataset, torch.utils.data.IterableDataset):
                state["iterable"] += 1
            return result
        __init__.__wrapped__ = orig  # type: ignore[attr-defined]
        trial.patch(cls, "__init__", __init__)

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        st = trial.shared.get("loaders")
        if st is None:
            return
        changed = st["changed"]
        parts = []
        if changed:
            same = len(set(changed)) == 1
            parts.append(f"DataLoader x{len(changed)}: " + (changed[0] if same else " | ".join(changed)))
        if st["kept"]:
            parts.append(f"DataLoader x{len(st['kept'])} left as it was ({', '.join(dict.fromkeys(st['kept']))})")
        if st["refused"]:
            parts.append(f"refused ({st['refused']})")
        if st["iterable"]:
            parts.append("an IterableDataset: each worker yields the stream unless it splits it "
                         "by get_worker_info()")
        report.note(", ".join(parts) if parts else "no DataLoader", applied=bool(changed))


HANDLERS = {Switch.WORKERS: Workers()}

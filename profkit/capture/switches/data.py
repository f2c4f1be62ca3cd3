"""``workers``: DataLoader batches made by worker processes, into pinned memory; ``batched_fetch``
(BatchedFetch, below): a TensorDataset's batches read in one call instead of row by row.

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
            bound = _first_bind(self, "_profkit_loader_seen", sig, args, kwargs)
            if bound is None:
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


class BatchedFetch(Handler):
    """``batched_fetch``: a DataLoader over a ``TensorDataset`` that reads each batch one row at a
    time (automatic batching: ``[dataset[i] for i in indices]``, then ``default_collate``) is
    made to read it in one call: its sampler wrapped in a ``BatchSampler`` of the same batch size
    and ``drop_last`` (a ``RandomSampler`` with the program's generator where it passed
    ``shuffle=True``), ``batch_size=None``, so that ``dataset[indices]`` gathers the rows of every
    tensor at once. The batches hold the same rows in the same order as a tuple of tensors.
    DataLoaders with a ``batch_sampler``, a ``collate_fn``, another dataset class, or no batch
    size are left as they were."""
    switch = Switch.BATCHED_FETCH

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        state = trial.shared.setdefault("batched", {"changed": 0, "kept": []})
        cls = torch.utils.data.DataLoader
        orig = cls.__init__
        sig = inspect.signature(orig)
        data = torch.utils.data

        def __init__(self, *args, **kwargs):  # noqa: N807
            bound = _first_bind(self, "_profkit_batched_seen", sig, args, kwargs)
            if bound is None:
                return orig(self, *args, **kwargs)
            given = dict(bound.arguments)
            given.pop("self", None)
            ds = given.get("dataset")
            why = _why_not_batched(torch, given)
            if why:
                state["kept"].append(why)
                return orig(self, *args, **kwargs)
            batch, drop = int(given.get("batch_size", 1)), bool(given.get("drop_last", False))
            sampler = given.pop("sampler", None)
            if sampler is None:
                sampler = (data.RandomSampler(ds, generator=given.get("generator"))
                           if given.pop("shuffle", False) else data.SequentialSampler(ds))
            given.pop("shuffle", None)
            given.update(sampler=data.BatchSampler(sampler, batch, drop), batch_size=None, drop_last=False)
            state["changed"] += 1
            return orig(self, **given)
        __init__.__wrapped__ = orig  # type: ignore[attr-defined]
        trial.patch(cls, "__init__", __init__)

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        st = trial.shared.get("batched")
        if st is None or not (st["changed"] or st["kept"]):
            report.note("no DataLoader", applied=False)
            return
        parts = [f"DataLoader x{st['changed']}: each batch read in one call (a BatchSampler as its sampler)"] \
            if st["changed"] else []
        parts += [f"DataLoader left as it was ({why})" for why in dict.fromkeys(st["kept"])]
        report.note(", ".join(parts), applied=bool(st["changed"]))


def _first_bind(obj: Any, flag: str, sig: inspect.Signature, args: tuple, kwargs: dict) -> Any:
    """The constructor call's arguments bound to its signature, the first time ``obj`` is
    constructed (a subclass's constructor calling its parent's goes straight through: None), or
    None where they do not bind (the constructor then says what is wrong with the call)."""
    if getattr(obj, flag, False):
        return None
    object.__setattr__(obj, flag, True)
    try:
        return sig.bind(obj, *args, **kwargs)
    except TypeError:
        return None


def _why_not_batched(torch: Any, given: dict) -> str:
    """Why a DataLoader's batches cannot be read in one call by this switch ('' if they can)."""
    from profkit.capture.loaders import tensor_rows
    ds = given.get("dataset")
    if not tensor_rows(torch, ds):
        return f"a {type(ds).__name__}, not a TensorDataset"
    if given.get("batch_sampler") is not None:
        return "a batch_sampler of its own"
    if given.get("collate_fn") is not None:
        return "a collate_fn of its own"
    if given.get("batch_size", 1) is None:
        return "batch_size=None: it reads what its sampler gives"
    return ""


HANDLERS = {Switch.WORKERS: Workers(), Switch.BATCHED_FETCH: BatchedFetch()}

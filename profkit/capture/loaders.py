"""The DataLoader fetches of the op record's iteration: how each batch is read from a map-style
dataset, and, where one call can read the same rows, what that call takes.

With automatic batching and no ``__getitems__``, a DataLoader reads a batch one row at a time
(``[dataset[i] for i in indices]``) and ``default_collate`` stacks the rows: an in-memory table
of 4,096-row batches took 28 ms a step that way on the host, 2.7 ms read a batch at a time
(a BatchSampler as the sampler, ``batch_size=None``; H100 machine, 2026-12-06). A trace shows the
loading's CPU time, not how it is spent; this shows it. Where the dataset is a
``TensorDataset`` (its ``__getitem__`` indexes every tensor, so a tensor of indices reads them
all at once) collated by torch's ``default_collate``, the same rows are also read with one gather
per tensor, after the program's own fetch (the program's first, whatever happens here), and that
time is kept beside the fetch's. A program's own ``collate_fn`` is never run again (it may count
or draw): such a fetch is noted, not timed.

Only the main process's fetches are seen (with workers, the fetch runs in them). Each fetch is
timed as it runs, its collate included (``fetch_ns``, under the record's dispatch mode, which
slows every indexing op); a TensorDataset's fetch is timed again row by row with its collate
(``row_ns``) and as one gather (``batched_ns``), both outside that mode.
"""
from __future__ import annotations

import time
from typing import Any, Optional


def watch(torch: Any, note: Any) -> Optional[Any]:
    """Wrap ``_MapDatasetFetcher.fetch`` so that each fetch, after it returned, is passed to
    ``note(fetcher, indices, ns)`` (which must not raise: the op record's hooks are guarded);
    returns the function that undoes it (None where torch has no such fetcher)."""
    try:
        from torch.utils.data._utils import fetch as fetch_mod
    except ImportError:
        return None
    cls = getattr(fetch_mod, "_MapDatasetFetcher", None)
    if cls is None:
        return None
    orig = cls.fetch

    def fetch(self, possibly_batched_index):
        t0 = time.perf_counter_ns()
        out = orig(self, possibly_batched_index)
        note(self, possibly_batched_index, time.perf_counter_ns() - t0)
        return out
    cls.fetch = fetch
    return lambda: setattr(cls, "fetch", orig)


BATCHED_REPEATS = 5   # calls of the one-call gather timed, the fastest kept


def entry(torch: Any, fetcher: Any, index: Any, ns: int) -> dict:
    """One fetch as the record keeps it."""
    ds = fetcher.dataset
    per_row = bool(fetcher.auto_collation) and not getattr(ds, "__getitems__", None)
    rows = len(index) if fetcher.auto_collation else 1
    out = {"dataset": type(ds).__name__, "rows": rows, "per_row": per_row, "fetch_ns": int(ns),
           "row_ns": None, "batched_ns": None}
    table = tensor_rows(torch, ds)
    if table:
        # the whole table's size: whether it could live on the GPU instead
        out["table_bytes"] = int(sum(t.numel() * t.element_size() for t in ds.tensors))
    # Only torch's own collate is run again: a program's collate_fn may count or draw
    if per_row and rows > 1 and table and fetcher.collate_fn is _default_collate():
        # Both timed again outside the record's dispatch mode, which the fetch ran under (a few
        # microseconds more per indexing op, thousands of them a batch); a TensorDataset's rows
        # are read without side effects.
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            t0 = time.perf_counter_ns()
            fetcher.collate_fn([ds[i] for i in index])
            row_ns = time.perf_counter_ns() - t0
            # The gather's first call in a process pays one-time costs (the intra-op thread pool
            # started, the output's pages faulted in: 9.5 ms against 0.2 ms for a 4,096-row batch
            # of a 1M x 64 table); it is cheap, so its best of a few calls is what a loop pays.
            batched_ns = []
            for _ in range(BATCHED_REPEATS):
                t1 = time.perf_counter_ns()
                idx = torch.as_tensor(list(index))
                [t[idx] for t in ds.tensors]
                batched_ns.append(time.perf_counter_ns() - t1)
        out["row_ns"], out["batched_ns"] = int(row_ns), int(min(batched_ns))
    return out


def _default_collate() -> Any:
    from torch.utils.data._utils.collate import default_collate
    return default_collate


def tensor_rows(torch: Any, ds: Any) -> bool:
    """A TensorDataset whose rows are read by its own __getitem__ (not a subclass's): indexed by
    a tensor of indices, it reads a whole batch in one call (the batched_fetch switch's test too)."""
    td = torch.utils.data.TensorDataset
    return isinstance(ds, td) and type(ds).__getitem__ is td.__getitem__


def summary(entries: list[dict]) -> list[dict]:
    """Per dataset class and batch size: the fetches, their median time, and the median times of
    the same rows read row by row and in one call (None where they cannot be read in one call)."""
    import statistics
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        groups.setdefault((e["dataset"], e["rows"], e["per_row"]), []).append(e)
    out = []
    for (name, rows, per_row), es in groups.items():
        timed = [e for e in es if e["batched_ns"] is not None]
        out.append({"dataset": name, "rows": rows, "per_row": per_row, "fetches": len(es),
                    "fetch_ns": int(statistics.median(e["fetch_ns"] for e in es)),
                    "row_ns": int(statistics.median(e["row_ns"] for e in timed)) if timed else None,
                    "batched_ns": int(statistics.median(e["batched_ns"] for e in timed)) if timed else None,
                    **({"table_bytes": max(e["table_bytes"] for e in es if "table_bytes" in e)}
                       if any("table_bytes" in e for e in es) else {})})
    return out

"""PK102 data-loading: the GPU waits while the main process loads and prepares batches.

What
    GPU idle time whose gaps fall inside a data-loading NVTX range (``data``, ``load``,
    ``batch``, ``fetch``, ...) or while the CPU is inside a memcpy call.
Why
    With ``DataLoader(num_workers=0)`` the main process decodes, augments and collates every
    batch while the GPU has nothing queued; pageable host memory makes each copy a CPU-staged
    synchronous transfer.
Evidence
    The step model's CPU time before each call that falls in a data-loading range; with no such
    range, the longest stretch of CPU time with no CUDA call in each iteration when it is at least
    ``min_gap_share`` of the iteration (a numpy augmentation in the training loop, tokenisation),
    outside the ranges nested in the step, or inside one when the stretch prepares the
    iteration's input: it comes before the iteration's first kernel, and host-to-device copies
    (the batch going to the GPU) follow it before that kernel. A tokenizer run in a range
    ``tokenize`` is loading by what it feeds, not by its name (a text-classification loop,
    cpu_tokenize_infer: the step after the fix priced 7.2 ms, pre-tokenised batches measured
    6.8 ms; the loop's own speed varies between runs, its baseline 25-40 ms). Pageable
    host-to-device copies (PK104) join the fix.
Fix
    A loader that reads a batch one row at a time: one call a batch (a ``BatchSampler`` as its
    sampler, ``batch_size=None``, a dataset indexed by a batch of indices), or the table kept on
    the GPU. Else ``DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2)``
    and ``batch.to(device, non_blocking=True)``; move heavy augmentation to the GPU. Loading told
    by what it feeds runs in the step's own code, in the ranges the action names (`tokenize`):
    the action says to move that work into a Dataset's ``__getitem__`` or ``collate_fn`` (where
    workers can run it) or to do it once before the loop (pre-tokenised batches measured 5.61x).
Expected gain
    Graph edit: the loading CPU time leaves the main process for ``workers`` processes that run
    beside it (``load_in_workers``): each batch is ready once the workers, sharing the loading,
    have produced it, so the step runs at the slower of the main process's own pace and the
    workers' (loading time / ``workers`` per batch); pageable copies become pinned and
    non-blocking. The step model replays the edited graph at the calibrated CPU scale. Measured
    on loader_cnn -> loader_cnn_workers (before the step model): predicted 12.3x, measured 11.5x.

    **A batch read one row at a time.** Where the capture's op record timed the DataLoader's own
    fetches (profkit.capture.loaders: a TensorDataset read with automatic batching, its rows
    indexed one by one and collated, timed again as one gather per tensor), the same loading is
    also priced read in one call: the loading's CPU time less what the timed fetches save
    (``scale_cpu``), pageable copies as they are. The better of the two leads the action; the
    other is its evidence (``batched_fetch_speedup``, ``workers_speedup``). An in-memory table of
    4,096-row batches (tabular_mlp_train, H100, 2026-12-06) measured 10.3x read a batch at a time
    and 3.6x with 4 workers, where this rule, without the fetch timing, offered only the workers
    (priced 4.90x for 8). A fetch that is not a TensorDataset's is not timed: the rule cannot say
    what one call would take. Where the record also holds the table's size and it takes a quarter
    of the GPU's memory or less, the table kept on the GPU is priced beside them
    (``gpu_resident_speedup``): the loading's CPU time and the pageable copies gone. It is said,
    not led with: no switch can move a program's table.
Trial
    ``profkit capture --try workers`` measures the workers' price: every DataLoader of the
    program given ``min(8, CPUs)`` workers where it had none, pinned memory, persistent workers
    and a prefetch factor of 4 where it passed none. Loading done outside a DataLoader (a numpy
    augmentation in the training loop, tokenisation) is untouched by it: the trial then says
    "no DataLoader" and the price stands unmeasured. ``--try batched_fetch`` measures the batch
    read in one call (a BatchSampler as the sampler of a TensorDataset's DataLoader,
    ``batch_size=None``); ``--try auto`` runs it only where the record timed such fetches.
References
    PyTorch ``torch.utils.data`` docs (multi-process loading, memory pinning);
    PyTorch performance tuning guide, "Enable async data loading and augmentation".
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, TrialOf, matches
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import load_in_workers, pin_copies, scale_cpu, scale_ops
from profkit.run.summary import DATA_RE

RULE = RuleMeta(
    code="PK102", name="data-loading",
    summary="the GPU idles while the main process loads batches: DataLoader workers, pinned memory",
    tables=(Table.NVTX, Table.RUNTIME, Table.KERNEL), example="traces/real/loader_cnn.sqlite.xz",
    quiet_on="traces/real/loader_cnn_workers.sqlite.xz",
    trials=(TrialOf("workers"), TrialOf("batched_fetch", "batched_fetch_speedup"),
            TrialOf("workers", "workers_speedup")),
    params=(Param("min_idle_share", 0.05, "loading CPU time, as a share of the iteration"),
            Param("min_gap_share", 0.25, "an unannotated gap with no CUDA call, as a share of the "
                                         "iteration, that counts as loading"),
            Param("workers", 8.0, "DataLoader worker processes the fix assumes")))


def loading_calls(g: StepGraph) -> tuple[np.ndarray, str, bool]:
    """The calls whose preceding CPU time is data loading, how they were found, and whether the
    CPU time after the window's last call (the batch after the window) is loading too."""
    data = matches(g.range_names, DATA_RE)
    in_data = data[g.c_gap_range]
    if in_data.any():
        return np.flatnonzero(in_data), "in data-loading ranges", bool(g.tail_range >= 0 and data[g.tail_range])
    # No such range: the longest gap of each iteration, outside the step's inner ranges.
    k = len(g.iter_call) - 1
    if k < 2 or not g.n_calls:
        return np.empty(0, dtype=np.int64), "", False
    periods = np.asarray(g.measured_periods, dtype=np.float64)
    med = float(np.median(periods))
    inner = {"(no range)"}  # between steps: outside every range (inside one, it is the step's own work)
    feeds = _feeds_a_batch(g)
    out, nested = [], set()
    for it in range(k):
        lo, hi = int(g.iter_call[it]), int(g.iter_call[it + 1])
        if hi <= lo:
            continue
        j = lo + int(np.argmax(g.c_gap[lo:hi]))
        if g.c_gap[j] < RULE.param("min_gap_share") * med:
            continue
        where = str(g.range_names[g.c_gap_range[j]])
        if where in inner:
            out.append(j)
        elif feeds(j, hi):
            out.append(j)
            nested.add(where)
    if len(out) < 0.5 * k:
        return np.empty(0, dtype=np.int64), "", False
    # The loop prepares each batch after the step before it: the last iteration's comes after the
    # window's last call.
    tail = g.tail_ns >= RULE.param("min_gap_share") * med and \
        g.tail_range >= 0 and str(g.range_names[g.tail_range]) in inner
    how = "with no CUDA call, outside the step's ranges"
    if nested:
        how = (f"with no CUDA call, before the host-to-device copies that start the iteration's GPU work, "
               f"in {', '.join(f'`{n}`' for n in sorted(nested))}")
    return np.asarray(out, dtype=np.int64), how, bool(tail)


def _feeds_a_batch(g: StepGraph):
    """``feeds(j, hi)``: whether the CPU time before call ``j`` prepares the iteration's input: it
    lies inside the iteration (its middle after the iteration's start: the host's work on the
    step before's results, numpy over copied logits, is that step's), no kernel was launched
    between the iteration's start and ``j``, and the calls from ``j`` on copy host data to the
    GPU before the iteration's first kernel. Work whose product is the batch's host-to-device
    copy is loading whatever the range around it is called (a tokenizer in ``tokenize``); CPU
    time after the first kernel (a loss computed in Python) is the step's own."""
    if not g.window.iteration_ns:
        return lambda j, hi: False
    begins = g.window.iteration_bounds_ns[:-1]
    placed = g.g_call >= 0
    kernel_call = np.zeros(g.n_calls + 1, dtype=bool)
    kernel_call[g.g_call[placed & (g.g_kind == 0)]] = True
    h2d = np.array(["Host-to-Device" in str(n) for n in g.op_names] + [False], dtype=bool)[g.g_name]
    h2d_call = np.zeros(g.n_calls + 1, dtype=bool)
    h2d_call[g.g_call[placed & (g.g_kind == 1) & h2d]] = True
    starts = np.asarray(g.iter_call, dtype=np.int64)

    def feeds(j: int, hi: int) -> bool:
        it = int(np.searchsorted(starts, j, side="right") - 1)
        lo = int(starts[it])
        if it >= len(begins) or g.c_start[j] - g.c_gap[j] / 2 < begins[it] or kernel_call[lo:j].any():
            return False
        later = np.flatnonzero(kernel_call[j:hi])
        first_kernel = j + int(later[0]) if len(later) else hi
        return bool(h2d_call[j:first_kernel].any())

    return feeds


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None:
        return []
    g = m.graph
    calls, how, tail = loading_calls(g)
    its = max(len(g.iter_call) - 1, 1)
    load_ns = (float(g.c_gap[calls].sum()) + (g.tail_ns if tail else 0.0)) * m.host / its if len(calls) else 0.0
    if load_ns <= RULE.param("min_idle_share") * m.iteration_ns:
        return []
    pageable = np.flatnonzero(g.g_host_paced & (g.g_call >= 0))
    w = RULE.param("workers")

    def edit(gr):
        out = load_in_workers(gr, calls, w, tail)
        return pin_copies(out, pageable, np.nan_to_num(gr.g_bytes[pageable])) if len(pageable) else out

    gain, basis = ctx.price(edit, f"loading {load_ns / 1e6:.2f} ms per iteration ({how}) / {w:.0f} "
                                  f"workers" + (f", {len(pageable) / its:.0f} pageable copies per "
                                                "iteration pinned" if len(pageable) else ""))
    fetch = row_fetches(ctx)
    batched = None
    if fetch is not None:
        saved = min(fetch["saved_ns"], load_ns)
        factor = 1.0 - saved / load_ns

        def one_call(gr):
            out = scale_cpu(gr, calls, factor, own=False)
            if tail:
                out.tail_ns = gr.tail_ns * factor
            return out
        batched = ctx.price(one_call, f"the loader's {fetch['fetches']} row-by-row fetch(es) per iteration "
                                      f"read in one call: loading {load_ns / 1e6:.2f} -> "
                                      f"{(load_ns - saved) / 1e6:.2f} ms per iteration ({fetch['text']})")
    ranges = sorted({g.range_names[int(g.c_gap_range[i])] for i in calls})
    # Name where the loading runs: a tokenizer or an augmentation in the step's own code is not
    # a DataLoader's to move until the user puts it in one (or does it once, before the loop).
    # (Told by what it feeds, not by a data-loading range's name: a DataLoader's own range is one.)
    named = [r for r in ranges if r and not r.startswith("(")] if how.startswith("with no CUDA call, before") else []
    where = (f" (the work in {', '.join(f'`{r}`' for r in named[:3])}: move it into a Dataset's "
             "__getitem__ or collate_fn, or do it once before the loop)" if named else "")
    ev = {"loading_ns_per_iteration": int(load_ns), "where": how, "data_ranges": ranges[:3],
          "pageable_copies": int(len(pageable))}
    workers_action = ("DataLoader num_workers > 0, pin_memory=True, .to(device, non_blocking=True), "
                      "prefetch")
    if batched is None:
        # no row-by-row fetch timed at capture: the batched_fetch trial has nothing to change
        ev["trials_refused"] = ["batched_fetch"]
        return [Finding(RULE.code, RULE.name, f"prepare batches off the critical path{where}: " + workers_action,
                        Rung.LIBRARY, ev, gain, basis, gain)]
    b_gain, b_basis = batched
    ev.update(batched_fetch_speedup=round(b_gain, 3), workers_speedup=round(gain, 3),
              fetch_rows=fetch["rows"], fetch_row_ns=fetch["row_ns"], fetch_batched_ns=fetch["batched_ns"])
    resident = _resident(ctx, fetch, calls, tail, pageable, load_ns)
    if resident is not None:
        ev["gpu_resident_speedup"] = round(resident[0], 3)
        ev["table_bytes"] = fetch["table_bytes"]
    kept = (f" ({resident[0]:.2f}x: the table, {fetch['table_bytes'] / 1e9:.2f} GB, fits the GPU's memory "
            "many times over)" if resident is not None else "")

    def read(price: str) -> str:
        return (f"the DataLoader reads each batch of {fetch['rows']} rows one at a time, then collates them "
                f"({fetch['text']}): give it a BatchSampler as its sampler and batch_size=None, with a dataset "
                f"indexed by a batch of indices (a TensorDataset is; {price}), or keep the table on the GPU "
                f"and gather each batch there{kept}")
    if b_gain >= gain:
        f = Finding(RULE.code, RULE.name, f"{read(f'{b_gain:.2f}x, the number below')}; else {workers_action} "
                    f"({gain:.2f}x)", Rung.LIBRARY, ev, b_gain, f"{TIMED_FETCH}; {b_basis}", b_gain)
        f.switch = "batched_fetch"
        return [f]
    return [Finding(RULE.code, RULE.name, f"prepare batches off the critical path{where}: {workers_action} "
                    f"(the number below); {read(f'{b_gain:.2f}x')}", Rung.LIBRARY, ev, gain, basis, gain)]


TIMED_FETCH = "timed at capture: the program's own rows read row by row and in one call"


# A table (PK104: weights streamed in) this share of the GPU's memory or less can stay there
# beside the model and its activations
RESIDENT_SHARE = 0.25


def _resident(ctx: RuleContext, fetch: dict, calls: np.ndarray, tail: bool, pageable: np.ndarray,
              load_ns: float) -> tuple[float, str] | None:
    """The price of the table kept on the GPU, each batch gathered there: the loading's CPU time
    and the pageable copies gone (the gather's few launches are not added); None where the record
    has no table size or the table would take more than RESIDENT_SHARE of the GPU's memory."""
    size, mem = fetch.get("table_bytes"), getattr(ctx.prof.full_trace.primary_gpu(), "total_memory", None)
    if not size or not mem or size > RESIDENT_SHARE * mem:
        return None
    g = ctx.model.graph

    def edit(gr: StepGraph) -> StepGraph:
        out = scale_cpu(gr, calls, 0.0, own=False)
        if tail:
            out.tail_ns = 0.0
        return scale_ops(out, pageable, float("inf"), drop_launches=True) if len(pageable) else out
    its = max(len(g.iter_call) - 1, 1)
    return ctx.price(edit, f"the table on the GPU ({size / 1e9:.2f} GB): loading {load_ns / 1e6:.2f} ms per "
                           f"iteration and {len(pageable) / its:.0f} pageable copies per iteration gone")


def row_fetches(ctx: RuleContext) -> dict | None:
    """The op record's row-by-row DataLoader fetches with a one-call time beside
    (profkit.capture.loaders): per iteration, the fetches and what reading each in one call saves
    (ns, without the profiler), with the words that say so; None without such a record."""
    rows = [r for r in ctx.replacements.recorded("loader")
            if r.get("per_row") and r.get("row_ns") and r.get("batched_ns") is not None]
    if not rows:
        return None
    r = max(rows, key=lambda r: r["fetches"] * (r["row_ns"] - r["batched_ns"]))
    saved = sum(x["fetches"] * max(x["row_ns"] - x["batched_ns"], 0) for x in rows)
    if saved <= 0:
        return None
    return {"fetches": int(sum(x["fetches"] for x in rows)), "rows": int(r["rows"]), "saved_ns": float(saved),
            "row_ns": int(r["row_ns"]), "batched_ns": int(r["batched_ns"]),
            "table_bytes": int(r["table_bytes"]) if isinstance(r.get("table_bytes"), int) else None,
            "text": f"{r['row_ns'] / 1e6:.2f} ms a batch row by row, {r['batched_ns'] / 1e6:.2f} ms in one call, "
                    f"timed at capture"}

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
    ``DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2)``
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
Trial
    ``profkit capture --try workers`` measures the finding's price: every DataLoader of the
    program given ``min(8, CPUs)`` workers where it had none, pinned memory, persistent workers
    and a prefetch factor of 4 where it passed none. Loading done outside a DataLoader (a numpy
    augmentation in the training loop, tokenisation) is untouched by it: the trial then says
    "no DataLoader" and the price stands unmeasured.
References
    PyTorch ``torch.utils.data`` docs (multi-process loading, memory pinning);
    PyTorch performance tuning guide, "Enable async data loading and augmentation".
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, TrialOf, matches
from profkit.run.step.graph import StepGraph
from profkit.run.step.transform import load_in_workers, pin_copies
from profkit.run.summary import DATA_RE

RULE = RuleMeta(
    code="PK102", name="data-loading",
    summary="the GPU idles while the main process loads batches: DataLoader workers, pinned memory",
    tables=(Table.NVTX, Table.RUNTIME, Table.KERNEL), example="traces/real/loader_cnn.sqlite.xz",
    quiet_on="traces/real/loader_cnn_workers.sqlite.xz",
    trials=(TrialOf("workers"),),
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
    ranges = sorted({g.range_names[int(g.c_gap_range[i])] for i in calls})
    # Name where the loading runs: a tokenizer or an augmentation in the step's own code is not
    # a DataLoader's to move until the user puts it in one (or does it once, before the loop).
    # (Told by what it feeds, not by a data-loading range's name: a DataLoader's own range is one.)
    named = [r for r in ranges if r and not r.startswith("(")] if how.startswith("with no CUDA call, before") else []
    where = (f" (the work in {', '.join(f'`{r}`' for r in named[:3])}: move it into a Dataset's "
             "__getitem__ or collate_fn, or do it once before the loop)" if named else "")
    return [Finding(RULE.code, RULE.name,
                    f"prepare batches off the critical path{where}: DataLoader num_workers > 0, "
                    "pin_memory=True, .to(device, non_blocking=True), prefetch", Rung.LIBRARY,
                    {"loading_ns_per_iteration": int(load_ns), "where": how, "data_ranges": ranges[:3],
                     "pageable_copies": int(len(pageable))}, gain, basis, gain)]

"""The trace container: what one export holds, loaded once and cached."""
from __future__ import annotations

import sqlite3
import re
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import Optional
from pathlib import Path

import numpy as np
import pandas as pd

from profkit.read.aten_record import RECORDER_COST_MARK
from profkit.read.intervals import busy_union
from profkit.errors import TraceError
from profkit.read.ncu import read_ncu_metrics
from profkit.read.peaks import GpuInfo
from profkit.read.nsys import ExportInfo, TraceReader, damaged
from profkit.read.runtime import RuntimeCalls

# What SQLite and pandas raise on a file that is broken below what the reader checks (pages
# that no longer decode, a schema that no longer parses).
READ_ERRORS = (sqlite3.Error, pd.errors.DatabaseError, UnicodeError)


def _damaged(path: str, exc: Exception) -> TraceError:
    return damaged(path, f"{exc.__class__.__name__}: {exc}")


ATTRIBUTIONS = ("process", "thread")
_ATEN_PREFIX = re.compile(r"aten::")


def _first_per_call(pid: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """The first row of each (process, correlation id), as drop_duplicates keeps it, found
    through one integer key where the ids allow (one hash instead of two and a join)."""
    pcode, uniq = pd.factorize(pid)
    lo, span = (int(corr.min()), int(corr.max()) - int(corr.min()) + 1) if len(corr) else (0, 1)
    if (len(uniq) or 1) * span < 2 ** 62:
        return ~pd.Series(pcode.astype(np.int64) * span + (corr - lo)).duplicated().to_numpy()
    return ~pd.DataFrame({"p": pcode, "c": corr}).duplicated().to_numpy()


class Trace:
    """One Nsight Systems export: GPU activities, NVTX ranges, GPU info, merged counters.

    ``attribution``: ``process`` (default) also gives GPU work launched from a helper thread
    (PyTorch's autograd engine, a loader thread) to the ranges open at that moment on the
    process's main thread; ``thread`` keeps Nsight Systems' own per-thread projection.
    ``ranges_now``: read the NVTX ranges in a thread while the activities are read, for a caller
    that will need them (else they are read on first use).
    """

    def __init__(self, path: str | Path, attribution: str = "process", ranges_now: bool = False) -> None:
        if attribution not in ATTRIBUTIONS:
            raise TraceError(f"unknown attribution {attribution!r}: use one of {', '.join(ATTRIBUTIONS)}")
        self.path = str(path)
        self.attribution = attribution
        self.unclosed_ranges = 0  # NVTX ranges that never closed (set when ranges are read)
        self._ranges_future: Optional[Future] = None
        self._reader = TraceReader(path)
        # Started once the file opened (a compressed trace is decompressed by then). SQLite
        # releases the GIL: on a second core this read costs no wall time.
        pool = ThreadPoolExecutor(max_workers=1) if ranges_now else None
        if pool is not None:
            self._ranges_future = pool.submit(self._read_ranges)
        read = False
        try:
            self.info: ExportInfo = self._reader.export_info()
            self.activities: pd.DataFrame = self._reader.activities()
            # The API table, read with the activities: later API-call questions select from it.
            self._runtime: Optional[RuntimeCalls] = self._reader.runtime
            self._kernel_starts: Optional[np.ndarray] = self._reader.kernel_starts
            self._one_per_call: Optional[bool] = self._reader.one_activity_per_call
            self.gpus: dict[int, GpuInfo] = self._reader.gpus()
            self.ncu: pd.DataFrame = read_ncu_metrics(self._reader.conn)
            read = True
        except READ_ERRORS as exc:
            raise _damaged(self.path, exc) from None
        finally:
            self._reader.close()
            if pool is not None:
                # On an error here, the ranges' thread must not outlive the call.
                pool.shutdown(wait=not read)

    @cached_property
    def ranges(self) -> pd.DataFrame:
        """NVTX ranges, read on first use (the kernel level never needs them), or as read with
        the activities (``ranges_now``)."""
        future, self._ranges_future = self._ranges_future, None
        ranges, self.unclosed_ranges = future.result() if future is not None else self._read_ranges()
        return ranges

    def _read_ranges(self) -> tuple[pd.DataFrame, int]:
        """The NVTX ranges and how many of them never closed."""
        reader = TraceReader(self.path)
        try:
            return reader.nvtx_ranges(), reader.unclosed_ranges
        except READ_ERRORS as exc:
            raise _damaged(self.path, exc) from None
        finally:
            reader.close()

    @cached_property
    def api_calls(self) -> pd.DataFrame:
        """CUDA API calls (all of them, not only launches), read on first use."""
        return self._in_window(self._read(lambda r: r.api_calls()))

    def api_calls_between(self, t0: int, t1: int) -> pd.DataFrame:
        """The CUDA API calls that start in [t0, t1] ns (all of them already read: filtered;
        else read for that stretch alone, so a long trace is not read whole for one window)."""
        if "api_calls" in self.__dict__:
            c = self.api_calls
            return c[(c["start"] >= t0) & (c["start"] <= t1)].reset_index(drop=True)
        cache = self.__dict__.setdefault("_api_between", {})
        if (t0, t1) not in cache:
            cache[(t0, t1)] = self._read(lambda r: r.api_calls(between=(t0, t1)))
        return cache[(t0, t1)]

    def kernel_shapes(self, t0: int, t1: int, min_ns: int = 0) -> pd.DataFrame:
        """The launch shapes (grid, block) of the kernels that start in [t0, t1] ns (those of
        ``min_ns`` or longer where given), read on first use for that stretch
        (TraceReader.kernel_shapes)."""
        cache = self.__dict__.setdefault("_kernel_shapes", {})
        if (t0, t1, min_ns) not in cache:
            cache[(t0, t1, min_ns)] = self._read(lambda r: r.kernel_shapes((t0, t1), min_ns))
        return cache[(t0, t1, min_ns)]

    def _in_window(self, calls: pd.DataFrame) -> pd.DataFrame:
        w = self.__dict__.get("_window_ns")
        if w is None:
            return calls
        return calls[(calls["start"] >= w[0]) & (calls["start"] <= w[1])].reset_index(drop=True)

    def api_calls_matching(self, pattern: "re.Pattern[str]") -> pd.DataFrame:
        """The API calls whose name ``pattern`` matches (read once per pattern; see api_calls)."""
        cache = self.__dict__.setdefault("_api_by_pattern", {})
        if pattern.pattern not in cache:
            if "api_calls" in self.__dict__:  # already read whole (or a window view): filter it
                c = self.api_calls
                from profkit.read.nsys import match_names
                cache[pattern.pattern] = c[match_names(c["name"], pattern)].reset_index(drop=True)
            else:
                ids = self._name_ids(pattern)
                cache[pattern.pattern] = self._in_window(self._read(lambda r: r.api_calls(ids)))
        return cache[pattern.pattern]

    @cached_property
    def launch_calls(self) -> pd.DataFrame:
        """The API calls that launched kernels (cudaLaunchKernel, cuLaunchKernelEx, a graph
        launch): start, end, globalTid, correlationId.

        Taken from the kernels' own launch calls (one row per correlation id and process), so a
        trace with a million launches is not read twice."""
        a = self.activities
        sel = (a["api_start"].notna() & (a["kind"] == "kernel")).to_numpy()
        pid = np.right_shift(a["globalPid"].to_numpy(np.int64)[sel], 24)
        corr = a["correlationId"].to_numpy(np.int64)[sel]
        # Every kernel its own call (as the reader found): nothing to drop.
        first = np.ones(len(corr), dtype=bool) if self.one_activity_per_call else _first_per_call(pid, corr)
        # One gather per column, in start order (a stable sort, as sort_values("start") does).
        rows = np.flatnonzero(sel)[first]
        start = a["api_start"].to_numpy()[rows].astype(np.int64)
        order = np.argsort(start, kind="stable")
        rows = rows[order]
        return pd.DataFrame({"start": start[order],
                             "end": a["api_end"].to_numpy()[rows].astype(np.int64),
                             "globalTid": a["globalTid"].to_numpy()[rows].astype(np.int64),
                             "correlationId": corr[first][order]}, copy=False)

    @cached_property
    def one_activity_per_call(self) -> bool:
        """Whether no two activities with a launch call share it (correlation id and process),
        as the reader found it when it joined them, else checked here."""
        known = getattr(self, "_one_per_call", None)
        if known is not None:
            return known
        a = self.activities
        linked = a["api_start"].notna().to_numpy()
        key = pd.DataFrame({"c": a["correlationId"].to_numpy(np.int64)[linked],
                            "p": np.right_shift(a["globalPid"].to_numpy(np.int64)[linked], 24)})
        return not key.duplicated().any()

    @cached_property
    def strings(self) -> dict[int, str]:
        """The export's string table (StringIds), read once."""
        return self._read(lambda r: r.strings())

    def _name_ids(self, pattern: "re.Pattern[str]") -> list[int]:
        # Ids of every string the pattern matches: API names are among them, and the runtime
        # table only holds API names, so no scan of it is needed to list them.
        return [int(i) for i, n in self.strings.items() if isinstance(n, str) and pattern.match(n)]

    def api_span(self, pid: Optional[int] = None) -> Optional[tuple[int, int]]:
        """First start and last end of the CUDA API calls (of process ``pid``)."""
        return self._read(lambda r: r.api_span(pid))

    def _read(self, fn):
        reader = TraceReader(self.path)
        reader.runtime = self._runtime
        reader.kernel_starts = self._kernel_starts
        if "strings" in self.__dict__:  # the string table, read once (not by every reader again)
            reader._strings = self.strings
        try:
            return fn(reader)
        except READ_ERRORS as exc:
            raise _damaged(self.path, exc) from None
        finally:
            reader.close()

    @cached_property
    def copy_kinds(self) -> pd.DataFrame:
        """Host memory kinds of the memcpys (pageable or pinned), read on first use."""
        reader = TraceReader(self.path)
        try:
            return reader.copy_memory_kinds()
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            raise TraceError(f"{self.path}: damaged or truncated export ({exc}); export the trace again") from None
        finally:
            reader.close()

    @cached_property
    def sync_streams(self) -> pd.DataFrame:
        """The stream each synchronising call was about (CUPTI synchronization records), read on
        first use: correlationId, pidkey, streamId, eventSyncId."""
        return self._read(lambda r: r.synchronization())

    @cached_property
    def event_records(self) -> pd.DataFrame:
        """Where each CUDA event was recorded (CUPTI's event records), read on first use:
        correlationId, pidkey, streamId, eventSyncId."""
        return self._read(lambda r: r.event_records())

    @cached_property
    def meta(self) -> dict[str, Optional[str]]:
        """profkit's own metadata (PROFKIT_META: the capture command, the calibration run, ...)."""
        return self._read(lambda r: r.profkit_meta())

    @cached_property
    def recorder_cost_ns(self) -> float:
        """The host time profkit's aten recorder added to each op it recorded, as it measured
        itself (an NVTX mark it leaves when it stops, profkit.read.aten_record.RECORDER_COST_MARK);
        0 in a trace it did not record."""
        marks = self._read(lambda r: r.nvtx_marks(RECORDER_COST_MARK))
        try:
            return float(marks[-1][len(RECORDER_COST_MARK):]) if marks else 0.0
        except ValueError:  # a mark of another version: no cost rather than a wrong one
            return 0.0

    @cached_property
    def total_gpu_time_ns(self) -> int:
        """Sum of the durations of every kernel, memcpy and memset in the trace."""
        return int((self.activities["end"] - self.activities["start"]).sum())

    @cached_property
    def gpu_busy_ns(self) -> int:
        """Union of all GPU activity intervals, per device, added up."""
        a = self.activities.sort_values(["deviceId", "start"], kind="stable")
        busy = busy_union(a["deviceId"].to_numpy(), a["start"].to_numpy(),
                                      a["end"].to_numpy())
        return int(busy.sum())

    @cached_property
    def gpu_span_ns(self) -> int:
        """From the first GPU activity's start to the last one's end."""
        return int(self.activities["end"].max() - self.activities["start"].min())

    @cached_property
    def linked_fraction(self) -> float:
        """Share of GPU activities whose launch call was found (needed for range attribution)."""
        return float(self.activities["api_start"].notna().mean())

    def primary_gpu(self) -> GpuInfo:
        """The GPU that ran the most GPU time (several devices: the busiest one)."""
        if not self.gpus:
            return GpuInfo()
        dur = (self.activities["end"] - self.activities["start"]).groupby(self.activities["deviceId"]).sum()
        for dev in dur.sort_values(ascending=False).index:
            if int(dev) in self.gpus:
                return self.gpus[int(dev)]
        return next(iter(self.gpus.values()))

    @cached_property
    def name_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """Activity names factorised once: (code per activity row, distinct names).

        Million-row traces hold a few hundred kernel names; matching and grouping by code
        instead of by string saves a factorisation per use."""
        coded = self.activities.attrs.get("name_codes")
        if coded is not None and len(coded[0]) == len(self.activities):
            return coded  # made by the reader from the names' integer keys
        codes, uniq = pd.factorize(self.activities["name"])
        return codes, np.asarray(uniq, dtype=object)

    def windowed(self, start_ns: int, end_ns: int) -> "Trace":
        """A view of the same export holding only what the window [start_ns, end_ns] ran.

        GPU work belongs to the window when its launch call does (the CPU runs ahead of the
        GPU, so a step's kernels may finish after its range closes); work with no launch call
        goes by its GPU start. Ranges and API calls go by their start.
        """
        view = object.__new__(Trace)
        view.path, view.attribution, view.info, view.gpus, view.ncu, view._runtime = (
            self.path, self.attribution, self.info, self.gpus, self.ncu, self._runtime)
        view._kernel_starts = self._kernel_starts
        # A window's activities are some of the trace's: no two of them share a call either.
        view._one_per_call = self._one_per_call if self._one_per_call else None
        view._ranges_future = None
        if "strings" in self.__dict__:
            view.__dict__["strings"] = self.strings
        a = self.activities
        t = a["api_start"].where(a["api_start"].notna(), a["start"])
        keep = ((t >= start_ns) & (t <= end_ns)).to_numpy()
        codes, uniq = self.name_codes
        rows = np.flatnonzero(keep)
        if len(rows) and rows[-1] - rows[0] + 1 == len(rows):
            # One stretch of rows (as a window of a long trace mostly is): a slice, which shares
            # the trace's arrays instead of copying a million rows.
            view.activities = a.iloc[rows[0]:rows[-1] + 1].reset_index(drop=True)
            view.__dict__["name_codes"] = (codes[rows[0]:rows[-1] + 1], uniq)
        else:
            view.activities = a[keep].reset_index(drop=True)
            view.__dict__["name_codes"] = (codes[keep], uniq)
        if view.activities.empty:
            raise TraceError(f"{self.path}: no GPU activity in the window {start_ns / 1e9:.3f}-"
                             f"{end_ns / 1e9:.3f} s; choose another --window (or --window all)")
        r = self.ranges
        view.unclosed_ranges = self.unclosed_ranges
        in_window = ((r["start"] >= start_ns) & (r["start"] <= end_ns)).to_numpy()
        view.__dict__["ranges"] = r[in_window].reset_index(drop=True)
        if "_aten_mask" in self.__dict__:  # names already matched: the view's are a subset
            view.__dict__["_aten_mask"] = pd.Series(self._aten_mask.to_numpy()[in_window])
        if "range_name_codes" in self.__dict__:  # likewise their codes (some names may be absent)
            codes, uniq = self.range_name_codes
            view.__dict__["range_name_codes"] = (codes[in_window], uniq)
        # API calls are read for the view on demand (rules); the run summary reads the full trace.
        view.__dict__["_window_ns"] = (start_ns, end_ns)
        return view

    @cached_property
    def user_ranges(self) -> pd.DataFrame:
        """NVTX ranges that are not emit_nvtx's aten:: ranges."""
        return self.ranges[~self._aten_mask]

    @cached_property
    def _aten_mask(self) -> pd.Series:
        from profkit.read.nsys import match_names
        return pd.Series(match_names(self.range_codes_of(self.ranges), _ATEN_PREFIX), index=self.ranges.index)

    @cached_property
    def range_name_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """NVTX range names factorised once: (code per row of ``ranges``, distinct names).

        A long trace holds 10^5 ranges and more under a few dozen names, and the window search,
        the run summary and the step graph each match or group them by name: through these
        codes, once per distinct name instead of once per range."""
        codes, uniq = pd.factorize(self.ranges["name"])
        return codes, np.asarray(uniq, dtype=object)

    def ranges_named(self, name: str) -> np.ndarray:
        """Mask over ``ranges``: the rows whose name is ``name`` (through range_name_codes)."""
        codes, uniq = self.range_name_codes
        return np.isin(codes, np.flatnonzero(uniq == name))

    def range_codes_of(self, ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(code per row, distinct names) of ``ranges``, rows of ``self.ranges`` that kept its
        index labels (a filter, a sort: user_ranges, ranges_of_level), from range_name_codes;
        a frame indexed otherwise is factorised on its own."""
        index, labels = self.ranges.index, ranges.index
        if (isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1 and len(labels)
                and pd.api.types.is_integer_dtype(labels) and labels.min() >= 0 and labels.max() < len(index)):
            codes, uniq = self.range_name_codes
            return codes[labels.to_numpy(np.int64)], uniq
        codes, uniq = pd.factorize(ranges["name"])
        return codes, np.asarray(uniq, dtype=object)

    def ranges_of_level(self, level: str) -> pd.DataFrame:
        mask = self._aten_mask
        return self.ranges[mask] if level == "aten" else self.ranges[~mask]

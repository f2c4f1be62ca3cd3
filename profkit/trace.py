"""The trace container: what one export holds, loaded once and cached."""
from __future__ import annotations

import sqlite3
from functools import cached_property
from pathlib import Path

import pandas as pd

from profkit import attribution
from profkit.errors import TraceError
from profkit.ncu import read_ncu_metrics
from profkit.peaks import GpuInfo
from profkit.reader import ExportInfo, TraceReader, damaged

# What SQLite and pandas raise on a file that is broken below what the reader checks (pages
# that no longer decode, a schema that no longer parses).
READ_ERRORS = (sqlite3.Error, pd.errors.DatabaseError, UnicodeError)


def _damaged(path: str, exc: Exception) -> TraceError:
    return damaged(path, f"{exc.__class__.__name__}: {exc}")


class Trace:
    """One Nsight Systems export: GPU activities, NVTX ranges, GPU info, merged counters."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.unclosed_ranges = 0  # NVTX ranges that never closed (set when ranges are read)
        self._reader = TraceReader(path)
        try:
            self.info: ExportInfo = self._reader.export_info()
            self.activities: pd.DataFrame = self._reader.activities()
            self.gpus: dict[int, GpuInfo] = self._reader.gpus()
            self.ncu: pd.DataFrame = read_ncu_metrics(self._reader.conn)
        except READ_ERRORS as exc:
            raise _damaged(self.path, exc) from None
        finally:
            self._reader.close()

    @cached_property
    def ranges(self) -> pd.DataFrame:
        """NVTX ranges, read on first use (the kernel level never needs them)."""
        reader = TraceReader(self.path)
        try:
            ranges = reader.nvtx_ranges()
            self.unclosed_ranges = reader.unclosed_ranges
            return ranges
        except READ_ERRORS as exc:
            raise _damaged(self.path, exc) from None
        finally:
            reader.close()

    @cached_property
    def api_calls(self) -> pd.DataFrame:
        """CUDA API calls (all of them, not only launches), read on first use."""
        reader = TraceReader(self.path)
        try:
            return reader.api_calls()
        except READ_ERRORS as exc:
            raise _damaged(self.path, exc) from None
        finally:
            reader.close()

    @cached_property
    def total_gpu_time_ns(self) -> int:
        """Sum of the durations of every kernel, memcpy and memset in the trace."""
        return int((self.activities["end"] - self.activities["start"]).sum())

    @cached_property
    def gpu_busy_ns(self) -> int:
        """Union of all GPU activity intervals, per device, added up."""
        a = self.activities.sort_values(["deviceId", "start"], kind="stable")
        busy = attribution.busy_union(a["deviceId"].to_numpy(), a["start"].to_numpy(),
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
    def _aten_mask(self) -> pd.Series:
        return self.ranges["name"].str.startswith("aten::").astype(bool)

    def ranges_of_level(self, level: str) -> pd.DataFrame:
        mask = self._aten_mask
        return self.ranges[mask] if level == "aten" else self.ranges[~mask]

    def pairs(self, level: str, innermost: bool = False) -> pd.DataFrame:
        """(range_idx, act_idx) membership for `range` or `aten` ranges."""
        key = (level, innermost)
        cache = self.__dict__.setdefault("_pairs", {})
        if key not in cache:
            ranges = self.ranges_of_level(level)
            pairs = attribution.range_activity_pairs(ranges, self.activities)
            if innermost:
                pairs = attribution.innermost_only(pairs, self.ranges)
            cache[key] = pairs
        return cache[key]

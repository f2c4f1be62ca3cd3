"""What the op table's judge reads of each op, gathered from the window's activities by position:
its names, ncu rows, kernel durations and element type (numpy on an op's positions rather than a
pandas frame per op: an aten table has thousands of ops), its activities as a frame when a source
asks for one, and what the shape model needs beside its shapes."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from profkit.judge import evidence as ev
from profkit.judge.dtypes import recorded_dtype


def shape_inputs(kernels: "Kernels", idx: np.ndarray, knames: list[str],
                  record) -> tuple[ev.OpDtype, Optional[bool]]:
    """What the shape model needs beside an op's shapes: its element type (the recorder's
    record first, else its own kernels) and whether its attention is causal (None: unknown)."""
    recorded = recorded_dtype(record) if record is not None else None
    dtype = recorded or kernels.dtype(idx)
    causal = (record.causal if record is not None and record.causal is not None
              else ev.attention_causal(knames))
    return dtype, causal


class Members:
    """An op's activities (rows ``idx`` of ``acts``) as a frame, taken on first use."""

    def __init__(self, acts: pd.DataFrame, idx: np.ndarray) -> None:
        self.acts, self.idx, self.frame = acts, idx, None

    def __call__(self) -> pd.DataFrame:
        if self.frame is None:
            self.frame = self.acts.take(self.idx)
        return self.frame


class Kernels:
    """The window's kernels as arrays, for the per-op questions of the op table (numpy on an
    op's activity positions instead of a pandas frame per op: an aten table has thousands)."""

    def __init__(self, acts: pd.DataFrame, ncu: pd.DataFrame,
                 name_codes: tuple[np.ndarray, np.ndarray]) -> None:
        self.is_kernel = (acts["kind"] == "kernel").to_numpy()
        # every kernel's ncu rows, matched once (evidence.match_ncu), by activity position
        self.ncu = (ev.match_ncu(acts[self.is_kernel].assign(_act=np.flatnonzero(self.is_kernel)), ncu)
                    if not ncu.empty else None)
        self._ncu_act = None if self.ncu is None else self.ncu["_act"].to_numpy()
        self.dur = (acts["end"] - acts["start"]).to_numpy(dtype="float64")
        # The trace's names coded once (Trace.name_codes; a window's view may not hold all of
        # them), renumbered in name order, as a groupby by name sorts them.
        codes, names = name_codes
        names = np.asarray(names, dtype=object)
        order = np.argsort(names.astype(str), kind="stable")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        self.code = rank[codes]
        self.names = names[order]

    def names_in(self, idx: np.ndarray) -> list:
        """The distinct names of the activities ``idx`` (kernels, copies and memsets), in the
        order they first come (through their codes: an op can hold a million activities)."""
        return self.names[pd.unique(self.code[idx])].tolist()

    def ncu_rows(self, idx: np.ndarray) -> Optional[pd.DataFrame]:
        """``evidence.match_ncu`` of the kernels among the activities ``idx``, in ``idx`` order."""
        if self.ncu is None:
            return None
        pos = np.flatnonzero(np.isin(self._ncu_act, idx))
        if len(pos) and np.any(np.diff(idx) < 0):  # members out of trace order: follow idx
            sorter = np.argsort(idx, kind="stable")
            at = sorter[np.searchsorted(idx, self._ncu_act[pos], sorter=sorter)]
            pos = pos[np.argsort(at, kind="stable")]
        return self.ncu.iloc[pos]

    def durations(self, idx: np.ndarray) -> np.ndarray:
        """GPU time of each kernel among the activities ``idx``."""
        return self.dur[idx[self.is_kernel[idx]]]

    def dtype(self, idx: np.ndarray) -> ev.OpDtype:
        """The op's element type from its kernels, weighted by their GPU time."""
        k = idx[self.is_kernel[idx]]
        if not len(k):
            return ev.op_dtype([])
        # Per name code through bincount (codes are dense): no sort of the op's kernels.
        code = self.code[k]
        present = np.flatnonzero(np.bincount(code, minlength=len(self.names)))
        t = np.bincount(code, weights=self.dur[k], minlength=len(self.names))[present]
        return ev.op_dtype(self.names[present].tolist(), t.tolist())

"""Grids too small for the GPU: long kernels launched on a few blocks, so that most SMs sit idle
and neither roof sets their time (latency-bound, in Nsight Compute's words). The op table's
verdict and PK307's finding read the same kernels."""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.run.step.fusion import LIBRARY_RE

MIN_KERNEL_NS = 100_000   # each kernel at least this long: a short one on few blocks costs little
MAX_GRID_SHARE = 0.125    # blocks at most this share of the SMs
FLOOR_NS = 5_000          # no kernel priced shorter than this when spread over the GPU
MIN_OP_SHARE = 0.5        # an op is latency-bound when such kernels hold this share of its kernel time


def grids_of(shapes: pd.DataFrame, starts: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """The blocks each kernel (``starts``, ``corr``: its start and correlation id, the key of a row
    of the trace's kernel table) was launched with, from ``shapes`` (Trace.kernel_shapes); -1
    where ``shapes`` does not hold it."""
    shapes = shapes.drop_duplicates(["start", "correlationId"])  # one row a kernel, as exports write
    key = pd.MultiIndex.from_arrays([shapes["start"].to_numpy(np.int64), shapes["correlationId"].to_numpy(np.int64)])
    at = key.get_indexer(pd.MultiIndex.from_arrays([np.asarray(starts, dtype=np.int64),
                                                    np.asarray(corr, dtype=np.int64)]))
    return np.where(at >= 0, shapes["grid"].to_numpy(np.int64)[np.maximum(at, 0)], -1)


def few_blocks(grid: np.ndarray, sm_count: int, share: float = MAX_GRID_SHARE) -> np.ndarray:
    """Per kernel of ``grid`` (its blocks, -1 where unknown): launched on at most ``share`` of the
    ``sm_count`` SMs."""
    return (grid > 0) & (grid <= share * sm_count)


def spread_ns(dur: np.ndarray, blocks: np.ndarray, sm_count: int, floor_ns: float = FLOOR_NS) -> np.ndarray:
    """What each kernel would take if every SM did what its ``blocks`` did, never under ``floor_ns``."""
    return np.maximum(dur * blocks / sm_count, floor_ns)


def small_grids(acts: pd.DataFrame, shapes: pd.DataFrame, sm_count: int) -> pd.Series:
    """The blocks of each kernel of ``acts`` (the window's activities) that runs MIN_KERNEL_NS or
    longer on at most MAX_GRID_SHARE of the ``sm_count`` SMs, by activity index; ``shapes``: the
    trace's launch shapes of those long kernels (Trace.kernel_shapes). A library's kernel on a
    small grid is its own choice (NCCL's channels, a split GEMM): left out."""
    if not sm_count or shapes.empty:
        return pd.Series(dtype="int64")
    long = acts[(acts["kind"] == "kernel") & ((acts["end"] - acts["start"]) >= MIN_KERNEL_NS)]
    if long.empty:
        return pd.Series(dtype="int64")
    grid = grids_of(shapes, long["start"].to_numpy(), long["correlationId"].to_numpy())
    names = long["name"].astype(str)
    library = names.map({n: bool(LIBRARY_RE.search(n)) for n in names.unique()}).to_numpy(bool)
    few = few_blocks(grid, sm_count) & ~library
    return pd.Series(grid[few], index=long.index[few], dtype="int64")


def op_small_grid(idx: np.ndarray, acts: pd.DataFrame, grids: pd.Series, sm_count: int) -> dict:
    """For one op (``idx``: its activities' indices): the share of its kernel time in kernels of
    ``grids`` (small_grids), their median blocks, their time and their time as if every SM did
    what their blocks did (never under FLOOR_NS a kernel). Empty when it has none."""
    if grids.empty or not len(idx):
        return {}
    idx = np.unique(idx)
    mine = grids.index.intersection(pd.Index(idx))
    if not len(mine):
        return {}
    rows = acts.loc[idx]
    kernel_ns = float((rows["end"] - rows["start"])[rows["kind"] == "kernel"].sum())
    dur = (acts.loc[mine, "end"] - acts.loc[mine, "start"]).to_numpy(np.float64)
    blocks = grids.loc[mine].to_numpy(np.float64)
    small = float(dur.sum())
    return {"small_grid_share": small / kernel_ns if kernel_ns > 0 else 0.0,
            "small_grid_blocks": int(np.median(blocks)), "small_grid_ns": small,
            "small_grid_full_ns": float(spread_ns(dur, blocks, sm_count).sum()),
            "kernel_ns": kernel_ns, "sm_count": int(sm_count)}


def op_speedup(stats: dict) -> float:
    """The op's kernel time over its kernel time with its small-grid kernels spread over the GPU."""
    new = stats["kernel_ns"] - stats["small_grid_ns"] + stats["small_grid_full_ns"]
    return stats["kernel_ns"] / new if new > 0 else 1.0

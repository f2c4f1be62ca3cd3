"""Aten shapes borrowed from another capture of the same program.

A ``--aten`` capture knows each kernel's aten op and its input sizes, but the recorder slows the
host, so its timing is not the program's; a plain capture has the timing and no shapes. The same
program launches the same kernels with the same launch shapes in both: a kernel's name, grid and
block size (its *signature*) tie it to the aten op that launched it in the ``--aten`` capture,
wherever only one op launched it there. Used by ``Profile(shapes_from=...)`` and
``classify --shapes-from``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.errors import ProfkitError
from profkit.read.trace import Trace
from profkit.run.ops import group_ops


def signatures(full: Trace, acts: pd.DataFrame) -> pd.Series:
    """(name, grid, block) of each kernel of ``acts`` (activities of ``full`` or a window of it),
    indexed like ``acts``; kernels whose launch shape the export lacks are left out."""
    k = acts[(acts["kind"] == "kernel").to_numpy()]
    if k.empty:
        return pd.Series(dtype=object)
    shp = full.kernel_shapes(int(k["start"].min()), int(k["start"].max()))
    if shp.empty:
        return pd.Series(dtype=object)
    m = (k[["start", "correlationId", "name"]].reset_index()
         .merge(shp, on=["start", "correlationId"], how="inner"))
    index_col = m.columns[0]
    return pd.Series(list(zip(m["name"].astype(str), m["grid"].astype(int), m["block"].astype(int))),
                     index=m[index_col].to_numpy())


def aten_capture(path) -> Trace:
    """The trace at ``path``, refused (ProfkitError) unless it holds aten ranges to take shapes
    from."""
    shapes = Trace(path)
    if shapes.ranges_of_level("aten").empty:
        raise ProfkitError(f"{shapes.path}: no aten ranges to take shapes from: capture the program "
                           "with `profkit capture --aten`")
    return shapes


def op_of_signature(shapes: Trace) -> dict[tuple, str]:
    """Per kernel signature of the ``--aten`` capture ``shapes`` (aten_capture), the aten op (its
    name and input sizes) that launched it, where only one did."""
    sig = signatures(shapes, shapes.activities)
    owners: dict[tuple, set] = {}
    for op, ix in group_ops(shapes, by="aten").members_by_op().items():
        for s in set(sig.reindex(ix).dropna()):
            owners.setdefault(s, set()).add(op)
    return {s: next(iter(ops)) for s, ops in owners.items() if len(ops) == 1}


def borrowed_aten_acts(full: Trace, acts: pd.DataFrame, by_signature: dict[tuple, str]) -> dict[str, np.ndarray]:
    """Per aten op, the index labels of the kernels of ``acts`` (a window of ``full``) whose
    signature that op alone launched in the ``--aten`` capture (op_of_signature)."""
    sig = signatures(full, acts)
    ops = sig.map(lambda s: by_signature.get(s))
    ops = ops[ops.notna()]
    return {op: ix.to_numpy() for op, ix in ops.groupby(ops).groups.items()} if len(ops) else {}

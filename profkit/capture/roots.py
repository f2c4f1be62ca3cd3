"""The program's outermost module calls in the watched iteration: how often each model was called.

A trace cannot tell a loop over the chunks of a batch, each run through the whole model (a NeRF
renderer's 64 chunks of points), from a stack of layers: both repeat a unit of GEMMs, and PK107
leaves GEMM-heavy units to PK103 as layers. What tells them apart is here: a loop over chunks
calls the outermost module many times an iteration, each time on a slice of one tensor (views
of one storage at different offsets), where a layer stack calls it once. A decode or sampling
loop also calls its model many times, but on the last call's output (a new tensor each time).

The op record (profkit.capture.oprecord) keeps, per module called at depth 0 (no other module's
forward running on the main thread) that holds parameters: its class, the calls, its parameters'
elements, and whether every call's first tensor argument was a view of one storage, the calls at
different offsets (``sliced_input``), or the very same tensor (``same_input``: the same storage at
the same offset, unwritten between the calls: the model run several times on one input with
other arguments changed, as a
diffusion sampler's classifier-free guidance calls its denoiser with the labels and then with
the null label). PK107 reads it.
"""
from __future__ import annotations

from typing import Any, Optional


class RootCalls:
    """Depth-0 module calls of one watched iteration (see the module docstring)."""

    def __init__(self) -> None:
        self.depth = 0
        self.calls: dict[int, Optional[dict]] = {}   # id(module) -> the row (None: no parameters)

    def pre(self, module: Any, inputs: tuple) -> None:
        self.depth += 1
        if self.depth != 1:
            return
        if id(module) not in self.calls:
            params = sum(int(p.numel()) for p in module.parameters())
            # (None for a module without parameters: counted once, never kept)
            self.calls[id(module)] = {"module": type(module).__name__, "calls": 0, "params": params,
                                      "storages": set(), "offsets": set(), "versions": set(),
                                      "fresh": False} if params else None
        row = self.calls[id(module)]
        if row is None:
            return
        row["calls"] += 1
        first = next((x for x in inputs if hasattr(x, "untyped_storage")), None)
        try:
            row["storages"].add(int(first.untyped_storage().data_ptr()))
            row["offsets"].add(int(first.storage_offset()))
            # a buffer written in place between calls (a static decode loop's input) is one
            # tensor fed different data: its version counter moves
            row["versions"].add(int(first._version))
        except Exception:  # noqa: BLE001 - no plain storage (nested, sparse): not sliced
            row["fresh"] = True

    def post(self, module: Any) -> None:
        self.depth = max(self.depth - 1, 0)

    def summary(self) -> list[dict]:
        rows = []
        for r in sorted((r for r in self.calls.values() if r is not None), key=lambda r: -r["params"]):
            sliced = (r["calls"] > 1 and not r["fresh"] and len(r["storages"]) == 1
                      and len(r["offsets"]) == r["calls"])
            same = (r["calls"] > 1 and not r["fresh"] and len(r["storages"]) == 1
                    and len(r["offsets"]) == 1 and len(r["versions"]) == 1)
            rows.append({"module": r["module"], "calls": r["calls"], "params": r["params"],
                         "sliced_input": sliced, "same_input": same})
        return rows

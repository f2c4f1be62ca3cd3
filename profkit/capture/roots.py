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
different offsets (``sliced_input``), or the same tensor (``same_input``: the same storage at the
same offset: the model run several times on one input with other arguments changed, as a
diffusion sampler's classifier-free guidance calls its denoiser with the labels and then with
the null label); and, of calls that do not depend on each other, the most made on inputs of one
shape and dtype, under one grad mode and module mode (``shape_calls``: DINO's multi-crop step runs
its network on each of two global crops and each of six local crops, 6; a contrastive step on
each of its two views, 2), which one call on them concatenated does.

Neither is said of calls that depend on each other. The record follows the data between the
calls: a root call's outputs, and what the ops run between calls (at depth 0) make from them, are
marked by their storages; a later call given any marked tensor (a decoder's next token, a
fixed-point iteration's state, a buffer a previous output was copied into) is ``chained``. So is
a model whose parameters changed between its calls (a sharpness-aware step's second forward),
and every call after the host read a marked tensor (``.item()``, ``.cpu()``: a token sampled on
the host and made a new tensor cannot be followed, so what comes after is taken to depend on it).
PK107 reads it.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional


def _tensors(x: Any) -> Iterable[Any]:
    """The tensors in ``x`` (nested tuples, lists and dicts), in order."""
    if hasattr(x, "untyped_storage"):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)


def _grad_enabled() -> bool:
    try:
        import torch
        return bool(torch.is_grad_enabled())
    except Exception:  # noqa: BLE001 - no torch: no grad mode to tell calls apart by
        return True


def _storage(t: Any) -> Optional[int]:
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - no plain storage (nested, sparse)
        return None


class RootCalls:
    """Depth-0 module calls of one watched iteration (see the module docstring)."""

    def __init__(self) -> None:
        self.depth = 0
        self.calls: dict[int, Optional[dict]] = {}   # id(module) -> the row (None: no parameters)
        self.marked: set[int] = set()                # storages made from a root call's outputs
        self.current: Optional[dict] = None          # the root call running
        self.host_read = False                       # a marked tensor's data went to the host

    def pre(self, module: Any, inputs: tuple) -> None:
        self.depth += 1
        if self.depth != 1:
            return
        if id(module) not in self.calls:
            params = sum(int(p.numel()) for p in module.parameters())
            # (None for a module without parameters: counted once, never kept)
            self.calls[id(module)] = {"module": type(module).__name__, "calls": 0, "params": params,
                                      "storages": set(), "offsets": set(), "shapes": {}, "fresh": False,
                                      "chained": False, "weights": set()} if params else None
        row = self.calls[id(module)]
        self.current = row
        if row is None:
            return
        row["calls"] += 1
        args = list(_tensors(inputs))
        first = args[0] if args else None
        if first is not None:
            # calls that one call could make: one shape and dtype, under one grad mode and module
            # mode (a validation batch run under no_grad and eval() is not the training batch's twin)
            key = (tuple(first.shape), str(first.dtype), _grad_enabled(), bool(getattr(module, "training", True)))
            row["shapes"][key] = row["shapes"].get(key, 0) + 1
        if self.host_read:
            row["chained"] = True
        ptr = _storage(first) if first is not None else None
        if ptr is None:
            row["fresh"] = True
        else:
            row["storages"].add(ptr)
            row["offsets"].add(int(first.storage_offset()))
        if any(_storage(t) in self.marked for t in args):
            row["chained"] = True
        try:   # the parameters' in-place updates between calls (an optimizer's, a perturbation's)
            row["weights"].add(sum(int(p._version) for p in module.parameters()))
        except Exception:  # noqa: BLE001 - inference tensors keep no version: unchanged
            row["weights"].add(-1)

    def post(self, module: Any, output: Any = None) -> None:
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0 and self.current is not None:
            self._mark(output)
            self.current = None

    def op(self, args: Any, out: Any) -> None:
        """An op dispatched on the main thread: between root calls, what it makes from marked
        tensors is marked (an in-place op's output is its input's storage: marked too)."""
        if self.depth or not self.marked:
            return
        marked = [t for t in _tensors(args) if _storage(t) in self.marked]
        if marked:
            self._mark(out)
            # a number (.item(), a tensor's truth) or a host tensor (.cpu()) made from a marked
            # tensor on the GPU: its data went to Python
            on_gpu = any(t.device.type != "cpu" for t in marked)
            if on_gpu and (isinstance(out, (bool, int, float))
                           or any(t.device.type == "cpu" for t in _tensors(out))):
                self.host_read = True

    def _mark(self, x: Any) -> None:
        for t in _tensors(x):
            ptr = _storage(t)
            if ptr is not None:
                self.marked.add(ptr)

    def summary(self) -> list[dict]:
        rows = []
        for r in sorted((r for r in self.calls.values() if r is not None), key=lambda r: -r["params"]):
            free = r["calls"] > 1 and not r["fresh"] and not r["chained"] and len(r["weights"]) == 1
            sliced = free and len(r["storages"]) == 1 and len(r["offsets"]) == r["calls"]
            same = free and len(r["storages"]) == 1 and len(r["offsets"]) == 1 and len(r["shapes"]) == 1
            shaped = max(r["shapes"].values(), default=0) if free else 0
            rows.append({"module": r["module"], "calls": r["calls"], "params": r["params"],
                         "sliced_input": sliced, "same_input": same,
                         "shape_calls": shaped if shaped >= 2 else 0})
        return rows

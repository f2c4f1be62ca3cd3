"""Where a program makes the host wait for the GPU: the program's line behind each synchronising op
of the recorded iteration (profkit.capture.oprecord).

A trace shows a sync (``cudaStreamSynchronize``, a device-to-host copy) and the NVTX range it ran
in, not the line that asked for it. ``loss.item()`` is easy to find; a check inside a library call
is not (``torch.distributions``' argument validation reads a boolean back for every distribution
made, a boolean mask's ``nonzero`` waits to know its output's size). Under the record's dispatch
mode each op that makes the host wait on a device tensor is kept with the innermost frame of the
Python stack outside torch and profkit (the program's line, or that of the library that called
torch) and the outermost torch frame under it (the torch API that line called)::

    {"op": "item", "file": "train.py", "line": 88, "function": "rollout",
     "via": "torch/distributions/distribution.py:__init__", "count": 128}

``op``: ``item`` (``.item()``, ``bool()``, ``int()``/``float()``, printing a value: aten's
``_local_scalar_dense``), ``nonzero``, ``masked_select``, ``unique``, ``boolean index`` (``x[mask]``,
which runs ``nonzero``), ``repeat_interleave`` (tensor repeats without ``output_size``), ``copy to
host`` (``.cpu()``, ``.numpy()`` after it, ``.tolist()``: a device-to-host copy that is not
``non_blocking`` into pinned memory). ``count``: calls in the recorded iteration.
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any, Optional

MAX_SITES = 64          # distinct sites kept (a loop over thousands of lines is not a program)

# aten op -> what the program called
WAITS = {"_local_scalar_dense": "item", "nonzero": "nonzero", "masked_select": "masked_select",
         "unique": "unique", "_unique": "unique", "_unique2": "unique", "unique_dim": "unique",
         "unique_consecutive": "unique"}
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}
# torch's own dispatch machinery: never the API a program called
MACHINERY = ("utils/_python_dispatch.py", "_ops.py", "overrides.py", "utils/_contextlib.py", "_compile.py",
             "_dynamo/eval_frame.py")


def on_device(t: Any) -> bool:
    """Whether ``t`` is a tensor whose value the host must wait for (not on the CPU)."""
    return getattr(getattr(t, "device", None), "type", "cpu") not in ("cpu", "meta")


def waits(name: str, args: tuple, kwargs: dict) -> Optional[str]:
    """What the aten op ``name`` waits for, as ``op`` above; None when it does not wait."""
    if name in WAITS:
        return WAITS[name] if args and on_device(args[0]) else None
    if name in INDEXING and args and on_device(args[0]) and len(args) > 1:
        idx = args[1] if isinstance(args[1], (list, tuple)) else ()
        if any(getattr(i, "dtype", None) is not None and str(i.dtype) in ("torch.bool", "torch.uint8")
               for i in idx):
            return "boolean index"
        return None
    if name == "repeat_interleave" and args and on_device(args[0]):
        given = kwargs.get("output_size")
        if given is None and len(args) > 3:
            given = args[3]
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return "repeat_interleave" if given is None and hasattr(repeats, "dim") else None
    return None


class SyncSites:
    """The sites of one iteration, counted (see the module docstring)."""

    def __init__(self) -> None:
        self.sites: Counter = Counter()
        torch = sys.modules.get("torch")
        self._torch = os.path.dirname(os.path.abspath(torch.__file__)) if torch is not None else None
        self._profkit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._cwd = os.getcwd()

    def note(self, op: str) -> None:
        """Count one wait of kind ``op`` at the program's line (profkit's frames skipped)."""
        where = self.caller(sys._getframe(1))
        key = (op, *where)
        if key in self.sites or len(self.sites) < MAX_SITES:
            self.sites[key] += 1

    def caller(self, frame: Any) -> tuple[str, int, str, Optional[str]]:
        """(file, line, function, via) of the innermost frame outside torch and profkit, and the
        outermost torch frame under it that is not dispatch machinery."""
        via = None
        f = frame
        while f is not None:
            fn = os.path.abspath(f.f_code.co_filename)
            if self._torch and fn.startswith(self._torch + os.sep):
                rel = fn[len(os.path.dirname(self._torch)) + 1:].replace(os.sep, "/")
                if not rel.endswith(MACHINERY):
                    via = f"{rel}:{f.f_code.co_name}"
            elif not fn.startswith(self._profkit + os.sep):
                return self.short(fn), int(f.f_lineno), f.f_code.co_name, via
            f = f.f_back
        return "?", 0, "?", via

    def short(self, path: str) -> str:
        """A path as a user reads it: relative to the working directory, or from site-packages."""
        if path.startswith(self._cwd + os.sep):
            return path[len(self._cwd) + 1:]
        marker = os.sep + "site-packages" + os.sep
        return path.split(marker, 1)[1] if marker in path else path

    def as_list(self) -> list[dict]:
        return [{"op": op, "file": f, "line": ln, "function": fn, "via": via, "count": c}
                for (op, f, ln, fn, via), c in self.sites.most_common()]

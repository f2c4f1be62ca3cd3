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

On a GPU the record also turns on CUDA's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``,
whose warning says an op synchronised) for its one iteration, which finds the waits no op name
gives away (:class:`SyncWatch`): ``op`` is then ``in op`` for a wait made inside torch's own code,
with ``inside`` naming where: the aten op that waited within its implementation, or, for a wait
outside the ops the dispatch shows, the innermost torch function on the stack (eager QAT's fake
quantization waited 27 times an iteration inside
``torch/ao/quantization/fake_quantize.py:forward``, called from the model's forward through its
hooks: no line of the program can keep those values on the GPU); and ``synchronize`` for a wait
made through torch.cuda's own APIs (a stream's or an event's ``synchronize()``, where the debug
mode flags it: it is made to flag the syncs hidden in ops, and an explicit
``torch.cuda.synchronize()`` is the trace's ``cudaDeviceSynchronize`` in any case).
"""
from __future__ import annotations

import os
import sys
import warnings
from collections import Counter
from typing import Any, Optional

from profkit.run.replacements import program_synchronize

MAX_SITES = 64          # distinct sites kept (a loop over thousands of lines is not a program)

# aten op -> what the program called
# (``item`` and ``is_nonzero`` are what the dispatch shows under inference mode, where autograd does
# not lower them to ``_local_scalar_dense``)
WAITS = {"_local_scalar_dense": "item", "item": "item", "is_nonzero": "item", "nonzero": "nonzero",
         "masked_select": "masked_select",
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
        # waits noted by their op at a program line and not yet seen by the watch: CUDA's warning
        # for them reaches Python when the program's own call returns, after the op (see SyncWatch)
        self.pending: Counter = Counter()
        torch = sys.modules.get("torch")
        self._torch = os.path.dirname(os.path.abspath(torch.__file__)) if torch is not None else None
        self._profkit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._cwd = os.getcwd()
        # the warnings module's frames stand between SyncWatch's showwarning and the program
        self._skip = os.path.splitext(os.path.abspath(warnings.__file__))[0]

    def note(self, op: str, inside: Optional[str] = None) -> None:
        """Count one wait of kind ``op`` at the program's line (profkit's frames skipped);
        ``inside``: where in torch it was made, for ``in op``."""
        where = self.caller(sys._getframe(1))
        key = (op, *where, inside)
        if key in self.sites or len(self.sites) < MAX_SITES:
            self.sites[key] += 1
        if op not in ("synchronize", "in op"):
            self.pending[where[:2]] += 1

    def claimed(self, frame: Any) -> bool:
        """Whether a wait the watch saw outside any op is one an op already noted at the same
        program line (and claim it: each noted wait is claimed once)."""
        where = self.caller(frame)[:2]
        if self.pending[where] > 0:
            self.pending[where] -= 1
            return True
        return False

    def _walk(self, frame: Any):
        """The stack from ``frame`` outwards, profkit's and the warnings module's frames left out:
        (``file:function`` for a torch frame that is not dispatch machinery, else None; None for
        the program's frame), ending at the first of the program's."""
        f = frame
        while f is not None:
            fn = os.path.abspath(f.f_code.co_filename)
            if self._torch and fn.startswith(self._torch + os.sep):
                rel = fn[len(os.path.dirname(self._torch)) + 1:].replace(os.sep, "/")
                yield ("torch", None if rel.endswith(MACHINERY) else f"{rel}:{f.f_code.co_name}", f)
            elif not fn.startswith(self._profkit + os.sep) and os.path.splitext(fn)[0] != self._skip:
                yield ("program", None, f)
                return
            f = f.f_back

    def caller(self, frame: Any) -> tuple[str, int, str, Optional[str]]:
        """(file, line, function, via) of the innermost frame outside torch and profkit, and the
        outermost torch frame under it that is not dispatch machinery."""
        via = None
        for kind, name, f in self._walk(frame):
            if kind == "program":
                fn = os.path.abspath(f.f_code.co_filename)
                return self.short(fn), int(f.f_lineno), f.f_code.co_name, via
            via = name or via
        return "?", 0, "?", via

    def short(self, path: str) -> str:
        """A path as a user reads it: relative to the working directory, or from site-packages."""
        if path.startswith(self._cwd + os.sep):
            return path[len(self._cwd) + 1:]
        marker = os.sep + "site-packages" + os.sep
        return path.split(marker, 1)[1] if marker in path else path

    def as_list(self) -> list[dict]:
        return [{"op": op, "file": f, "line": ln, "function": fn, "via": via, "count": c,
                 **({"inside": inside} if inside else {})}
                for (op, f, ln, fn, via, inside), c in self.sites.most_common()]

    def innermost_torch(self, frame: Any) -> Optional[str]:
        """``file:function`` of the innermost torch frame that is not dispatch machinery, or
        None where the innermost frame outside profkit and the warnings module is the program's."""
        for kind, name, _ in self._walk(frame):
            if kind == "program":
                return None
            if name:
                return name
        return None


SYNC_WARNING = "called a synchronizing CUDA operation"   # c10/cuda's warn_or_error_on_sync


class SyncWatch:
    """CUDA's sync debug mode as a counter, for the recorded iteration: every synchronising CUDA
    call torch makes (a stream or device sync, a blocking copy, ``.item()``'s read) raises a
    warning in ``warn`` mode; the watch counts them (``count``) instead of showing them, and the
    program's other warnings pass as before. ``start`` returns False where the mode is not there
    (no CUDA, an older torch): the record then tells the waits by the ops' names alone.

    Waits outside any op (``in_op`` false) are noted in ``sites`` at the program's line: as
    ``synchronize`` where torch.cuda's APIs made them (``torch.cuda.synchronize()``), else as
    ``in op`` inside the innermost torch function on the stack."""

    def __init__(self, sites: SyncSites) -> None:
        self.sites = sites
        self.count = 0
        self.in_op = False
        self._ctx: Any = None
        self._prev_mode: Any = None

    def start(self) -> bool:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        try:
            if cuda is None or not cuda.is_available() or not hasattr(cuda, "set_sync_debug_mode"):
                return False
            self._ctx = warnings.catch_warnings()
            self._ctx.__enter__()     # the filters and showwarning come back as they were at stop
            warnings.filterwarnings("always", message=SYNC_WARNING)
            shown = warnings.showwarning

            def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                     line: Any = None) -> None:
                if SYNC_WARNING not in str(message):
                    return shown(message, category, filename, lineno, file, line)
                self.count += 1
                if not self.in_op and not self.sites.claimed(sys._getframe(1)):
                    # outside the ops the dispatch shows: the program's own wait, or one torch's
                    # code made (a composite op's body, a module's Python). (A wait inside an op
                    # often reaches here after it: CUDA's warning is raised in Python when the
                    # program's call into torch returns, ``.item()``'s after its aten op; the op
                    # noted it at this line already, and it is claimed instead.)
                    inside = self.sites.innermost_torch(sys._getframe(1))
                    if program_synchronize(inside):
                        self.sites.note("synchronize")
                    else:
                        self.sites.note("in op", inside)
                return None
            warnings.showwarning = show
            self._prev_mode = cuda.get_sync_debug_mode()
            cuda.set_sync_debug_mode("warn")
            return True
        except Exception:  # noqa: BLE001 - without the watch the record names waits by their ops
            self.stop()
            return False

    def stop(self) -> None:
        torch = sys.modules.get("torch")
        if self._prev_mode is not None:
            try:
                torch.cuda.set_sync_debug_mode(self._prev_mode)
            except Exception:  # noqa: BLE001 - nothing more to restore
                pass
            self._prev_mode = None
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            try:
                ctx.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass

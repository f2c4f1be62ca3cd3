"""The calibration run: the user's script timed without any profiler, range by range.

Under Nsight Systems the host side of a step runs 1.2-1.7x slower than without it (every traced
CUDA call and the CPU time around it cost more), so a model built from the profiled run alone
would price a slowed host. ``profkit capture`` therefore runs the script once more with no
profiler attached, under this recorder (``python -m profkit.capture.bootstrap --calibrate FILE``):
it hooks the NVTX push/pop calls of ``torch.cuda.nvtx`` and the ``nvtx`` package (which do
nothing when no profiler listens) and records, for every top-level range of the main thread:

* ``start_ns``/``end_ns``: the host clock (``time.perf_counter_ns``) at its push and pop;
* ``gpu_ns``: where the GPU was in the stream when the range began: a CUDA event recorded at the
  push, read after the script ends (ns after the first such event). An iteration's GPU-side
  period stays right when the CPU runs ahead of the GPU, which the host clock alone does not.
* ``mem_bytes``: the memory PyTorch's caching allocator held allocated at its push
  (``torch.cuda.memory_allocated``: the weights, the optimizer's state, what the step keeps),
  and once, after the script, ``memory``: ``{"peak_bytes", "device_bytes"}`` (the run's
  ``max_memory_allocated`` and the GPU's size): how much a step's activations take, and so
  whether larger micro-batches would fit (PK205);
* ``inner_ns``: the host time of the ranges opened directly inside it, summed by name
  (``{"forward": ..., "argmax": ...}``; only where it opened any). Where the step's period is
  set by the GPU, a copy or Python the profiler does not slow, the period cannot say how much
  the profiler slowed the host's CUDA calls; these ranges can (profkit.run.step.inner).

One event per top-level range costs a few microseconds of CPU. Nothing is recorded while a CUDA
graph is being captured, and CUDA is never initialised by the recorder itself. Neither is torch
imported by it: the hooks go in when the script imports ``torch.cuda.nvtx`` or ``nvtx`` (an import
hook), so a script's start-up is the same as without profkit. What it writes:

    {"format": "profkit-calibration/1", "script": ..., "argv": [...], "wall_ns": ...,
     "exit_code": ..., "ranges": [{"name", "start_ns", "end_ns", "gpu_ns", "inner_ns"}, ...],
     "cut": {"range": NAME, "iterations": N}    (only when --max-iterations ended the run)
     "trial": {"switch", "applied", "note"}      (only under --try: profkit.capture.switches)
     "error": "Type: message"}                  (only when the script raised)

**Cutting a run short** (``max_iterations``): the clock counts the pops at depth 0 of the range
that marks iterations (``step``; without one, of whichever top-level range reaches the count
first, the most frequent so far) and, once the Nth such range has closed, raises
``SystemExit(0)`` from the pop hook, after NVTX's own pop and after waiting for the GPU work
already queued (a GPU-bound loop runs iterations ahead of its GPU; the profiled trace needs their
kernels). The script ends there as if it had
called ``sys.exit(0)``: its ``finally`` blocks and ``atexit`` handlers run, its DataLoader
workers are shut down, and the timings are written; a script that catches ``SystemExit`` gets it
again at its next top-level pop. Without ``events`` (the profiled run, which needs no timings)
the clock only counts.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.abc
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

FORMAT = "profkit-calibration/1"


def wait_for_gpu() -> None:
    """Wait for the GPU work the script has queued, if it used CUDA. A GPU-bound loop runs many
    iterations ahead of its GPU: cut before its own final sync, the process would end with those
    iterations' kernels unrun, and the profiled trace would hold their launches without their
    kernels (a window paced by the CPU's periods, not the GPU's)."""
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):  # a broken CUDA context: nothing more to wait for
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()


class RangeClock:
    """Times the top-level NVTX ranges of the main thread (see the module docstring)."""

    def __init__(self, max_iterations: Optional[int] = None, step: Optional[str] = None,
                 events: bool = True) -> None:
        self.main = threading.main_thread().ident
        self.depth = 0
        self.open: Optional[dict] = None
        self.child: Optional[tuple[str, int]] = None   # the range open at depth 2: name, push time
        self.ranges: list[dict] = []
        self._events: list[tuple[dict, Any]] = []
        self.max_iterations = max_iterations
        self.step = step
        self.events = events
        self.counts: Counter = Counter()
        self.cut: Optional[dict] = None
        self.memory: Optional[dict] = None
        # Called with the name at every top-level push of the main thread (the op record's
        # iteration: profkit.capture.oprecord); their failures never reach the script.
        self.listeners: list[Callable[[str], None]] = []

    # -- the hooks ----------------------------------------------------------------------------
    def push(self, name: Any) -> None:
        if threading.get_ident() != self.main:
            return
        self.depth += 1
        if self.depth > 1 and self.open is not None:
            # the nested ranges an iteration opens: a measure of its work that a trial must keep
            # (an optimiser that stops its evaluations early runs fewer: profkit.run.trials)
            self.open["inner"] = self.open.get("inner", 0) + 1
            if self.depth == 2 and self.events:
                self.child = (str(name), time.perf_counter_ns())
        if self.depth == 1:
            for listen in self.listeners:
                with contextlib.suppress(Exception):
                    listen(str(name))
            rec = {"name": str(name), "start_ns": time.perf_counter_ns(), "end_ns": None,
                   "gpu_ns": None}
            ev = self._event()
            if ev is not None:
                self._events.append((rec, ev))
                mem = self._allocated()
                if mem is not None:
                    rec["mem_bytes"] = mem
            self.open = rec

    def pop(self) -> None:
        if threading.get_ident() != self.main or self.depth == 0:
            return
        self.depth -= 1
        if self.depth == 1 and self.child is not None and self.open is not None:
            name, t0 = self.child
            inner = self.open.setdefault("inner_ns", {})
            inner[name] = inner.get(name, 0) + time.perf_counter_ns() - t0
            self.child = None
        if self.depth == 0 and self.open is not None:
            self.open["end_ns"] = time.perf_counter_ns()
            self.ranges.append(self.open)
            name = self.open["name"]
            self.open = None
            if self.max_iterations and (self.step is None or name == self.step):
                self.counts[name] += 1
                if self.cut is None and self.counts[name] >= self.max_iterations:
                    self.cut = {"range": name, "iterations": int(self.counts[name])}

    def stop_if_cut(self) -> None:
        """After NVTX's own pop: end the script once the run has its iterations (the module
        docstring's "Cutting a run short")."""
        if self.cut is not None and self.depth == 0 and threading.get_ident() == self.main:
            wait_for_gpu()
            raise SystemExit(0)

    def _event(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or not self.events:
            return None
        try:
            # Never the one to initialise CUDA, and never inside a graph capture (the event
            # would become a node of the graph).
            if not torch.cuda.is_initialized() or torch.cuda.is_current_stream_capturing():
                return None
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        except Exception:  # noqa: BLE001 - timing must never break the user's program
            return None

    # -- installing ----------------------------------------------------------------------------
    def install(self) -> None:
        """Hook torch.cuda.nvtx and the nvtx package: now where the script's process already
        imported them, otherwise right after the script imports them."""
        after_import({"torch.cuda.nvtx": self._hook_torch_nvtx, "nvtx": self._hook_nvtx})

    def _hook_torch_nvtx(self, tnvtx: Any) -> None:
        _wrap(tnvtx, "range_push", lambda msg, *a, **k: self.push(msg))
        _wrap(tnvtx, "range_pop", lambda *a, **k: self.pop(), after=self.stop_if_cut)

    def _hook_nvtx(self, nvtx: Any) -> None:
        mod = getattr(nvtx, "nvtx", nvtx)
        for owner in {id(nvtx): nvtx, id(mod): mod}.values():
            _wrap(owner, "push_range", lambda message=None, *a, **k: self.push(message or ""))
            _wrap(owner, "pop_range", lambda *a, **k: self.pop(), after=self.stop_if_cut)
        cls = getattr(mod, "annotate", None)
        if cls is None:
            return
        clock = self
        init, enter, exit_, call = cls.__init__, cls.__enter__, cls.__exit__, cls.__call__

        @functools.wraps(init)
        def __init__(inst, message=None, *a, **k):  # noqa: N807
            init(inst, message, *a, **k)
            inst._profkit_name = message

        @functools.wraps(enter)
        def __enter__(inst):  # noqa: N807
            clock.push(getattr(inst, "_profkit_name", None) or "")
            return enter(inst)

        @functools.wraps(exit_)
        def __exit__(inst, *exc):  # noqa: N807
            try:
                return exit_(inst, *exc)
            finally:
                clock.pop()
                clock.stop_if_cut()

        @functools.wraps(call)
        def __call__(inst, func):  # noqa: N807
            inner = call(inst, func)  # without a profiler nvtx returns func itself
            name = getattr(inst, "_profkit_name", None) or func.__name__

            @functools.wraps(func)
            def timed(*args, **kwargs):
                clock.push(name)
                try:
                    return inner(*args, **kwargs)
                finally:
                    clock.pop()
                    clock.stop_if_cut()
            return timed

        cls.__init__, cls.__enter__, cls.__exit__, cls.__call__ = __init__, __enter__, __exit__, __call__

    def _allocated(self) -> Optional[int]:
        try:
            return int(sys.modules["torch"].cuda.memory_allocated())
        except Exception:  # noqa: BLE001 - timing must never break the user's program
            return None

    # -- the result ----------------------------------------------------------------------------
    def finish(self) -> None:
        """Read the GPU times of the ranges (waits for the GPU once, after the script), and the
        run's peak of allocated memory."""
        if not self._events:
            return
        try:
            cuda = sys.modules["torch"].cuda
            self.memory = {"peak_bytes": int(cuda.max_memory_allocated()),
                           "device_bytes": int(cuda.get_device_properties(cuda.current_device()).total_memory)}
        except Exception:  # noqa: BLE001 - no memory figures: PK205 keeps its conservative number
            self.memory = None
        try:
            sys.modules["torch"].cuda.synchronize()
            first = self._events[0][1]
            for rec, ev in self._events:
                rec["gpu_ns"] = int(round(first.elapsed_time(ev) * 1e6))
        except Exception:  # noqa: BLE001 - a broken CUDA context: host times only
            for rec, _ in self._events:
                rec["gpu_ns"] = None

    def as_dict(self, script: str, argv: list[str], wall_ns: int, exit_code: int) -> dict:
        ranges = list(self.ranges)
        if self.open is not None:  # the script ended inside a range
            ranges.append({**self.open, "end_ns": self.open["start_ns"] + 0})
        out = {"format": FORMAT, "script": script, "argv": argv, "wall_ns": int(wall_ns),
               "exit_code": int(exit_code), "ranges": ranges}
        if self.cut is not None:
            out["cut"] = dict(self.cut)
        if self.memory:
            out["memory"] = dict(self.memory)
        return out


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks[name](module)`` right after module ``name`` has executed, before the importer
    sees it. Finding and loading stay with the finders behind this one."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            with contextlib.suppress(Exception):
                hook(module)
        # Loaders are made per spec by the path finders: setting this one's method touches no
        # other module's import. A loader that takes no new attribute is left alone (no timing
        # of that module's ranges, never a failed import).
        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_then_hook
        return spec


def after_import(hooks: dict[str, Callable[[ModuleType], None]]) -> None:
    """Call each hook on its module: at once if it is imported, else when it gets imported."""
    pending = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is None:
            pending[name] = hook
        else:
            with contextlib.suppress(Exception):
                hook(module)
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


def _wrap(owner: Any, name: str, hook: Callable, after: Optional[Callable[[], None]] = None) -> None:
    """Replace ``owner.name`` by a function that calls ``hook`` first, then the original, then
    ``after`` (whose exceptions, unlike the hook's, reach the caller: SystemExit ends a cut run)."""
    orig = getattr(owner, name, None)
    if orig is None or getattr(orig, "_profkit_hooked", False):
        return

    @functools.wraps(orig)
    def hooked(*args, **kwargs):
        with contextlib.suppress(Exception):
            hook(*args, **kwargs)
        result = orig(*args, **kwargs)
        if after is not None:
            after()
        return result
    hooked._profkit_hooked = True  # type: ignore[attr-defined]
    setattr(owner, name, hooked)


def write(path: str | Path, data: dict) -> None:
    Path(path).write_text(json.dumps(data, separators=(",", ":")))

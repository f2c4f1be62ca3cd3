"""Work an iteration recomputes from tensors that never change: loop-invariant ops.

Weights quantized to int8 and dequantized at every call (``q.to(bf16) * scale``), a weight
normalisation left on at inference (``parametrizations.weight_norm``: a norm and a scaling per
convolution, every call), autocast's cast of a frozen fp32 weight at every step: each produces
the same tensor every iteration from parameters and buffers that nothing writes. The op record
(profkit.capture.oprecord) follows, through its watched iteration, which tensors are such:

* roots: the parameters and buffers of every module called (a global forward pre-hook, before
  the module's own ops read them), by storage;
* an op is invariant when every tensor it takes is a root or the output of an invariant op, it
  takes at least one, and it draws no random numbers; its outputs are then invariant too. An op
  that is not writes its outputs' storage afresh (a block the caching allocator hands out again,
  an in-place update): that storage stops being invariant, and a root written so (an optimizer's
  update) takes back every op computed from it;
* at the end, ops from roots that are trained are dropped as well: a root that requires a
  gradient, where the iteration ran a backward or the root holds a gradient (it changes every
  step, or every few with accumulation); a frozen weight (``requires_grad=False``) is not.

Per kind of invariant op that writes new memory (views are followed, not counted): the op, its
first input's element type (``from``: int8 for a dequantization), the output's element type and
size, how often, and its time on the GPU, timed with CUDA
events around the op in the watched iteration (their times are read once the run is over; the
iteration is warm-up, never one the model is calibrated to). PK207 removes them from the step.
"""
from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Any, Optional

# Ops whose output is not a function of their inputs alone
RANDOM = ("rand", "normal", "bernoulli", "dropout", "uniform", "multinomial", "exponential",
          "poisson", "geometric", "cauchy", "log_normal", "random_")
MAX_EVENTS = 4096       # invariant ops timed, at most (the events are kept until the run ends)


def _tensors(x: Any, torch: Any) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for a in x for t in _tensors(a, torch)]
    if isinstance(x, dict):
        return [t for a in x.values() for t in _tensors(a, torch)]
    return []


def storage_key(t: Any) -> Optional[int]:
    """A dense tensor's storage address (views share it), or None (sparse, meta, no storage)."""
    try:
        return int(t.untyped_storage().data_ptr()) or None
    except Exception:  # noqa: BLE001 - nested, sparse or functional tensors have no plain storage
        return None


class Invariants:
    """The tracking described in the module docstring, for one watched iteration."""

    def __init__(self) -> None:
        self.roots: dict[int, Any] = {}             # storage -> a weak reference to the tensor
        self.derived: dict[int, frozenset] = {}     # storage -> the roots it was computed from
        self.written: set[int] = set()              # roots an op that is not invariant wrote
        self.ops: list[tuple] = []                  # (op, from, dtype, numel, bytes, roots, events)
        self.timed = 0
        self.closed = False

    def note_module(self, module: Any) -> None:
        for t in (*module._parameters.values(), *module._buffers.values()):
            k = storage_key(t) if t is not None else None
            if k is not None and k not in self.roots and k not in self.derived:
                self.roots[k] = weakref.ref(t)

    def before(self, name: str, args: tuple, kwargs: dict, torch: Any) -> Optional[tuple[frozenset, list]]:
        """(the roots an op's inputs come from, its input tensors) when it is invariant, else None."""
        if any(r in name for r in RANDOM):
            return None
        ins = _tensors(args, torch) + _tensors(kwargs, torch)
        if not ins:
            return None
        roots: set[int] = set()
        for t in ins:
            k = storage_key(t)
            if k is None:
                return None
            if k in self.derived:
                roots |= self.derived[k]
            elif k in self.roots and k not in self.written:
                roots.add(k)
            else:
                return None
        return frozenset(roots), ins

    def events(self, torch: Any) -> Optional[tuple]:
        """A pair of timing events recorded on the current stream, or None (CPU, too many)."""
        if self.timed >= MAX_EVENTS or not torch.cuda.is_available():
            return None
        if torch.cuda.is_current_stream_capturing():
            return None   # a timing event inside a CUDA graph's capture would invalidate it
        self.timed += 1
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        return start, end

    def after(self, name: str, out: Any, found: Optional[tuple[frozenset, list]],
              timing: Optional[tuple], torch: Any) -> None:
        """``found``: what ``before`` returned (None: the op is not invariant)."""
        if timing is not None:
            timing[1].record()
        roots, tin = found if found is not None else (None, [])
        ins = {storage_key(t) for t in tin}
        src = str(tin[0].dtype).replace("torch.", "") if tin else ""
        for t in _tensors(out, torch):
            k = storage_key(t)
            if k is None:
                continue
            if roots is None:
                self.derived.pop(k, None)
                if k in self.roots:
                    self.written.add(k)
                continue
            self.derived[k] = roots
            if k not in ins:
                self.ops.append((name, src, str(t.dtype).replace("torch.", ""), int(t.numel()),
                                 int(t.numel() * t.element_size()), roots, timing))
                timing = None   # an op's time counted once, with its first output

    def close(self, backward: bool) -> None:
        """At the end of the watched iteration, while the program's tensors are alive: drop the
        ops computed from roots written in it or trained (``backward``: whether the iteration
        ran a backward). The events' times are read later (summary), once the run is over."""
        trained = set()
        for k, ref in self.roots.items():
            t = ref()
            if t is None or (t.requires_grad and (backward or t.grad is not None)):
                trained.add(k)
        gone = self.written | trained
        self.ops = [op for op in self.ops if not (op[5] & gone)]
        self.closed = True

    def summary(self, torch: Any) -> list[dict]:
        """Per (op, from, dtype, numel): count, bytes written and GPU time, of the ops kept at
        close (nothing where the iteration never closed)."""
        if not self.closed:
            return []
        if any(ev is not None for *_, ev in self.ops):
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - no GPU time then, the rest stands
                pass
        rows: dict[tuple, list] = defaultdict(lambda: [0, 0, 0.0, 0])
        for name, src, dt, numel, nbytes, _, ev in self.ops:
            row = rows[(name, src, dt, numel)]
            row[0] += 1
            row[1] += nbytes
            if ev is not None:
                try:
                    row[2] += ev[0].elapsed_time(ev[1]) * 1e6
                    row[3] += 1
                except Exception:  # noqa: BLE001 - an event never reached: that op untimed
                    pass
        return [{"op": n, "from": src, "dtype": dt, "numel": numel, "count": c, "bytes": b,
                 "gpu_ns": int(ns), "timed": timed}
                for (n, src, dt, numel), (c, b, ns, timed) in sorted(rows.items(), key=lambda kv: -kv[1][1])]

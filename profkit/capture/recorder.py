"""profkit's aten recorder: one NVTX range per aten op, carrying the op's types and arguments.

Capture side: imports torch (lazily, inside :func:`recorder`); the analyzer never imports this
module. The range text is documented in :mod:`profkit.read.aten_record`.

Mechanism: a ``TorchDispatchMode``. The mode sees every op after autograd and autocast, i.e.
the ops that launch kernels (``aten::mm``/``addmm``, ``aten::_to_copy`` for autocast's casts,
``aten::_scaled_dot_product_flash_attention``), and not the CompositeImplicit wrappers above
them (``aten::linear``, ``aten::matmul``, ``aten::scaled_dot_product_attention``): those have no
kernels of their own, so every kernel lands in exactly one recorded range. While the handler
runs, torch takes the mode off the stack, so ops an op calls internally are part of it.

Backward ops: the autograd engine runs them on its own device threads. The mode stack is part
of ``at::ThreadLocalState`` (``torch_dispatch_mode_state_``, ATen/ThreadLocalState.h), which the
engine captures in ``GraphTask::thread_locals_`` when ``backward()`` is called and installs with
``ThreadLocalStateGuard`` on the thread that runs each node (``Engine::thread_main``), so a mode
active at ``backward()`` records the backward ops on whichever thread runs them.

Cost per op: the formatting plan of each ``OpOverload`` is built once (which arguments are
tensors, which scalars change the cost), tensors are described from ``shape``/``dtype`` without
``str(tensor)``, and the outputs of an input signature seen before come from a cache, so the
hot path is a dict look-up, a string join and two NVTX calls. View ops (no kernels) get no range.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from profkit.read.aten_record import FUSABLE_PAIRS, MARKER, RECORDER_COST_MARK, format_outputs, run_length

# Scalar arguments that change an op's cost, by schema name -> token.
_SCALARS = {"is_causal": "causal", "dropout_p": "p", "scale": "scale", "dim": "dim",
            "keepdim": "keepdim", "alpha": "alpha", "dtype": "dtype"}
_SIGNATURE_CACHE_MAX = 200_000


def _dtype_names() -> dict:
    import torch
    names = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16",
             torch.float16: "fp16", torch.int64: "int64", torch.int32: "int32",
             torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
             torch.complex64: "c64", torch.complex128: "c128"}
    for attr, short in (("float8_e4m3fn", "fp8e4m3"), ("float8_e5m2", "fp8e5m2"),
                        ("float8_e4m3fnuz", "fp8e4m3"), ("float8_e5m2fnuz", "fp8e5m2")):
        if hasattr(torch, attr):
            names[getattr(torch, attr)] = short
    return names


@dataclass(frozen=True)
class _Arg:
    index: int            # position in args, or -1 when keyword-only
    name: str
    kind: str             # "tensor", "tensors", "scalar" (a cost-changing one), "other"
    token: str = ""
    is_out: bool = False  # a written keyword-only tensor (out=, values=, indices=)
    default: Any = None   # the schema's default: callers leave defaulted arguments out


@dataclass(frozen=True)
class _Plan:
    name: str
    skip: bool
    args: tuple[_Arg, ...]
    producer: bool = False   # its outputs may feed a fusable consumer (add, mul, div)
    consumer: bool = False   # a norm/activation/softmax a bundled kernel fuses with its producer


def _roles(name: str) -> tuple[bool, bool]:
    """Whether an op can be a producer or a consumer of a pair a bundled kernel fuses
    (FUSABLE_PAIRS): only those carry emit_nvtx's ``op_id``/``input_op_ids``."""
    producer = any(name.startswith(p) for _, prods, _ in FUSABLE_PAIRS for p in prods)
    consumer = any(name.startswith(c) for cons, _, _ in FUSABLE_PAIRS for c in cons)
    return producer, consumer


def _plan(func: Any) -> _Plan:
    schema = func._schema
    name = func.name()
    if func.namespace != "aten" or func.is_view:
        return _Plan(name, True, ())
    args = []
    for i, a in enumerate(schema.arguments):
        t = str(a.type)
        kind = ("tensors" if (t.startswith("List[") and "Tensor" in t) or t.endswith("[]")
                and t.startswith("Tensor") else
                "tensor" if t.startswith("Tensor") else
                "scalar" if a.name in _SCALARS else "other")
        is_out = bool(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write)
        default = a.default_value if kind == "scalar" and a.has_default_value() else None
        args.append(_Arg(-1 if a.kwarg_only else i, a.name, kind, _SCALARS.get(a.name, ""), is_out,
                         default))
    producer, consumer = _roles(name)
    return _Plan(name, False, tuple(args), producer, consumer)


def _scalar_text(v: Any, names: dict) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, float)):
        return f"{v:g}" if isinstance(v, float) else str(v)
    if isinstance(v, (list, tuple)):
        return ",".join(str(int(x)) for x in v)
    return names.get(v)  # a torch.dtype; anything else is not written


class AtenRecorder:
    """A ``TorchDispatchMode`` factory holder; use :func:`recorder` to get an active one."""

    def __init__(self, push: Callable[[str], Any], pop: Callable[[], Any],
                 count_threads: bool = False) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        self.push, self.pop = push, pop
        self.names = _dtype_names()
        self.plans: dict = {}
        self.outputs: dict[str, str] = {}
        self.count_threads = count_threads
        self.main_thread = threading.get_ident()
        self.per_thread: dict[int, dict[str, int]] = {}
        # Which producer op wrote a tensor, for the pairs the bundled kernels fuse (add -> norm):
        # keyed by tensor identity, dropped with the tensor.
        from torch.utils.weak import WeakIdKeyDictionary
        self.made_by = WeakIdKeyDictionary()
        self.next_id = 0
        self.id_lock = threading.Lock()
        # Host cost accounting (host_cost_ns): ops seen (views included), ops recorded, the
        # handler's own time outside the ops, and the per-op cost of entering it (the probe's).
        self.dispatches = 0
        self.recorded = 0
        self.self_ns = 0
        self.entry_ns = 0.0
        owner = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return owner.dispatch(func, args, kwargs or {})

        self.mode = _Mode()

    # The hot path: keep it to look-ups and joins.
    def describe(self, plan: _Plan, args: tuple, kwargs: dict) -> str:
        sizes, dts, cont, extra = [], [], [], []
        names = self.names
        nargs = len(args)
        firsts: list = []   # (entry, first tensor) of each tensor argument so far
        same: list[str] = []
        for a in plan.args:
            if a.index >= 0 and a.index < nargs:
                v = args[a.index]
            else:
                v = kwargs.get(a.name, a.default)
            if a.kind == "tensor":
                if v is None or not hasattr(v, "shape"):
                    sizes.append("[]")
                    dts.append("-")
                    cont.append("-")
                    continue
                head = v
                sizes.append(str(list(v.shape)))
                dts.append(names.get(v.dtype, "other"))
                cont.append("1" if v.is_contiguous() else "0")
            elif a.kind == "tensors":
                ts = [t for t in (v or ()) if t is not None and hasattr(t, "shape")]
                if not ts:
                    sizes.append("[]")
                    dts.append("-")
                    cont.append("-")
                    continue
                head = ts[0]  # a list that starts with an earlier argument: addcmul_(v, grads, grads)
                sizes.append("[" + ", ".join(str(list(t.shape)) for t in ts) + "]")
                dts.extend(names.get(t.dtype, "other") for t in ts)
                cont.extend("1" if t.is_contiguous() else "0" for t in ts)
            else:
                sizes.append("[]")
                dts.append("-")
                cont.append("-")
                if a.kind == "scalar":
                    s = _scalar_text(v, names)
                    if s is not None:
                        extra.append(f"{a.token}={s}")
                continue
            # The same tensor passed twice (x * x) is read once: say so, or bytes double.
            entry = len(sizes) - 1
            for j, t in firsts:
                if t is head:
                    same.append(f"{entry}:{j}")
                    break
            firsts.append((entry, head))
            if a.is_out:
                extra.append("outarg=1")
        if same:
            extra.append("same=" + ",".join(same))
        text = (f"{plan.name}, sizes = [{', '.join(sizes)}]{MARKER}in={run_length(dts)} "
                f"c={''.join(cont)}")
        return text + (" " + " ".join(extra) if extra else "")

    def _outputs(self, out: Any) -> str:
        names = self.names
        items = out if isinstance(out, (tuple, list)) else (out,)
        outs = []
        for o in items:
            if isinstance(o, (tuple, list)):
                outs.extend((names.get(t.dtype, "other"), None) for t in o if hasattr(t, "dtype"))
            elif hasattr(o, "dtype") and hasattr(o, "shape"):
                outs.append((names.get(o.dtype, "other"), list(o.shape)))
        return format_outputs(outs)

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        # Its own time, outside the op, is summed (self_ns), for the step model to take off the
        # CPU (host_cost_ns); a lost update between threads costs one op's worth, no more.
        t0 = time.perf_counter_ns()
        self.dispatches += 1
        plan = self.plans.get(func)
        if plan is None:
            plan = self.plans[func] = _plan(func)
        if plan.skip:
            self.self_ns += time.perf_counter_ns() - t0
            return func(*args, **kwargs)
        self.recorded += 1
        return self._record(func, plan, args, kwargs, t0)

    def _record(self, func: Any, plan: _Plan, args: tuple, kwargs: dict, t0: int) -> Any:
        try:
            text = self.describe(plan, args, kwargs)
        except Exception:  # an argument of a kind not foreseen: the op name alone, never a crash
            text = plan.name
        known = self.outputs.get(text)
        if self.count_threads:
            counts = self.per_thread.setdefault(threading.get_ident(), {})
            counts[plan.name] = counts.get(plan.name, 0) + 1
        shown, op_id = text, None
        if plan.producer or plan.consumer:
            try:
                shown, op_id = self._with_ids(plan, text, args)
            except Exception:  # provenance is a nicety: never break the user's program for it
                shown, op_id = text, None
        self.push(shown + " out=" + known if known else shown)
        self.self_ns += time.perf_counter_ns() - t0
        try:
            out = func(*args, **kwargs)
        finally:
            t2 = time.perf_counter_ns()
            self.pop()
        if op_id is not None and plan.producer:
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if hasattr(o, "shape"):
                    try:
                        self.made_by[o] = op_id
                    except TypeError:  # an output that takes no weak reference
                        pass
        if known is None and len(self.outputs) < _SIGNATURE_CACHE_MAX:
            # Outputs are known only after the call; later calls with these inputs carry them.
            self.outputs[text] = self._outputs(out)
        self.self_ns += time.perf_counter_ns() - t2
        return out

    def host_cost_ns(self) -> float:
        """The host time the recorder has added so far: its own time outside the ops, and the
        cost of entering and leaving its handler for every op it saw (``entry_ns``, measured by
        probe_cost_ns; 0 without the probe)."""
        return float(self.self_ns) + self.dispatches * self.entry_ns

    def _with_ids(self, plan: _Plan, text: str, args: tuple) -> tuple[str, int]:
        """``text`` with emit_nvtx's ``op_id = N`` and, for a consumer, ``input_op_ids`` naming
        the producer of its first tensor input, so the add -> norm pairs are found as in
        emit_nvtx traces. The signature cache keeps using ``text`` without them."""
        with self.id_lock:  # backward ops run on autograd's threads
            self.next_id += 1
            op_id = self.next_id
        head, sep, tail = text.partition(MARKER)
        ids = f", op_id = {op_id}"
        if plan.consumer:
            first = next((a for a in args if hasattr(a, "shape")), None)
            producer = self.made_by.get(first, 0) if first is not None else 0
            ids += f", input_op_ids = [({producer}, 0)]"
        return head + ids + sep + tail, op_id

    def off_main_thread(self) -> dict[str, int]:
        """Ops recorded on threads other than the one that created the recorder (with
        ``count_threads``): the autograd engine's device threads."""
        total: dict[str, int] = {}
        for tid, counts in self.per_thread.items():
            if tid != self.main_thread:
                for k, v in counts.items():
                    total[k] = total.get(k, 0) + v
        return total


def nvtx_functions() -> tuple[Callable[[str], Any], Callable[[], Any]]:
    """(push, pop): torch's own NVTX binding (one C call each), else the ``nvtx`` package."""
    try:
        from torch._C import _nvtx
        return _nvtx.rangePushA, _nvtx.rangePop
    except ImportError:
        pass
    try:
        import nvtx  # a CPU-only torch has no NVTX binding
    except ImportError:
        raise RuntimeError("no NVTX to write to: this torch has no CUDA NVTX binding and the "
                           "nvtx package is not installed") from None
    return (lambda msg: nvtx.push_range(msg)), nvtx.pop_range


def nvtx_mark() -> Optional[Callable[[str], Any]]:
    """torch's NVTX mark (one C call), else the ``nvtx`` package's; None without either."""
    try:
        from torch._C import _nvtx
        return _nvtx.markA
    except (ImportError, AttributeError):
        pass
    try:
        import nvtx
    except ImportError:
        return None
    return lambda msg: nvtx.mark(msg)


def probe_cost_ns(rec: AtenRecorder, ops: int = 200, rounds: int = 3) -> float:
    """The host time ``rec`` adds to one op, here and now (this machine, this profiler): a small
    CPU op run ``ops`` times without the recorder and with it, the fastest of ``rounds`` each.
    Sets ``rec.entry_ns``, the part of it the recorder cannot time itself (entering the Python
    handler from the dispatcher and leaving it), and leaves its counters at zero. Measured rather
    than a constant: it is Python's cost, and these machines' CPU speed changes from one process
    to the next (on the H200 corpus up to 1.8x); under Nsight Systems the NVTX calls cost more
    again. The probe's ops are recorded like any other, before the script starts."""
    import torch
    a, b = torch.ones(4), torch.ones(4)

    def loop() -> int:
        t0 = time.perf_counter_ns()
        for _ in range(ops):
            torch.add(a, b)
        return time.perf_counter_ns() - t0
    loop()
    plain = min(loop() for _ in range(rounds))
    with rec.mode:
        loop()  # the first call builds the op's formatting plan
        best, own = None, 0.0
        for _ in range(rounds):
            before = rec.self_ns
            t = loop()
            if best is None or t < best:
                best, own = t, (rec.self_ns - before) / ops
    cost = max(0.0, (best - plain) / ops)
    rec.entry_ns = max(0.0, cost - own)
    rec.dispatches = rec.recorded = rec.self_ns = 0
    return cost


@contextlib.contextmanager
def recorder(push: Optional[Callable[[str], Any]] = None, pop: Optional[Callable[[], Any]] = None,
             count_threads: bool = False, probe: bool = False) -> Iterator[AtenRecorder]:
    """Record every aten op run while the block is active (backward ops included).

    ``push``/``pop``: where ranges go (default: NVTX, :func:`nvtx_functions`). ``probe``: measure
    the recorder's own cost (:func:`probe_cost_ns`) first, and when the block ends leave its host
    cost per recorded op over the block (AtenRecorder.host_cost_ns) in the trace as an NVTX mark
    (RECORDER_COST_MARK), for the step model to take off the CPU."""
    if push is None or pop is None:
        push, pop = nvtx_functions()
    rec = AtenRecorder(push, pop, count_threads=count_threads)
    mark = nvtx_mark() if probe else None
    if probe:
        probe_cost_ns(rec)
    try:
        with rec.mode:
            yield rec
    finally:
        if mark is not None and rec.recorded:
            mark(f"{RECORDER_COST_MARK}{rec.host_cost_ns() / rec.recorded:.0f}")


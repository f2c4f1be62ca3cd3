"""The op record: the few ops the replacement rules need, from one iteration of the calibration run.

The rules that replace work by library work (PK301 SDPA for a written-out attention, PK201 a
fused optimizer, PK106 cuDNN's LSTM for a cell loop, PK104 pinned copies, PK302 TF32/bf16 GEMMs)
price the replacement best when it is timed at the program's own shapes
(:mod:`profkit.capture.replacements`). Those shapes come from here: during the calibration run
(``bootstrap --calibrate FILE --record-ops FILE``) one iteration is watched and only these ops are
kept, aggregated into unique shapes with their counts:

* GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``): batch, M, N, K, element type, and the
  operands' layout (``layout``: ``N`` for a row-major operand, ``T`` for a transposed view, the
  left operand's letter first: ``nn.Linear`` is ``NT``; on Hopper, TF32 runs the layouts at
  different speeds, a ViT-B/16's ``NT`` projections timed as ``NN`` 1.2-1.7x too slow); and those of
  ``nn.MultiheadAttention``'s and ``nn.TransformerEncoderLayer``'s inference fast paths, which run
  as one op (their projections and feed-forward, from the weights' shapes);
* attention on the math path: a batched GEMM whose output reaches a softmax (through views, a
  scale, a mask, a cast) whose output is the left operand of a second batched GEMM: batch x
  heads, the query and key lengths, the head sizes, the element type, whether the inputs
  required gradients, and the mask: ``causal`` where the mask applied between the GEMM and the
  softmax (``masked_fill``, ``where``, an added mask) is the upper triangle (read from four of its
  elements: one device-to-host read per shape, never during a CUDA-graph capture), ``masked``
  for another mask, ``none`` without one; and the dropout applied to the probabilities in training
  (``dropout``: its p, where ``native_dropout`` ran between the softmax and the second GEMM);
* host<->device copies (``_to_copy``, ``copy_``, under inference mode ``to``, between the CPU and
  another device): bytes,
  direction, whether the host side is pinned, ``non_blocking``, and ``weights`` (present, true,
  where the host tensor of a host-to-device copy is an ``nn.Parameter`` or a parameter or buffer
  of a module the program called: weights streamed from host memory, as a CPU offload does);
* ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell`` calls (a global module forward hook): sizes,
  batch, element type, calls per iteration of each cell, and ``fed_by`` (the index of the cell
  whose output h is its input at every step: a stacked layer);
* each optimizer's step (a global optimizer step pre-hook): its class, ``foreach``/``fused`` as
  constructed, the parameters' element counts (unique sizes with counts), element type, device;
* the ops that make the host wait for the GPU (``.item()``, ``bool()`` of a device tensor, a
  boolean mask's ``nonzero``, a blocking copy to the host), each with the program's line that
  ran it and the torch API it went through (:mod:`profkit.capture.syncsites`); on a GPU also the
  waits torch's own code made (inside an op's implementation, or outside the ops the dispatch
  shows), found by CUDA's sync debug mode (``sync_watch`` true where it ran);
* fused attention (``F.scaled_dot_product_attention``, its backend's op): batch x heads, the
  query and key lengths, the head sizes, the element type, the mask, whether its inputs
  required gradients, the dropout (``sdpa``);
* at the iteration's first optimizer step, the parameters that hold gradients no optimizer
  steps, per root module (:mod:`profkit.capture.unstepped`: a teacher never frozen);
* the DataLoader's fetches from a map-style dataset (:mod:`profkit.capture.loaders`): whether
  it reads a batch one row at a time, each fetch's time, and a TensorDataset's same rows read
  with one gather and its whole size (``table_bytes``);
* the ops that compute on host tensors (``host_ops``: every tensor they take and return in
  CPU memory, an output of ``HOST_OP_MIN_BYTES`` or more: an embedding table looked up and
  updated on the CPU, a metric over host arrays), per op: calls, the time the op itself took
  (timed around it, the record's own work left out) and its output's bytes;
* whether autograd's anomaly detection is on (``anomaly``: the ops seen while it was, and whether
  it checks the backward's gradients for NaN): a debugging mode that keeps a Python stack per
  autograd node and reads every backward node's gradients back to the host;
* 2-D and 3-D convolutions (``convolution`` of a 4-D or 5-D input, forward: its backward is
  priced from it):
  the input's and weight's shapes, stride, padding, dilation, groups, element type, whether the
  input is channels_last, whether input or weight required gradients, and whether cuDNN may use
  TF32 (``torch.backends.cudnn.allow_tf32``) as the program ran them;
* the ops whose every input is a parameter or buffer nothing writes, or such an op's output
  (``invariant``, :mod:`profkit.capture.invariant`): int8 weights dequantized at every call, a
  weight normalisation recomputed at inference, a frozen weight cast at every step; per kind:
  the op, its input's and output's element types, the output's size, the count, the bytes
  written and the GPU time (CUDA events around each, read when the run is over);
* whether the iteration ran a backward (``backward``: an op under an autograd node);
* each outermost module call (no other module's forward running: :mod:`profkit.capture.roots`):
  per module holding parameters, its class, calls, parameters' elements, and whether every call
  took a slice of one tensor (``sliced_input``: a loop over the chunks of one batch) or the same
  tensor (``same_input``: a guided sampler's two calls), neither said of calls fed what an
  earlier one made (a decode loop).

Which iteration: the third start of the first top-level NVTX range to start three times (the step
range when ``--step`` names it), up to that range's next start. The calibration leaves the first
three periods of a run out as warm-up (profkit.run.iterations.warm_up_count), so the slower
recorded period is never one the model is calibrated to. Only one iteration is watched, so the
record stays small whatever the program's length. A program that has run torch.compile'd code by
then is not recorded at all (a note says so): the record's dispatch mode and module hooks would
make its compiled frames recompile or run eagerly, and the calibration run would not time the
program as it runs.

A recorder must never break the program: the ops run first and the record is taken after, inside
a ``try``; the first failure turns the record off for the rest of the run and is kept as a
one-line note. What it writes (``profkit-oprecord/1``)::

    {"format": "profkit-oprecord/1", "range": "train_step", "iteration": 3, "device": "cuda",
     "ops_seen": 1234, "cost_ns": 2100000, "notes": [],
     "gemm": [{"op": "bmm", "batch": 32, "m": 2048, "n": 2048, "k": 64, "dtype": "bf16",
               "layout": "NT", "count": 12}, ...],
     "attention": [{"batch": 32, "sq": 2048, "sk": 2048, "d": 64, "dv": 64, "dtype": "bf16",
                    "mask": "causal", "grad": true, "count": 12}, ...],
     "copy": [{"direction": "h2d", "bytes": 8388608, "pinned": false, "non_blocking": false,
               "count": 2}, ...],
     "rnn_cell": [{"cell": "LSTMCell", "input": 256, "hidden": 512, "batch": 64, "bias": true,
                   "dtype": "fp32", "grad": false, "calls": 256}, ...],
     "optimizer": [{"class": "AdamW", "foreach": null, "fused": null, "dtype": "fp32",
                    "device": "cuda", "params": 147, "numel": 124439808,
                    "sizes": [[589824, 48], ...], "options": {"amsgrad": false, ...}}, ...],
     "conv": [{"input": [128, 40, 56, 56], "weight": [40, 1, 7, 7], "stride": [1, 1],
               "padding": [3, 3], "dilation": [1, 1], "groups": 40, "dtype": "fp32",
               "channels_last": false, "grad": true, "tf32": true, "count": 2}, ...],
     "sync": [{"op": "item", "file": "train.py", "line": 88, "function": "rollout",
               "via": "torch/distributions/distribution.py:__init__", "count": 128},
              {"op": "in op", "inside": "torch/ao/quantization/fake_quantize.py:forward",
               "file": "train.py", "line": 53, "function": "forward",
               "via": "torch/nn/modules/module.py:_wrapped_call_impl", "count": 27}, ...],
     "sync_watch": true,
     "unstepped": [{"module": "Encoder", "tensors": 201, "elements": 109484547}],
     "loader": [{"dataset": "TensorDataset", "rows": 4096, "per_row": true, "fetches": 1,
                 "fetch_ns": 41300000, "row_ns": 15200000, "batched_ns": 210000, "table_bytes": 260000000}],
     "host_ops": [{"op": "_sparse_coalesce", "count": 2, "ns": 21400000, "bytes": 61865984}, ...],
     "anomaly": [{"ops": 1893, "check_nan": true}],
     "backward": false,
     "invariant": [{"op": "to", "from": "int8", "dtype": "bfloat16", "numel": 11534336, "count": 24,
                    "bytes": 553648128, "gpu_ns": 812000, "timed": 24}, ...],
     "root_calls": [{"module": "Field", "calls": 64, "params": 595844, "sliced_input": true,
                     "same_input": false, "shape_calls": 64}]}
"""
from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from profkit.capture import loaders, unstepped
from profkit.capture.invariant import Invariants, storage_key
from profkit.capture.roots import RootCalls
from profkit.capture.syncsites import SyncSites, SyncWatch, waits

FORMAT = "profkit-oprecord/1"
RECORD_AT = 3           # the start (1-based) of the repeated range whose period is recorded
MAX_TRACKED = 4096      # tensors followed from a score GEMM towards its softmax, at most
MASK_LARGE_NEGATIVE = -1e4  # an added mask's value that masks a score
# An op on host tensors with an output this large is work a GPU could take (an index, a scalar's
# bookkeeping or a shape computation is not)
HOST_OP_MIN_BYTES = 4096

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}


def layout(t: Any) -> str:
    """``T`` for a GEMM operand that is a transposed view (its last two dimensions' strides
    swapped: ``weight.t()``), ``N`` otherwise."""
    if t.dim() < 2 or t.shape[-1] == 1 or t.shape[-2] == 1:
        return "N"
    return "T" if t.stride(-2) == 1 and t.stride(-1) != 1 else "N"
# nn.MultiheadAttention's and nn.TransformerEncoderLayer's inference fast paths: one op whose
# projections (and feed-forward) are GEMMs the dispatch never shows on their own
FUSED_LAYERS = {"_native_multi_head_attention", "_transformer_encoder_layer_fwd"}
SOFTMAX = {"_softmax", "softmax", "_safe_softmax"}
MASKING = {"masked_fill", "masked_fill_", "where", "add", "add_"}
# (``to`` is what the dispatch shows under inference mode: ``.cpu()``, ``.to(device)``)
COPIES = {"_to_copy", "copy_", "to"}
CONVS = {"convolution"}
# F.scaled_dot_product_attention as the dispatch shows it: the backend's op, or the composite
# itself under inference mode; (the attention mask's position, dropout's, is_causal's) in its args
SDPA_OPS = {"scaled_dot_product_attention": (3, 4, 5), "_scaled_dot_product_efficient_attention": (3, 5, 6),
            "_scaled_dot_product_flash_attention": (None, 3, 4), "_scaled_dot_product_cudnn_attention": (3, 5, 6),
            "_scaled_dot_product_flash_attention_for_cpu": (None, 3, 4)}
# What the dispatch shows instead of the ops above where autograd does not lower it (inference mode)
COMPOSITE_GEMMS = {"linear", "matmul"}
COMPOSITE_CONVS = {"conv1d", "conv2d", "conv3d"}
DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
OPTIONS = ("momentum", "nesterov", "amsgrad", "weight_decay", "maximize", "dampening")


def dtype_name(dtype: Any) -> str:
    s = str(dtype).replace("torch.", "")
    return DTYPE_NAMES.get(s, s)


def compiled_frames() -> int:
    """How many frames torch.compile (Dynamo) has compiled in this process so far (0 when it was
    never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["frames"].get("ok", 0)) if utils is not None else 0
    except Exception:  # noqa: BLE001 - a torch without the counter: as if nothing was compiled
        return 0


class OpRecord:
    """Watches one iteration (see the module docstring); ``on_push`` is called by the calibration
    clock at every top-level NVTX push of the main thread, ``finish`` after the script."""

    def __init__(self, step: Optional[str] = None) -> None:
        self.step = step
        self.starts: Counter = Counter()
        self.range: Optional[str] = None
        self.active = False
        self.done = False
        self.broken = False
        self.notes: list[str] = []
        self.ops_seen = 0
        self.cost_ns = 0
        self.gemm: Counter = Counter()
        self.attention: Counter = Counter()
        self.copy: Counter = Counter()
        self.conv: Counter = Counter()
        self.sdpa: Counter = Counter()
        self.cells: dict[int, dict] = {}
        self.optimizers: dict[int, dict] = {}
        self.unstepped: Optional[list[dict]] = None
        self.fetches: list[dict] = []
        self.host_ops: dict[str, list[int]] = {}   # op -> [calls, ns, output bytes]
        self.anomaly_ops = 0
        self.anomaly_check_nan = False
        self.watched = False            # the waits were found by CUDA's sync debug mode
        self._invariant: Optional[Invariants] = None
        self._roots = RootCalls()
        self.saw_backward = False
        self.devices: set[str] = set()
        self._mode = None
        self._handles: list = []
        self._tracked = None            # tensor -> ("score"|"probs", info)
        self._cell_out: Any = None      # a cell's output h -> the cell's index in ``cells``
        self._mask_cache: dict = {}
        self._thread = threading.get_ident()
        self.syncs: Optional[SyncSites] = None
        self._watch: Optional[SyncWatch] = None   # CUDA's sync debug mode, where there is one

    # -- when to watch ------------------------------------------------------------------------
    def on_push(self, name: Any) -> None:
        if self.broken and self.active:
            self.stop()      # a failure inside the dispatch handler: the mode is left here
        if self.done or self.broken:
            return
        name = str(name)
        if self.active:
            if name == self.range:   # the next period starts: one iteration was watched
                self.stop()
            return
        if self.step is not None and name != self.step:
            return
        self.starts[name] += 1
        if self.starts[name] == RECORD_AT:
            self.range = name
            self.start()

    def start(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            self.notes.append("the script had not imported torch when the iteration began: nothing recorded")
            self.done = True
            return
        if compiled_frames():
            # Under a dispatch mode and global module hooks, Dynamo's compiled frames recompile
            # (their guards fail) or run eagerly: an HF Llama step compiled with torch.compile
            # ran 57 ms an iteration in the calibration run that recorded its ops, 30 ms without.
            # The calibration must time the program as it runs; a compiled step's own kernels are
            # Inductor's, which the replacements do not stand in for.
            self.notes.append("the script runs torch.compile'd code: its ops are not recorded (recording them "
                              "would make its compiled frames recompile or run eagerly in the calibration run)")
            self.done = True
            return
        try:
            from torch.utils._python_dispatch import TorchDispatchMode
            from torch.utils.weak import WeakIdKeyDictionary
            owner = self

            class _Mode(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    kwargs = kwargs or {}
                    inv = owner.invariant_before(func, args, kwargs)
                    watch = owner._watch
                    synced = watch.count if watch is not None else 0
                    if watch is not None:
                        watch.in_op = True
                    t0 = time.perf_counter_ns()
                    try:
                        out = func(*args, **kwargs)   # the program's op first, whatever happens here
                    finally:
                        if watch is not None:
                            watch.in_op = False
                    ns = time.perf_counter_ns() - t0
                    owner.invariant_after(func, out, inv)
                    owner.see(func, args, kwargs, out, ns,
                              None if watch is None else watch.count != synced)
                    owner.root_op(args, kwargs, out)
                    return out

            self.syncs = SyncSites()
            self._tracked = WeakIdKeyDictionary()
            self._cell_out = WeakIdKeyDictionary()
            self._mode = _Mode()
            self._mode.__enter__()
            self.active = True
            watch = SyncWatch(self.syncs)
            self._watch = watch if watch.start() else None
            import torch.nn.modules.module as nn_module
            import torch.optim.optimizer as optim_module
            self._invariant = Invariants()
            self._handles = [nn_module.register_module_forward_hook(self._safe(self._module_hook)),
                             nn_module.register_module_forward_pre_hook(self._safe(self._module_pre_hook)),
                             optim_module.register_optimizer_step_pre_hook(self._safe(self._optimizer_hook))]
            undo = loaders.watch(torch, self._safe(self._fetch))
            if undo is not None:
                self._handles.append(_Undo(undo))
        except Exception as exc:  # noqa: BLE001 - a record must never break the program
            self._fail(exc, "could not start")
            self.stop()

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        self.done = True
        if self._watch is not None:
            self._watch.stop()
            self.watched = True
            self._watch = None
        if self._invariant is not None and not self.broken:
            try:   # while the program's tensors are alive: at finish() its model may be gone
                self._invariant.close(self.saw_backward)
            except Exception as exc:  # noqa: BLE001 - the rest of the record stands
                self.notes.append(f"op record: invariant ops not kept ({type(exc).__name__}: {exc})"[:200])
                self._invariant = None
        for h in self._handles:
            with contextlib.suppress(Exception):
                h.remove()
        self._handles = []
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                self.notes.append(f"the record's dispatch mode could not be left cleanly "
                                  f"({type(exc).__name__}: {exc})"[:200])
            self._mode = None
        self._tracked = None

    # -- loop-invariant ops (profkit.capture.invariant) -------------------------------------
    def _module_pre_hook(self, module: Any, inputs: tuple) -> None:
        if threading.get_ident() != self._thread or self.broken:
            return
        if self._invariant is not None:
            self._invariant.note_module(module)
        self._roots.pre(module, inputs)

    def root_op(self, args: tuple, kwargs: dict, out: Any) -> None:
        """The data between the outermost module calls (profkit.capture.roots); never raises."""
        if not self.active or self.broken or threading.get_ident() != self._thread:
            return
        try:
            self._roots.op((args, kwargs), out)
        except Exception as exc:  # noqa: BLE001 - a record must never break the program
            self._fail(exc, "failed following the data between module calls")

    def invariant_before(self, func: Any, args: tuple, kwargs: dict) -> Optional[tuple]:
        """(what Invariants.before found, the timing events) of an op about to run that is
        invariant, else None; never raises (the program's op runs next, whatever happens here)."""
        if not self.active or self.broken or self._invariant is None:
            return None
        try:
            torch = sys.modules["torch"]
            found = self._invariant.before(func.__name__.split(".")[0], args, kwargs, torch)
            return None if found is None else (found, self._invariant.events(torch))
        except Exception as exc:  # noqa: BLE001 - a record must never break the program
            self._fail(exc, "failed before an op")
            return None

    def invariant_after(self, func: Any, out: Any, inv: Optional[tuple]) -> None:
        if not self.active or self.broken or self._invariant is None:
            return
        try:
            torch = sys.modules["torch"]
            if self._autograd_node() is not None:
                self.saw_backward = True
            self._invariant.after(func.__name__.split(".")[0], out, None if inv is None else inv[0],
                                  None if inv is None else inv[1], torch)
        except Exception as exc:  # noqa: BLE001 - a record must never break the program
            self._fail(exc, f"failed after {getattr(func, '__name__', func)}")

    def _fail(self, exc: BaseException, where: str) -> None:
        """Turn the record off for the rest of the run, with a note. The hooks go at once; the
        dispatch mode, which cannot be left from inside its own handler (torch takes it off the
        stack while the handler runs), passes every op through until the next top-level range
        starts, or the script ends."""
        if self.broken:
            return
        self.broken = True
        self.notes.append(f"op record {where}: {type(exc).__name__}: {exc}"[:200])
        for h in self._handles:
            with contextlib.suppress(Exception):
                h.remove()
        self._handles = []

    def _safe(self, hook: Any) -> Any:
        """``hook`` as torch calls it, its failures a note: never the program's exception."""
        def safe(*args: Any) -> None:
            try:
                hook(*args)
            except Exception as exc:  # noqa: BLE001 - a record must never break the program
                self._fail(exc, f"failed in {getattr(hook, '__name__', 'a hook')}")
        return safe

    # -- what is kept -------------------------------------------------------------------------
    def see(self, func: Any, args: tuple, kwargs: dict, out: Any, ns: int = 0,
            synced: Optional[bool] = None) -> None:
        """Keep what ``func`` (an aten op the program ran) tells; ``synced``: whether CUDA's sync
        debug mode saw it make the host wait (None without the watch)."""
        if not self.active or self.broken:
            return
        t0 = time.perf_counter_ns()
        try:
            self.ops_seen += 1
            name = func.__name__.split(".")[0]
            torch = sys.modules["torch"]
            self._host(torch, name, args, out, ns)
            if torch.is_anomaly_enabled():
                self.anomaly_ops += 1
                self.anomaly_check_nan = self.anomaly_check_nan or torch.is_anomaly_check_nan_enabled()
            # Backward ops read the forward's saved tensors (the probabilities, transposed):
            # the attention is the forward's pattern, its backward is priced from it.
            backward = self._autograd_node() is not None
            wait = None if backward else waits(name, args, kwargs)
            if wait is not None:
                self.syncs.note(wait)
            elif synced and name not in COPIES:
                # a wait that no op's name gives away is the op's own (a read inside its
                # implementation); named waits and blocking copies are noted by what they are,
                # with or without the watch, so a watch that sees nothing loses nothing
                self.syncs.note("in op", name)
            if name in GEMMS:
                self._gemm(name, args, out, backward)
            elif name in COMPOSITE_GEMMS:
                self._composite_gemm(name, args, kwargs, out)
            elif name in COMPOSITE_CONVS:
                self._conv(_as_convolution(args, kwargs))
            elif name in SDPA_OPS and not backward:
                self._sdpa(name, args, kwargs)
            elif name in FUSED_LAYERS:
                self._fused_layer(name, args)
            elif backward:
                return
            elif name in CONVS:
                self._conv(args)
            elif name in COPIES:
                self._copy(func, args, kwargs, out)
                # A cast on the device (autocast's fp32 softmax, `.to(q.dtype)` after it) is a
                # step between the GEMM and the softmax like any other.
                self._follow(args, out)
            elif name in SOFTMAX:
                self._follow(args, out, to="probs")
            elif name == "native_dropout" and len(args) > 2 and bool(args[2]):
                # native_dropout(input, p, train): SDPA draws the same dropout inside its kernels
                self._follow(args, out, dropout=float(args[1]))
            else:
                self._follow(args, out, masking=name in MASKING)
        except Exception as exc:  # noqa: BLE001 - a record must never break the program
            self._fail(exc, f"failed at {getattr(func, '__name__', func)}")
        finally:
            self.cost_ns += time.perf_counter_ns() - t0

    def _host(self, torch: Any, name: str, args: tuple, out: Any, ns: int) -> None:
        """An op whose tensors all live in host memory, with an output worth a GPU's work."""
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        nbytes = sum(_stored_bytes(torch, t) for t in outs)
        if nbytes < HOST_OP_MIN_BYTES:
            return
        ins = [t for a in args for t in (a if isinstance(a, (tuple, list)) else (a,)) if isinstance(t, torch.Tensor)]
        if any(t.device.type != "cpu" for t in (*ins, *outs)):
            return
        if any(_same_storage(o, i) for o in outs for i in ins):
            return   # a view or the input itself (``detach``, ``to`` its own dtype): no work done
        row = self.host_ops.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += int(ns)
        row[2] += int(nbytes)

    @staticmethod
    def _autograd_node() -> Any:
        import torch
        return torch._C._current_autograd_node()

    def _gemm(self, name: str, args: tuple, out: Any, backward: bool = False) -> None:
        a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
        batch = math.prod(int(d) for d in a.shape[:-2]) if a.dim() >= 3 else 1
        m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
        dt = dtype_name(a.dtype)
        self.devices.add(a.device.type)
        self.gemm[(name, batch, m, n, k, dt, layout(a) + layout(b))] += 1
        if a.dim() < 3 or backward:
            return
        first = self._tracked.get(a)
        if first is not None and first[0] == "probs":
            info = first[1]
            grad = bool(info["grad"] or a.requires_grad or b.requires_grad)
            self.attention[(info["batch"], info["sq"], info["sk"], info["d"], n, info["dtype"],
                            info["mask"], grad, info.get("dropout", 0.0))] += 1
            return
        if len(self._tracked) < MAX_TRACKED:
            self._tracked[out] = ("score", {"batch": batch, "sq": m, "sk": n, "d": k, "dtype": dt,
                                            "mask": "none",
                                            "grad": bool(a.requires_grad or b.requires_grad)})

    def _sdpa(self, name: str, args: tuple, kwargs: dict) -> None:
        """A fused attention call (SDPA's backend op): batch x heads, the query and key lengths,
        the head sizes, the element type, the mask (``causal``, ``causal_mask`` for a mask tensor
        that says exactly that, ``masked`` for another attention mask, ``none``), whether its inputs required gradients. PK302 prices an fp32 one in bf16 from
        them (flash attention's FLOPs and bytes)."""
        import torch
        q, k, v = args[0], args[1], args[2]
        if q.dim() < 3:
            return
        at_mask, at_drop, at_causal = SDPA_OPS[name]

        def arg(i, keys, default=None):
            if i is not None and len(args) > i:
                return args[i]
            return next((kwargs[key] for key in keys if key in kwargs), default)
        mask = arg(at_mask, ("attn_mask", "attn_bias"))
        causal = bool(arg(at_causal, ("is_causal",), False))
        drop = float(arg(at_drop, ("dropout_p",), 0.0) or 0.0)
        batch = math.prod(int(d) for d in q.shape[:-2])
        grad = bool(torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        self.devices.add(q.device.type)
        kind = "causal" if causal else "none" if mask is None else self._sdpa_mask_kind(mask, q.shape[-2], k.shape[-2])
        self.sdpa[(batch, int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1]), int(v.shape[-1]),
                   dtype_name(q.dtype), kind, grad, round(drop, 4))] += 1

    def _sdpa_mask_kind(self, mask: Any, sq: int, sk: int) -> str:
        """``causal_mask`` when SDPA's mask tensor says exactly what ``is_causal=True`` does (every
        slice the lower triangle kept: True or 0 below and on the diagonal, False or a large
        negative above), else ``masked``. A mask tensor keeps SDPA off its flash kernels, which
        skip the hidden half; ``is_causal`` would not. One comparison on the device per mask
        (keyed by its storage, shape and strides: a buffer sliced afresh each call is one mask),
        never during a CUDA graph's capture."""
        import torch
        if not isinstance(mask, torch.Tensor) or sq != sk or sq < 2 or mask.dim() < 2 \
                or tuple(mask.shape[-2:]) != (sq, sk):
            return "masked"

        def exactly_causal() -> bool:
            keep = torch.ones(sq, sk, dtype=torch.bool, device=mask.device).tril()
            kept = mask if mask.dtype == torch.bool else mask > MASK_LARGE_NEGATIVE
            return bool((kept.reshape(-1, sq, sk) == keep).all())
        key = ("sdpa", mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), str(mask.dtype))
        return self._read_mask(key, exactly_causal, "causal_mask")

    def _read_mask(self, key: tuple, causal: Callable[[], bool], kind: str) -> str:
        """``kind`` where ``causal()`` (which reads the mask on its device) says the mask hides
        exactly the upper triangle, else ``masked``: once per ``key``, never during a CUDA graph's
        capture (a read there would break it), and ``masked`` where the read fails."""
        import torch
        if key not in self._mask_cache:
            found = "masked"
            with contextlib.suppress(Exception):
                if not (torch.cuda.is_available() and torch.cuda.is_initialized()
                        and torch.cuda.is_current_stream_capturing()) and causal():
                    found = kind
            self._mask_cache[key] = found
        return self._mask_cache[key]

    def _composite_gemm(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """``linear`` and ``matmul`` as the dispatch shows them where autograd does not lower
        them (under ``torch.inference_mode()`` the Python dispatch mode sees ``aten.linear``,
        not the ``addmm`` it becomes: a BERT encoder's forward under inference mode left no GEMM
        in the record, and its fp32 GEMMs were priced from the peaks). Kept as the GEMM they run:
        ``linear`` as ``addmm`` (``mm`` without a bias) over the input's rows against the
        transposed weight; ``matmul`` of two matrices as ``mm``, of batches as ``bmm``."""
        a, b = args[0], args[1]
        if name == "linear":
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if a.dim() < 1 or b.dim() != 2:
                return
            rows = math.prod(int(d) for d in a.shape[:-1]) if a.dim() > 1 else 1
            self.devices.add(a.device.type)
            self.gemm[("addmm" if bias is not None else "mm", 1, rows, int(b.shape[0]), int(b.shape[1]),
                       dtype_name(a.dtype), "NT")] += 1
            return
        if a.dim() < 2 or b.dim() < 2:
            return      # a vector product: no GEMM of the kind the replacements time
        self._gemm("bmm" if a.dim() >= 3 or b.dim() >= 3 else "mm", (a, b), out)

    def _fused_layer(self, name: str, args: tuple) -> None:
        """The GEMMs of a fused attention (or encoder) layer, from its inputs' and weights' shapes:
        the Q/K/V projection (one GEMM when query, key and value are one tensor), the output
        projection, and an encoder layer's two feed-forward GEMMs. A ViT-B/16's attention
        projections, about a third of its fp32 GEMM time, were missing from the record."""
        import torch
        q = args[0]
        if not isinstance(q, torch.Tensor) or q.is_nested or q.dim() != 3:
            return
        if name == "_native_multi_head_attention":
            k, v, w_qkv, w_out = args[1], args[2], args[5], args[7]
        else:   # _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, ...)
            k = v = q
            w_qkv, w_out = args[3], args[5]
        e = int(w_out.shape[0])
        dt = dtype_name(q.dtype)
        self.devices.add(q.device.type)
        rows = lambda t: int(t.shape[0]) * int(t.shape[1])   # noqa: E731 - batch x sequence
        if k is q and v is q:
            self.gemm[("addmm", 1, rows(q), int(w_qkv.shape[0]), e, dt, "NT")] += 1
        else:
            for t in (q, k, v):
                self.gemm[("addmm", 1, rows(t), e, e, dt, "NT")] += 1
        self.gemm[("addmm", 1, rows(q), e, e, dt, "NT")] += 1
        if name == "_transformer_encoder_layer_fwd" and len(args) > 16:
            w1 = args[14]
            f = int(w1.shape[0])
            self.gemm[("addmm", 1, rows(q), f, e, dt, "NT")] += 1
            self.gemm[("addmm", 1, rows(q), e, f, dt, "NT")] += 1

    def _follow(self, args: tuple, out: Any, to: Optional[str] = None, masking: bool = False,
                dropout: Optional[float] = None) -> None:
        """Carry a score GEMM's mark through the ops between it and the softmax (views, scale,
        mask, cast, dropout), and from the softmax to the second GEMM's operand."""
        import torch
        src = None
        for x in args:
            if isinstance(x, torch.Tensor):
                src = self._tracked.get(x)
                if src is not None:
                    break
        if src is None:
            return
        stage, info = src
        if to is not None:
            if stage != "score":
                return
            stage = to
        elif masking and stage == "score":
            info = {**info, "mask": self._mask_kind(args, info)}
        elif dropout is not None and stage == "probs":
            info = {**info, "dropout": dropout}
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs[:1]:   # dropout's mask, a max's indices: not the scores
            if isinstance(o, torch.Tensor) and len(self._tracked) < MAX_TRACKED:
                self._tracked[o] = (stage, info)

    def _mask_kind(self, args: tuple, info: dict) -> str:
        """``causal`` when the mask applied to the scores hides exactly the upper triangle (four
        elements read: above and below the diagonal at both ends), else ``masked``."""
        import torch
        sq, sk = info["sq"], info["sk"]
        tensors = [x for x in args if isinstance(x, torch.Tensor)]
        if len(tensors) < 2 or sq != sk or sq < 2:
            return "masked" if len(tensors) >= 2 else info["mask"]
        scores = next((x for x in tensors if self._tracked.get(x) is not None), tensors[0])
        mask = next((x for x in tensors if x is not scores and x.dim() >= 2
                     and tuple(x.shape[-2:]) == (sq, sk)), None)
        if mask is None:
            return "masked"
        def corners_causal() -> bool:
            m2 = mask.reshape(-1, sq, sk)[0]
            vals = torch.stack([m2[0, 1], m2[1, 0], m2[sq - 2, sk - 1], m2[sq - 1, sk - 2]])
            if vals.dtype == torch.bool:
                hidden = vals.tolist()
                if args and args[0] is mask:       # where(keep, scores, -inf): True keeps
                    hidden = [not v for v in hidden]
            else:                                  # an added mask: a large negative hides
                hidden = [v < MASK_LARGE_NEGATIVE for v in vals.float().tolist()]
            return hidden == [True, False, True, False]
        return self._read_mask((id(mask), sq, sk), corners_causal, "causal")

    def _conv(self, args: tuple) -> None:
        """aten.convolution(input, weight, bias, stride, padding, dilation, transposed,
        output_padding, groups): a 2-D or 3-D, not transposed one is kept."""
        import torch
        x, w = args[0], args[1]
        if x.dim() not in (4, 5) or w.dim() != x.dim() or bool(args[6]):
            return
        self.devices.add(x.device.type)
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        cl = bool(x.is_contiguous(memory_format=fmt) and not x.is_contiguous())
        grad = bool(torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        self.conv[(tuple(int(d) for d in x.shape), tuple(int(d) for d in w.shape),
                   tuple(int(v) for v in args[3]), tuple(int(v) for v in args[4]),
                   tuple(int(v) for v in args[5]), int(args[8]), dtype_name(x.dtype), cl, grad,
                   bool(torch.backends.cudnn.allow_tf32))] += 1

    def _copy(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """A copy between the host and a device; a blocking one to the host is a wait."""
        if func.__name__.split(".")[0] == "copy_":
            dst, src = args[0], args[1]
        else:
            src, dst = args[0], out
        non_blocking = bool(_argument(func, args, kwargs, "non_blocking", False))
        if not hasattr(dst, "device"):
            return
        s, d = src.device.type, dst.device.type
        if s == d or "cpu" not in (s, d):
            return
        host = src if s == "cpu" else dst
        self.devices.add(d if s == "cpu" else s)
        pinned = False
        with contextlib.suppress(Exception):
            pinned = bool(host.is_pinned())
        nbytes = int(src.numel()) * int(src.element_size())
        weights = s == "cpu" and self._is_weight(src)
        self.copy[("h2d" if s == "cpu" else "d2h", nbytes, pinned, non_blocking, weights)] += 1
        if d == "cpu" and s != "meta" and not (pinned and non_blocking):
            self.syncs.note("copy to host")   # the host waits for the copy, and the work before it

    def _is_weight(self, t: Any) -> bool:
        """Whether host tensor ``t`` is a model's weight: an ``nn.Parameter``, or the storage of a
        parameter or buffer of a module called in the watched iteration."""
        nn = getattr(sys.modules.get("torch"), "nn", None)
        if nn is not None and isinstance(t, nn.Parameter):
            return True
        return self._invariant is not None and storage_key(t) in self._invariant.roots

    def _module_hook(self, module: Any, inputs: tuple, output: Any) -> None:
        if threading.get_ident() != self._thread or self.broken:
            return
        self._roots.post(module, output)
        try:
            import torch
            cls = type(module).__name__
            if not isinstance(module, (torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell)):
                return
            x = inputs[0]
            rec = self.cells.get(id(module))
            if rec is None:
                w = module.weight_ih
                self.devices.add(w.device.type)
                rec = {"cell": cls, "input": int(module.input_size), "hidden": int(module.hidden_size),
                       "batch": int(x.shape[0]) if x.dim() == 2 else 1, "bias": bool(module.bias),
                       "dtype": dtype_name(w.dtype),
                       "grad": bool(torch.is_grad_enabled() and w.requires_grad), "calls": 0}
                self.cells[id(module)] = rec
            rec["calls"] += 1
            # Stacked cells (layer 2 steps on layer 1's h): the fix runs them as one multi-layer
            # nn.LSTM call, so they are timed as one, not as one-layer calls added up.
            index = list(self.cells).index(id(module))
            src = self._cell_out.get(x) if isinstance(x, torch.Tensor) else None
            if src is not None and src != index and rec.get("fed_by", src) == src:
                rec["fed_by"] = src
            elif "fed_by" in rec and src != rec["fed_by"]:
                rec["fed_by"] = None   # fed by something else at another step: not a stack
            h = output[0] if isinstance(output, tuple) else output
            if isinstance(h, torch.Tensor):
                self._cell_out[h] = index
        except Exception as exc:  # noqa: BLE001
            self._fail(exc, "failed in a cell's forward hook")

    def _fetch(self, fetcher: Any, index: Any, ns: int) -> None:
        if self.active and not self.broken and threading.get_ident() == self._thread:
            import torch
            self.fetches.append(loaders.entry(torch, fetcher, index, ns))

    def _optimizer_hook(self, opt: Any, args: tuple, kwargs: dict) -> None:
        if id(opt) in self.optimizers or self.broken:
            return
        try:
            if self.unstepped is None:   # at the iteration's first step, every gradient computed
                import torch
                self.unstepped = unstepped.summary(unstepped.find(torch))
            sizes: Counter = Counter()
            dtypes: Counter = Counter()
            device = ""
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    sizes[int(p.numel())] += 1
                    dtypes[dtype_name(p.dtype)] += int(p.numel())
                    device = device or p.device.type
            defaults = getattr(opt, "defaults", {}) or {}
            group0 = opt.param_groups[0] if opt.param_groups else {}
            options = {k: group0[k] for k in OPTIONS
                       if isinstance(group0.get(k), (bool, int, float)) and k in group0}
            self.devices.add(device)
            self.optimizers[id(opt)] = {
                "class": type(opt).__name__, "foreach": defaults.get("foreach"),
                "fused": defaults.get("fused"),
                "dtype": dtypes.most_common(1)[0][0] if dtypes else "",
                "device": device, "params": int(sum(sizes.values())),
                "numel": int(sum(n * c for n, c in sizes.items())),
                "sizes": sorted(([n, c] for n, c in sizes.items()), key=lambda x: -x[0] * x[1]),
                "options": options}
        except Exception as exc:  # noqa: BLE001
            self._fail(exc, "failed in the optimizer's step hook")

    # -- the result ---------------------------------------------------------------------------
    def finish(self) -> dict:
        """The record (the module docstring's format); ends the watch if the run ended in it."""
        if self.active:
            if not self.broken:
                self.notes.append(f"the run ended inside the recorded iteration of `{self.range}`")
            self.stop()
        if self.range is None and not self.notes:
            self.notes.append("no top-level NVTX range started three times: no iteration to record"
                              if self.step is None else
                              f"the range `{self.step}` did not start three times: nothing recorded")
        dev = sorted(d for d in self.devices if d)
        return {
            "format": FORMAT, "range": self.range, "iteration": RECORD_AT if self.range else None,
            "device": next((d for d in dev if d != "cpu"), dev[0] if dev else None),
            "ops_seen": int(self.ops_seen), "cost_ns": int(self.cost_ns), "notes": self.notes,
            "gemm": [{"op": op, "batch": b, "m": m, "n": n, "k": k, "dtype": dt, "layout": lay, "count": c}
                     for (op, b, m, n, k, dt, lay), c in self.gemm.most_common()],
            "attention": [{"batch": b, "sq": sq, "sk": sk, "d": d, "dv": dv, "dtype": dt,
                           "mask": mask, "grad": grad, "count": c, **({"dropout": p} if p else {})}
                          for (b, sq, sk, d, dv, dt, mask, grad, p), c in self.attention.most_common()],
            "copy": [{"direction": dr, "bytes": nb, "pinned": pin, "non_blocking": nbk, "count": c}
                     | ({"weights": True} if w else {})
                     for (dr, nb, pin, nbk, w), c in self.copy.most_common()],
            "rnn_cell": [{k: v for k, v in c.items() if not (k == "fed_by" and v is None)}
                         for c in self.cells.values()],
            "optimizer": list(self.optimizers.values()),
            "conv": [{"input": list(x), "weight": list(w), "stride": list(st), "padding": list(pad),
                      "dilation": list(dil), "groups": gr, "dtype": dt, "channels_last": cl,
                      "grad": grad, "tf32": tf32, "count": c}
                     for (x, w, st, pad, dil, gr, dt, cl, grad, tf32), c in self.conv.most_common()],
            "sync": self.syncs.as_list() if self.syncs is not None else [],
            "sync_watch": bool(self.watched),
            "sdpa": [{"batch": b, "sq": sq, "sk": sk, "d": d, "dv": dv, "dtype": dt, "mask": mask, "grad": grad,
                      "count": c, **({"dropout": p} if p else {})}
                     for (b, sq, sk, d, dv, dt, mask, grad, p), c in self.sdpa.most_common()],
            "unstepped": self.unstepped or [],
            "loader": loaders.summary(self.fetches),
            "host_ops": [{"op": op, "count": c, "ns": ns, "bytes": nb}
                         for op, (c, ns, nb) in sorted(self.host_ops.items(), key=lambda kv: -kv[1][1])],
            "anomaly": ([{"ops": int(self.anomaly_ops), "check_nan": bool(self.anomaly_check_nan)}]
                        if self.anomaly_ops else []),
            "backward": bool(self.saw_backward) if self.range else None,
            "invariant": self._invariant_summary(),
            "root_calls": self._roots.summary()}

    def _invariant_summary(self) -> list[dict]:
        torch = sys.modules.get("torch")
        if self._invariant is None or torch is None or self.broken:
            return []
        try:
            return self._invariant.summary(torch)
        except Exception as exc:  # noqa: BLE001 - the rest of the record stands
            self.notes.append(f"op record: invariant ops not summed ({type(exc).__name__}: {exc})"[:200])
            return []


def _argument(func: Any, args: tuple, kwargs: dict, name: str, default: Any = None) -> Any:
    """The argument ``name`` of an aten op's call, positional or keyword (by its schema)."""
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(getattr(getattr(func, "_schema", None), "arguments", ())):
        if a.name == name:
            return args[i] if i < len(args) else default
    return default


def _same_storage(a: Any, b: Any) -> bool:
    """Whether two strided tensors share their storage."""
    try:
        return a is b or a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0
    except Exception:  # noqa: BLE001 - sparse and other layouts: not the same
        return False


def _stored_bytes(torch: Any, t: Any) -> int:
    """A tensor's stored bytes: a dense one's elements, a sparse COO one's indices and values;
    other layouts count none."""
    if t.layout == torch.strided:
        return t.numel() * t.element_size()
    if t.layout == torch.sparse_coo:
        return t._values().numel() * t.element_size() + t._indices().numel() * 8
    return 0


def _as_convolution(args: tuple, kwargs: dict) -> tuple:
    """``conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups)`` as
    ``convolution``'s arguments (stride, padding and dilation one per spatial dimension;
    ``padding="same"`` as the symmetric padding it takes for an odd kernel, "valid" as none)."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    got = {**defaults, **dict(zip(names, args)), **kwargs}
    x, w = got["input"], got["weight"]
    dims = max(w.dim() - 2, 1)

    def per_dim(v: Any) -> list[int]:
        v = list(v) if isinstance(v, (list, tuple)) else [v] * dims
        return [int(e) for e in (v * dims if len(v) == 1 else v)]
    dil = per_dim(got["dilation"])
    pad = got["padding"]
    if isinstance(pad, str):
        pad = [0] * dims if pad == "valid" else [d * (int(k) - 1) // 2 for d, k in zip(dil, w.shape[2:])]
    return (x, w, got["bias"], per_dim(got["stride"]), per_dim(pad), dil, False, [0] * dims,
            int(got["groups"]))


class _Undo:
    """A patch's undo as a hook handle (``remove()``), kept with the record's hooks."""

    def __init__(self, undo: Any) -> None:
        self.remove = undo


def write(path: str | Path, record: dict) -> None:
    Path(path).write_text(json.dumps(record, separators=(",", ":")))

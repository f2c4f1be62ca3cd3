"""Replacement timings: the library work a rule proposes, timed at the program's own shapes.

    python -m profkit.capture.replacements RECORD.json OUT.json [--device cuda] [--reps N] [--budget S]

``profkit capture`` runs this in a process of its own after the calibration run, so the user's
program is never touched, on the op record of one iteration (:mod:`profkit.capture.oprecord`).
For each recorded shape it times the original and its replacement the way profkit benchmarks
(warm-up runs, a synchronisation, then ``reps`` timed runs each between two CUDA events, or the
host clock around a synchronised run where the host's part is the point; the median and the
range of the runs; on CUDA the timed runs are queued behind a sleep kernel, so that the events
time their GPU work and not the host's launching, and timed unheld too, the lower kept):

* ``attention``: the math path (QK^T, the causal mask where one was recorded, an fp32 softmax,
  the recorded dropout, @V) against ``F.scaled_dot_product_attention`` with that dropout as the
  program would call it (no backend chosen: its time is the replacement's), and under each
  backend ``torch.nn.attention.sdpa_kernel`` offers beside it (flash, cuDNN, memory-efficient),
  forward and backward
  when the program's inputs required gradients (the forward alone is kept beside it). An fp32
  attention on CUDA is replaced in bf16: the fused kernels' fast path is 16-bit;
* ``attention_causal_mask``: an SDPA call given its causal mask as a tensor (the op record's
  ``causal_mask``) against the same call with ``is_causal=True`` instead, both with no backend
  chosen, forward and backward as above: a mask tensor keeps SDPA off the kernels that skip the
  hidden half;
* ``optimizer``: one step of the recorded class over parameters of the recorded sizes, as
  constructed (foreach, or the for-loop where the program had it) against ``fused=True``;
  each step's host time (its call, until it returns) is kept beside;
* ``optimizer_fused_floor``: for a recorded optimizer torch.optim does not have (the program's
  own), ``AdamW(fused=True)`` over the same parameter sizes: what one fused pass costs (the
  program's step is not timed here: its time is the trace's);
* ``rnn``: the cell loop (stacked cells together: :func:`stacks`) over the recorded steps against
  ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` of as many layers over
  the whole sequence; on CUDA the loop is timed as a CUDA graph where it can be captured (its
  kernels back to back: the step model already removes the loop's host time), else as it runs;
* ``copy`` (CUDA only): each recorded host<->device copy from (into) pageable memory against the
  same bytes from (into) a pinned buffer with ``non_blocking=True``, on the host clock with a
  synchronisation (a pageable copy is staged by the CPU);
* ``gemm_tf32`` / ``gemm_bf16``: each fp32 GEMM shape in full fp32 against TF32 and against bf16
  operands, in the operands' recorded layout (``nn.Linear``'s transposed weight: Hopper's TF32
  kernels run it faster than two row-major operands); the casts autocast would add are not
  timed (PK302 prices their CPU apart);
* ``gemm_fp64_fp32`` / ``gemm_fp64_tf32`` / ``gemm_fp64_bf16``: each float64 GEMM shape in
  float64 against float32 operands in full precision, in TF32 and against bf16 operands (PK306's
  three prices);
* ``conv_bf16``: each fp32 2-D or 3-D convolution shape as the program ran it (its memory format,
  cuDNN's TF32 as it was set) against bf16 on channels_last (channels_last_3d) tensors, forward and backward (input and
  weight gradients) where the program's inputs required gradients, the forward alone kept beside
  it (``forward``); cuDNN picks its algorithms as the program's default does (no benchmark mode);
* ``conv_cl``: each of those shapes the program ran on NCHW (NCDHW) tensors against the same
  precision on channels_last (channels_last_3d) tensors, the layout alone: cuDNN's kernels for
  the other layout (grouped and depthwise convolutions run other algorithms there) and no
  transposes around them (PK305's channels_last, PK403's layout).

Each entry (``profkit-replacements/1``; profkit.run.replacements reads it)::

    {"kind": "attention", "key": "b=32 sq=2048 sk=2048 d=64 dv=64 bf16 causal grad",
     "shape": {...the record's fields...}, "count": 12,
     "original_ns": 2325100, "replacement_ns": 412000, "backend": "default",
     "repetitions": 10, "spread": {"original_ns": [lo, hi], "replacement_ns": [lo, hi]},
     "forward": {"original_ns": ..., "replacement_ns": ...},   (attention with gradients)
     "host": {"original_ns": ..., "replacement_ns": ...},      (optimizer)
     "backends": {"default": 412000, "flash": 398000, "efficient": "RuntimeError: ..."}, "seconds": 0.8,
     "error": null}

A failure (out of memory, no such backend, no fused implementation) is that entry's one-line
``error``; nothing here fails the capture. The whole step stops taking new shapes once
``budget`` seconds are spent (said in ``notes``).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import statistics
import sys
import time
from typing import Any, Callable, Optional

from profkit.model import GEMM_ALIGN, gemm_multiply_adds, gemm_unaligned

FORMAT = "profkit-replacements/1"
DEFAULT_REPS = 10
WARM_UP = 3
SLEEP_PROBE_CYCLES = 2_000_000   # to learn the sleep kernel's cycles per ns (about 1 ms)
SLEEP_MARGIN_NS = 200_000        # the GPU's hold beyond twice the runs' launching time
SLEEP_MAX_NS = 2_000_000_000     # a slow-launching call is held at most 2 s
MAX_PER_KIND = 6        # the heaviest shapes of each kind (count x work); the rest are listed
ALIGN_16BIT = GEMM_ALIGN["bf16"]  # a 16-bit GEMM's M, N and K multiples of it run on aligned kernels
UNALIGNED_SHARE = 0.03  # unaligned GEMM shapes with this share of the GEMMs' work together are timed,
UNALIGNED_MIN = 0.005   # each of them holding at least this share
MAX_CONVS = 12          # a CNN has a dozen conv shapes or more, each timed in milliseconds
DEFAULT_BUDGET_S = 120.0
MAX_RNN_STEPS = 4096
MAX_OPTIMIZER_ELEMENTS = 2_000_000_000
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64"}
RNN_LAYERS = {"LSTMCell": "LSTM", "GRUCell": "GRU", "RNNCell": "RNN"}


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


class Timer:
    """Times a callable on ``device``: CUDA events between warm-up and the timed runs, or the
    host clock (always on the CPU; with ``host=True`` on CUDA too, synchronising each run)."""

    def __init__(self, torch: Any, device: Any, reps: int = DEFAULT_REPS, warm_up: int = WARM_UP) -> None:
        self.torch, self.device, self.reps, self.warm_up = torch, device, reps, warm_up
        self.cuda = device.type == "cuda"
        self._cycles_per_ns: Optional[float] = None

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], Any], host: bool = False) -> list[int]:
        for _ in range(self.warm_up):
            fn()
        self.sync()
        out: list[int] = []
        if self.cuda and not host:
            # Held, the runs' GPU work back to back; but a call of hundreds of launches (a cuDNN
            # LSTM over 256 steps: 2.8 ms unheld, 8.2 ms held) overflows the launch queue, whose
            # waits then starve the GPU: the lower of the two is the GPU's time.
            held = self._events(fn, hold=True)
            plain = self._events(fn, hold=False)
            return min(held, plain, key=statistics.median) if held else plain
        for _ in range(self.reps):
            t0 = time.perf_counter_ns()
            fn()
            self.sync()
            out.append(time.perf_counter_ns() - t0)
        return out

    def _events(self, fn: Callable[[], Any], hold: bool) -> list[int]:
        ev = [(self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))
              for _ in range(self.reps)]
        if hold and not self._hold_gpu(fn):
            return []
        for a, b in ev:
            a.record()
            fn()
            b.record()
        self.sync()
        return [int(a.elapsed_time(b) * 1e6) for a, b in ev]

    def _hold_gpu(self, fn: Callable[[], Any]) -> bool:
        """Keep the GPU busy (a sleep kernel) while the timed runs are queued, so that the events
        time the runs' GPU work back to back, not the host's launching: a fused optimizer step over
        109 tensors took 386 us per step when the host queued it as the GPU ran it, and its kernels
        182 us in the program (an SDPA call of 7 us ran 34 us a call; an H100, 2026-12-05).
        Without torch.cuda._sleep, as before."""
        sleep = getattr(self.torch.cuda, "_sleep", None)
        if sleep is None:
            return False
        t0 = time.perf_counter_ns()
        fn()
        launch_ns = time.perf_counter_ns() - t0
        self.sync()
        if self._cycles_per_ns is None:
            a, b = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            a.record()
            sleep(SLEEP_PROBE_CYCLES)
            b.record()
            self.sync()
            self._cycles_per_ns = SLEEP_PROBE_CYCLES / max(a.elapsed_time(b) * 1e6, 1.0)
        hold_ns = min(2.0 * launch_ns * self.reps + SLEEP_MARGIN_NS, SLEEP_MAX_NS)
        sleep(int(hold_ns * self._cycles_per_ns))
        return True

    def host_ns(self, fn: Callable[[], Any]) -> int:
        """The median time ``fn`` takes to return (its launches issued, not waited for), each
        run started on an idle GPU."""
        out = []
        for _ in range(self.reps):
            self.sync()
            t0 = time.perf_counter_ns()
            fn()
            out.append(time.perf_counter_ns() - t0)
        self.sync()
        return int(statistics.median(out))


def _stats(samples: list[int]) -> tuple[int, list[int]]:
    return int(statistics.median(samples)), [int(min(samples)), int(max(samples))]


def _entry(kind: str, key: str, shape: dict, count: int) -> dict:
    return {"kind": kind, "key": key, "shape": shape, "count": int(count), "original_ns": None,
            "replacement_ns": None, "backend": None, "repetitions": 0, "spread": None,
            "error": None, "seconds": 0.0}


def _fill(e: dict, orig: list[int], repl: list[int], backend: str) -> dict:
    (o, o_spread), (r, r_spread) = _stats(orig), _stats(repl)
    e.update({"original_ns": o, "replacement_ns": r, "backend": backend,
              "repetitions": len(repl), "spread": {"original_ns": o_spread, "replacement_ns": r_spread}})
    return e


# -- attention ---------------------------------------------------------------------------------
def attention_key(a: dict) -> str:
    return (f"b={a['batch']} sq={a['sq']} sk={a['sk']} d={a['d']} dv={a['dv']} {a['dtype']} "
            f"{a.get('mask', 'none')}{' grad' if a.get('grad') else ''}"
            + (f" dropout={a['dropout']:g}" if a.get("dropout") else ""))


def time_attention(torch: Any, timer: Timer, a: dict) -> dict:
    import torch.nn.functional as F
    e = _entry("attention", attention_key(a), a, a.get("count", 1))
    dev = timer.device
    dt = getattr(torch, DTYPES.get(a["dtype"], "float32"))
    # The fused kernels' fast path is 16-bit: an fp32 attention is replaced in bf16 on a GPU.
    rdt = torch.bfloat16 if (dt == torch.float32 and timer.cuda) else dt
    b, sq, sk, d, dv = (int(a[k]) for k in ("batch", "sq", "sk", "d", "dv"))
    causal = a.get("mask") == "causal"
    grad = bool(a.get("grad"))
    # dropout on the probabilities: SDPA's kernels draw it themselves, and not at the same cost
    p_drop = float(a.get("dropout") or 0.0) if grad else 0.0

    def inputs(dtype):
        q = torch.randn(1, b, sq, d, device=dev, dtype=dtype, requires_grad=grad)
        k = torch.randn(1, b, sk, d, device=dev, dtype=dtype, requires_grad=grad)
        v = torch.randn(1, b, sk, dv, device=dev, dtype=dtype, requires_grad=grad)
        return q, k, v
    q, k, v = inputs(dt)
    hidden = torch.triu(torch.ones(sq, sk, dtype=torch.bool, device=dev), diagonal=1) if causal else None
    scale = d ** -0.5

    def math_path(q, k, v):
        s = (q @ k.transpose(-2, -1)) * scale
        if hidden is not None:
            s = s.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(s.float(), dim=-1)
        if p_drop:
            probs = F.dropout(probs, p_drop)
        return probs.to(q.dtype) @ v

    def run(f, q, k, v, backward):
        def go():
            o = f(q, k, v)
            if backward:
                torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        return go
    orig = timer(run(math_path, q, k, v, grad))
    rq, rk, rv = (q, k, v) if rdt == dt else inputs(rdt)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")]
    if not timer.cuda:
        names = names[:1]   # the CPU has one fused kernel (flash's algorithm)
    found: dict[str, Any] = {}
    best: Optional[tuple[str, list[int], Callable]] = None
    for name, attr in [("default", None), *names]:
        backend = getattr(SDPBackend, attr, None) if attr else None
        if attr and backend is None:
            continue

        def sdpa(q, k, v, backend=backend):
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=p_drop)
        try:
            t = timer(run(sdpa, rq, rk, rv, grad))
            found[name] = int(statistics.median(t))
            # The program calls SDPA without choosing a backend: the one PyTorch picks is what
            # the fix brings, whether or not another is faster here.
            if best is None or (best[0] != "default" and found[name] < statistics.median(best[1])):
                best = (name, t, sdpa)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run these inputs
            found[name] = one_line(exc)
    e["backends"] = found
    if best is None:
        e["error"] = "no fused SDPA backend ran these inputs: " + "; ".join(
            f"{k}: {v}" for k, v in found.items())
        return e
    _fill(e, orig, best[1], best[0])
    if rdt != dt:
        e["replacement_dtype"] = "bf16"
    if grad:
        fo = timer(run(math_path, q, k, v, False))
        fr = timer(run(best[2], rq, rk, rv, False))
        e["forward"] = {"original_ns": _stats(fo)[0], "replacement_ns": _stats(fr)[0]}
    return e


def time_causal_mask(torch: Any, timer: Timer, a: dict) -> dict:
    """SDPA given its causal mask as a tensor (``attn_mask``: off the flash kernels, every block of
    the score matrix computed) against ``is_causal=True`` (the hidden half skipped), both as the
    program calls them (no backend chosen), in the program's dtype, with its dropout."""
    import torch.nn.functional as F
    e = _entry("attention_causal_mask", attention_key(a), a, a.get("count", 1))
    dev = timer.device
    dt = getattr(torch, DTYPES.get(a["dtype"], "float32"))
    b, sq, sk, d, dv = (int(a[k]) for k in ("batch", "sq", "sk", "d", "dv"))
    grad = bool(a.get("grad"))
    p_drop = float(a.get("dropout") or 0.0) if grad else 0.0
    q = torch.randn(1, b, sq, d, device=dev, dtype=dt, requires_grad=grad)
    k = torch.randn(1, b, sk, d, device=dev, dtype=dt, requires_grad=grad)
    v = torch.randn(1, b, sk, dv, device=dev, dtype=dt, requires_grad=grad)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=dev).tril()

    def run(kw: dict, backward: bool):
        def go():
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, **kw)
            if backward:
                torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        return go
    masked, causal = {"attn_mask": keep}, {"is_causal": True}
    _fill(e, timer(run(masked, grad)), timer(run(causal, grad)), "is_causal=True")
    e["original"] = "attn_mask (a causal mask tensor)"
    if grad:
        e["forward"] = {"original_ns": _stats(timer(run(masked, False)))[0],
                        "replacement_ns": _stats(timer(run(causal, False)))[0]}
    return e


# -- the optimizer -----------------------------------------------------------------------------
def optimizer_key(o: dict) -> str:
    return f"{o['class']} {o['params']} params {o['numel']} elements {o.get('dtype', '')}".strip()


def time_optimizer(torch: Any, timer: Timer, o: dict) -> dict:
    e = _entry("optimizer", optimizer_key(o), o, 1)
    cls = getattr(torch.optim, str(o["class"]), None)
    if int(o.get("numel", 0)) > MAX_OPTIMIZER_ELEMENTS:
        e["error"] = f"{o['numel']} elements: more than this timing allocates"
        return e
    if cls is None:
        return _fused_floor(torch, timer, o)
    accepted = set(inspect.signature(cls.__init__).parameters)
    options = {k: v for k, v in (o.get("options") or {}).items() if k in accepted}
    params = _parameters(torch, o, timer.device)
    foreach = bool(o.get("foreach")) or (o.get("foreach") is None and not o.get("fused") and timer.cuda)

    def step_of(opt):
        return opt.step
    try:
        opt = cls(params, lr=1e-4, foreach=foreach, **options)
        orig, orig_host = timer(step_of(opt)), timer.host_ns(step_of(opt))
        del opt
        fused = cls(params, lr=1e-4, fused=True, **options)
        repl, repl_host = timer(step_of(fused)), timer.host_ns(step_of(fused))
    except Exception as exc:  # noqa: BLE001 - no fused implementation, out of memory
        e["error"] = one_line(exc)
        return e
    _fill(e, orig, repl, "fused")
    e["original"] = "foreach" if foreach else "for-loop"
    e["host"] = {"original_ns": orig_host, "replacement_ns": repl_host}
    return e


def _parameters(torch: Any, o: dict, device: Any) -> list:
    """Parameters of the recorded optimizer's sizes and dtype, each with a gradient."""
    dt = getattr(torch, DTYPES.get(o.get("dtype") or "fp32", "float32"))
    params = []
    for n, c in o.get("sizes") or []:
        for _ in range(int(c)):
            p = torch.zeros(int(n), device=device, dtype=dt, requires_grad=True)
            p.grad = torch.full_like(p, 1e-3)
            params.append(p)
    return params


def _fused_floor(torch: Any, timer: Timer, o: dict) -> dict:
    """An optimizer torch.optim does not have (the program's own LAMB, LARS, Lion): its step
    cannot be timed outside the program, but what a fused step over the same parameters costs
    can: ``AdamW(fused=True)`` at the recorded sizes (the original's time is the trace's)."""
    e = _entry("optimizer_fused_floor", optimizer_key(o), o, 1)
    try:
        fused = torch.optim.AdamW(_parameters(torch, o, timer.device), lr=1e-4, fused=True)
        repl, host = timer(fused.step), timer.host_ns(fused.step)
    except Exception as exc:  # noqa: BLE001 - no fused kernel for this device or dtype, out of memory
        e["error"] = one_line(exc)
        return e
    r, r_spread = _stats(repl)
    e.update({"replacement_ns": r, "backend": "AdamW(fused=True)", "repetitions": len(repl),
              "spread": {"replacement_ns": r_spread}, "host": {"replacement_ns": host}})
    e["original"] = f"{o['class']} (not torch.optim's: its time is the trace's)"
    return e


# -- RNN cells ---------------------------------------------------------------------------------
def rnn_key(c: dict) -> str:
    return (f"{c['cell']} I={c['input']} H={c['hidden']} B={c['batch']} T={c['calls']} "
            f"{c['dtype']}{' grad' if c.get('grad') else ''}")


def stacks(cells: list[dict]) -> list[list[dict]]:
    """The recorded cells as the layers nn.LSTM / nn.GRU / nn.RNN would run together: a cell fed
    by another's output at every step (``fed_by``), of the same kind, batch, steps, hidden size and
    element type, is that cell's next layer; every other cell is a stack of one."""
    def same(a: dict, b: dict) -> bool:
        return all(a.get(k) == b.get(k) for k in ("cell", "batch", "calls", "hidden", "dtype", "grad", "bias"))
    below: dict[int, int] = {}
    for i, c in enumerate(cells):
        j = c.get("fed_by")
        if (isinstance(j, int) and 0 <= j < len(cells) and j != i and j not in below.values()
                and same(c, cells[j]) and int(c["input"]) == int(cells[j]["hidden"])):
            below[i] = j
    tops = [i for i in range(len(cells)) if i not in below]
    out = []
    for top in tops:
        chain = [top]
        while True:
            nxt = [i for i, j in below.items() if j == chain[-1]]
            if not nxt:
                break
            chain.append(nxt[0])
        out.append([cells[i] for i in chain])
    return out


def time_rnn(torch: Any, timer: Timer, c: "dict | list[dict]") -> dict:
    """A cell loop (or a stack of them, ``stacks``) against the library layer with as many layers."""
    layers = c if isinstance(c, list) else [c]
    c = layers[0]
    n = len(layers)
    key = rnn_key(c) if n == 1 else f"{c['cell']} x{n} " + rnn_key(c)[len(str(c["cell"])) + 1:]
    e = _entry("rnn", key, c if n == 1 else {**c, "layers": n}, 1)
    layer_name = RNN_LAYERS.get(str(c["cell"]))
    if layer_name is None:
        e["error"] = f"no library layer for {c['cell']}"
        return e
    nn = torch.nn
    dt = getattr(torch, DTYPES.get(c["dtype"], "float32"))
    steps = min(int(c["calls"]), MAX_RNN_STEPS)
    bsz, i_size, h_size = int(c["batch"]), int(c["input"]), int(c["hidden"])
    grad = bool(c.get("grad"))
    bias = bool(c.get("bias", True))
    cells = [getattr(nn, str(c["cell"]))(int(x["input"]), h_size, bias=bias).to(timer.device, dt) for x in layers]
    layer = getattr(nn, layer_name)(i_size, h_size, num_layers=n, bias=bias).to(timer.device, dt)
    # A record without gradients is inference: the layer in eval mode, as such a program runs it
    # (cuDNN's training forward also keeps a reserve for the backward).
    layer.train(grad)
    x = torch.randn(steps, bsz, i_size, device=timer.device, dtype=dt)
    lstm = c["cell"] == "LSTMCell"

    def loop():
        seq = [x[t] for t in range(steps)]
        for one in cells:     # layer by layer, each over the whole sequence
            h = torch.zeros(bsz, h_size, device=timer.device, dtype=dt)
            state = (h, torch.zeros_like(h)) if lstm else h
            outs = []
            for t in range(steps):
                state = one(seq[t], state)
                outs.append(state[0] if lstm else state)
            seq = outs
        return seq

    def lib():
        return layer(x)[0]

    def with_grad(f, params):
        def go():
            out = f()
            out = torch.stack(out) if isinstance(out, list) else out
            torch.autograd.grad(out.sum(), list(params))
        return go
    try:
        with torch.set_grad_enabled(grad):
            original = "the cell loop"
            if grad:
                orig = timer(with_grad(loop, [q for one in cells for q in one.parameters()]))
                repl = timer(with_grad(lib, list(layer.parameters())))
            else:
                run_loop = loop
                if timer.cuda:
                    # Its kernels back to back: the step model removes the loop's host time itself.
                    with contextlib.suppress(Exception):
                        loop()
                        timer.sync()
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            loop()
                        run_loop = graph.replay
                        original = "the cell loop as a CUDA graph"
                orig, repl = timer(run_loop), timer(lib)
    except Exception as exc:  # noqa: BLE001
        e["error"] = one_line(exc)
        return e
    _fill(e, orig, repl, f"nn.{layer_name}" + (" (cuDNN)" if timer.cuda else ""))
    e["original"] = original
    return e


# -- copies ------------------------------------------------------------------------------------
def copy_key(c: dict) -> str:
    return f"{c['direction']} {c['bytes']} B {'pinned' if c.get('pinned') else 'pageable'}"


def time_copy(torch: Any, timer: Timer, c: dict) -> dict:
    e = _entry("copy", copy_key(c), c, c.get("count", 1))
    if not timer.cuda:
        e["error"] = "pinned memory needs CUDA"
        return e
    n = int(c["bytes"])
    try:
        pageable = torch.empty(n, dtype=torch.uint8)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        on_dev = torch.empty(n, dtype=torch.uint8, device=timer.device)
        if c["direction"] == "h2d":
            orig = timer(lambda: on_dev.copy_(pageable), host=True)
            repl = timer(lambda: on_dev.copy_(pinned, non_blocking=True), host=True)
        else:
            orig = timer(lambda: pageable.copy_(on_dev), host=True)
            repl = timer(lambda: pinned.copy_(on_dev, non_blocking=True), host=True)
    except Exception as exc:  # noqa: BLE001
        e["error"] = one_line(exc)
        return e
    return _fill(e, orig, repl, "pinned, non_blocking")


# -- GEMMs -------------------------------------------------------------------------------------
def gemm_key(g: dict) -> str:
    lay = g.get("layout", "NN")
    return f"{g['op']} b={g['batch']} m={g['m']} n={g['n']} k={g['k']} {g['dtype']}" + (f" {lay}" if lay != "NN" else "")


def gemm_operands(torch: Any, g: dict, device: Any) -> tuple[Any, Any]:
    """Random fp32 operands of a recorded GEMM in its layout (a record without one: ``NN``): a
    ``T`` operand is the transposed view of a row-major tensor, as ``nn.Linear``'s weight is."""
    b, m, n, k = (int(g[x]) for x in ("batch", "m", "n", "k"))
    lay = g.get("layout", "NN")
    batched = g["op"] in ("bmm", "baddbmm")

    def make(rows: int, cols: int, transposed: bool) -> Any:
        lead = (b,) if batched else ()
        if transposed:
            return torch.randn(*lead, cols, rows, device=device).transpose(-1, -2)
        return torch.randn(*lead, rows, cols, device=device)
    return make(m, k, lay[0] == "T"), make(k, n, lay[1] == "T")


def time_gemm(torch: Any, timer: Timer, g: dict, to: str) -> dict:
    """An fp32 GEMM shape in full fp32 against ``to`` (tf32, bf16); a float64 one in float64
    against float32 operands in ``to`` (fp32: full precision, tf32, bf16)."""
    fp64 = g.get("dtype") == "fp64"
    e = _entry(f"gemm_fp64_{to}" if fp64 else f"gemm_{to}", gemm_key(g), g, g.get("count", 1))
    before = torch.get_float32_matmul_precision()
    try:
        x, y = gemm_operands(torch, g, timer.device)
        torch.set_float32_matmul_precision("highest")
        if fp64:
            x64, y64 = x.double(), y.double()
            orig = timer(lambda: x64 @ y64)
        else:
            orig = timer(lambda: x @ y)
        if to == "fp32":
            repl = timer(lambda: x @ y)
        elif to == "tf32":
            torch.set_float32_matmul_precision("high")
            repl = timer(lambda: x @ y)
        else:
            x16, y16 = x.bfloat16(), y.bfloat16()
            repl = timer(lambda: x16 @ y16)
    except Exception as exc:  # noqa: BLE001
        e["error"] = one_line(exc)
        return e
    finally:
        torch.set_float32_matmul_precision(before)
    return _fill(e, orig, repl, to)


# -- convolutions ------------------------------------------------------------------------------
def conv_key(c: dict) -> str:
    g = f" g={c['groups']}" if int(c.get("groups", 1)) != 1 else ""
    return (f"x={'x'.join(map(str, c['input']))} w={'x'.join(map(str, c['weight']))} "
            f"s={'x'.join(map(str, c['stride']))}{g} {c['dtype']}"
            + (" channels_last" if c.get("channels_last") else "") + (" grad" if c.get("grad") else ""))


def time_conv(torch: Any, timer: Timer, c: dict, layout_only: bool = False) -> dict:
    """``c`` as the program ran it against bf16 on channels_last tensors (``conv_bf16``), or, with
    ``layout_only``, against its own precision on channels_last tensors (``conv_cl``)."""
    e = _entry("conv_cl" if layout_only else "conv_bf16", conv_key(c), c, c.get("count", 1))
    F = torch.nn.functional
    conv = F.conv3d if len(c["input"]) == 5 else F.conv2d
    last = torch.channels_last_3d if len(c["input"]) == 5 else torch.channels_last
    args = {"stride": tuple(c["stride"]), "padding": tuple(c["padding"]), "dilation": tuple(c["dilation"]),
            "groups": int(c["groups"])}
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = bool(c.get("tf32", True))
        fmt = last if c.get("channels_last") else torch.contiguous_format
        x = torch.randn(*c["input"], device=timer.device).contiguous(memory_format=fmt)
        w = torch.randn(*c["weight"], device=timer.device).contiguous(memory_format=fmt)
        to = torch.float32 if layout_only else torch.bfloat16
        x16 = x.to(to).contiguous(memory_format=last)
        w16 = w.to(to).contiguous(memory_format=last)

        def step(a, b, grad: bool):
            if not grad:
                return lambda: conv(a, b, **args)
            a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
            out = conv(a, b, **args)
            dy = torch.randn_like(out)
            # the backward as training runs it: the input's and the weight's gradients
            return lambda: torch.autograd.grad(conv(a, b, **args), (a, b), dy)
        grad = bool(c.get("grad"))
        orig, repl = timer(step(x, w, grad)), timer(step(x16, w16, grad))
        if grad:
            fo, fr = timer(step(x, w, False)), timer(step(x16, w16, False))
            e["forward"] = {"original_ns": _stats(fo)[0], "replacement_ns": _stats(fr)[0]}
    except Exception as exc:  # noqa: BLE001
        e["error"] = one_line(exc)
        return e
    finally:
        torch.backends.cudnn.allow_tf32 = before
    three_d = len(c["input"]) == 5
    e["original"] = (("TF32" if c.get("tf32", True) else "fp32")
                     + ((", channels_last_3d" if three_d else ", channels_last") if c.get("channels_last")
                        else (", NCDHW" if three_d else ", NCHW")))
    precision = e["original"].split(",")[0] if layout_only else "bf16"
    return _fill(e, orig, repl, f"{precision}, channels_last_3d" if three_d else f"{precision}, channels_last")


# -- the whole record --------------------------------------------------------------------------
def _work(kind: str, r: dict) -> float:
    if kind == "attention":
        return float(r.get("count", 1)) * r["batch"] * r["sq"] * r["sk"] * (r["d"] + r["dv"])
    if kind == "gemm":
        return float(r.get("count", 1)) * gemm_multiply_adds(r)
    if kind == "copy":
        return float(r.get("count", 1)) * r["bytes"]
    if kind == "conv":
        # multiply-adds plus the elements read and written: a depthwise convolution does few of
        # the first and takes its time from the second
        n, cin, *space = r["input"]
        cout, cg, *window = r["weight"]
        s = max(math.prod(int(v) for v in r["stride"]), 1)
        return (float(r.get("count", 1)) * n * math.prod(space)
                * (cout * cg * math.prod(window) / s + cin + cout / s))
    return float(r.get("numel", 0) or r.get("calls", 1) * r.get("hidden", 1))


def gemm_shapes(gemms: list[dict]) -> list[dict]:
    """The fp32 GEMM shapes to time, MAX_PER_KIND at most, heaviest first: the heaviest overall,
    with up to a third of them kept for the heaviest unaligned shapes where those carry
    UNALIGNED_SHARE of the work or more together (each UNALIGNED_MIN or more). Their bf16 gain is
    not the aligned shapes' (a Conformer's attention GEMMs over 399 frames, six shapes of 2% of the
    FLOPs each, ran on align1 kernels, 8.3 ms an iteration in bf16, where the aligned projections
    timed 10x faster), and the rules scale each group by its own timed ratio
    (profkit.run.replacements.Replacements.gemm_gain)."""
    ranked = sorted(gemms, key=lambda r: -_work("gemm", r))
    total = sum(_work("gemm", g) for g in ranked) or 1.0
    # M, N or K not a multiple of 8: in 16-bit such a GEMM runs on cuBLAS's unaligned kernels
    odd_all = [g for g in ranked if gemm_unaligned(g, ALIGN_16BIT)]
    odd = []
    if sum(_work("gemm", g) for g in odd_all) >= UNALIGNED_SHARE * total:
        odd = [g for g in odd_all if _work("gemm", g) >= UNALIGNED_MIN * total][:MAX_PER_KIND // 3]
    rest = [g for g in ranked if not any(g is o for o in odd)][:MAX_PER_KIND - len(odd)]
    keep = {id(g) for g in rest + odd}
    return [g for g in ranked if id(g) in keep]


def jobs(record: dict) -> list[tuple[str, dict, Callable]]:
    """What to time for a record, heaviest first within each kind: (kind, item, function)."""
    out: list[tuple[str, dict, Callable]] = []

    def top(kind: str, items: list) -> list:
        return sorted(items, key=lambda r: -_work(kind, r))[:MAX_PER_KIND]
    for a in top("attention", record.get("attention") or []):
        out.append(("attention", a, time_attention))
    causal_masks = [a for a in record.get("sdpa") or [] if a.get("mask") == "causal_mask"]
    for a in top("attention", causal_masks):
        out.append(("attention_causal_mask", a, time_causal_mask))
    for o in record.get("optimizer") or []:
        if not o.get("fused"):
            out.append(("optimizer", o, time_optimizer))
    for stack in stacks(record.get("rnn_cell") or []):
        out.append(("rnn", stack, time_rnn))
    for c in top("copy", [c for c in record.get("copy") or [] if not c.get("pinned")]):
        out.append(("copy", c, time_copy))
    for g in gemm_shapes([g for g in record.get("gemm") or [] if g.get("dtype") == "fp32"]):
        out.append(("gemm_tf32", g, lambda t, tm, g: time_gemm(t, tm, g, "tf32")))
        out.append(("gemm_bf16", g, lambda t, tm, g: time_gemm(t, tm, g, "bf16")))
    for g in gemm_shapes([g for g in record.get("gemm") or [] if g.get("dtype") == "fp64"]):
        for to in ("fp32", "tf32", "bf16"):
            out.append((f"gemm_fp64_{to}", g, lambda t, tm, g, to=to: time_gemm(t, tm, g, to)))
    convs = [c for c in record.get("conv") or [] if c.get("dtype") == "fp32"]
    heaviest = sorted(convs, key=lambda r: -_work("conv", r))[:MAX_CONVS]
    for c in heaviest:
        out.append(("conv_bf16", c, time_conv))
    for c in heaviest:
        if not c.get("channels_last"):
            out.append(("conv_cl", c, lambda t, tm, c: time_conv(t, tm, c, layout_only=True)))
    return out


def time_record(record: dict, device: Optional[str] = None, reps: int = DEFAULT_REPS,
                budget_s: float = DEFAULT_BUDGET_S, say: Callable[[str], None] = lambda m: None) -> dict:
    """Time every replacement the record calls for (module docstring); the ``replacements`` JSON.
    ``device``: where to time (default: CUDA, and nothing without it)."""
    import torch
    out: dict = {"format": FORMAT, "device": None, "torch": torch.__version__, "repetitions": reps,
                 "entries": [], "notes": [], "seconds": 0.0}
    if device is None:
        if not torch.cuda.is_available():
            out["notes"].append("no CUDA device: the replacements were not timed")
            return out
        device = "cuda"
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
        out["gpu"] = torch.cuda.get_device_name(dev)
    out["device"] = str(dev)
    timer = Timer(torch, dev, reps)
    t_all = time.monotonic()
    todo = jobs(record)
    for i, (kind, item, fn) in enumerate(todo):
        if time.monotonic() - t_all > budget_s:
            out["notes"].append(f"the timing budget of {budget_s:.0f} s was spent: "
                                f"{len(todo) - i} shape(s) not timed")
            break
        t0 = time.monotonic()
        try:
            e = fn(torch, timer, item)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is that entry's
            one = item[0] if isinstance(item, list) else item   # a stack of cells: its first
            e = _entry(kind, str(one)[:80], one, one.get("count", 1))
            e["error"] = one_line(exc)
        e["seconds"] = round(time.monotonic() - t0, 3)
        out["entries"].append(e)
        if dev.type == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
        say(entry_text(e))
    out["seconds"] = round(time.monotonic() - t_all, 3)
    return out


def entry_text(e: dict) -> str:
    """One line of the capture log: the replacement, its time against the original's, its cost."""
    head = f"replacement {e['kind']} {e['key']}"
    if e.get("error"):
        return f"{head}: not timed ({e['error']}; {e['seconds']:.1f} s)"
    if not e.get("original_ns"):
        return f"{head}: {e['replacement_ns'] / 1e3:.1f} us ({e['backend']}) ({e['seconds']:.1f} s)"
    return (f"{head}: {e['replacement_ns'] / 1e3:.1f} us ({e['backend']}) vs "
            f"{e['original_ns'] / 1e3:.1f} us, {e['original_ns'] / max(e['replacement_ns'], 1):.2f}x "
            f"({e['seconds']:.1f} s)")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m profkit.capture.replacements")
    p.add_argument("record")
    p.add_argument("out")
    p.add_argument("--device", default=None)
    p.add_argument("--reps", type=int, default=DEFAULT_REPS)
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S)
    args = p.parse_args(argv)
    with open(args.record) as fh:
        record = json.load(fh)
    out = time_record(record, args.device, args.reps, args.budget,
                      say=lambda m: print(f"profkit: {m}", file=sys.stderr, flush=True))
    with open(args.out, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Typed public wrappers: host-side checks, then the custom op of the chosen backend.

    out, residual_out = add_rmsnorm(x, residual, weight, eps)            # backend="auto"
    out = add_rmsnorm_(x, residual, weight, eps)          # residual <- x + residual, in place
    out, residual_out = add_layernorm(x, residual, weight, bias, eps)
    y = bias_gelu(x, bias, approximate="none" | "tanh")
    y = softmax(x, scale=1.0)                             # over the last dim

backend: "auto" (default: per shape, and per context: eager calls or CUDA graph capture; see
choose_backend and graph_backend), "triton", "cuda" (CUDA C++ extension, built on first use) or
"torch" (the eager baseline in kernels/baselines.py).  CPU tensors run the float reference for
"auto"/"triton"/"cuda".

Host cost per call matters as much as GPU time at decode shapes (a 1x4096 kernel runs ~2 µs on an
H200), so the common path is kept short: one cheap validity test (the detailed checks with their
error messages run only when it fails), the resolved OpOverload cached per (op, backend), and the
Python autograd wrapper of the custom op skipped when no input requires grad.
"""
from __future__ import annotations

import os
import warnings
from typing import Literal

import torch
from torch import Tensor

from kernels import _library, baselines

Backend = Literal["auto", "triton", "cuda", "torch"]
BACKENDS = ("auto", "triton", "cuda", "torch")
COMPILED = ("triton", "cuda")
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
_GPU_DTYPES = frozenset(_SUPPORTED)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f'backend must be "auto", "triton", "cuda" or "torch", got {backend!r}.')


def _check_tensor(name: str, t: object) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")


def _check_common(x: Tensor, named: dict[str, Tensor], vectors: dict[str, Tensor]):
    """Device, dtype and shape agreement for x, same-shape tensors `named` and (hidden,) `vectors`."""
    _check_tensor("x", x)
    for name, t in {**named, **vectors}.items():
        _check_tensor(name, t)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (the hidden dimension).")
    allowed = _SUPPORTED + ((torch.float64,) if x.device.type == "cpu" else ())
    if x.dtype not in allowed:
        raise TypeError(
            f"x has dtype {x.dtype}; the kernels support float32, float16 and bfloat16"
            + (" (and float64 on CPU)." if x.device.type == "cpu" else ".")
        )
    for name, t in {**named, **vectors}.items():
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; put them on one device.")
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; they must match.")
    for name, t in named.items():
        if t.shape != x.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but x has {tuple(x.shape)}.")
    for name, t in vectors.items():
        if t.shape != x.shape[-1:]:
            raise ValueError(
                f"{name} must have shape ({x.shape[-1]},) (the hidden size of x), got {tuple(t.shape)}."
            )


def _fast_ok(x, same=(), vectors=()) -> bool:
    """The common case in one expression (about 1 µs); False sends the call to _check_common."""
    try:
        dt, dev = x.dtype, x.device
        if dt not in _GPU_DTYPES or x.dim() < 1:
            return False
        hidden = x.shape[-1:]
        for t in same:
            if t.dtype is not dt or t.shape != x.shape or t.device != dev:
                return False
        for t in vectors:
            if t.dtype is not dt or t.shape != hidden or t.device != dev:
                return False
        return True
    except AttributeError:  # not a tensor
        return False


# ----------------------------------------------------------------------------------------------
# backend="auto"
# ----------------------------------------------------------------------------------------------
# State of the CUDA extension for "auto": None = not tried yet, True = loaded, False = unavailable
# (no GPU toolchain or a build error: warned once, then Triton).
_CUDA_STATE: bool | None = None
_TRITON_OK: bool | None = None

# Where Triton's kernel is faster on the GPU than the CUDA extension's (H200, bf16, CUDA graph
# replays, µs, triton vs cuda, 2026-11-30, analyses/kernels_h200.md): the row kernels at the large
# shapes, add+RMSNorm 16384x4096 126.4 vs 136.5, in place 127.6 vs 137.7, add+LayerNorm 16384x4096
# 132.9 vs 143.1, softmax 16384x4096 66.3 vs 66.7.  bias+GELU stays on the extension (616.5 vs
# 551.7 at 65536x8192).  At the decode shapes Triton's kernels are also 0.03-0.68 µs faster, but its
# host cost per plain launch is about twice the extension's (19-34 vs 10-15 µs there, even through
# the compiled kernel's own launcher), which decides any call whose GPU time is shorter than
# Triton's launcher.  So Triton only above _TRITON_MIN_ELEMS elements, where the GPU work
# (>= ~60 µs) hides it.
#
# That is the choice in eager code.  Inside a CUDA graph capture the host cost is paid once, at
# capture, and each replay launches the recorded kernels, so there GPU time alone decides: see
# graph_backend and _PerContext below.
_TRITON_GPU_FASTER = frozenset({"add_layernorm", "add_rmsnorm", "add_rmsnorm_", "softmax"})
_TRITON_MIN_ELEMS = 32 * 2**20


def triton_by_shape(op: str, rows: int, n: int) -> bool:
    """Whether "auto" runs Triton for op on rows x n when both backends are available (the table
    above); the benchmark page asks the same question."""
    return op in _TRITON_GPU_FASTER and rows * n >= _TRITON_MIN_ELEMS


# GPU time alone (CUDA graph replays, same run and table): Triton's row kernels are faster than the
# extension's at every benchmarked row-op shape, by 0.07-0.7 µs at the decode shapes (softmax
# 16x4096 1.89 vs 2.09, add+LayerNorm 64x8192 3.88 vs 4.56) and 4-8% at 4096x4096.  bias+GELU:
# Triton's flat kernel (up to FLAT_GELU_MAX elements) 1.15-2.37 vs 1.24-2.40 µs; above it the
# extension (19.1 vs 23.5 µs at 4096x4096).
_FLAT_GELU_MAX = 1 << 19  # = kernels.triton_kernels.FLAT_GELU_MAX (not imported: triton is optional)


_SINGLE_BLOCK_MAX = 16384  # = kernels.triton_kernels.MAX_SINGLE_BLOCK: longer rows loop (not benchmarked)


def graph_backend(op: str, rows: int, n: int) -> str:
    """The backend with the lower GPU time for op on rows x n: what "auto" runs inside a CUDA graph
    capture (once that backend has run outside one for this shape; see _PerContext).  Rows longer
    than one Triton block (the looping kernels, never benchmarked) keep the eager choice."""
    if op == "bias_gelu":
        return "triton" if rows * n <= _FLAT_GELU_MAX else "cuda"
    if n > _SINGLE_BLOCK_MAX:
        return "triton" if triton_by_shape(op, rows, n) else "cuda"
    return "triton"


def _cuda_available() -> bool:
    """Build/load the extension once for "auto"; on failure warn once and remember."""
    global _CUDA_STATE
    if _CUDA_STATE is None:
        from kernels import _build

        if os.environ.get("PROFKIT_KERNELS_AUTO_NO_CUDA") == "1":
            _CUDA_STATE = False
            return False
        try:
            _build.ensure_loaded()
            _CUDA_STATE = True
        except _build.KernelBuildError as exc:
            _CUDA_STATE = False
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            warnings.warn(
                f'profkit kernels: backend="auto" cannot use the CUDA extension ({first}); '
                'using Triton (or PyTorch) instead.',
                RuntimeWarning,
                stacklevel=4,
            )
    return _CUDA_STATE


def _triton_available() -> bool:
    global _TRITON_OK
    if _TRITON_OK is None:
        try:
            import triton  # noqa: F401

            _TRITON_OK = True
        except ImportError:
            _TRITON_OK = False
    return _TRITON_OK


def choose_backend(op: str, x: Tensor) -> str:
    """The backend "auto" runs for op on x: "cuda", "triton" or "torch" (see the table above).

    CPU tensors -> "triton" (its CPU kernel is the float reference).  CUDA tensors -> the CUDA
    extension if it builds/loads, with Triton for the shapes where Triton's GPU time is lower and
    the tensor is large enough to hide its launcher; Triton if the extension is unavailable; the
    PyTorch baseline if neither is.  This is the choice for eager calls; the same shape always gets
    it.  Inside a CUDA graph capture (torch.cuda.graph) "auto" runs graph_backend's choice instead,
    where that backend has been prepared outside the capture (_PerContext).  Under torch.compile
    this choice is traced, CUDA graphs (mode="reduce-overhead") or not.
    """
    if not x.is_cuda:
        return "triton"
    if torch.compiler.is_compiling():
        # host cost is compiled away; no build attempt while tracing
        return "cuda" if _CUDA_STATE else ("triton" if _triton_available() else "torch")
    has_cuda = _cuda_available()
    has_triton = _triton_available()
    if not has_cuda:
        return "triton" if has_triton else "torch"
    if not has_triton:
        return "cuda"
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    return "triton" if triton_by_shape(op, rows, n) else "cuda"


# ----------------------------------------------------------------------------------------------
# per context: eager calls vs CUDA graph capture
# ----------------------------------------------------------------------------------------------
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)


def _signature(args: tuple) -> tuple:
    """What a compiled Triton kernel is specialised on, besides the shape: each tensor's dtype and
    16-byte alignment, and the string arguments (bias+GELU's form is a compile-time constant)."""
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, Tensor) else a
                 for a in args if isinstance(a, (Tensor, str)))


class _PerContext:
    """The "auto" choice for a shape where eager code and a CUDA graph want different backends.

    Eager calls run `eager`.  The first of them also runs `graph` once, on copies of the inputs
    (the caller's tensors are never written twice), so that its kernel is compiled and tuned
    outside any capture: compiling or autotuning inside a capture would break it.  A capture then
    runs `graph` if that first call had the same dtypes, alignment and string arguments, else
    `eager` (each GELU form has its own _PerContext; of the alignments, the first call's is
    prepared).  The cost, paid by eager-only code too: one extra kernel at the
    first eager call of each such shape, and the first time per (op, hidden size, dtype, few/many
    rows) a Triton compile and, for many rows, an autotune of its warp counts (a fraction of a
    second).  PROFKIT_KERNELS_AUTO_GRAPH=0 turns this off: the eager choice in every context."""

    __slots__ = ("eager", "graph", "warm")

    def __init__(self, eager: str, graph: str):
        self.eager, self.graph = eager, graph
        self.warm: tuple | None = None  # the _signature the graph backend ran with; () = it failed

    def pick(self, name: str, args: tuple) -> str:
        if _capturing():
            return self.graph if self.warm and self.warm == _signature(args) else self.eager
        if self.warm is None:
            self._warm_up(name, args)
        return self.eager

    def _warm_up(self, name: str, args: tuple) -> None:
        try:
            with torch.no_grad(), _below_autograd():
                copies = tuple(a.clone() if isinstance(a, Tensor) else a for a in args)
                _op(name, self.graph)(*copies)
            self.warm = _signature(copies)
        except Exception as exc:  # noqa: BLE001  (never fail the user's call for an optional warm-up)
            self.warm = ()
            warnings.warn(f'profkit kernels: backend="auto" could not prepare {self.graph} for {name} '
                          f"inside CUDA graphs ({type(exc).__name__}: {exc}); graphs will run "
                          f"{self.eager} for this shape.", RuntimeWarning, stacklevel=5)


def _auto_choice(op: str, x: Tensor):
    """choose_backend's eager choice, or a _PerContext where a CUDA graph would run another one."""
    eager = choose_backend(op, x)
    if eager not in COMPILED or not (x.is_cuda and _CUDA_STATE and _triton_available()):
        return eager
    if os.environ.get("PROFKIT_KERNELS_AUTO_GRAPH") == "0":
        return eager
    n = x.shape[-1]
    graph = graph_backend(op, x.numel() // n if n else 0, n)
    return eager if graph == eager else _PerContext(eager, graph)


# ----------------------------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------------------------
_OPS: dict[tuple[str, str], object] = {}
_below_autograd = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad


def _op(name: str, backend: str):
    """The resolved OpOverload (torch.ops.profkit_kernels.<name>_<backend>.default), cached."""
    try:
        return _OPS[(name, backend)]
    except KeyError:
        op = getattr(torch.ops.profkit_kernels, f"{name}_{backend}").default
        _OPS[(name, backend)] = op
        return op


# (op, form, shape, dtype, device) -> what "auto" chose, a backend name or a _PerContext: same shape,
# same choice
_CHOICE: dict[tuple, object] = {}


def _resolve(op: str, backend: str, x: Tensor, form: str = ""):
    """The backend name, or for "auto" possibly a _PerContext that _call resolves with the inputs.
    `form`: a compile-time variant of the op (bias+GELU's approximate), prepared for graphs apart."""
    if backend == "auto":
        if torch.compiler.is_compiling():  # symbolic shapes: no cache
            return choose_backend(op, x)
        key = (op, form, x.shape, x.dtype, x.device)
        hit = _CHOICE.get(key)
        if hit is None:
            if len(_CHOICE) < 4096:
                hit = _CHOICE[key] = _auto_choice(op, x)
            else:  # a full cache: the eager choice, never a warm-up that nothing would remember
                hit = choose_backend(op, x)
        return hit
    if backend == "cuda" and x.is_cuda:
        from kernels import _build

        _build.ensure_loaded()
    return backend


def _call(name: str, backend: str, *args):
    """Run the custom op; below the autograd key when no input requires grad (same result as the
    registered autograd wrapper's no-grad branch, without its Python frames)."""
    if backend.__class__ is _PerContext:
        backend = backend.pick(name, args)
    op = _op(name, backend)
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and _any_requires_grad(*args)):
        return op(*args)
    with _below_autograd():
        return op(*args)


def add_rmsnorm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, *, backend: Backend = "auto"
) -> tuple[Tensor, Tensor]:
    """Return (rms_norm(x + residual) * weight, x + residual), one pass over the data."""
    if backend not in BACKENDS:
        _check_backend(backend)
    if not _fast_ok(x, (residual,), (weight,)):
        _check_common(x, {"residual": residual}, {"weight": weight})
    backend = _resolve("add_rmsnorm", backend, x)
    if backend == "torch":
        return baselines.add_rmsnorm(x, residual, weight, eps)
    return _call("add_rmsnorm", backend, x.contiguous(), residual.contiguous(), weight.contiguous(), float(eps))


def add_rmsnorm_(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, *, backend: Backend = "auto"
) -> Tensor:
    """In place: residual <- x + residual; return rms_norm(residual) * weight (inference engines)."""
    if backend not in BACKENDS:
        _check_backend(backend)
    if not _fast_ok(x, (residual,), (weight,)):
        _check_common(x, {"residual": residual}, {"weight": weight})
    if not residual.is_contiguous():
        raise ValueError("residual must be contiguous for the in-place add_rmsnorm_ (it is written in place).")
    backend = _resolve("add_rmsnorm_", backend, x)
    if backend == "torch":
        return baselines.add_rmsnorm_(x, residual, weight, eps)
    args = (x.contiguous(), residual, weight.contiguous(), float(eps))
    if backend.__class__ is _PerContext:
        backend = backend.pick("add_rmsnorm_inplace", args)
    # no autograd is registered for the mutating variant: a direct call
    return _op("add_rmsnorm_inplace", backend)(*args)


def add_layernorm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float = 1e-5,
    *,
    backend: Backend = "auto",
) -> tuple[Tensor, Tensor]:
    """Return (layer_norm(x + residual) * weight + bias, x + residual), one pass over the data."""
    if backend not in BACKENDS:
        _check_backend(backend)
    if not _fast_ok(x, (residual,), (weight, bias)):
        _check_common(x, {"residual": residual}, {"weight": weight, "bias": bias})
    backend = _resolve("add_layernorm", backend, x)
    if backend == "torch":
        return baselines.add_layernorm(x, residual, weight, bias, eps)
    return _call(
        "add_layernorm", backend, x.contiguous(), residual.contiguous(), weight.contiguous(), bias.contiguous(),
        float(eps),
    )


def bias_gelu(
    x: Tensor, bias: Tensor, approximate: Literal["none", "tanh"] = "none", *, backend: Backend = "auto"
) -> Tensor:
    """Return gelu(x + bias) with the erf ("none") or tanh form, bias broadcast over the last dim."""
    if backend not in BACKENDS:
        _check_backend(backend)
    if approximate != "none" and approximate != "tanh":
        _library._check_approximate(approximate)
    if not _fast_ok(x, (), (bias,)):
        _check_common(x, {}, {"bias": bias})
    backend = _resolve("bias_gelu", backend, x, approximate)
    if backend == "torch":
        return baselines.bias_gelu(x, bias, approximate)
    return _call("bias_gelu", backend, x.contiguous(), bias.contiguous(), approximate)


def softmax(x: Tensor, scale: float = 1.0, *, backend: Backend = "auto") -> Tensor:
    """Return softmax(x * scale) over the last dimension."""
    if backend not in BACKENDS:
        _check_backend(backend)
    if not _fast_ok(x):
        _check_common(x, {}, {})
    backend = _resolve("softmax", backend, x)
    if backend == "torch":
        return baselines.softmax(x, scale)
    return _call("softmax", backend, x.contiguous(), float(scale))

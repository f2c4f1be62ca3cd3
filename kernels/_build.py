"""JIT build of the CUDA C++ backend (kernels/csrc/*.cu) on first use.

The extension is compiled with torch.utils.cpp_extension.load into a controlled cache directory,
``$PROFKIT_KERNELS_CACHE`` or ``~/.cache/profkit/kernels``, one subdirectory per torch version and
GPU architecture, and loaded as a plain shared library: its TORCH_LIBRARY_IMPL blocks add CUDA
kernels to the op schemas defined in kernels/_library.py.  This module imports torch lazily.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("add_rmsnorm.cu", "add_layernorm.cu", "bias_gelu.cu", "softmax.cu")

_LOADED = False
_LOCK = threading.Lock()
_LIB_PATH: str | None = None

# Launch variant of each CUDA op: 1 = current launch configuration / kernel body, 0 = the previous
# one (kept so a benchmark can time both in one run; see kernels/csrc/common.h).  The choice lives
# here, in Python, so switching it needs no rebuild.  PROFKIT_KERNELS_LAUNCH=legacy selects 0 for all.
LAUNCH_OPS = ("add_rmsnorm", "add_layernorm", "softmax", "bias_gelu")  # = OpId order in common.h
# Measured side by side on an H200 (2026-11-30, analyses/kernels_h200.md): the new add_rmsnorm
# (8 warps a row) and bias_gelu (2-D grid, large tensors) are faster; the one-barrier softmax and
# add_layernorm reductions were 4-11% slower than the previous two-pass ones.  Softmax variant 3
# (8 warps, two barriers, each exp2 computed once) took 2.13 -> 1.92 us at 1x4096 and 20.2 ->
# 19.1 us at 4096x4096 (analyses/data/bench_variants_h200.csv); add_layernorm's variant 3 (two
# barriers) changed nothing, so it stays at 0.
LAUNCH_DEFAULTS = {"add_rmsnorm": 1, "add_layernorm": 0, "softmax": 3, "bias_gelu": 1}


class KernelBuildError(RuntimeError):
    """The CUDA extension could not be built or loaded (no nvcc, no compiler, a compile error)."""


def cache_dir() -> Path:
    root = os.environ.get("PROFKIT_KERNELS_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "profkit", "kernels"
    )
    return Path(root)


def is_loaded() -> bool:
    return _LOADED


def ensure_loaded() -> None:
    """Build (first time) and load the CUDA extension; cheap once loaded."""
    if _LOADED:
        return
    _load()


def _load() -> None:
    global _LOADED, _LIB_PATH
    with _LOCK:
        if _LOADED:
            return
        # A bad PROFKIT_KERNELS_LAUNCH fails here, on every call, before a minute of build (and never
        # leaves a loaded extension running on defaults the user did not ask for).
        choice = launch_choice(os.environ.get("PROFKIT_KERNELS_LAUNCH", ""))
        import torch
        from torch.utils import cpp_extension

        from kernels import _library  # noqa: F401  (the schemas must exist before the .so loads)

        if not torch.cuda.is_available():
            raise KernelBuildError('backend="cuda" needs a CUDA device and a CUDA build of PyTorch.')
        cuda_home = cpp_extension.CUDA_HOME
        nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else shutil.which("nvcc")
        if not nvcc or not os.path.exists(nvcc):
            raise KernelBuildError(
                'backend="cuda" needs nvcc to build its extension: install the CUDA toolkit or set '
                "CUDA_HOME (or use backend=\"triton\")."
            )
        if shutil.which(os.environ.get("CXX", "c++")) is None:
            raise KernelBuildError('backend="cuda" needs a C++ compiler (c++/g++) on PATH to build its extension.')
        major, minor = torch.cuda.get_device_capability()
        cc = f"{major}{minor}"
        tag = torch.__version__.replace("+", "_").replace(".", "_")
        build_dir = cache_dir() / f"torch{tag}_sm{cc}"
        build_dir.mkdir(parents=True, exist_ok=True)
        name = f"profkit_kernels_cuda_sm{cc}"
        sources = [str(CSRC / s) for s in SOURCES]
        fresh = not any(build_dir.glob("*.so"))
        if fresh:
            print(
                f"profkit kernels: building the CUDA extension for sm_{cc} into {build_dir} "
                "(first use, about a minute)...",
                file=sys.stderr,
                flush=True,
            )
        try:
            path = cpp_extension.load(
                name=name,
                sources=sources,
                extra_include_paths=[str(CSRC)],
                extra_cflags=["-O3"],
                extra_cuda_cflags=[
                    "-O3",
                    "-lineinfo",
                    f"-gencode=arch=compute_{cc},code=sm_{cc}",
                    "--expt-relaxed-constexpr",
                ],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=os.environ.get("PROFKIT_KERNELS_VERBOSE") == "1",
            )
        except Exception as exc:  # compile/link/load errors: one clear message, not a deep traceback
            detail = str(exc).strip().splitlines()
            tail = "\n".join(detail[-15:])
            raise KernelBuildError(
                f"building the profkit CUDA extension in {build_dir} failed "
                f"(set PROFKIT_KERNELS_VERBOSE=1 for the full compiler output):\n{tail}"
            ) from None
        _LIB_PATH = path if isinstance(path, str) else None
        _LOADED = True
        for op, v in choice.items():
            try:
                set_launch_variant(op, v)
            except KernelBuildError:
                break  # an extension without the switch: its built-in configuration stays


def launch_choice(env: str) -> dict[str, int]:
    """LAUNCH_DEFAULTS with PROFKIT_KERNELS_LAUNCH applied: ``legacy`` (every op on variant 0) or
    ``op=variant`` pairs, comma-separated (``softmax=2,add_layernorm=2``), for side-by-side runs."""
    if env.strip() == "legacy":
        return {op: 0 for op in LAUNCH_DEFAULTS}
    out = dict(LAUNCH_DEFAULTS)
    for part in filter(None, (p.strip() for p in env.split(","))):
        op, _, v = part.partition("=")
        op = op.strip()
        if op not in out or v.strip() not in ("0", "1", "2", "3"):
            raise ValueError(f"PROFKIT_KERNELS_LAUNCH: {part!r} is not OP=VARIANT with OP one of "
                             f"{', '.join(LAUNCH_OPS)} and VARIANT 0 to 3, or 'legacy'")
        out[op] = int(v.strip())
    return out


def _lib():
    import ctypes

    if not _LOADED or _LIB_PATH is None:
        raise KernelBuildError("the CUDA extension is not loaded (call ensure_loaded() first).")
    lib = ctypes.CDLL(_LIB_PATH)  # the already-loaded library: same handle, no second copy
    try:
        fn = lib.profkit_kernels_set_launch_variant
    except AttributeError:
        raise KernelBuildError("this build of the CUDA extension has no launch-variant switch.") from None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    get = lib.profkit_kernels_get_launch_variant
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    return fn, get


def set_launch_variant(op: str, variant: int) -> int:
    """Select the launch configuration of one CUDA op (1 current, 0 previous; softmax and
    add_layernorm also 2: the two-pass body on 8 warps a decode row); returns the old one.

    Read at each launch on the host, so it applies to the next call (and to CUDA graphs captured
    after it)."""
    fn, _ = _lib()
    old = fn(LAUNCH_OPS.index(op), int(variant))
    if old < 0:
        raise ValueError(f"bad launch variant {variant!r} for {op!r} (0 to 3).")
    return old


def get_launch_variant(op: str) -> int:
    _, get = _lib()
    return get(LAUNCH_OPS.index(op))

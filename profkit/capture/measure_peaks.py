"""Measure a GPU's practical ceilings for ``profkit peaks`` (needs torch and a CUDA device).

* memory bandwidth: device-to-device copy of a 1 GiB buffer, (bytes read + bytes written) / time;
* GEMM FLOP/s at 8192^3 for bf16, fp16, tf32 (fp32 inputs, TF32 tensor cores) and fp32 (no TF32);
* launch floor: GPU time per kernel of 1000 one-element adds captured in a CUDA graph and replayed
  back to back (a timed eager loop when graphs are unavailable).

Each number is the median of timed repetitions after warm-up, timed with CUDA events. The
result is the JSON documented in :mod:`profkit.read.peaks`.
"""
from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any, Callable, Optional

from profkit.errors import ProfkitError

GEMM_N = 8192
COPY_BYTES = 1 << 30
LAUNCHES = 1000


def _torch() -> Any:
    try:
        import torch
    except Exception as exc:  # ImportError or a broken install
        raise ProfkitError(f"profkit peaks needs PyTorch with CUDA (import torch failed: {exc}); "
                           "install torch on the GPU machine") from None
    if not torch.cuda.is_available():
        raise ProfkitError("profkit peaks needs a CUDA GPU: torch.cuda.is_available() is False "
                           f"(torch {torch.__version__})")
    return torch


def _median_ms(torch: Any, fn: Callable[[], None], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_bandwidth(torch: Any, nbytes: int = COPY_BYTES, reps: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _median_ms(torch, lambda: dst.copy_(src), warmup=3, reps=reps)
    return 2 * nbytes / (ms * 1e-3)


def measure_gemm(torch: Any, precision: str, n: int = GEMM_N, reps: int = 10) -> float:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
             "fp32": torch.float32}[precision]
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        ms = _median_ms(torch, lambda: torch.mm(a, b, out=c), warmup=3, reps=reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return 2.0 * n ** 3 / (ms * 1e-3)


def measure_launch_floor(torch: Any, launches: int = LAUNCHES) -> tuple[float, str]:
    """ns of GPU time per tiny kernel, back to back; and how it was measured."""
    x = torch.zeros(1, device="cuda")
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                x.add_(1)
        ms = _median_ms(torch, graph.replay, warmup=3, reps=10)
        how = f"CUDA graph of {launches} one-element adds"
    except Exception:  # graphs unsupported: an eager loop (includes CPU launch gaps)
        def loop() -> None:
            for _ in range(launches):
                x.add_(1)
        ms = _median_ms(torch, loop, warmup=2, reps=5)
        how = f"eager loop of {launches} one-element adds"
    return ms * 1e6 / launches, how


def measure(precisions: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32"),
            say: Optional[Callable[[str], None]] = None) -> dict:
    """All ceilings as the peaks JSON (``profkit.read.peaks`` format, plus a ``details`` block)."""
    torch = _torch()
    say = say or (lambda _msg: None)
    gpu = torch.cuda.get_device_name()
    say(f"profkit peaks: {gpu}: copy bandwidth")
    bw = measure_bandwidth(torch)
    flops = {}
    for p in precisions:
        say(f"profkit peaks: {p} GEMM {GEMM_N}^3")
        flops[p] = measure_gemm(torch, p)
    say("profkit peaks: launch floor")
    floor_ns, how = measure_launch_floor(torch)
    today = _dt.date.today().isoformat()
    return {
        "gpu": gpu,
        "source": f"measured with profkit peaks, {today}",
        "memory_bandwidth": bw,
        "flops": flops,
        "launch_floor_ns": floor_ns,
        "details": {"copy_bytes": COPY_BYTES, "gemm_n": GEMM_N, "launch_floor": how,
                    "torch": torch.__version__, "statistic": "median of CUDA-event timings"},
    }

"""Small GPU workloads that profkit's own tests and case studies are captured from.

Each case puts its work inside NVTX ranges whose names the tests look for. The first call of
each op happens inside the same range as the rest, so the first instance carries cuBLAS/cuDNN
set-up (the tests check that medians ignore it).

    python scripts/workloads/micro.py gemm|chain|addnorm|memcpy|softmax|graph|hinted|all
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from profkit.read.hints import format_range_name  # noqa: E402  (pure Python, no GPU needed)

try:
    import nvtx

    def rng(name: str):
        return nvtx.annotate(name)
except ImportError:  # pragma: no cover - the GPU machine may lack the nvtx package
    import contextlib

    @contextlib.contextmanager
    def rng(name: str):
        torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()

DEV = "cuda"
REPS = 10


def sync() -> None:
    torch.cuda.synchronize()


def case_gemm() -> None:
    """A large bf16 GEMM (compute-bound, near roof), an fp32 GEMM without TF32, a skinny decode GEMM."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    for _ in range(REPS):
        with rng("gemm_bf16_8192"):
            a @ b
    af, bf = a[:4096, :4096].float(), b[:4096, :4096].float()
    for _ in range(REPS):
        with rng("gemm_fp32_4096"):
            af @ bf
    x = torch.randn(1, 8192, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(8192, 8192 * 2, device=DEV, dtype=torch.bfloat16)
    for _ in range(REPS):
        with rng("gemm_skinny_decode"):
            x @ w
    sync()


def case_chain() -> None:
    """Twenty tiny elementwise kernels on 4096 floats: launch-bound."""
    x = torch.randn(4096, device=DEV)
    for _ in range(REPS):
        with rng("tiny_chain"):
            y = x
            for _ in range(5):
                y = y * 1.01
                y = y + 0.5
                y = torch.relu(y)
                y = torch.sigmoid(y)
    sync()


def case_addnorm() -> None:
    """Eager residual add + RMSNorm at a prefill shape (memory-bound, two passes over HBM)."""
    x = torch.randn(16384, 4096, device=DEV, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device=DEV, dtype=torch.bfloat16)
    for _ in range(REPS):
        with rng("add_rmsnorm"):
            h = x + r
            F.rms_norm(h, (4096,), w, 1e-6)
    sync()


def case_memcpy() -> None:
    """Host-to-device, device-to-host and device-to-device copies and a memset."""
    host = torch.randn(64 * 1024 * 1024 // 4).pin_memory()
    dev = torch.empty(host.shape, device=DEV)
    dev2 = torch.empty_like(dev)
    for _ in range(REPS):
        with rng("h2d_copy"):
            dev.copy_(host, non_blocking=True)
        with rng("d2d_copy"):
            dev2.copy_(dev)
        with rng("d2h_copy"):
            host.copy_(dev2, non_blocking=True)
        with rng("memset"):
            dev2.zero_()
    sync()


def case_softmax() -> None:
    """Row softmax with a scale (the fused-softmax pattern) at 16384 x 4096 bf16."""
    x = torch.randn(16384, 4096, device=DEV, dtype=torch.bfloat16)
    for _ in range(REPS):
        with rng("scaled_softmax"):
            torch.softmax(x * 0.125, dim=-1)
    sync()


def case_graph() -> None:
    """The tiny chain captured once in a CUDA graph and replayed; eager beside it."""
    x = torch.randn(4096, device=DEV)

    def chain(t: torch.Tensor) -> torch.Tensor:
        for _ in range(5):
            t = t * 1.01
            t = t + 0.5
            t = torch.relu(t)
            t = torch.sigmoid(t)
        return t

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chain(x)  # warm-up on a side stream, as torch.cuda.graphs requires
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain(x)
    sync()
    for _ in range(REPS):
        with rng("eager_chain"):
            chain(x)
    for _ in range(REPS):
        with rng("graph_replay"):
            g.replay()
    sync()


def case_hinted() -> None:
    """A custom region whose name carries FLOP/byte hints (profkit's NVTX convention)."""
    n = 4096
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    name = format_range_name("my_matmul", flops=2.0 * n**3, bytes=3.0 * n * n * 2, precision="bf16")
    for _ in range(REPS):
        with rng(name):
            torch.mm(a, b)
    sync()


CASES = {
    "gemm": case_gemm, "chain": case_chain, "addnorm": case_addnorm, "memcpy": case_memcpy,
    "softmax": case_softmax, "graph": case_graph, "hinted": case_hinted,
}


def main(argv: list[str]) -> None:
    names = list(CASES) if argv[:1] == ["all"] or not argv else argv
    for name in names:
        CASES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])

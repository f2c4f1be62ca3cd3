"""Closed categories of profkit's verdicts."""
from __future__ import annotations

from enum import Enum


class BoundClass(str, Enum):
    """What sets an op's time."""
    COMPUTE = "compute"   # arithmetic units: intensity above the ridge point
    MEMORY = "memory"     # bytes through HBM (or a host link): intensity below the ridge point
    LAUNCH = "launch"     # the fixed cost of launching kernels, not the work in them
    COMMUNICATION = "communication"  # NCCL collectives: bytes between GPUs (see profkit.judge.comm)
    UNKNOWN = "unknown"   # the evidence cannot decide (e.g. a GEMM seen on the timeline only)


class Rung(str, Enum):
    """The ladder of fixes, cheapest first."""
    NONE = "none"                      # no kernel work pays: leave it, or do less work
    LIBRARY = "library"                # a mature library call or setting (cuBLAS, cuDNN, SDPA, TF32)
    TORCH_COMPILE = "torch.compile"    # let the compiler fuse, or capture CUDA graphs
    TRITON = "triton"                  # a Triton kernel (profkit bundles some)
    CUDA_EXTENSION = "cuda-extension"  # a CUDA C++ extension
    CUTLASS = "cutlass"                # CUTLASS/CuTe for GEMM-like mainloops with custom epilogues


class Source(str, Enum):
    """Where an op's work counts came from, best first."""
    NCU = "ncu"            # hardware counters merged from an Nsight Compute pass
    GPU_METRICS = "gpu_metrics"  # nsys GPU-metrics samples (DRAM, SM, tensor activity) over the op
    SHAPES = "shapes"      # FLOPs/bytes from aten op shapes (emit_nvtx record_shapes)
    HINTS = "hints"        # FLOP/byte hints in the NVTX range name
    COPY = "copy"          # bytes of a memcpy/memset, exact from the trace
    TIMELINE = "timeline"  # durations, gaps and kernel names alone


CONFIDENCE = {Source.NCU: "high", Source.GPU_METRICS: "medium", Source.SHAPES: "medium", Source.HINTS: "medium",
              Source.COPY: "high", Source.TIMELINE: "low"}

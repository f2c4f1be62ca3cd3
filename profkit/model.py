"""Closed categories of profkit's verdicts."""
from __future__ import annotations

from enum import Enum


class BoundClass(str, Enum):
    """What sets an op's time."""
    COMPUTE = "compute"   # arithmetic units: intensity above the ridge point
    MEMORY = "memory"     # bytes through HBM (or a host link): intensity below the ridge point
    LAUNCH = "launch"     # the fixed cost of launching kernels, not the work in them
    LATENCY = "latency"   # a grid of a few blocks: most SMs idle, neither roof sets the time
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


# Elements a tensor-core GEMM wants each of M, K, N to be a multiple of (16-byte operand loads),
# by the precision it runs in: the capture's timings, the run model and the rules share it.
GEMM_ALIGN = {"bf16": 8, "fp16": 8, "fp8": 16, "fp32": 4, "tf32": 4}


def gemm_multiply_adds(shape: dict) -> float:
    """A recorded GEMM shape's multiply-adds per call (batch x M x N x K); 0 for a shape that
    lacks them."""
    try:
        return float(int(shape.get("batch", 1)) * int(shape["m"]) * int(shape["n"]) * int(shape["k"]))
    except (KeyError, TypeError, ValueError):
        return 0.0


def gemm_unaligned(shape: dict, align: int) -> bool:
    """Whether a recorded GEMM shape's M, N or K is not a multiple of ``align`` elements (off the
    aligned tensor-core kernels); False for a shape that lacks them."""
    try:
        return any(int(shape[d]) % align for d in ("m", "n", "k"))
    except (KeyError, TypeError, ValueError):
        return False


class Switch(str, Enum):
    """A fix that ``profkit capture --try`` applies to the user's program without editing it
    (profkit.capture.switches), to time it beside the unchanged program."""
    TF32 = "tf32"                            # matmul and cuDNN convolutions in TF32
    BF16 = "bf16"                            # autocast bf16 around the outermost module's call
    FUSED_OPTIM = "fused_optim"              # fused=True for Adam, AdamW, SGD, Adagrad
    WORKERS = "workers"                      # DataLoader worker processes, pinned memory
    NO_EMPTY_CACHE = "no_empty_cache"        # torch.cuda.empty_cache() does nothing
    CUDNN_BENCHMARK = "cudnn_benchmark"      # torch.backends.cudnn.benchmark = True
    CHANNELS_LAST = "channels_last"          # the outermost module and its 4-D/5-D inputs
    COMPILE = "compile"                      # torch.compile of the outermost module
    COMPILE_GRAPHS = "compile_graphs"        # the same, mode="reduce-overhead" (CUDA graphs)
    COMPILE_FROZEN = "compile_frozen"        # the same, default mode, with Inductor's freezing
    EXPANDABLE_SEGMENTS = "expandable_segments"  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    FREEZE_UNSTEPPED = "freeze_unstepped"    # parameters no optimizer steps stop requiring gradients
    BATCHED_FETCH = "batched_fetch"          # a TensorDataset's DataLoader reads a batch in one call
    NO_ANOMALY = "no_anomaly"                # autograd's anomaly detection never turned on
    INFERENCE_MODE = "inference_mode"        # the outermost module's calls under torch.inference_mode()
    FP32 = "fp32"                            # the outermost module's float64 weights and inputs in float32


def parse_trial(text: str) -> tuple[Switch, ...]:
    """A trial's switches from its name: one switch (``tf32``), or several applied together
    joined by ``+`` (``channels_last+bf16``). ValueError names what is not a switch."""
    parts = [p.strip() for p in str(text).split("+")]
    known = {s.value for s in Switch}
    bad = [p for p in parts if p not in known]
    if bad or not parts:
        raise ValueError(f"unknown switch {'+'.join(bad) or text!r}: known are "
                         f"{', '.join(s.value for s in Switch)} (several at once joined by +)")
    return tuple(dict.fromkeys(Switch(p) for p in parts))

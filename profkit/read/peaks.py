"""Roofline ceilings for a GPU: a spec table keyed by name, a measured-peaks file, or the trace's own numbers.

Peaks file (JSON, written by ``profkit peaks`` on a GPU machine, or by hand)::

    {"gpu": "NVIDIA H200", "source": "measured with profkit peaks, 2026-11-30",
     "memory_bandwidth": 4.25e12,                      # bytes/s
     "flops": {"fp32": 5.1e13, "tf32": 3.45e14, "bf16": 7.9e14, "fp16": 6.64e14},  # FLOP/s
     "launch_floor_ns": 1300}                          # one empty kernel, back to back

Keys missing from the file fall back to the spec table.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from profkit.errors import ProfkitError

PRECISION_ORDER = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")

# Datasheet numbers: dense tensor-core rates (no sparsity), SXM parts where there are several.
# fp64 is the FP64 tensor cores' rate where there are some (cuBLAS runs DGEMM there: 42-57 TFLOP/s
# measured on an H100 SXM, above its CUDA cores' 34): the roof of float64 GEMMs. Parts without
# FP64 tensor cores (L4, L40S, RTX 4090) run float64 at 1/64 of float32.
# Each entry: (name regex, memory bandwidth B/s, {precision: FLOP/s}).
_SPECS: list[tuple[str, float, dict[str, float]]] = [
    (r"H200", 4.8e12, {"fp64": 67e12, "fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12,
                       "fp16": 989.5e12, "fp8": 1979e12}),
    (r"H100.*PCIe", 2.0e12, {"fp64": 51e12, "fp32": 51e12, "tf32": 378e12, "bf16": 756e12,
                             "fp16": 756e12, "fp8": 1513e12}),
    (r"H100|GH200", 3.35e12, {"fp64": 67e12, "fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12,
                              "fp16": 989.5e12, "fp8": 1979e12}),
    (r"B200", 8.0e12, {"fp64": 40e12, "fp32": 80e12, "tf32": 1100e12, "bf16": 2250e12,
                       "fp16": 2250e12, "fp8": 4500e12}),
    (r"A100.*40GB", 1.555e12, {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12,
                               "fp16": 312e12}),
    (r"A100", 2.039e12, {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12,
                         "fp16": 312e12}),
    (r"L40S", 0.864e12, {"fp64": 1.4e12, "fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12,
                         "fp8": 733e12}),
    (r"L4\b", 0.3e12, {"fp64": 0.47e12, "fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12,
                       "fp8": 242e12}),
    (r"RTX 4090", 1.008e12, {"fp64": 1.3e12, "fp32": 82.6e12, "tf32": 82.6e12, "bf16": 165e12, "fp16": 165e12,
                             "fp8": 330e12}),
    (r"V100", 0.9e12, {"fp64": 7.8e12, "fp32": 15.7e12, "fp16": 125e12}),
]

DEFAULT_LAUNCH_FLOOR_NS = 2000.0  # an empty kernel back to back is ~1-2 us on recent GPUs


@dataclass(frozen=True)
class GpuInfo:
    """What the trace says about the GPU (TARGET_INFO_GPU)."""
    name: str = "unknown GPU"
    sm_count: Optional[int] = None
    clock_hz: Optional[float] = None
    memory_bandwidth: Optional[float] = None  # B/s, as the driver reports it
    compute_capability: Optional[str] = None
    l2_bytes: Optional[int] = None
    total_memory: Optional[int] = None


@dataclass(frozen=True)
class Peaks:
    gpu: str
    memory_bandwidth: float                      # bytes/s
    flops: dict[str, float] = field(default_factory=dict)  # precision -> FLOP/s
    launch_floor_ns: float = DEFAULT_LAUNCH_FLOOR_NS
    source: str = "spec"

    def compute_peak(self, precision: Optional[str]) -> tuple[str, float]:
        """The roof for ``precision`` (falls back to fp32, then the lowest roof known)."""
        if precision and precision in self.flops:
            return precision, self.flops[precision]
        if "fp32" in self.flops:
            return "fp32", self.flops["fp32"]
        name = min(self.flops, key=self.flops.__getitem__)
        return name, self.flops[name]

    def ridge(self, precision: Optional[str]) -> float:
        """Arithmetic intensity (FLOP/byte) where the compute roof meets the memory roof."""
        return self.compute_peak(precision)[1] / self.memory_bandwidth

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "source": self.source, "memory_bandwidth": self.memory_bandwidth,
                "flops": dict(self.flops), "launch_floor_ns": self.launch_floor_ns}


def spec_peaks(gpu: GpuInfo) -> Optional[Peaks]:
    for pattern, bw, flops in _SPECS:
        if re.search(pattern, gpu.name):
            return Peaks(gpu=gpu.name, memory_bandwidth=bw, flops=dict(flops),
                         source=f"spec table ({pattern.replace(chr(92) + 'b', '')} datasheet)")
    return None


def derived_peaks(gpu: GpuInfo) -> Optional[Peaks]:
    """Ceilings from the trace's own numbers for a GPU the spec table does not know.

    fp32 = 2 FLOP x 128 FP32 lanes x SMs x clock (true of sm_80 and later); tensor rates are
    left out because they vary too much between parts to guess.
    """
    if not gpu.memory_bandwidth:
        return None
    flops: dict[str, float] = {}
    if gpu.sm_count and gpu.clock_hz:
        flops["fp32"] = 2 * 128 * gpu.sm_count * gpu.clock_hz
    else:
        return None
    return Peaks(gpu=gpu.name, memory_bandwidth=float(gpu.memory_bandwidth), flops=flops,
                 source="derived from the trace (bandwidth, SMs x clock); pass --peaks for better")


PEAKS_KEYS = {"gpu", "source", "memory_bandwidth", "flops", "launch_floor_ns", "details"}
FLOPS_KEYS = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8")


def _positive(p: Path, where: str, value: object, upper: float) -> float:
    """A finite number in (0, upper], or a one-line error naming the file and the key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfkitError(f"peaks file {p}: {where} must be a number, not {value!r}")
    if not (0 < value <= upper) or math.isnan(value):
        raise ProfkitError(f"peaks file {p}: {where} = {value!r} is not a plausible peak "
                           f"(expected a positive number up to {upper:g})")
    return float(value)


def load_peaks_file(path: str | Path, base: Optional[Peaks], gpu: GpuInfo) -> Peaks:
    """The peaks in a JSON file from ``profkit peaks`` (keys it omits come from the spec table).

    Every key is checked: an unknown key (a typo such as ``bandwidth``) or an implausible value is
    an error rather than silently falling back to the spec table.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProfkitError(f"peaks file not found: {p}") from None
    except (OSError, ValueError) as exc:
        raise ProfkitError(f"peaks file {p} is not valid JSON ({exc}); "
                           "write one with `profkit peaks -o FILE` on the GPU") from None
    if not isinstance(data, dict):
        raise ProfkitError(f"peaks file {p} must hold a JSON object")
    unknown = sorted(set(data) - PEAKS_KEYS)
    if unknown:
        raise ProfkitError(f"peaks file {p}: unknown key(s) {', '.join(map(repr, unknown))}; "
                           f"expected {', '.join(sorted(PEAKS_KEYS))}")
    if not {"memory_bandwidth", "flops", "launch_floor_ns"} & set(data):
        raise ProfkitError(f"peaks file {p} sets none of memory_bandwidth, flops, launch_floor_ns")
    bw = (_positive(p, "memory_bandwidth", data["memory_bandwidth"], 1e15)  # B/s; HBM is ~5e12
          if "memory_bandwidth" in data else (base.memory_bandwidth if base else None))
    flops = dict(base.flops) if base else {}
    file_flops = data.get("flops", {})
    if not isinstance(file_flops, dict):
        raise ProfkitError(f"peaks file {p}: flops must be an object such as {{\"bf16\": 9.9e14}}")
    for k, v in file_flops.items():
        if k not in FLOPS_KEYS:
            raise ProfkitError(f"peaks file {p}: flops has unknown precision {k!r}; expected "
                               f"{', '.join(FLOPS_KEYS)}")
        flops[k] = _positive(p, f"flops.{k}", v, 1e18)  # FLOP/s; an H200 does ~1e15
    floor = (_positive(p, "launch_floor_ns", data["launch_floor_ns"], 1e6)
             if "launch_floor_ns" in data else
             (base.launch_floor_ns if base else DEFAULT_LAUNCH_FLOOR_NS))
    if not bw or not flops:
        raise ProfkitError(f"peaks file {p} needs memory_bandwidth and flops for {gpu.name}")
    source = str(data.get("source") or f"peaks file {p.name}")
    return Peaks(gpu=str(data.get("gpu") or gpu.name), memory_bandwidth=float(bw), flops=flops,
                 launch_floor_ns=floor, source=source)


def resolve_peaks(gpu: GpuInfo, peaks_file: Optional[str | Path] = None) -> tuple[Peaks, list[str]]:
    """The ceilings to use and any warnings to show the user."""
    warnings: list[str] = []
    base = spec_peaks(gpu)
    if peaks_file is not None:
        return load_peaks_file(peaks_file, base, gpu), warnings
    if base is not None:
        return base, warnings
    derived = derived_peaks(gpu)
    if derived is not None:
        warnings.append(f"{gpu.name} is not in the spec table: using ceilings derived from the "
                        "trace (memory bandwidth, fp32 from SMs x clock); pass --peaks FILE for "
                        "tensor-core roofs")
        return derived, warnings
    raise ProfkitError(f"unknown GPU {gpu.name!r} and the trace has no bandwidth/clock numbers: "
                       "pass --peaks FILE (write one with `profkit peaks -o FILE` on that GPU)")


"""The next step for each op: the cheapest rung of the ladder that is likely to pay, and by how much.

mature library -> torch.compile -> Triton -> CUDA C++ extension -> CUTLASS/CuTe

Every estimate is a bound, with its formula in ``basis``: a roofline bound (the op at a target
fraction of its roof), or a fusion bound ((kernels + launch gaps) / one fused kernel). The
end-to-end gain is over the window's wall time: GPU time saved shortens the run only where the
GPU was the bottleneck (the next work already queued), not where it waited for the host. The
same saving over the window's GPU time is kept as ``expected_gpu_time_speedup``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from profkit.judge import comm

from profkit.judge import patterns
from profkit.judge.classify import GEMM_RE, Verdict, gemm_shape_hint
from profkit.judge.evidence import Work
from profkit.judge.flops import gemm_mkn
from profkit.judge.grid import op_speedup as grid_speedup
from profkit.model import GEMM_ALIGN, BoundClass, Rung
from profkit.read.peaks import Peaks

NEAR_ROOF = 0.70          # at or above this share of its roof, a new kernel would not pay
TARGET_MEMORY = 0.90      # what a good memory-bound kernel reaches (share of the bandwidth roof)
TARGET_COMPUTE = 0.70     # what a good library GEMM reaches (share of the compute roof)
MIN_END_TO_END = 1.02     # below this end-to-end gain, the work does not pay
HOST_GAP_NS = 100_000.0   # idle per kernel above this is host work, not launch cost (~5-50 us)
SMALL_SHARE = 0.05        # with no speedup estimate, an op under this share is not worth a kernel

_NORM_RE = re.compile(r"rms_?norm|layer_?norm|RMSNorm|LayerNorm", re.I)
_ADD_RE = re.compile(r"add|residual", re.I)
_SOFTMAX_RE = re.compile(r"softmax", re.I)
_GELU_RE = re.compile(r"gelu", re.I)
FUSED_OPTIMIZER_RE = re.compile(r"Fused(Adam|AdamW|Sgd|SGD|Adagrad)\w*Functor", re.I)
NCCL_SETUP_RE = re.compile(r"nccl(CommInit\w*|CommSplit|GetUniqueId|CommDestroy|CommAbort|"
                           r"CommFinalize|CommRegister)", re.I)
_ATTN_RE = re.compile(r"attention|flash|fmha|sdpa|cudnn_attention", re.I)


@dataclass(frozen=True)
class Frame:
    """What an op's saving is measured against: the window's GPU time and its wall time.

    ``host_floor_ns``: the CPU's own time in the window (wall minus the time it sat blocked
    waiting for the GPU). A GPU saving cannot take the wall time below it: the host still issues
    every launch (train_llama: the optimizer's kernels 2.65x faster with fused AdamW, the step
    not faster). 0 when gains are judged on GPU time alone."""
    gpu_time_ns: float
    wall_ns: float
    host_floor_ns: float = 0.0


@dataclass
class Suggestion:
    rung: Rung
    action: str
    expected_op_speedup: float
    expected_end_to_end_speedup: float   # over the window's wall time
    basis: str
    worth_it: bool
    expected_gpu_time_speedup: float = 1.0  # the same saving over the window's GPU time

    def as_dict(self) -> dict:
        return {"rung": self.rung.value, "action": self.action,
                "expected_op_speedup": round(self.expected_op_speedup, 3),
                "expected_end_to_end_speedup": round(self.expected_end_to_end_speedup, 4),
                "expected_gpu_time_speedup": round(self.expected_gpu_time_speedup, 4),
                "basis": self.basis, "worth_it": self.worth_it}


def _unaligned_dims(name: str, precision: Optional[str]) -> str:
    """'N = 50257 not a multiple of 8' for a GEMM op key whose dims break tensor-core alignment."""
    mkn = gemm_mkn(name)
    align = GEMM_ALIGN.get(precision or "")
    if mkn is None or not align:
        return ""
    bad = [f"{d} = {v}" for d, v in zip("MKN", mkn) if v % align]
    return f"{', '.join(bad)} not a multiple of {align}" if bad else ""


def gains(saved_ns: float, op_speedup: float, critical: float, frame: Frame) -> tuple[float, float]:
    """(end to end on wall time, on GPU time) for ``saved_ns`` of GPU time saved.

    On wall time only the critical share of the saving counts (``critical``: the share of the
    op's GPU time after which the GPU was the bottleneck). Neither gain exceeds the op's own.
    """
    if op_speedup <= 1.0 or saved_ns <= 0:
        return 1.0, 1.0
    g = frame.gpu_time_ns / (frame.gpu_time_ns - saved_ns) if frame.gpu_time_ns > saved_ns else op_speedup
    w_saved = saved_ns * min(max(critical, 0.0), 1.0)
    w = (frame.wall_ns / max(frame.wall_ns - w_saved, frame.host_floor_ns)
         if frame.wall_ns > w_saved else op_speedup)
    return min(w, op_speedup), min(g, op_speedup)


def end_to_end(op: dict, op_speedup: float, frame: Frame) -> tuple[float, float]:
    """Gains of making ``op`` ``op_speedup`` times faster. The saving is counted on steady-state
    calls (median x count) and never exceeds the op's own busy GPU time, so idle gaps cannot
    inflate it."""
    if op_speedup <= 1.0:
        return 1.0, 1.0
    return gains(steady_saving(op, op_speedup), op_speedup, float(op.get("critical_fraction", 1.0)), frame)


def steady_saving(op: dict, op_speedup: float) -> float:
    """GPU time saved by making ``op`` ``op_speedup`` times faster: on its steady-state calls
    (median x count), never more than its own busy time."""
    steady = float(op["gpu_time_median_ns"]) * float(op["count"])
    return min(steady * (1.0 - 1.0 / op_speedup), float(op["busy_ns"]))


def _pattern(text: str, kernel_names: tuple[str, ...] = (), op_name: str = "") -> Optional[str]:
    if _NORM_RE.search(text) and _ADD_RE.search(text):
        # The kernels say which norm runs (HF names its RMSNorm modules `*_layernorm`).
        kind = patterns.norm_kind(list(kernel_names), op_name)
        if kind is not None:
            return "add_layernorm" if kind is patterns.NormKind.LAYER else "add_rmsnorm"
        return "add_layernorm" if re.search(r"layer_?norm", text, re.I) and not \
            re.search(r"rms", text, re.I) else "add_rmsnorm"
    if _SOFTMAX_RE.search(text):
        return "softmax"
    if _GELU_RE.search(text) and _ADD_RE.search(text):
        return "bias_gelu"
    return None


# Passes over the activation tensor: eager PyTorch vs the bundled fused kernel.
_FUSED_PASSES = {"add_rmsnorm": (5, 4), "add_layernorm": (5, 4), "softmax": (4, 2), "bias_gelu": (4, 2)}
FUSED_PASSES = _FUSED_PASSES  # public name for the rules (profkit.judge.rules.pk401_eager_norm_fusion)


def advise(op: dict, verdict: Verdict, work: Optional[Work], peaks: Peaks, kernel_names: list[str],
           under_graph: bool, frame: Frame,
           price: Optional[Callable[[float], Optional[tuple[float, str]]]] = None,
           library_kernels: int = 0) -> Suggestion:
    """The next step for one op and what it would give. ``price(op_speedup)``: the step model's
    (gain on wall time, basis) of the op's kernels running that much faster (None where it cannot
    say); without it, or where it says nothing, the Amdahl estimate on the window (gains()).
    ``library_kernels``: how many of the op's distinct kernels are library ones (GEMMs,
    convolutions, attention, NCCL), which no fusion of its other kernels shortens."""
    span = float(op["gpu_time_median_ns"])
    busy = float(op["busy_median_ns"]) or span
    kpc = float(op["kernels_per_call"])
    text = " ".join([str(op["name"])] + kernel_names)
    pct = verdict.pct_of_roof
    if NCCL_SETUP_RE.search(str(op["name"])):
        # Communicator set-up runs once: there is nothing to fuse or overlap.
        return Suggestion(Rung.NONE, "Leave it: NCCL communicator set-up, a one-off before the "
                          "steady state", 1.0, 1.0, "one-off set-up: no estimate", False, 1.0)
    if patterns.is_compiled(str(op["name"]), kernel_names):
        # torch.compile made these kernels: telling the user to compile them contradicts the
        # evidence; their next step is in the compiler's own settings, not a new kernel.
        return Suggestion(Rung.NONE, "Leave it: these kernels were generated by torch.compile "
                          "(Inductor) already; look at the compiled region as a whole (its graph "
                          "breaks, CUDA-graph capture) rather than this kernel", 1.0, 1.0,
                          "already compiled: no estimate", False, 1.0)
    rung, action, s, basis = _choose(op, verdict, work, peaks, text, kpc, span, busy, pct, under_graph,
                                     tuple(kernel_names), library_kernels)
    s = max(1.0, s)
    e2e, e2e_gpu = end_to_end(op, s, frame)
    # A launch-bound op's gain is CPU time (fewer launches), not shorter kernels: the kernel-time
    # edit would not see it, so it keeps the estimate on the window. Nor is the step replayed for
    # a saving that could not pay even if all of it came off the wall time.
    saved = steady_saving(op, s) if s > 1.0 else 0.0
    could_pay = frame.wall_ns > saved and frame.wall_ns / (frame.wall_ns - saved) >= MIN_END_TO_END
    priced = (price(s) if (price is not None and s > 1.0 and e2e_gpu > 1.0 and could_pay
                           and verdict.bound is not BoundClass.LAUNCH) else None)
    if priced is not None:
        # The model replays the step with the op's kernels shrunk: the Amdahl estimate is its
        # special case (a GPU-bound step, the op on the critical path).
        e2e = min(priced[0], s)
        basis = f"{basis}; {priced[1]}" if basis else priced[1]
    worth = rung is not Rung.NONE and e2e >= MIN_END_TO_END
    share = float(op["share"])
    what = "the work" if verdict.bound is BoundClass.COMMUNICATION else "a kernel"
    if rung is not Rung.NONE and not worth and s > 1.0:
        waits = (" (the GPU mostly waits for the host after it)"
                 if e2e_gpu >= MIN_END_TO_END else "")
        action = (f"Not worth {what}: {share:.1%} of GPU time, so even {s:.2f}x on "
                  f"this op is {e2e:.3f}x end to end{waits}. (If it grows: {action})")
    elif rung is not Rung.NONE and not worth and share < SMALL_SHARE:
        action = f"Not worth {what}: only {share:.1%} of GPU time. (If it grows: {action})"
    return Suggestion(rung, action, s, e2e, basis, worth, e2e_gpu)


def _longest(op, busy: float) -> float:
    """The call's longest kernel (at most its busy time): no fusion of the call's kernels is
    shorter, as the step model's fusion edit has the same floor."""
    return min(float(op.get("kernel_longest_ns", 0.0) or 0.0), busy)


def _choose(op, verdict, work, peaks, text, kpc, span, busy, pct, under_graph, knames=(), library=0):
    # Distinct kernels per op: a chain worth fusing has several; repeats of one kernel do not.
    chain = float(op.get("distinct_kernels", kpc))
    if verdict.bound is BoundClass.COMMUNICATION:  # overlap, bucket sizes, fewer collectives
        return (Rung.LIBRARY, *comm.advice_parts(op, verdict))
    floor = peaks.launch_floor_ns
    kmed = float(op["kernel_median_ns"])
    if verdict.bound is BoundClass.LATENCY:  # the kernels, not their launches or bytes
        s = grid_speedup(op)
        return (Rung.LIBRARY,
                f"spread the work over the GPU: {op['small_grid_share']:.0%} of its kernel time runs on "
                f"{op['small_grid_blocks']} block(s) of {op['sm_count']} SMs; use an algorithm that fills "
                "every SM (a device-wide sort or top-k for a selection, a reduction split over many "
                "blocks), or compute it less often (profkit rules --explain PK307)", s,
                f"grid bound: its small-grid kernels as if every SM did what their blocks did "
                f"({op['small_grid_ns'] / 1e6:.2f} -> {op['small_grid_full_ns'] / 1e6:.2f} ms over the window)")
    if verdict.bound is BoundClass.UNKNOWN:  # no advice on a guess
        return (Rung.NONE, "bound unknown: measure before acting (profkit capture --ncu, "
                           "--gpu-metrics or --aten gives the evidence)", 1.0,
                "bound unknown: no estimate")
    if verdict.bound is BoundClass.LAUNCH:
        pat = _pattern(text, knames, str(op["name"]))
        bundled = f" (bundled: kernels.{pat})" if pat else ""
        gap = max(span - busy, 0.0) / max(kpc, 1.0)
        if gap > HOST_GAP_NS:
            return (Rung.NONE,
                    f"the GPU waits {gap / 1e3:.0f} us per kernel, far more than launching costs: the "
                    "host is busy with other work inside this range (compilation, autotuning, "
                    "synchronisation, data loading, Python); profile the CPU side (nsys -s cpu) — no "
                    "kernel will help", 1.0,
                    f"host bound: no kernel gain (span {span / 1e3:.1f} us vs busy {busy / 1e3:.1f} us "
                    "is the host's work)")
        if kpc >= 2 and under_graph:
            # Launch gaps are already gone: only fewer, larger kernels help.
            # Fusion merges the distinct kernels of a call; repeats of one kernel (a loop inside
            # the range) stay separate launches: kpc / chain kernels remain.
            left = max(kpc / max(chain, 1.0), 1.0)
            fused_t = max(max(floor, kmed) * left, _longest(op, busy))
            return (Rung.TORCH_COMPILE,
                    f"these kernels already replay from a CUDA graph, so launches are cheap but each "
                    f"kernel is tiny: fuse the {chain:.0f} different kernels of each call with "
                    f"torch.compile{bundled}",
                    span / fused_t,
                    f"fusion bound: span {span / 1e3:.1f} us / ({left:.0f} fused kernel(s) x "
                    f"{max(floor, kmed) / 1e3:.1f} us)" if fused_t == max(floor, kmed) * left else
                    f"fusion bound: span / the call's longest kernel ({fused_t / 1e3:.1f} us)")
        if kpc >= 2:
            return (Rung.TORCH_COMPILE,
                    f"the GPU waits on launches: fuse the {kpc:.0f} kernels of each call with "
                    f"torch.compile (mode=\"reduce-overhead\" also captures a CUDA graph){bundled}",
                    span / max(busy, floor),
                    f"launch bound: span {span / 1e3:.1f} us / busy {busy / 1e3:.1f} us (removing the "
                    "idle gaps; fusing tiny kernels can go further)")
        return (Rung.TORCH_COMPILE,
                "one tiny kernel per call: give each launch more work (batch calls) or capture it "
                "with its neighbours in a CUDA graph / torch.compile",
                span / max(floor, kmed), "launch bound: span / max(launch floor, kernel time)")

    gemm = bool(GEMM_RE.search(text))
    # A range whose work is summed over the calls of several different aten ops (a range of a
    # --aten capture): where it sits under its roof is known, but advice drawn from its kernel
    # names (a GEMM, TF32, a bundled kernel for a pattern among them) would be about a part of
    # it, with the whole range's bytes or FLOPs: the fix is made on one of its ops. (A range
    # around one op, such as an autograd node around its aten call, gets that op's advice.)
    summed = (work is not None and work.parts > 1 and chain > 2
              and not (pct is not None and pct >= NEAR_ROOF))
    if summed and (verdict.bound is BoundClass.COMPUTE or (verdict.bound is BoundClass.MEMORY and gemm)):
        roof = "compute" if verdict.bound is BoundClass.COMPUTE else "memory bandwidth"
        where = f" at {pct:.0%} of its {roof} roof" if pct is not None else ""
        return (Rung.NONE, f"a range of {chain:.0f} different kernels{where} (work summed over its "
                           "aten calls): act on its ops, not on the range: --by aten shows which "
                           "ones to change", 1.0, "several ops summed: no estimate for the range")
    if verdict.bound is BoundClass.MEMORY:
        if work is not None and work.source.value == "copy":
            return (Rung.NONE, "a copy: avoid it (keep the data on the GPU), use pinned memory with "
                               "non_blocking=True, and overlap it with compute on another stream",
                    1.0, "copies are removed, not sped up")
        # One kernel per call is already fused.
        pat = _pattern(text, knames, str(op["name"])) if chain >= 2 else None
        if pat:  # fusion removes bytes, so it pays even for an op already near the bandwidth roof
            eager, fused = _FUSED_PASSES[pat]
            if work is not None and work.bytes and not work.parts:
                # (A range's bytes summed over its aten calls are not all the pattern's bytes.)
                t_fused = work.bytes * fused / eager / (TARGET_MEMORY * peaks.memory_bandwidth) * 1e9
                basis = (f"byte-count bound: span / ({fused}/{eager} of the bytes at "
                         f"{TARGET_MEMORY:.0%} of bandwidth)")
            else:
                t_fused, basis = busy * fused / eager, f"byte-count bound: span / (busy x {fused}/{eager})"
            return (Rung.TRITON, f"fuse into one pass with the bundled kernel kernels.{pat} "
                                 f"(Triton or CUDA backend): {eager} passes over HBM become {fused}",
                    span / t_fused, basis)
        if pct is not None and pct >= NEAR_ROOF:
            less = ("batch more tokens per weight read, or quantize the weights (fewer bytes each)"
                    if gemm else "move fewer bytes: fuse it with its neighbours or keep tensors in "
                                 "a lower precision")
            return (Rung.NONE, f"Leave the kernel: at {pct:.0%} of the memory bandwidth roof a new "
                               f"kernel would not pay; to go faster, {less}", 1.0,
                    f"roofline: {pct:.0%} of roof")
        if gemm and chain > 2:
            # A range mixing GEMMs with many other kernels (a whole step): GEMM advice would be
            # about the range's name, not its evidence.
            return (Rung.NONE, f"a range of {chain:.0f} different kernels, GEMM-family among them: "
                               "break it down with --by kernel or --by aten before acting", 1.0,
                    "no single kernel family: no estimate")
        if gemm:
            tgt = (work.bytes / (TARGET_MEMORY * peaks.memory_bandwidth) * 1e9
                   if work is not None and work.bytes else None)
            skinny = gemm_shape_hint(list(knames)) == "skinny"
            what = ("memory-bound GEMM (skinny: it streams the weights)" if skinny else
                    "memory-bound GEMM (few FLOPs per byte)")
            return (Rung.LIBRARY, f"{what}: batch more tokens per call, or use weight-only int8/fp8 "
                                  "quantization (fewer bytes per weight)", (span / tgt) if tgt else 1.0,
                    "roofline bound at 90% of bandwidth" if tgt else "no work counts")
        if FUSED_OPTIMIZER_RE.search(text):
            return (Rung.NONE, "Leave it: the optimizer already runs as the fused kernel "
                               "(fused=True)", 1.0, "already fused: no estimate")
        if chain >= 2 and kpc >= 2 and library:
            # The busy time over the distinct kernels would price a fusion of the library kernels
            # too, which no compiler fuses: a Conformer's backward (59 kernels, its fp32 GEMMs and
            # convolutions among them) was offered 60.85x on the op, 1.94x end to end.
            return (Rung.NONE, f"a range of {chain:.0f} different kernels, {library} of them library "
                               "kernels (GEMMs, convolutions, attention) that fusion does not shorten: "
                               "break it down with --by kernel or --by aten before acting", 1.0,
                    "library kernels among them: no fusion estimate for the range")
        if chain >= 2 and kpc >= 2:
            # Each of the `chain` distinct kernels makes a pass over the data; one fused pass
            # remains, never shorter than the call's longest kernel (its own pass). A range whose
            # time is one slow kernel (a global kthvalue: one block walks 23 M values, 110 ms of a
            # 116 ms step) was offered 5.01x on the op, 4.21x end to end, for fusing its five kernels.
            longest = _longest(op, busy)
            fused_t = max(floor * kpc / chain, busy / chain, longest)
            basis = (f"fusion bound: span / the call's longest kernel ({longest / 1e3:.1f} us)"
                     if longest >= busy / chain else f"fusion bound: span / (busy / {chain:.0f} kernels)")
            return (Rung.TORCH_COMPILE, f"fuse the {chain:.0f} different memory-bound kernels of each "
                                        "call with torch.compile so the tensor crosses HBM once",
                    span / fused_t, basis)
        if pct is not None:
            return (Rung.TRITON, f"at {pct:.0%} of the bandwidth roof: a Triton kernel with wide, "
                                 "coalesced loads should reach ~90%",
                    _roof_gain(TARGET_MEMORY, pct, span, floor),
                    f"roofline bound: 90% / {pct:.1%}, no kernel shorter than the launch floor")
        return (Rung.TORCH_COMPILE, "try torch.compile on the code around it; capture with --ncu "
                                    "to see how far it is from the bandwidth roof",
                1.0, "no work counts: no estimate")

    # compute-bound
    prec = work.precision if work is not None else None
    if gemm and prec == "fp32" and "tf32" in peaks.flops and work is not None and work.flops:
        # An fp32 GEMM near the fp32 roof is still 5-7x from the tensor-core roof it could use.
        tgt = work.flops / (TARGET_COMPUTE * peaks.flops["tf32"]) * 1e9
        return (Rung.LIBRARY, "fp32 GEMM on the CUDA cores: allow TF32 "
                              "(torch.backends.cuda.matmul.allow_tf32 = True) or run it in bf16",
                busy / tgt, "roofline bound: 70% of the TF32 tensor roof")
    if pct is not None and pct >= NEAR_ROOF:
        return (Rung.NONE, f"Leave it: at {pct:.0%} of its compute roof a new kernel would not pay; "
                           "to go faster, do less arithmetic or use a lower precision (bf16/fp8) if "
                           "accuracy allows", 1.0, f"roofline: {pct:.0%} of roof")
    # Attention advice only for an attention op, not for a range that merely contains one.
    attention = bool(_ATTN_RE.search(str(op["name"]))) or (chain <= 2 and bool(_ATTN_RE.search(text)))
    if attention and patterns.on_flash_path(str(op["name"]), list(knames)):
        # Already the fused kernel that the SDPA advice would pick: leave it.
        return (Rung.NONE, "Leave it: attention already runs on a fused flash / cuDNN kernel; to go "
                           "faster, shorten the sequence or use a lower precision", 1.0,
                "already on the flash / cuDNN path: no estimate")
    if attention and (pct is None or pct < NEAR_ROOF):
        return (Rung.LIBRARY, "use torch.nn.functional.scaled_dot_product_attention with the "
                              "flash / cuDNN backend in bf16",
                _roof_gain(TARGET_COMPUTE, pct, span, floor) if pct else 1.0,
                "roofline bound at 70% of compute" if pct else "no work counts")
    if gemm:
        unaligned = _unaligned_dims(str(op["name"]), prec)
        if pct is not None and unaligned:
            # The dims themselves are the cause: no autotuning reaches the fast path (PK304).
            return (Rung.LIBRARY, f"GEMM at {pct:.0%} of its roof with {unaligned}: pad it to a "
                                  "multiple of 64 (a vocabulary: resize_token_embeddings("
                                  "pad_to_multiple_of=64))", _roof_gain(TARGET_COMPUTE, pct, span, floor),
                    "roofline bound at 70%")
        if pct is not None:
            return (Rung.LIBRARY, f"GEMM at {pct:.0%} of its roof: try torch.compile(mode='max-autotune') "
                                  "or cuBLASLt heuristics; keep dims multiples of 64; CUTLASS only for "
                                  "a custom epilogue", _roof_gain(TARGET_COMPUTE, pct, span, floor),
                    "roofline bound at 70%")
        if chain > 2:
            return (Rung.NONE, f"a range of {chain:.0f} different kernels, GEMM-family among them: break "
                               "it down with --by kernel or --by aten (capture with --aten/--ncu) before "
                               "acting", 1.0, "no work counts: no estimate")
        return (Rung.NONE, "a GEMM-family kernel: measure before acting (capture with --ncu or --aten "
                           "to see how close it is to its roof)", 1.0, "no work counts: no estimate")
    if pct is not None:
        return (Rung.TRITON, f"compute-bound at {pct:.0%} of its roof: a Triton kernel (or CUTLASS "
                             "for a GEMM-like mainloop) could use the tensor cores",
                _roof_gain(TARGET_COMPUTE, pct, span, floor), "roofline bound at 70%")
    return (Rung.NONE, "measure before acting: capture with --ncu to read the counters", 1.0,
            "no work counts: no estimate")


def _roof_gain(target: float, pct: float, span: float, floor: float) -> float:
    """target / pct of roof, but no kernel runs shorter than the launch floor: a tiny kernel at
    0.1% of its roof is not 900x from a good one."""
    if not pct or pct <= 0:
        return span / floor if floor else 1.0
    return max(1.0, min(target / pct, span / floor if floor else target / pct))


def advise_pair(producer: dict, consumer: dict, kernel: str, pair_calls: int,
                producer_work: Optional[Work], consumer_work: Optional[Work], peaks: Peaks,
                frame: Frame) -> tuple[Suggestion, Suggestion]:
    """A producer -> consumer pair that one bundled kernel fuses (aten level).

    The gain is counted once, on the consumer's row: (producer + consumer time per call) over the
    fused kernel's time, which moves fused/eager of the pair's bytes at 90% of bandwidth (or, with
    no byte counts, takes fused/eager of the pair's busy time).
    """
    eager, fused = _FUSED_PASSES[kernel]
    pair_ns = float(producer["gpu_time_median_ns"]) + float(consumer["gpu_time_median_ns"])
    if producer_work is not None and consumer_work is not None and producer_work.bytes \
            and consumer_work.bytes:
        t_fused = ((producer_work.bytes + consumer_work.bytes) * fused / eager
                   / (TARGET_MEMORY * peaks.memory_bandwidth) * 1e9)
        basis = (f"pair bound: (producer + consumer per call) / ({fused}/{eager} of their bytes "
                 f"at {TARGET_MEMORY:.0%} of bandwidth)")
    else:
        t_fused = (float(producer["busy_median_ns"]) + float(consumer["busy_median_ns"])) * fused / eager
        basis = f"pair bound: (producer + consumer per call) / (their busy time x {fused}/{eager})"
    s = max(1.0, pair_ns / t_fused) if t_fused > 0 else 1.0
    busy = float(producer["busy_ns"]) + float(consumer["busy_ns"])
    saved = min(pair_calls * pair_ns * (1.0 - 1.0 / s), busy)
    crit = ((float(producer.get("critical_fraction", 1.0)) * float(producer["busy_ns"])
             + float(consumer.get("critical_fraction", 1.0)) * float(consumer["busy_ns"])) / busy
            if busy > 0 else 1.0)
    e2e, e2e_gpu = gains(saved, s, crit, frame)
    worth = e2e >= MIN_END_TO_END
    pname, cname = str(producer["name"]).split(" [")[0], str(consumer["name"]).split(" [")[0]
    action = (f"fuse with the {pname} that feeds it ({pair_calls} calls) into the bundled "
              f"kernels.{kernel}: {eager} passes over HBM become {fused}")
    if not worth:
        share = busy / frame.gpu_time_ns
        action = (f"Not worth a kernel: the pair is {share:.1%} of GPU time, so even {s:.2f}x on it "
                  f"is {e2e:.3f}x end to end. (If it grows: {action})")
    cons = Suggestion(Rung.TRITON, action, s, e2e, basis, worth, e2e_gpu)
    prod = Suggestion(Rung.TRITON, f"part of the kernels.{kernel} fusion on the {cname} row "
                                   "(its gain is counted there)", 1.0, 1.0, "counted on the consumer",
                      worth, 1.0)
    return prod, cons

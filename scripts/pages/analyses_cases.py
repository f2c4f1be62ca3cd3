"""The case studies of analyses/: each case's traces, what the page compares, and the WHY texts
written after reading the generated numbers. make_analyses.py renders them.

A case is (name, BEFORE trace, AFTER trace or none, level, title, notes); the fields of ``Case``
say what each optional part adds (make_analyses.py's docstring describes the page they make).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Case:
    name: str                       # page: analyses/<name>.md
    before: str                     # trace, relative to the repository root
    after: Optional[str]            # None: a single-trace page (verdict only)
    by: str                         # range | kernel | aten
    title: str
    notes: str = ""                 # the WHY text, written after looking at the numbers
    ops: tuple[str, ...] = ()       # BEFORE ops of interest (default: every matched op)
    before_range: Optional[str] = None  # compare BEFORE's op of this name ...
    after_range: Optional[str] = None   # ... with AFTER's op of this name
    summary: str = ""               # one paragraph: what was run and what the question is
    peaks: Optional[str] = "traces/peaks_h200.json"  # roofline ceilings (measured H200 peaks)
    afters: tuple[str, ...] = ()    # more AFTER traces (another backend), each diffed against BEFORE
    ladder: tuple[str, ...] = ()    # BEFORE traces with less evidence (timeline only): their
    #                                 predictions next to the same measurements
    survey: Optional[str] = None    # a trace (--aten --ncu) whose top opportunities are listed
    survey_by: str = "aten"
    survey_top: int = 3
    survey_exclude: tuple[str, ...] = ()  # regexes: one-off set-up ops left out of the ranking
    swap: Optional[str] = None      # the survey op (prefix) that the measured AFTER traces implement
    facts: bool = False             # timeline facts of `ops`: busy %, CPU per call, launch gaps, first call
    pairs: tuple[tuple[str, str], ...] = ()  # more (BEFORE, AFTER) pairs captured in one run of their
    #                                 own, each diffed on its own over `ops` (its own eager baseline)
    blurb: str = ""                 # analyses/README.md: the page's one-line point (no numbers)

    @property
    def renames(self) -> dict:
        if (self.before_range is None) != (self.after_range is None):
            raise CaseError(f"case {self.name}: give both before_range and after_range, or neither")
        return {self.before_range: self.after_range} if self.before_range else {}

    def all_afters(self) -> list[str]:
        return ([self.after] if self.after else []) + list(self.afters)

    def traces(self) -> list[str]:
        return ([self.before] + self.all_afters() + list(self.ladder)
                + ([self.survey] if self.survey else []) + [t for pair in self.pairs for t in pair])



OTHER_PAGES = (("kernels_h200.md", "benchmark of the bundled kernels on the H200 (scripts/bench/bench_kernels.py)"),
               ("report_benchmark.md", "`profkit report` on a 1M-kernel trace (scripts/bench/bench_report.py)"),
               ("closing_the_loop.md", "the rules' predictions against measured before/after pairs of real "
                                       "programs (scripts/pages/make_loop_page.py)"),
               ("loader_throughput.md", "how fast DataLoader workers produce the what-if corpus's batches "
                                        "against the main process (scripts/bench/loader_throughput.py)"),
               ("process_spread.md", "how far a host-bound program's step time moves between its runs, "
                                     "free or pinned to four cores (scripts/bench/process_spread.sh)"),
               ("whatif.md", "each fix's predicted gain against the measured one, on the what-if corpus and "
                             "at first sight (scripts/whatif_accuracy.py page)"),
               ("replacement_check.md", "the replacement timings of `profkit capture` against the op in a "
                                        "capture of the fixed program (scripts/whatif_accuracy.py replacements)"))


class CaseError(Exception):
    """A case that cannot be written as defined (the message says what to fix)."""


# The WHY texts, written after reading the generated numbers (keep them true when a trace changes).
MODEL_NOTES = (
    "*The forward is paced by the CPU, in all three runs.* Its span per call is its CPU time per "
    "call (timeline facts: eager 2.74 ms span / 2.75 ms CPU, CUDA 2.50 / 2.49 ms, Triton 4.56 / "
    "4.54 ms) and the GPU is busy only 71% / 76% / 42% of it: the host issues a launch every "
    "~42 us (median gap, eager), slower than the GPU runs the kernels. So a forward's span moves "
    "with CPU time, not with kernel time, and the advisor's kernel-time frame cannot see that. "
    "The CUDA swap's -8.5% span (1.093x) is mostly a shorter CPU path (54 launches per forward "
    "instead of 62; CPU per forward 2.75 → 2.49 ms); its kernel time gains only 1.017x.\n\n"
    "*Why the Triton backend regresses (+67%, 2.75 → 4.59 ms per forward).* On the GPU its kernel "
    "is fine: 8.6 us per call vs 8.0 us for the CUDA kernel and 6.0 + 5.8 us for the eager add and "
    "norm, and the forward's kernel time fell (1.94 → 1.93 ms). On the CPU it is not: the host "
    "spends a median 228.5 us before each `_add_rmsnorm_kernel` launch vs 86.8 us before the CUDA "
    "extension's, because Triton's Python launcher (the autotuner's key lookup, argument binding "
    "and specialisation, the launch itself) runs on every call. Eight calls per forward make "
    "~1.1 ms more CPU per forward; the other launches of the Triton run also waited longer (median "
    "gap 65.3 us vs 42.5 us eager: 58.7 us before the remaining add, 64.0 us before the final "
    "norm), which makes up the rest of the 2.75 → 4.54 ms CPU time; these traces (no CPU "
    "sampling) do not show why. With the GPU idle 58% of the forward, profkit now calls the "
    "Triton forward launch-bound. The range-level prediction (1.00x: the eager `forward` range is "
    "timeline-only evidence, GEMM-family kernel names, no estimate) is off by -40% against the "
    "measured 0.60x because nothing in a kernel-time bound accounts for CPU launch cost. A kernel "
    "that wins in isolation (see `fused_add_rmsnorm.md`) loses end to end when its launch costs "
    "more CPU than the GPU time it saves and the step is already CPU-paced; the CUDA extension, "
    "launched from C++, does not pay that cost.\n\n"
    "*The Triton total (0.318x end to end).* The first Triton forward autotunes: 2683 GPU "
    "activities instead of 54, among them 1382 device-to-device copies (the autotuner saves and "
    "restores the in-place residual, `restore_value=[\"R\"]`) and 555 fill kernels (Triton's "
    "benchmark clears L2 between timing runs), over a 3.63 s span. The diff's total kernel time "
    "counts every call (19.46 → 63.65 ms), hence 0.318x; the medians leave the first call out, "
    "and per call the forward's kernel time is 1.008x. (The CUDA extension's first forward is "
    "41.65 s: the extension is compiled on first use; its kernels are the steady 56.)\n\n"
    "*The survey's pair bound vs the swap (52.3 us predicted saved per forward; measured 32.5 us "
    "CUDA, 14.8 us Triton).* Two reasons. (1) The advisor counted 54 add → rms_norm pairs in 6 "
    "forwards, 9 per forward (the last layer's residual add feeds the final norm too); the model "
    "swaps 8 (the final norm stays eager: one layer_norm kernel per forward remains), so 8/9 of the "
    "prediction, 46.5 us, is the most this swap could show. (2) The fused kernel takes 8.0 us "
    "(CUDA) / 8.6 us (Triton) per call, not the 5.9 us the bound assumes. The bound moves 4/5 of "
    "the eager pair's measured DRAM traffic (19.6 + 8.3 MB) at 90% of bandwidth, but that traffic "
    "is already well under five full passes over the 8.4 MB activation (4x512x2048 bf16): part of "
    "it is served by L2, which holds the whole activation (the norm reads and writes 16.8 MB but "
    "moves 8.3 MB of DRAM traffic), so fusion removes less DRAM traffic than the 5 → 4 pass "
    "count assumes. Per pair the kernels measure 11.8 → 8.0 us "
    "(1.47x, CUDA) and → 8.6 us (1.37x, Triton) against the 1.98x bound; 8 x 3.8 us = 30.4 us "
    "matches the CUDA run's 32.5 us. For Triton, 8 x 3.2 us = 25.6 us would be expected from the "
    "kernel medians; the rest of the gap to 14.8 us is in other kernels of the Triton run's "
    "forward, which these pages do not attribute.\n\n"
    "*The survey's other two.* `aten::silu` (1.041x) and `aten::mul` (1.030x) are the SwiGLU's "
    "elementwise ops on the 4x512x5632 MLP activation, at 33% and 48% of HBM by their shapes' "
    "bytes; no bundled kernel covers them and no swap was captured, so they stay predictions. "
    "Their natural fix is one fused SiLU-and-multiply (torch.compile does it), which also removes "
    "a pass over that activation.\n\n"
    "*The default backend in the same-run pair (eager vs `--fused auto`).* `auto` runs the CUDA "
    "extension for every shape of add+RMSNorm (`kernels/ops.py` `choose_backend` has a Triton rule "
    "for add+LayerNorm only): the same `add_rmsnorm_reg_kernel` as the CUDA run (its first forward, "
    "41.11 s, includes building the extension). This run's forward is GPU-paced (busy 93% eager, "
    "96% auto), unlike the three older runs, so the CPU time it saves (2.07 → 1.51 ms per forward) "
    "does not shorten the span; what remains is the kernel time: 8 fused calls of 8.3 us instead of "
    "8 eager add + norm pairs (6.0 + 5.8 us), busy 1.90 → 1.87 ms per forward. The forward's median "
    "per-call span fell 5.4% (2.07 → 1.96 ms), inside its ±9.0% noise band (the spread comes from "
    "`layer3` and `layer2`, ±19.8% and ±20.5%), so profkit's verdict is *no change*; `layer0` and "
    "`layer1`, with a ±3.0% band, fell 1.7% and 1.8%, also below it. The default backend is not "
    "slower than eager here, but this capture cannot call it faster.")

NOTES: dict[str, str] = {
    "add_rmsnorm": (
        "Both backends land within 5% of the byte-count bound, and the timeline-only prediction "
        "agrees too: the eager pair already runs at 88% of HBM (ncu), so 4/5 of its busy time "
        "(the timeline's guess for the fused kernel) is close to 4/5 of its bytes at 90% of "
        "bandwidth (what the counters give). When the eager kernels run near the roof, counters "
        "add confidence, not accuracy."),
    "add_layernorm": (
        "With counters the prediction is within 3% of the Triton kernel. Without them it is 13% "
        "low (1.26x vs 1.42x): the eager pair runs at 77% of HBM, not near the roof, and the "
        "timeline-only bound assumes the fused kernel moves bytes at the eager kernels' rate, so "
        "the gain from reaching 90% of bandwidth is left out."),
    "bias_gelu": (
        "*Timeline only (predicted 2.01x, measured 3.66x).* Without counters the advisor can only "
        "take the pass count: the fused kernel makes 2 passes over HBM where eager makes 4, so it "
        "predicts busy x 2/4, i.e. a fused kernel moving bytes exactly as fast as the eager ones. "
        "The eager kernels were far from that: ncu measures them at 2.06 TB/s, 49% of HBM, with "
        "the SM at 72% and DRAM at 44% of peak (issue-bound, not bandwidth-bound). The fused "
        "kernel halves the bytes AND runs near bandwidth; the measured 3.59x (vs the ncu BEFORE) "
        "implies about 3.59 / 2 x 49% = 88% of HBM. The timeline cannot see the rate, only the "
        "time, so it misses the second factor.\n\n"
        "*With counters (predicted 3.68x, measured 3.59x).* The byte-count bound (2/4 of the "
        "measured bytes at 90% of bandwidth, about 2 x 90/49) describes both factors and lands "
        "within 3%. Note the baseline's ceiling line (at most 2.03x for the op at the roof) is a "
        "bound on the same bytes; fusion removes half of them, which is how the kernel passes it."),
    "softmax": (
        "*Timeline only (predicted 2.01x, measured 3.96x Triton / 4.00x CUDA).* The timeline-only "
        "bound is the pass count alone, busy x 2/4: it assumes the fused kernel reads and writes "
        "at the eager kernels' rate. ncu shows the eager softmax (a scale kernel, then "
        "cunn_SoftMaxForward) far below bandwidth: 1.80 TB/s, 43% of HBM, SM at 63% and DRAM at "
        "38% of peak. The bundled kernels make one pass each way and run near bandwidth (3.92x vs "
        "the ncu BEFORE implies about 3.92 / 2 x 43% = 84% of HBM, CUDA 85%), so the timeline "
        "under-predicts by half.\n\n"
        "*With counters (predicted 4.21x, measured 3.92x / 3.97x).* Measured bytes give the rate, "
        "and the bound (2/4 of the bytes at 90% of bandwidth) lands within 7%; the kernels reach "
        "about 84-85% of HBM rather than the 90% the bound assumes. As for bias_gelu, the "
        "baseline's ceiling line (2.32x) is for the same bytes; fusion halves them."),
}

CASES: list[Case] = [
    Case(
        name="cuda_graph_tiny_chain",
        before="traces/micro_graph.sqlite.xz", after="traces/micro_graph.sqlite.xz", by="range",
        before_range="eager_chain", after_range="graph_replay",
        title="A chain of tiny kernels: eager vs CUDA graph replay",
        blurb="20 tiny kernels per call, eager vs CUDA graph replay: a graph removes launch gaps, not kernels",
        summary=(
            "`scripts/workloads/micro.py graph` runs the same 20 tiny elementwise kernels (4096 floats) "
            "per call twice in one process, 10 calls each: eagerly under the NVTX range `eager_chain`, "
            "and replayed from a captured CUDA graph under `graph_replay`. Both ranges are in one trace, "
            "so the diff compares the two ranges (`--match eager_chain=graph_replay`). The question: "
            "profkit calls the eager chain launch-bound and suggests fusing / CUDA graphs; what does a "
            "graph replay actually buy, and how close is the advisor's estimate?"),
        notes=(
            "*Per op (predicted 17.92x, measured 12.78x).* The advisor's number is a launch bound: "
            "one call's span (349.8 us) over its busy time (19.5 us, the union of its 20 kernels), i.e. "
            "every idle launch gap removed and the kernels unchanged. Graph replay removes the CPU "
            "launch gaps but meets neither half of that assumption: it still runs 20 kernels per call "
            "(kern/call 20 → 20), they ran slower replayed (median kernel 1.1 us vs 0.9 us eager; "
            "kernel time 195.4 us → 224.1 us, +14.7%), and short gaps between graph nodes remain "
            "(per call: busy 22.4 us, span 27.4 us), so a call takes 27.4 us, not 19.5 us. Graph "
            "replay is not fusion either: classified on its own the replay is still launch-bound and "
            "profkit suggests fusing its 20 kernels (torch.compile), which is what would go past the "
            "bound, towards one kernel per call.\n\n"
            "*End to end (predicted 1.788x, measured 0.939x).* The end-to-end figure is Amdahl over "
            "the trace's GPU time, the sum of kernel durations (443.3 us), which holds no idle launch "
            "gaps. The advisor credits the op's saving against that sum, capped at the op's busy time "
            "(195.4 us): 443.3 / (443.3 - 195.4) = 1.788x. But what a launch-bound fix removes is idle "
            "time, which is not in the sum, and a graph removes no kernels: in kernel-time terms the "
            "replay is 0.94x (the +14.7% above) while each call's wall time on the GPU fell 12.8x. For "
            "launch-bound work the honest end-to-end measure is step (wall) time, which kernel-time "
            "accounting cannot show; this pair does not isolate it."),
    ),
    Case(
        name="dont_write_a_kernel_bf16_gemm",
        before="traces/micro_hinted.sqlite.xz", after=None, by="range", ops=("my_matmul",),
        title="Don't write a kernel: a bf16 GEMM near its roof",
        blurb="a bf16 GEMM already at its measured roof: profkit says leave it",
        summary=(
            "`scripts/workloads/micro.py hinted` runs a bf16 matmul 10 times inside an NVTX range that "
            "carries its FLOP and byte counts (`profkit.annotate`), so profkit can place it on the "
            "H200 roofline without counters. The question: is a custom kernel worth writing?"),
        notes=(
            "The roof here is the measured one (`traces/peaks_h200.json`: the bf16 rate of an "
            "8192-cube cuBLAS GEMM, median of CUDA-event timings), not the datasheet's. This matmul "
            "ran slightly faster than that measurement (812.75 TFLOP/s, 102%), so there is no "
            "headroom left for any kernel: the answer is no, and only less arithmetic or a lower "
            "precision would make it faster."),
    ),
    Case(
        name="model_tiny_llama",
        before="traces/model_tiny_llama_plain_eager.sqlite.xz",
        after="traces/model_tiny_llama_plain_cuda.sqlite.xz",
        afters=("traces/model_tiny_llama_plain_triton.sqlite.xz",), by="range", ops=("forward",),
        survey="traces/model_tiny_llama.sqlite.xz", survey_by="aten", survey_top=3,
        survey_exclude=(r"^aten::(normal_|uniform_)",), swap="aten::_fused_rms_norm", facts=True,
        pairs=(("traces/model_tiny_llama_swap_eager.sqlite.xz", "traces/model_tiny_llama_swap_auto.sqlite.xz"),),
        title="A 4-layer Llama-style decoder: what profkit suggests, and swapping in the fused add+RMSNorm",
        blurb=("profkit's top opportunities in a small decoder, and the measured add+RMSNorm swap: the CUDA "
               "kernel helps, the Triton one regresses the CPU-paced forward (Python launch cost); the default "
               "backend in a GPU-paced same-run pair: faster, but within the noise"),
        summary=(
            "`scripts/workloads/tiny_llama.py` is a 4-layer Llama-style decoder (hidden 2048, MLP 5632, "
            "16 heads, vocabulary 32000, random weights) run forward in bf16 on a batch of 4x512 tokens. "
            "Two questions. (1) Where should the effort go? `traces/model_tiny_llama.sqlite.xz` was "
            "captured with `profkit capture --aten --ncu` (6 forward passes), so every aten op has "
            "its input shapes and, where ncu profiled it, measured DRAM bytes; profkit ranks the "
            "opportunities. (2) What does the fused residual add + RMSNorm (`kernels.add_rmsnorm`, "
            "`--fused cuda|triton`) buy in the model? Three plain captures (no emit_nvtx, 10 forward "
            "passes each, NVTX ranges `forward` and `layer0`..`layer3`), eager, CUDA backend and Triton "
            "backend, are diffed by range. A later pair captured in one run of its own "
            "(`traces/model_tiny_llama_swap_eager.sqlite.xz` vs `traces/model_tiny_llama_swap_auto.sqlite.xz`, "
            "`profkit capture scripts/workloads/tiny_llama.py --steps 10 [--fused auto]`) measures the "
            "default backend (`backend=\"auto\"`) against its own eager baseline."),
        notes=MODEL_NOTES),
    *[Case(
        name=f"fused_{op}",
        before=f"traces/fused_{op}_torch_ncu.sqlite.xz", after=f"traces/fused_{op}_triton.sqlite.xz",
        afters=((f"traces/fused_{op}_cuda.sqlite.xz",) if op in ("add_rmsnorm", "softmax") else ()),
        ladder=(f"traces/fused_{op}_torch.sqlite.xz",), by="range", ops=(op,),
        title=f"{title}: eager PyTorch vs the bundled kernel" + (
            "s (Triton and CUDA)" if op in ("add_rmsnorm", "softmax") else " (Triton)"),
        summary=(
            f"`scripts/workloads/fused.py {op} BACKEND` runs {what} 20 times under the NVTX range "
            f"`{op}`, once per backend: eager PyTorch (`torch`), the bundled `kernels.{op}` in Triton "
            + ("and in CUDA C++ " if op in ("add_rmsnorm", "softmax") else "")
            + "(the same range name in every trace, so the diff matches by range). The eager run was "
            "captured twice: with an ncu pass over the range (`_torch_ncu`, so the advisor predicts "
            "from measured DRAM bytes) and with the timeline alone (`_torch`). The question: how close "
            "is the advisor's fusion estimate to what the kernel delivers, and how much does the "
            "evidence behind the estimate matter?"),
        notes=NOTES.get(op, ""),
        blurb=f"{title}, fused: ncu-based vs timeline-only prediction beside the measured kernel")
      for op, title, what in (
          ("add_rmsnorm", "Residual add + RMSNorm", "a residual add followed by RMSNorm (16384x4096 bf16)"),
          ("add_layernorm", "Residual add + LayerNorm", "a residual add followed by LayerNorm (16384x4096 bf16)"),
          ("bias_gelu", "Bias add + GELU", "a bias add followed by GELU (tanh approximation, 16384x4096 bf16)"),
          ("softmax", "Scaled softmax", "a scaled softmax `softmax(x * 0.125)` over the last dimension (16384x4096 bf16)"))],
]


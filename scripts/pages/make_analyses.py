"""Write the case-study pages analyses/<name>.md from real traces, with profkit's own numbers.

    python scripts/pages/make_analyses.py                 # (re)write every page whose traces exist
    python scripts/pages/make_analyses.py --only cuda_graph_tiny_chain
    python scripts/pages/make_analyses.py --check         # CI: regenerate into a temp dir, exit 1 on drift
    python scripts/pages/make_analyses.py --name my_case --before traces/a.sqlite --after traces/b.sqlite \\
        --before-range eager_chain --after-range graph_replay --title "..." --out /tmp/pages

A case is (name, BEFORE trace, AFTER trace or none, level, title, notes). Optional parts: ``afters``
(more AFTER traces, e.g. a second backend: one diff each), ``ladder`` (BEFORE traces with less
evidence, e.g. timeline only: their predictions beside the same measurements), ``survey`` (a trace
whose top opportunities are ranked, with ``survey_exclude`` for one-off set-up ops, and ``swap``: the
survey op the AFTER traces implement, its prediction checked against them), ``facts`` (busy %, CPU
per call, launch gaps and the first call of the ops, per trace) and ``peaks`` (default: the measured
H200 peaks). A full run also writes analyses/README.md, one line per page. Each page holds BEFORE's
classification and suggestion for the op(s) of interest, the diff table (profkit.compare.diff), profkit's
predicted vs the measured gain per op and end to end, and — where the two disagree by more than
20% — a "Why" section whose text is the case's ``notes``. The notes are written by a person after
looking at the numbers; a case that disagrees by more than 20% and has no notes FAILS the run
(exit 2), so no page ships an unexplained miss. ``before_range``/``after_range`` compare two
differently named ranges (for one trace that holds both variants). Roofline images are added when
``profkit.show.plots.roofline`` exists (skipped otherwise). Exit codes: 0 ok, 1 drift (--check),
2 a case error.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import profkit  # noqa: E402
from profkit.read.compressed import trace_stem  # noqa: E402
from profkit.judge import estimate  # noqa: E402
from profkit.judge import patterns
from profkit.show import render
from profkit.run.attribution import aten_key  # noqa: E402
from profkit.compare.diff import DiffResult, diff, to_markdown  # noqa: E402
from profkit.run.ops import group_ops  # noqa: E402
from functools import partial  # noqa: E402
from _page import write_or_check  # noqa: E402  (scripts/pages/)

# The case studies measure kernels in benchmark scripts: the whole capture, per-thread
# projection, and gains on GPU time (the scripts synchronise around each timed call).
load_case = partial(profkit.load, window="all", attribution="thread", gains="gpu")

COMMAND = "python scripts/pages/make_analyses.py"  # regenerates every page
DISAGREEMENT_PCT = 20.0   # predicted vs measured further apart than this needs a "why"
NOTES_PLACEHOLDER = "WHY:"  # notes are inserted under this heading


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


_HEADLINES: dict[str, str] = {}  # case name -> its headline numbers, filled by render_case
OTHER_PAGES = (("kernels_h200.md", "benchmark of the bundled kernels on the H200 (scripts/bench/bench_kernels.py)"),
               ("report_benchmark.md", "`profkit report` on a 1M-kernel trace (scripts/bench/bench_report.py)"),
               ("closing_the_loop.md", "the rules' predictions against measured before/after pairs of real "
                                       "programs (scripts/pages/make_loop_page.py)"),
               ("loader_throughput.md", "how fast DataLoader workers produce the what-if corpus's batches "
                                        "against the main process (scripts/bench/loader_throughput.py)"))


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


# ------------------------------------------------------------------------------------ page parts

def _fmt_x(v: Optional[float], nd: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}x"


def _fmt_pct(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def disagreements(res: DiffResult, ops: tuple[str, ...]) -> list[tuple[str, str, float]]:
    """(op, which, percent) for every predicted-vs-measured pair further apart than 20%."""
    out = []
    for op in res.ops:
        if ops and op["name"] not in ops:
            continue
        for which, key in (("op speedup", "op_disagreement_pct"),
                           ("end-to-end speedup", "end_to_end_disagreement_pct")):
            d = op[key]
            if d is not None and abs(d) > DISAGREEMENT_PCT:
                out.append((op["name"], which, d))
    t = res.total
    p, m = t["predicted_end_to_end_speedup"], t["measured_end_to_end_speedup"]
    if p and m is not None and abs((m / p - 1) * 100) > DISAGREEMENT_PCT and len(res.ops) > 1:
        out.append(("total", "end-to-end speedup", (m / p - 1) * 100))
    return out


def _baseline(case: Case, prof) -> list[str]:
    df = prof.ops(by=case.by)
    wanted = list(case.ops) or ([case.before_range] if case.before_range else list(df.index))
    missing = [o for o in wanted if o not in df.index]
    if missing:
        raise CaseError(f"case {case.name}: no op {missing[0]!r} at --by {case.by} in {case.before}")
    sel = df.loc[wanted]
    header = {"trace": Path(case.before).name, "gpu": prof.gpu.name,
              "total_gpu_time_ns": prof.trace.total_gpu_time_ns, "level": case.by}
    lines = ["## Baseline: profkit's verdict", "", render.to_markdown(sel, header).rstrip(), ""]
    for name, row in sel.iterrows():
        lines.append(f"- **{render.short_name(str(name), 60)}**: {row['class']}-bound "
                     f"({row['confidence']} confidence, evidence from {row['source']}): {row['reason']}")
        lines.append(f"  - next step ({row['rung']}): {row['action']}")
        lines.append(f"  - expected: {row['expected_op_speedup']:.2f}x on the op, "
                     f"{row['expected_gpu_time_speedup']:.3f}x end to end "
                     f"({'worth it' if row['worth_it'] else 'not worth it'}); basis: {row['basis']}")
        pct = row["pct_of_roof"]
        if pct is not None and pct == pct and pct >= 1.0:
            lines.append(f"  - ceiling: at {float(pct):.0%} of its roof the op already runs at (or past) "
                         f"the roof, so no kernel work can buy anything; a roof is itself a measured "
                         f"rate ({prof.peaks.source}), which a well-shaped op can match or exceed")
        elif pct is not None and pct == pct and pct > 0:
            perfect = 1.0 / float(pct)
            e2e = estimate.amdahl(min(float(row["share"]), 1.0), perfect)
            lines.append(f"  - ceiling: at {float(pct):.0%} of its roof, the op can get at most "
                         f"{perfect:.2f}x faster (a kernel at 100% of the roof, which no real kernel "
                         f"reaches), and `amdahl({float(row['share']):.3f}, {perfect:.2f})` = "
                         f"{e2e:.3f}x end to end is the most any kernel work could buy")
    lines.append("")
    return lines


def _prediction_table(res: DiffResult, ops: tuple[str, ...]) -> list[str]:
    lines = ["## Predicted vs measured", "",
             "| op | predicted op x | measured op x | off by | predicted e2e | measured e2e | off by |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for op in res.ops:
        if ops and op["name"] not in ops:
            continue
        label = op["name"] if op["after_name"] == op["name"] else f"{op['name']} → {op['after_name']}"
        lines.append(f"| {render.short_name(label, 60)} | {_fmt_x(op['predicted_op_speedup'])} | "
                     f"{_fmt_x(op['measured_op_speedup'])} | {_fmt_pct(op['op_disagreement_pct'])} | "
                     f"{_fmt_x(op['predicted_end_to_end_speedup'], 3)} | "
                     f"{_fmt_x(op['measured_end_to_end_speedup'], 3)} | "
                     f"{_fmt_pct(op['end_to_end_disagreement_pct'])} |")
    t = res.total
    p, m = t["predicted_end_to_end_speedup"], t["measured_end_to_end_speedup"]
    off = None if not p or m is None else (m / p - 1) * 100
    lines.append(f"| total (matched ops) | | | | {_fmt_x(p, 3)} | {_fmt_x(m, 3)} | {_fmt_pct(off)} |")
    lines += ["",
              "Predicted = BEFORE's `expected_op_speedup` / `expected_gpu_time_speedup` (profkit "
              "classify on BEFORE). Measured op = BEFORE median / AFTER median GPU time per call. "
              "Measured end to end = BEFORE's total GPU time (sum of kernel, memcpy and memset "
              "durations) with the op's kernel time replaced by AFTER's (per op: calls x busy median; "
              "total: the matched ops' kernel time, scaled to BEFORE's call count) — the frame the "
              "prediction is made in. \"Off by\" = measured / predicted - 1.", ""]
    return lines


def _roofline(case: Case, sides: list[tuple[str, object, list[str]]], img_dir: Path,
              page_dir: Path) -> list[str]:
    """Roofline images before/after through profkit.show.plots.roofline, when it exists. ``sides``:
    (label, profile, ops to show). Ops without FLOP and byte counts cannot be placed; a side with
    none placed gets no image (said on the page)."""
    try:
        from profkit.show.plots import roofline, roofline_data  # another engineer's module; optional
    except ImportError:
        return []
    lines = ["## Roofline", ""]
    for label, prof, names in sides:
        df = prof.ops(by=case.by)
        df = df.loc[[n for n in names if n in df.index]] if names else df
        try:
            data = roofline_data(prof, by=case.by, ops=df)
            if data.points.empty:
                lines += [f"{label}: no roofline point to draw: {', '.join(data.not_placed)} "
                          "has no FLOP and byte counts (for those: FLOP/byte hints in the range name, "
                          "`--aten` shapes or `--ncu` counters).", ""]
                continue
            fig = roofline(data=data)
            img_dir.mkdir(parents=True, exist_ok=True)
            png = img_dir / f"{case.name}_{label.lower()}.png"
            fig.savefig(png, dpi=80, metadata={"Software": None})
            _palette(png)
        except Exception as exc:  # the plot module is not ours: never let it break the pages
            print(f"{case.name}: roofline skipped ({exc.__class__.__name__}: {exc})", file=sys.stderr)
            return []
        lines += [f"![{label}: roofline of {Path(prof.path).name}]({png.relative_to(page_dir).as_posix()})", ""]
    return lines


def _palette(png: Path) -> None:
    """Re-save ``png`` with 256 colours: enough for a plot, and a third of the bytes in the
    repository."""
    from PIL import Image
    with Image.open(png) as im:
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    q.save(png, optimize=True)


def _label(path: str) -> str:
    return trace_stem(path)


def _disagree_text(off: list[tuple[str, str, float]]) -> str:
    return "; ".join(f"{render.short_name(o, 100)} {w} {d:+.1f}%" for o, w, d in off)


def _off(m: Optional[float], p: Optional[float]) -> Optional[float]:
    return None if m is None or not p else (m / p - 1) * 100


def _ladder(case: Case, before, afters: list[tuple[str, object]], peaks) -> tuple[list[str], list, str]:
    """BEFORE with full evidence and with less (``case.ladder``), each diffed against every AFTER:
    the same measurement beside each prediction."""
    lines = ["## The evidence ladder: one measurement, predictions from more and less evidence", "",
             "| BEFORE trace | evidence | basis of the prediction | AFTER trace | predicted op x | "
             "measured op x | off by | predicted e2e | measured e2e | off by |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    off, heads = [], {}
    befores = [(case.before, before)] + [(t, load_case(ROOT / t, peaks=peaks)) for t in case.ladder]
    for bpath, bprof in befores:
        df = bprof.ops(by=case.by)
        for apath, aprof in afters:
            res = diff(bprof, aprof, by=case.by, rename=case.renames)
            for op in res.ops:
                if case.ops and op["name"] not in case.ops:
                    continue
                row = df.loc[op["name"]]
                lines.append(
                    f"| {_label(bpath)} | {render.evidence_text(row)} | {row['basis']} | {_label(apath)} | {_fmt_x(op['predicted_op_speedup'])} | "
                    f"{_fmt_x(op['measured_op_speedup'])} | {_fmt_pct(op['op_disagreement_pct'])} | "
                    f"{_fmt_x(op['predicted_end_to_end_speedup'], 3)} | "
                    f"{_fmt_x(op['measured_end_to_end_speedup'], 3)} | "
                    f"{_fmt_pct(op['end_to_end_disagreement_pct'])} |")
                if bpath != case.before:
                    heads[bpath] = (f"predicted from {_label(bpath)} ({row['source']} only): "
                                    f"{_fmt_x(op['predicted_op_speedup'])}")
                    off += [(f"{op['name']} (timeline-only BEFORE {_label(bpath)} → {_label(apath)})", w, d)
                            for o, w, d in disagreements(res, case.ops) if o == op["name"]]
    lines += ["", "Each row is `profkit diff BEFORE AFTER` for that pair: the prediction is BEFORE's, "
              "the measurement AFTER's median against BEFORE's. The BEFORE traces ran the same "
              "eager code; the first row's carries ncu counters (measured DRAM bytes), the others "
              "only the timeline.", ""]
    return lines, off, "; ".join(heads.values())


def _survey(case: Case, peaks) -> tuple[list[str], Optional[dict], str]:
    """The top opportunities of ``case.survey`` by expected end-to-end gain; the swap op's row."""
    prof = load_case(ROOT / case.survey, peaks=peaks)
    df = prof.ops(by=case.survey_by)
    pats = [re.compile(x) for x in case.survey_exclude]
    setup = df[[any(p.search(str(n)) for p in pats) for n in df.index]]
    ranked = df.drop(index=setup.index).sort_values(
        ["expected_gpu_time_speedup", "gpu_time_ns"], ascending=False, kind="stable")
    top = ranked.head(case.survey_top)
    total = prof.trace.total_gpu_time_ns
    lines = [f"## Where the time goes: profkit's top {case.survey_top} opportunities", "",
             f"`profkit classify {case.survey} --by {case.survey_by}"
             + (f" --peaks {case.peaks}" if case.peaks else "") + "`, ranked by expected end-to-end "
             f"gain (Amdahl over the trace's GPU time, {render.fmt_time(total)}).", "",
             "| # | op | calls | share | class | evidence | predicted op x | predicted e2e | "
             "worth it | measured |", "|---:|---|---:|---:|---|---|---:|---:|---|---|"]
    swap_row = None
    for i, (name, row) in enumerate(top.iterrows(), 1):
        is_swap = bool(case.swap) and str(name).startswith(case.swap)
        if is_swap:
            swap_row = {"name": name, **row.to_dict()}
        lines.append(f"| {i} | {render.short_name(str(name), 60)} | {int(row['count'])} | "
                     f"{float(row['share']):.1%} | {row['class']} | {render.evidence_text(row)} | "
                     f"{_fmt_x(row['expected_op_speedup'])} | "
                     f"{_fmt_x(row['expected_gpu_time_speedup'], 3)} | "
                     f"{'yes' if row['worth_it'] else 'no'} | "
                     + ("below: the swap was captured" if is_swap else "not measured (no swap captured)")
                     + " |")
    lines.append("")
    for i, (name, row) in enumerate(top.iterrows(), 1):
        lines.append(f"{i}. **{render.short_name(str(name), 70)}**: {row['action']} "
                     f"(basis: {row['basis']})")
    lines.append("")
    if len(setup):
        best = setup.sort_values("expected_gpu_time_speedup", ascending=False).iloc[0]
        lines += [f"Left out of the ranking: {len(setup)} one-off set-up ops (weight initialisation, "
                  f"matched by {', '.join(f'`{x}`' for x in case.survey_exclude)}), "
                  f"{float(setup['busy_ns'].sum()) / total:.1%} of the trace's GPU time; they run once "
                  f"before the first forward and not in a serving or training step. The best of them "
                  f"would rank at {_fmt_x(float(best['expected_gpu_time_speedup']), 3)} end to end.", ""]
    if case.swap and swap_row is None:  # the swapped op is not in the top ranks: still check it
        names = [n for n in df.index if str(n).startswith(case.swap)]
        if not names:
            raise CaseError(f"case {case.name}: no op starting {case.swap!r} in {case.survey}")
        swap_row = {"name": names[0], **df.loc[names[0]].to_dict()}
    if swap_row is not None:
        swap_row["_total"] = total
        pairs = [x for x in patterns.fusable_pairs(prof.trace.ranges_of_level("aten")["name"], aten_key)
                 if x.consumer == swap_row["name"]]
        if pairs and pairs[0].producer in df.index:
            swap_row["_producer"] = {"name": pairs[0].producer, **df.loc[pairs[0].producer].to_dict()}
        rng = prof.ops(by="range")
        swap_row["_calls"] = int(rng.loc[case.ops[0], "count"]) if case.ops and case.ops[0] in rng.index else None
    head = "profkit's top {} in {}: {}".format(case.survey_top, _label(case.survey), ", ".join(
        f"{str(n).split(' [')[0]} {_fmt_x(float(r['expected_gpu_time_speedup']), 3)}"
        for n, r in top.iterrows()))
    return lines, swap_row, head


def _swap_check(case: Case, swap: dict, before, afters: list[tuple[str, object]]) -> tuple[list[str], list, str]:
    """The survey's prediction for the swapped op vs the GPU time the swap saved per call of
    ``case.ops[0]`` (kernel time, the frame of the prediction)."""
    op = case.ops[0]
    e2e = float(swap["expected_gpu_time_speedup"])
    saved_pred = swap["_total"] * (1 - 1 / e2e) / swap["_calls"]
    b = before.ops(by=case.by).loc[op]
    busy_b, span_b = float(b["busy_median_ns"]), float(b["gpu_time_median_ns"])
    pred_x = busy_b / (busy_b - saved_pred)
    lines = ["## The survey's prediction vs the measured swap", "",
             f"The survey predicts {_fmt_x(float(swap['expected_op_speedup']))} on "
             f"{render.short_name(str(swap['name']), 60)} and {_fmt_x(e2e, 3)} end to end: "
             f"{render.fmt_time(swap['_total'] * (1 - 1 / e2e))} of kernel time saved over "
             f"{swap['_calls']} `{op}` calls, {render.fmt_time(saved_pred)} per `{op}`. Applied to "
             f"`{_label(case.before)}`'s `{op}` (busy {render.fmt_time(busy_b)} per call, median) that "
             f"is {_fmt_x(pred_x, 3)} on its kernel time.", ""]
    prod = swap.get("_producer")
    if prod is not None:
        def part(r):
            mb = r["evidence"].get("bytes_per_call")
            return (f"{render.short_name(str(r['name']).split(' [')[0], 40)} "
                    f"{render.fmt_time(float(r['gpu_time_median_ns']))}"
                    + (f" ({mb / 1e6:.1f} MB of DRAM traffic per call, {r['source']})" if mb else ""))
        pair_ns = float(prod["gpu_time_median_ns"]) + float(swap["gpu_time_median_ns"])
        lines += [f"Per call, the eager pair is {part(prod)} + {part(swap)} = {render.fmt_time(pair_ns)}; "
                  f"the bound takes one fused kernel at {render.fmt_time(pair_ns / float(swap['expected_op_speedup']))} "
                  f"({swap['basis']}).", ""]
    lines += [f"| AFTER | kernel time saved per {op} (pred) | measured | off by | {op} kernel time x "
             f"(pred) | measured | off by | {op} span x (measured) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    off, heads = [], []
    for apath, aprof in afters:
        a = aprof.ops(by=case.by).loc[op]
        saved = busy_b - float(a["busy_median_ns"])
        mx = busy_b / float(a["busy_median_ns"])
        d1, d2 = _off(saved, saved_pred), _off(mx, pred_x)
        lines.append(f"| {_label(apath)} | {render.fmt_time(saved_pred)} | {render.fmt_time(saved)} | "
                     f"{_fmt_pct(d1)} | {_fmt_x(pred_x, 3)} | {_fmt_x(mx, 3)} | {_fmt_pct(d2)} | "
                     f"{_fmt_x(span_b / float(a['gpu_time_median_ns']), 3)} |")
        heads.append(f"{render.fmt_time(saved)} {_label(apath)}")
        if d1 is not None and abs(d1) > DISAGREEMENT_PCT:
            off.append((f"{str(swap['name']).split(' [')[0]} pair → {_label(apath)}",
                        f"kernel time saved per {op}", d1))
        if d2 is not None and abs(d2) > DISAGREEMENT_PCT:
            off.append((f"{str(swap['name']).split(' [')[0]} pair → {_label(apath)}",
                        f"{op} kernel-time speedup", d2))
    lines += ["", f"Kernel time = the median busy time of one `{op}` (the union of its kernels); "
              f"span = first kernel start to last kernel end, idle gaps included.", ""]
    head = (f"{str(swap['name']).split(' [')[0]} pair swap: predicted {render.fmt_time(saved_pred)} "
            f"of kernel time saved per {op}, measured " + ", ".join(heads))
    return lines, off, head


def _instances(prof, by: str, op: str):
    """Per call of ``op`` (in GPU order): the call's row and its activities."""
    g = group_ops(prof.trace, by=by)
    inst = g.instances[g.instances["op"] == op].sort_values("gpu_start", kind="stable")
    acts = prof.trace.activities
    mem = g.members[g.members["op"] == op]
    for _, row in inst.iterrows():
        idx = mem.loc[mem["instance"] == row["range_idx"], "act_idx"].to_numpy()
        a = acts.loc[idx]
        a = a.assign(dur=a["end"] - a["start"], short=a["name"].map(lambda n: render.short_name(str(n), 60)))
        yield row, a.sort_values("api_start", kind="stable")


def _facts(case: Case, sides: list[tuple[str, object]]) -> list[str]:
    """Timeline facts of each op of interest: steady-state calls (all but the first) and the first."""
    lines = ["## Timeline facts", "",
             "Steady state = every call but the first (medians); the first call carries one-off "
             "work (lazy loading, compilation, autotuning). CPU per call = the NVTX range's duration "
             "on the CPU; launch gap = CPU time between two consecutive kernel launches of a call.", "",
             "| trace | op | span | busy | busy % | CPU per call | kernels per call | launch gap | "
             "first call: span | kernels | D2D copies | fills |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    kern: dict[str, dict[str, list]] = {}
    for label, prof in sides:
        for op in case.ops:
            calls = list(_instances(prof, case.by, op))
            if not calls:
                continue
            (r0, a0), steady = calls[0], calls[1:]
            med = lambda xs: float(np.median(xs)) if len(xs) else float("nan")  # noqa: E731
            gaps = np.concatenate([a["api_start"].diff().dropna().to_numpy() for _, a in steady]) \
                if steady else np.array([])
            d2d = int(a0["name"].str.contains("Device-to-Device", regex=False).sum())
            fills = int(a0["name"].str.contains("FillFunctor", regex=False).sum())
            lines.append(
                f"| {label} | {op} | {render.fmt_time(med([r['span_ns'] for r, _ in steady]))} | "
                f"{render.fmt_time(med([r['busy_ns'] for r, _ in steady]))} | "
                f"{med([r['busy_ns'] / r['span_ns'] for r, _ in steady]):.0%} | "
                f"{render.fmt_time(med([r['cpu_time_ns'] for r, _ in steady]))} | "
                f"{med([len(a) for _, a in steady]):g} | {render.fmt_time(med(gaps))} | "
                f"{render.fmt_time(r0['span_ns'])} | {len(a0)} | {d2d} | {fills} |")
            if op == case.ops[0]:
                for _, a in steady:
                    a = a.assign(gap=a["api_start"].diff())
                    for k, grp in a.groupby("short"):
                        d = kern.setdefault(k, {}).setdefault(label, [[], [], 0])
                        d[0] += grp["dur"].tolist()
                        d[1] += grp["gap"].dropna().tolist()
                        d[2] += len(grp)
    lines.append("")
    labels = [lab for lab, _ in sides]
    n = {lab: max(1, len(list(_instances(p, case.by, case.ops[0]))) - 1) for lab, p in sides}
    changed = [k for k, v in kern.items()
               if len({round(v.get(lab, [[], [], 0])[2] / n[lab], 2) for lab in labels}) > 1]
    if changed:
        lines += [f"Kernels whose count per `{case.ops[0]}` differs between the traces (steady state): "
                  "launches per call, median duration, median CPU time since the previous launch "
                  "(what the CPU spent before it could launch this kernel).", "",
                  "| kernel | " + " | ".join(f"{lab}: per call, duration, CPU before launch" for lab in labels)
                  + " |", "|---|" + "---:|" * len(labels)]
        for k in sorted(changed):
            cells = []
            for lab in labels:
                d = kern[k].get(lab)
                cells.append("—" if not d else
                             f"{d[2] / n[lab]:g}, {render.fmt_time(float(np.median(d[0])))}, "
                             f"{render.fmt_time(float(np.median(d[1]))) if d[1] else 'n/a'}")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _pair(case: Case, bpath: str, apath: str, peaks) -> tuple[list[str], list, str]:
    """One more (BEFORE, AFTER) pair captured in the same run: its diff, prediction table and
    timeline facts, against its own BEFORE."""
    pb, pa = load_case(ROOT / bpath, peaks=peaks), load_case(ROOT / apath, peaks=peaks)
    res = diff(pb, pa, by=case.by, rename=case.renames)
    res.run = {}
    cmd = (f"profkit diff {bpath} {apath} --by {case.by} --window all --attribution thread"
           + (f" --peaks {case.peaks}" if case.peaks else "") + " --format markdown")
    suffix = f": {_label(bpath)} → {_label(apath)} (same run)"
    lines = [f"## Before → after{suffix}", "", f"`{cmd}`", "", to_markdown(res).rstrip(), ""]
    table = _prediction_table(res, case.ops)
    table[0] += suffix
    lines += table
    off = [(f"{o} ({_label(bpath)} vs {_label(apath)})", w, d) for o, w, d in disagreements(res, case.ops)]
    head = ""
    for op in res.ops[:1] if not case.ops else [o for o in res.ops if o["name"] == case.ops[0]]:
        head = (f"{_label(apath)} vs {_label(bpath)}: {op['name']} "
                f"{render.fmt_time(op['before']['gpu_time_median_ns'])} → "
                f"{render.fmt_time(op['after']['gpu_time_median_ns'])} per call "
                f"({_fmt_pct(op['median_change_pct'])}, {op['verdict']})")
    if case.facts:
        facts = _facts(case, [(_label(bpath), pb), (_label(apath), pa)])
        facts[0] += suffix
        lines += facts
    return lines, off, head


def render_case(case: Case, out_dir: Path) -> str:
    """The Markdown page of one case (images, if any, are written beside it)."""
    for t in case.traces():
        if not (ROOT / t).exists():
            raise FileNotFoundError(t)
    peaks = ROOT / case.peaks if case.peaks else None
    before = load_case(ROOT / case.before, peaks=peaks)
    others = [t for t in case.traces()[1:] if t != case.before]
    lines = [f"# {case.title}", "",
             f"*Generated by `scripts/pages/make_analyses.py` from `{case.before}`"
             + "".join(f", `{t}`" for t in others[:-1])
             + (f" and `{others[-1]}`" if others else "")
             + f" (ops by {case.by}"
             + (f"; peaks `{case.peaks}`" if case.peaks else "")
             + "); do not edit by hand: edit the case and regenerate.*", ""]
    if case.summary:
        lines += [case.summary, ""]
    swap, heads = None, []
    if case.survey:
        part, swap, head = _survey(case, peaks)
        lines += part
        heads.append(head)
    lines += _baseline(case, before)
    if not case.all_afters():
        row = before.ops(by=case.by).loc[list(case.ops)[0] if case.ops else case.before_range]
        heads.append(f"{list(case.ops)[0] if case.ops else case.before_range}: {row['class']}-bound, "
                     f"{render.evidence_text(row)}; next step: {row['rung']}")
    afters = [(t, before if t == case.before else load_case(ROOT / t, peaks=peaks))
              for t in case.all_afters()]
    off: list = []
    bsrc = before.ops(by=case.by)["source"].to_dict() if afters else {}
    if not afters:
        lines += ["## Measured", "",
                  "No AFTER trace: this page is the verdict alone. Where profkit says to leave the op "
                  "alone, there is nothing to measure.", ""]
    for apath, after in afters:
        suffix = f": {_label(apath)}" if len(afters) > 1 else ""
        res = diff(before, after, by=case.by, rename=case.renames)
        res.run = {}  # kernel studies compare GPU time; the scripts' wall time is set-up bound
        cmd = (f"profkit diff {case.before} {apath} --by {case.by} --window all --attribution thread"
               + "".join(f" --match {k}={v}" for k, v in case.renames.items())
               + (f" --peaks {case.peaks}" if case.peaks else "") + " --format markdown")
        lines += [f"## Before → after{suffix}", "", f"`{cmd}`", "", to_markdown(res).rstrip(), ""]
        table = _prediction_table(res, case.ops)
        table[0] += suffix
        lines += table
        off += [((f"{o} vs {_label(apath)}" if suffix else o), w, d)
                for o, w, d in disagreements(res, case.ops)]
        for op in res.ops[:1] if not case.ops else [o for o in res.ops if o["name"] == case.ops[0]]:
            heads.append(f"{_label(apath)}: {op['name']} {render.fmt_time(op['before']['gpu_time_median_ns'])} → "
                         f"{render.fmt_time(op['after']['gpu_time_median_ns'])} per call "
                         f"({_fmt_pct(op['median_change_pct'])}, {op['verdict']}), measured "
                         f"{_fmt_x(op['measured_op_speedup'])} vs predicted {_fmt_x(op['predicted_op_speedup'])}"
                         f" ({bsrc.get(op['name'], '?')} evidence)")
    if case.ladder:
        part, more, head = _ladder(case, before, afters, peaks)
        lines += part
        off += more
        heads.append(head)
    if swap is not None and afters:
        part, more, head = _swap_check(case, swap, before, afters)
        lines += part
        off += more
        heads.append(head)
    if case.facts and afters:
        lines += _facts(case, [(_label(case.before), before)] + [(_label(t), p) for t, p in afters])
    for pb, pa in case.pairs:
        part, more, head = _pair(case, pb, pa, peaks)
        lines += part
        off += more
        heads.append(head)
    if off:
        if not case.notes.strip():
            raise CaseError(
                f"case {case.name}: predicted and measured disagree by more than "
                f"{DISAGREEMENT_PCT:.0f}% (" + "; ".join(f"{o} {w} {d:+.1f}%" for o, w, d in off)
                + ") and the case has no notes: read the numbers and write its `notes` (the WHY)")
        lines += ["## Why the prediction and the measurement differ", "",
                  "Disagreements over 20%: " + _disagree_text(off) + ".", "",
                  case.notes.strip(), ""]
    elif case.notes.strip():
        lines += ["## Notes", "", case.notes.strip(), ""]
    sides = [("BEFORE" if afters else "Baseline", before,
              list(case.ops) or ([case.before_range] if case.before_range else []))]
    for apath, after in afters:
        after_names = [case.renames.get(n, n) for n in sides[0][2]]
        label = "AFTER" if len(afters) == 1 else f"AFTER {_label(apath)}"
        sides.append((label, after, after_names))
    lines += _roofline(case, sides, out_dir / "img", out_dir)
    _HEADLINES[case.name] = "; ".join(heads)
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------------ driver

def render_index(cases: list[Case]) -> str:
    """analyses/README.md: one line per page with its headline numbers, and how to regenerate."""
    lines = ["# Case studies", "",
             "*Generated by `scripts/pages/make_analyses.py` (with the pages); do not edit by hand.*", "",
             "Each page is profkit run on committed traces in `traces/` (captured on one NVIDIA H200, "
             "measured peaks `traces/peaks_h200.json`): profkit's verdict and predicted speedup, the "
             "measured change (`profkit diff`), and, where the two disagree by more than 20%, why.", "",
             "    python scripts/pages/make_analyses.py            # regenerate every page and this index",
             "    python scripts/pages/make_analyses.py --only NAME  # one page",
             "    python scripts/pages/make_analyses.py --check    # CI: exit 1 if a page differs from a fresh run",
             "    python3 -m pytest -q tests/test_analyses_drift.py", "",
             "| page | what it shows | headline (from the traces) |", "|---|---|---|"]
    for c in cases:
        if c.name in _HEADLINES:
            lines.append(f"| [{c.name}.md]({c.name}.md) | {c.blurb or c.title} | {_HEADLINES[c.name]} |")
    lines += ["", "Other pages here are not generated by this script:", ""]
    lines += [f"- [{n}]({n}): {what}" for n, what in OTHER_PAGES]
    return "\n".join(lines) + "\n"


def render_pages(cases: list[Case], out_dir: Path, index: bool = False,
                 img_root: Optional[Path] = None) -> tuple[dict[Path, str], list[str]]:
    """The page of every case whose traces exist, {out_dir/NAME.md: text}, and the cases skipped.
    ``index``: README.md too (a full run of the defined cases). Roofline images go to
    ``img_root``/img (default: ``out_dir``/img); the pages link to them as img/NAME.png."""
    pages, skipped = {}, []
    for case in cases:
        try:
            pages[out_dir / f"{case.name}.md"] = render_case(case, img_root or out_dir)
        except FileNotFoundError as exc:
            skipped.append(f"{case.name} (trace {exc.args[0]} not captured yet)")
    if index:
        pages[out_dir / "README.md"] = render_index(cases)
    return pages, skipped


def write_pages(cases: list[Case], out_dir: Path, index: bool = False) -> tuple[list[Path], list[str]]:
    """Write every case whose traces exist; return (pages written, cases skipped)."""
    pages, skipped = render_pages(cases, out_dir, index=index)
    write_or_check(pages, check=False, command=COMMAND)
    return list(pages), skipped


def _adhoc(args) -> Case:
    return Case(name=args.name, before=args.before, after=args.after, by=args.by,
                title=args.title or args.name, notes=args.notes or "",
                ops=tuple(args.op or ()), before_range=args.before_range, after_range=args.after_range)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir; exit 1 on drift")
    ap.add_argument("--only", action="append", help="only this case (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "analyses", help="output directory")
    ap.add_argument("--list", action="store_true", help="list the cases and whether their traces exist")
    adhoc = ap.add_argument_group("one ad-hoc case instead of the defined ones")
    adhoc.add_argument("--name")
    adhoc.add_argument("--before")
    adhoc.add_argument("--after")
    adhoc.add_argument("--by", default="range", choices=["range", "kernel", "aten"])
    adhoc.add_argument("--title")
    adhoc.add_argument("--notes")
    adhoc.add_argument("--op", action="append", help="an op of interest (repeatable)")
    adhoc.add_argument("--before-range", help="BEFORE's op to compare with --after-range")
    adhoc.add_argument("--after-range", help="AFTER's op to compare with --before-range")
    args = ap.parse_args(argv)

    full = not (args.name or args.before or args.only)  # every defined case: README.md too
    if args.name or args.before:
        if not (args.name and args.before):
            ap.error("an ad-hoc case needs --name and --before")
        cases = [_adhoc(args)]
    else:
        cases = [c for c in CASES if not args.only or c.name in args.only]
        unknown = set(args.only or ()) - {c.name for c in CASES}
        if unknown:
            ap.error(f"no case named {sorted(unknown)[0]!r}; cases: {', '.join(c.name for c in CASES)}")
    if args.list:
        for c in cases:
            have = all((ROOT / t).exists() for t in c.traces())
            print(f"{c.name}: {' vs '.join(c.traces())} ({'ready' if have else 'trace missing'})")
        return 0
    try:
        with tempfile.TemporaryDirectory() as tmp:  # --check: images of the fresh run go here
            pages, skipped = render_pages(cases, args.out, index=full,
                                          img_root=Path(tmp) if args.check else None)
    except (CaseError, profkit.ProfkitError) as exc:
        print(f"make_analyses: error: {exc}", file=sys.stderr)
        return 2
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    return write_or_check(pages, args.check, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())

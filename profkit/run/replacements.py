"""Replacements: the library work the rules propose, timed at the program's shapes at capture.

``profkit capture`` keeps, in the trace's PROFKIT_META under ``replacements``, the op record of one
iteration of its calibration run (profkit.capture.oprecord: the shapes) and the timings made from
it (profkit.capture.replacements)::

    {"format": "profkit-replacements/1", "device": "cuda:0", "gpu": "NVIDIA H200",
     "torch": "2.13.0", "repetitions": 10, "seconds": 6.2, "notes": [...],
     "record": {"format": "profkit-oprecord/1", "attention": [...], "gemm": [...], ...},
     "entries": [{"kind": "attention", "key": "...", "shape": {...}, "count": 12,
                  "original_ns": 2325100, "replacement_ns": 412000, "backend": "default",
                  "repetitions": 10, "spread": {...}, "error": null, ...}, ...]}

This module reads it into typed data for the rules; a capture without it, or with another
format, reads as empty (the rules then price from the trace alone and say so).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from profkit.model import GEMM_ALIGN, gemm_multiply_adds, gemm_unaligned

FORMAT = "profkit-replacements/1"
RECORD_FORMAT = "profkit-oprecord/1"


@dataclass(frozen=True)
class Replacement:
    """One replacement timed at one of the program's shapes."""
    kind: str                        # attention, attention_causal_mask, optimizer, optimizer_fused_floor,
                                     # rnn, copy, gemm_tf32, gemm_bf16, gemm_fp64_*, conv_bf16, conv_cl
    key: str
    shape: dict
    count: int                       # calls per iteration of the recorded op
    original_ns: Optional[float]     # the program's way, per call (median of the runs)
    replacement_ns: Optional[float]  # the replacement's
    backend: str
    repetitions: int
    error: Optional[str]
    forward: Optional[tuple[float, float]] = None   # (original, replacement) of the forward alone
    host: Optional[tuple[float, float]] = None      # (original, replacement) host time per call
    spread: dict = field(default_factory=dict)
    original: str = ""               # how the original ran when it matters ("... as a CUDA graph")

    @property
    def measured(self) -> bool:
        return (self.error is None and bool(self.original_ns) and bool(self.replacement_ns)
                and self.original_ns > 0 and self.replacement_ns > 0)

    @property
    def ratio(self) -> float:
        """Original over replacement: how many times faster the replacement ran."""
        return float(self.original_ns) / float(self.replacement_ns) if self.measured else 1.0

    def text(self) -> str:
        """``412.0 us vs 2325.1 us`` (replacement vs original, per call)."""
        return f"{self.replacement_ns / 1e3:.1f} us vs {self.original_ns / 1e3:.1f} us"


# The kernels a backward launches: PyTorch's *_backward kernels, cuDNN's data and weight
# gradients, flash attention's backward
BACKWARD_KERNEL_RE = re.compile(r"backward|bwd|dgrad|wgrad", re.I)


# torch's own ways for a program to wait (torch.cuda.synchronize, Stream/Event.synchronize and
# wait): a wait under one of them outside any op is the program's ``synchronize``
PROGRAM_WAITS = ("torch/cuda/",)


def program_synchronize(via: Optional[str]) -> bool:
    """Whether a recorded ``synchronize`` (a wait outside the ops the dispatch shows) is the
    program's own: made through torch.cuda's synchronize/wait APIs (``via``, the outermost torch
    frame), not inside other torch code (a module's forward: records made before ``in op`` took
    such waits say ``synchronize`` with ``via`` torch/nn/modules/module.py)."""
    return via is None or str(via).startswith(PROGRAM_WAITS)


def backward_launched(trace) -> bool:
    """Whether ``trace`` (a profkit.read.trace.Trace) launched backward kernels: the evidence
    Replacements.autograd_at_inference takes for a record made before it said whether a
    backward ran."""
    acts = trace.activities
    names = acts.loc[(acts["kind"] == "kernel").to_numpy(), "name"].astype(str).unique()
    return any(BACKWARD_KERNEL_RE.search(n) for n in names)


@dataclass(frozen=True)
class Replacements:
    """A capture's ``replacements``: the op record and the timed entries."""
    entries: tuple[Replacement, ...] = ()
    record: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    gpu: str = ""

    def measured(self, kind: str) -> list[Replacement]:
        """The entries of ``kind`` that timed both sides."""
        return [e for e in self.entries if e.kind == kind and e.measured]

    def gemm_gain(self, kind: str) -> Optional[float]:
        """How many times faster the program's fp32 GEMMs run as ``kind`` (gemm_tf32, gemm_bf16; its
        float64 GEMMs for gemm_fp64_fp32, gemm_fp64_tf32, gemm_fp64_bf16), from
        the timed shapes: the timed fp32 time over the replacement's, each shape by its calls; where
        both aligned and unaligned shapes were timed (M, N or K not a multiple of ALIGN[kind]: off
        the aligned tensor-core kernels), each group is weighted by its share of the recorded GEMMs'
        FLOPs instead, at its own timed fp32 time per FLOP and its own gain. A Conformer's six
        unaligned attention GEMMs hold 12% of its FLOPs: they ran slower in bf16 than in fp32 where
        the aligned projections ran 10x faster, and one ratio over the timed shapes priced the
        GEMMs at 4.9 ms an iteration that took 12.4. None where nothing was timed."""
        timed = self.measured(kind)
        if not timed:
            return None
        plain = sum(e.original_ns * e.count for e in timed) / sum(e.replacement_ns * e.count for e in timed)
        align = ALIGN.get(kind, 8)
        groups = {odd: [e for e in timed if gemm_unaligned(e.shape, align) is odd] for odd in (False, True)}
        src = "fp64" if kind.startswith("gemm_fp64_") else "fp32"
        work = {odd: sum(gemm_multiply_adds(g) * float(g.get("count", 1)) for g in self.recorded("gemm")
                         if g.get("dtype") == src and gemm_unaligned(g, align) is odd) for odd in (False, True)}
        if not all(groups.values()) or not all(work.values()):
            return plain
        before = after = 0.0
        for odd, group in groups.items():
            fp32_ns = sum(e.original_ns * e.count for e in group)
            per_flop = fp32_ns / max(sum(gemm_multiply_adds(e.shape) * e.count for e in group), 1.0)
            gain = fp32_ns / sum(e.replacement_ns * e.count for e in group)
            before += work[odd] * per_flop
            after += work[odd] * per_flop / gain
        return before / after

    def recorded(self, kind: str) -> list[dict]:
        """The op record's items of ``kind`` (attention, gemm, copy, rnn_cell, optimizer, conv, sync)."""
        items = self.record.get(kind) if isinstance(self.record, dict) else None
        return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []

    def module_calls(self) -> int:
        """Calls an iteration of the modules the program called from its own code (the op
        record's ``root_calls``, every outermost module): as many calls of their compiled graphs
        under torch.compile. 0 where the record has none."""
        return sum(int(r["calls"]) for r in self.recorded("root_calls")
                   if isinstance(r.get("calls"), int) and not isinstance(r.get("calls"), bool) and r["calls"] > 0)

    def autograd_at_inference(self, backward_kernels: Callable[[], bool]) -> Optional[int]:
        """How many ops of the recorded iteration took inputs that require gradients (fused
        attention, math-path attention, convolutions, RNN cells) in an iteration that ran no
        backward and stepped no optimizer: inference with autograd left on (evaluation code that
        forgot ``torch.no_grad()``). ``backward_kernels``: whether the trace holds backward
        kernels (backward_launched), asked only of a record made before it said whether a
        backward ran. None otherwise."""
        rec = self.record if isinstance(self.record, dict) else {}
        n = sum(int(r.get("count", r.get("calls", 1)) or 0)
                for kind in ("sdpa", "attention", "conv", "rnn_cell") for r in self.recorded(kind)
                if r.get("grad") is True)
        if not n or self.recorded("optimizer"):
            return None
        ran = rec.get("backward")
        return None if ran is True or (ran is None and backward_kernels()) else n

    def __bool__(self) -> bool:
        return bool(self.entries) or bool(self.record)


# A GEMM's M, N and K in multiples of these run on the aligned tensor-core kernels (16 bytes)
ALIGN = {"gemm_tf32": GEMM_ALIGN["tf32"], "gemm_bf16": GEMM_ALIGN["bf16"],
         "gemm_fp64_fp32": GEMM_ALIGN["tf32"], "gemm_fp64_tf32": GEMM_ALIGN["tf32"],
         "gemm_fp64_bf16": GEMM_ALIGN["bf16"]}


def _pair(d: object) -> Optional[tuple[float, float]]:
    if not isinstance(d, dict):
        return None
    o, r = d.get("original_ns"), d.get("replacement_ns")
    if isinstance(o, (int, float)) and isinstance(r, (int, float)) and o > 0 and r > 0:
        return float(o), float(r)
    return None


def _num(x: object) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def parse(meta_text: Optional[str]) -> Replacements:
    """The ``replacements`` of a trace's PROFKIT_META (empty without it, or when it is not a
    profkit-replacements/1 record); an entry that does not read is left out."""
    if not meta_text:
        return Replacements()
    try:
        data = json.loads(meta_text)
    except ValueError:
        return Replacements()
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return Replacements()
    record = data.get("record")
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        record = {}
    out = []
    for e in data.get("entries") or []:
        if not isinstance(e, dict) or not isinstance(e.get("kind"), str):
            continue
        try:
            out.append(Replacement(
                kind=e["kind"], key=str(e.get("key", "")),
                shape=e["shape"] if isinstance(e.get("shape"), dict) else {},
                count=int(e.get("count") or 1), original_ns=_num(e.get("original_ns")),
                replacement_ns=_num(e.get("replacement_ns")), backend=str(e.get("backend") or ""),
                repetitions=int(e.get("repetitions") or 0),
                error=str(e["error"]) if e.get("error") else None,
                forward=_pair(e.get("forward")), host=_pair(e.get("host")),
                spread=e["spread"] if isinstance(e.get("spread"), dict) else {},
                original=str(e.get("original") or "")))
        except (TypeError, ValueError):
            continue
    notes = tuple(str(n) for n in data.get("notes") or [] if isinstance(n, str))
    return Replacements(tuple(out), record, notes, str(data.get("gpu") or ""))

"""The user-facing facade: load a trace, get ops with their verdicts as a DataFrame or a report.

    >>> import profkit
    >>> prof = profkit.load("traces/micro_addnorm.sqlite.xz")
    >>> prof.ops(by="range")[["count", "gpu_time_ns", "class", "rung"]]
    >>> prof.report(by="kernel")      # the JSON contract, as a dict
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from functools import cached_property
from pathlib import Path
from typing import Callable, Collection, Optional

import numpy as np
import pandas as pd

from profkit.judge import evidence as ev
from profkit.judge import gpu_metrics, grid
from profkit.read import gpu_metrics as read_gpu_metrics
from profkit.judge import patterns
from profkit.judge import rules
from profkit.judge.advisor import Frame, advise, advise_pair
from profkit.judge.op_inputs import Kernels, Members, shape_inputs
from profkit.judge.ranking import ranked_actions
from profkit.read import aten_record
from profkit.run.attribution import aten_key
from profkit.run.replacements import backward_launched
from profkit.run.summary import GEMM_RE as LIBRARY_KERNEL_RE, NCCL_RE
from profkit.judge.classify import judge, kernel_launch_stats
from profkit.judge.trials import tried_of, trials_json, variants_measured
from profkit.run.ops import OpGroups, group_ops
from profkit.errors import ProfkitError
from profkit.read.peaks import resolve_peaks
from profkit.read.nsys import match_names
from profkit.run.summary import (SYNC_OR_COPY_RE, RunSummary, apply_actions,
                                  charge_refill_to_syncs, critical_fraction, summarize,
                                  sync_intervals)
from profkit.read.trace import Trace
from profkit.run.shapes import aten_capture, op_of_signature
from profkit.run.step.model import StepModel, model_of
from profkit.show.fields import gpu_json, op_json, suggestion_fields
from profkit.run.window import LIBRARY_RANGE_RE, Window, find_window

SCHEMA_VERSION = 2


class Profile:
    """One trace, its GPU's roofline ceilings, and the analyses over it.

    ``window``: the stretch judged (profkit.run.window): ``auto`` (the iterations after the first),
    ``all``, ``RANGE``, ``RANGE[i:j]`` or ``T0:T1`` seconds. ``trace`` is the windowed view that
    every op, share and gain is computed on; ``full_trace`` the whole capture.
    ``attribution``: ``process`` or ``thread`` (profkit.read.trace.Trace).
    ``gains``: ``wall`` (default) judges end-to-end gains on the window's wall time; ``gpu``
    on its GPU time alone, as if the GPU were always the bottleneck (kernel benchmarks).
    ``shapes_from``: a ``--aten`` capture of the same program, whose GEMM shapes the rules use
    where this trace has none (profkit.run.shapes: kernels matched by name and launch shape).
    """

    def __init__(self, path: str | Path, peaks_file: Optional[str | Path] = None,
                 window: str = "auto", attribution: str = "process", gains: str = "wall",
                 shapes_from: Optional[str | Path] = None) -> None:
        if gains not in ("wall", "gpu"):
            raise ProfkitError(f"unknown gains frame {gains!r}: use wall or gpu")
        self.gains = gains
        self.shapes_from = shapes_from
        # Checked now, not when a rule first asks for shapes
        self._shapes_trace = aten_capture(shapes_from) if shapes_from is not None else None
        # The window, run summary and op table all read the NVTX ranges: read them at once.
        self.full_trace = Trace(path, attribution=attribution, ranges_now=True)
        # What the step model reads first and the window does not (the launch calls, the
        # synchronising and copy calls): made on the other core while the window is found.
        self._calls_ahead = _in_thread(_ahead, lambda: self.full_trace.launch_calls,
                                       lambda: self.full_trace.api_calls_matching(SYNC_OR_COPY_RE))
        self.window: Window = find_window(self.full_trace, window)
        self.trace = (self.full_trace if self.window.is_all else
                      self.full_trace.windowed(self.window.start_ns, self.window.end_ns))
        self.gpu = self.full_trace.primary_gpu()
        self.peaks, self.warnings = resolve_peaks(self.gpu, peaks_file)
        w = self.window
        if w.lost_launches:
            self.warn(f"the trace ends before the GPU finished: {w.lost_launches} kernel launch(es) of the "
                      f"last {w.lost_iterations} {w.delimiter} range(s) have no kernel in the trace (the "
                      "program ended without waiting for the GPU, or the trace was cut by the GPU's "
                      "clock; a GPU-bound loop with no sync runs iterations behind its CPU) - " +
                      ("too few whole iterations are left, so the window keeps them: the GPU's time per "
                       "iteration is undercounted; capture again with torch.cuda.synchronize() before "
                       "the program ends, or more iterations" if w.lost_kept else
                       "the window ends before them"))
        if (self.full_trace.meta or {}).get("interrupted") not in (None, "", "0"):
            # profkit capture's profiled run stopped by Ctrl-C (or its time limit): the script
            # did not end, and the trace is what ran until then
            self.warn("this capture was interrupted before the script ended: the trace holds what ran "
                      "until then, and its last iterations may be partial; capture again to judge the "
                      "program's steady state")
        self.notes: list[str] = []
        self._run: Optional[RunSummary] = None
        self._findings: list = []
        self._ops: dict[tuple, pd.DataFrame] = {}

    def run(self, summarized: Optional[Callable[[], None]] = None) -> RunSummary:
        """Where the window's wall time goes and the verdict for the whole program.
        ``summarized``: called once the run summary is made (at once when it was made before)."""
        if self._run is not None and summarized is not None:
            summarized()
        if self._run is None:
            # The step model does not need the run summary: it is built on the other core while
            # the summary is made here (step_model() takes it, or its error, as if made there);
            # that core goes on to ``summarized`` once the model is built.
            if "_step_model" not in self.__dict__ and "_model_ahead" not in self.__dict__:
                self.__dict__["_model_ahead"] = _in_thread(self._model_then, summarized)
            summary = summarize(self.full_trace, self.window, self.peaks.launch_floor_ns)
            if summarized is not None:
                summarized()
            model = self.step_model() if summary.refill_ns else None
            if model is not None:
                charge_refill_to_syncs(summary, model.sync_cost_ns(max(len(self.window.iteration_ns), 1)))
            # Set first: rules may read the frame (wall time) while they run.
            self._run = summary
            self._findings = rules.evaluate(self, summary)
            apply_actions(summary, self._findings)
            if not self.full_trace.ranges_of_level("aten").empty:
                cost = self.full_trace.recorder_cost_ns
                if cost > 0:
                    self.warn(f"this capture recorded every aten op (--aten): the recorder measured "
                              f"its own cost at {cost / 1e3:.1f} us an op, which the step model "
                              "takes off the CPU time; the timeline and the host-side shares "
                              "still describe the recorded run")
                else:
                    self.warn("this capture recorded every aten op (--aten), which slows the host "
                              "(the H200 Llama training step: +44-74% a step under emit_nvtx, "
                              "+103-173% under profkit's recorder): host-side verdicts and gains "
                              "describe the recorded run; judge them on a capture without --aten")
        return self._run

    @cached_property
    def borrowed_shapes(self) -> dict:
        """For a trace without aten ranges and ``shapes_from`` given: per kernel signature, the
        aten op that launched it in that capture (profkit.run.shapes.op_of_signature); empty
        otherwise."""
        return op_of_signature(self._shapes_trace) if self._shapes_trace is not None else {}

    def _model_then(self, then: Optional[Callable[[], None]]) -> StepModel:
        """model_of, for a thread: first the calls the run summary reads last (the launch calls,
        the synchronising and copy calls, read ahead while the window was found), then the model
        and the replay without its syncs' waits that the summary asks next, then the critical
        share the rules read first (an error of those is raised where they are read, as before),
        then ``then`` (whatever model_of raised)."""
        try:
            self._calls_ahead.result()
            model = model_of(self.full_trace, self.window, self.peaks.launch_floor_ns)
            _ahead(lambda: model.sync_cost_ns(1), lambda: self.critical)
            return model
        finally:
            if then is not None:
                then()

    def step_model(self) -> Optional[StepModel]:
        """The step model of the window (profkit.run.step): the dependency graph of its CPU and GPU
        work replayed from the trace, calibrated to the program without a profiler, with the
        critical path of the calibrated replay. ``model.simulate(graph)`` replays an edited copy
        of ``model.graph``. None (with a warning) when the window cannot be modelled."""
        if "_step_model" not in self.__dict__:
            ahead = self.__dict__.pop("_model_ahead", None)
            try:
                m = (ahead.result() if ahead is not None else
                     model_of(self.full_trace, self.window, self.peaks.launch_floor_ns))
            except (ValueError, IndexError, KeyError) as exc:  # an odd window: no model, no crash
                self.warn(f"the step model could not be built for this window ({exc}); "
                          "predictions use the profiled run as it is")
                m = None
            if m is not None:
                for w in m.warnings:
                    self.warn(w)
            self.__dict__["_step_model"] = m
        return self.__dict__["_step_model"]

    def findings(self) -> list:
        """Every rule's findings (profkit.judge.rules), best expected gain on wall time first."""
        self.run()
        return list(self._findings)

    @property
    def pricing_host(self) -> float:
        """The CPU scale fixes are priced at: the program without a profiler (calibrated), or no
        CPU at all when gains are judged on GPU time (``gains="gpu"``: kernel benchmarks)."""
        if self.__dict__.get("_host_override") is not None:
            return self.__dict__["_host_override"]
        model = self.step_model()
        return 0.0 if self.gains == "gpu" else (model.host if model else 1.0)

    def findings_at(self, unprofiled_iteration_ns: float, issue_ns: Optional[float] = None,
                    codes: Optional[Collection[str]] = None) -> tuple[list, float]:
        """Every rule's findings priced for the program as it ran in another unprofiled run, whose
        median iteration was ``unprofiled_iteration_ns`` (the same program timed on another
        machine, or another day): the step model is calibrated to it as to the capture's own
        calibration run, and the rules price at that CPU scale. Where the GPU sets that run's
        pace, its period shows nothing of the CPU's speed: ``issue_ns``, the host's time to issue
        one iteration in that run while nothing blocks it (not waited for), gives the scale then
        (calibrate.host_from_issue).
        ``codes``: those rules' findings alone (a harness that prices one fix at many baselines).
        Returns (findings, CPU scale); the profile's own findings are left as they are."""
        from profkit.run.step.calibrate import MIN_HOST, TOLERANCE, estimated_host, fit_host, host_from_issue
        model = self.step_model()
        self.run()
        if model is None or self.gains == "gpu":
            return self.findings(), self.pricing_host
        fitted = self.__dict__.setdefault("_host_at", {})  # one fit per run priced at
        key = (float(unprofiled_iteration_ns), issue_ns)
        if key not in fitted:
            sim = lambda h: model.simulate(host=h)  # noqa: E731
            host, _ = fit_host(sim, float(unprofiled_iteration_ns),
                               min(model.host, estimated_host(model.graph)) if model.calibration.source
                               == "measured" else model.host)
            if issue_ns and sim(host).iteration_ns <= sim(MIN_HOST).iteration_ns * (1 + TOLERANCE):
                # GPU-paced at that scale: the period fits any CPU fast enough; the issue time says which
                host = host_from_issue(model.graph, float(issue_ns), float(unprofiled_iteration_ns), sim) or host
            fitted[key] = host
        host = fitted[key]
        self.__dict__["_host_override"] = host
        try:
            return rules.evaluate(self, self._run, codes), host
        finally:
            self.__dict__["_host_override"] = None

    def calibration_ranges(self) -> dict[str, tuple[float, float, int]]:
        """Where the program's own speed varied between its runs without the profiler (runs that
        disagree by more than calibrate.RUN_SPREAD, or one slower than the profiled run, which
        tracing cannot cause), every finding priced at the speed of each of those runs as well
        (``findings_at``): {code: (lowest gain, highest gain, runs)}, for the findings whose price
        moves by more than 1% across them; empty where the runs agree. One run cannot say what the
        user will see on such a program: the range is the answer, not a refusal."""
        if "_ranges" in self.__dict__:
            return self.__dict__["_ranges"]
        out: dict[str, tuple[float, float, int]] = {}
        model = self.step_model()
        if model is not None and self.gains != "gpu" and model.calibration.unstable:
            prices: dict[str, list[float]] = {}
            for found in [self.findings()] + [self.findings_at(m)[0] for m in model.calibration.run_medians]:
                best: dict[str, float] = {}
                for f in found:
                    best[f.code] = max(best.get(f.code, 0.0), f.expected_end_to_end_speedup)
                for code, g in best.items():
                    prices.setdefault(code, []).append(g)
            n = len(model.calibration.run_medians)
            out = {c: (min(v), max(v), n) for c, v in prices.items() if max(v) > 1.01 * min(v)}
        self.__dict__["_ranges"] = out
        return out

    def trials(self) -> list:
        """The fixes ``profkit capture --try`` applied to the program and timed beside it (the
        trace's PROFKIT_META ``trials``; profkit.run.trials.TrialResult), in the order they ran;
        empty for a capture without trials."""
        if "_trials" not in self.__dict__:
            from profkit.run.trials import summarize
            self.__dict__["_trials"] = summarize(self.full_trace.meta.get("trials"))
        return list(self.__dict__["_trials"])

    def replacements(self):
        """What ``profkit capture`` recorded and timed at the program's shapes (the trace's
        PROFKIT_META ``replacements``: the op record and the replacement timings;
        profkit.run.replacements.Replacements); empty for a trace without."""
        if "_replacements" not in self.__dict__:
            from profkit.run.replacements import parse
            self.__dict__["_replacements"] = parse(self.full_trace.meta.get("replacements"))
        return self.__dict__["_replacements"]

    def combined_actions(self) -> list[dict]:
        """The top findings priced together by the step model (profkit.judge.combine): every pair
        and the triple of the three best, each replayed as one edited graph; best first. On a
        capture with trials, a combination holding a measured fix is also replayed with that
        fix's edit scaled to its measured gain (``with_trials``)."""
        if "_combined" not in self.__dict__:
            from profkit.judge.combine import combined, with_trials
            found = self.findings()
            tried = tried_of(found, self.trials())
            # a fix the program failed under is no part of a combination it can run
            found = [f for f in found if not (f.code in tried and tried[f.code].failed)]
            tried = {c: t for c, t in tried.items() if not t.failed}
            combos = combined(self.step_model(), self.pricing_host, found)
            if combos and tried:
                combos = with_trials(self.step_model(), self.pricing_host, found, combos, tried)
            self.__dict__["_combined"] = combos
        return list(self.__dict__["_combined"])

    def price_together(self, codes: list[str], host: Optional[float] = None,
                       findings: Optional[list] = None, variant: Optional[str] = None) -> Optional[float]:
        """The gain of one change that does what several rules propose (compiling the model and
        the optimizer step: PK103 and PK201), their edits replayed at once at CPU scale ``host``
        (default: the pricing scale) from ``findings`` (default: the profile's own; those of
        ``findings_at`` with its scale). ``variant``: an evidence key naming which of a rule's
        priced variants the change is (``bf16_channels_last_speedup``: PK305's bf16, whatever
        its action), for the rules that priced it. None when a rule does not fire or the edits
        do not compose."""
        from dataclasses import replace
        from profkit.judge.combine import together
        found = {f.code: f for f in (self.findings() if findings is None else findings)}
        if any(c not in found for c in codes):
            return None
        group = [replace(found[c], edit=found[c].alternatives[variant])
                 if variant in found[c].alternatives else found[c] for c in codes]
        return together(self.step_model(), self.pricing_host if host is None else host, group)

    def backward_kernels(self) -> bool:
        """Whether the capture launched backward kernels (PyTorch's ``*_backward`` kernels,
        cuDNN's weight and data gradients, flash attention's backward)."""
        return backward_launched(self.full_trace)

    @cached_property
    def _kernels(self) -> "Kernels":
        return Kernels(self.trace.activities, self.trace.ncu, self.trace.name_codes)

    @cached_property
    def small_grids(self) -> pd.Series:
        """The window's long kernels launched on a few blocks (profkit.judge.grid.small_grids):
        their blocks, by activity index; their launch shapes read once, for those kernels alone."""
        acts = self.trace.activities
        long = acts[(acts["kind"] == "kernel") & ((acts["end"] - acts["start"]) >= grid.MIN_KERNEL_NS)]
        if long.empty or not self.gpu.sm_count:
            return pd.Series(dtype="int64")
        shapes = self.full_trace.kernel_shapes(int(long["start"].min()), int(long["start"].max()),
                                               grid.MIN_KERNEL_NS)
        return grid.small_grids(long, shapes, self.gpu.sm_count)

    @cached_property
    def critical(self) -> np.ndarray:
        """Per activity of the window: 1 where finishing it sooner would shorten the run
        (run.critical_fraction), computed once for the op table and the rules."""
        return critical_fraction(self.trace.activities, sync_intervals(self.full_trace)).to_numpy()

    def frame(self, summarized: Optional[Callable[[], None]] = None) -> Frame:
        """What end-to-end gains are measured against: the window's GPU time and wall time.
        ``summarized``: as for run() (called at once where no run summary is needed)."""
        gpu = float(self.trace.total_gpu_time_ns)
        if self.gains == "gpu":
            if summarized is not None:
                summarized()
            return Frame(gpu_time_ns=gpu, wall_ns=gpu)
        r = self.run(summarized)
        return Frame(gpu_time_ns=gpu, wall_ns=float(r.wall_time_ns),
                     host_floor_ns=r.host_floor_ns)

    def level_for(self, by: str) -> str:
        """``by``, or the level an unannotated trace falls back to (with a note)."""
        if by != "range":
            return by
        user = self.trace.user_ranges
        user = user[~match_names(self.trace.range_codes_of(user), LIBRARY_RANGE_RE)]
        if len(user) and self.trace.linked_fraction > 0:
            return by
        aten = bool(self.trace.ranges["name"].str.startswith("aten::").any())
        fallback = "aten" if aten else "kernel"
        note = (f"no user NVTX ranges in the window: showing --by {fallback}; annotate steps "
                "with NVTX ranges (profkit.annotate) for a per-range view")
        if note not in self.notes:
            self.notes.append(note)
        return fallback

    def warn(self, message: str) -> None:
        """Add a warning to the report (once); the rules add theirs through it too."""
        if message not in self.warnings:
            self.warnings.append(message)

    @property
    def path(self) -> str:
        return self.trace.path

    @cached_property
    def gpu_samples(self) -> Optional[read_gpu_metrics.GpuMetrics]:
        """nsys GPU-metrics samples (``capture --gpu-metrics``), None when the export has none."""
        return read_gpu_metrics.read_gpu_metrics(self.path)

    def ops(self, by: str = "range", innermost: bool = False, top: Optional[int] = None) -> pd.DataFrame:
        """One row per op, most busy GPU time first: times, share, bound class, evidence and next step.

        ``by``: ``range`` (NVTX range name), ``kernel`` (kernel name) or ``aten`` (aten op and
        input sizes, from emit_nvtx). ``innermost``: with ``by="range"``, count each GPU activity
        only for the innermost range around its launch.
        """
        by = self.level_for(by)
        # The op table is computed once per view: report() and the CLI's header ask again.
        key = (by, innermost, top)
        if key not in self._ops:
            self._ops[key] = self._compute_ops(by, innermost, top)
        return self._ops[key].copy()

    def _compute_ops(self, by: str, innermost: bool, top: Optional[int]) -> pd.DataFrame:
        # The ops are grouped on the other core while the rules run here (frame(): started once
        # the run summary is made, which the step model shares the cores with); an error of the
        # grouping is raised as if it came first.
        ahead = _Later(self._grouped, by, innermost, top)
        if by != "kernel":  # the ranges read here (or by the grouping first): their count below
            _ = self.trace.ranges
        n_open = self.trace.unclosed_ranges if by != "kernel" else 0
        note = (f"{n_open} NVTX range(s) never closed (the program ended or crashed inside them): "
                "they end at the end of the capture")
        noted = bool(n_open) and note not in self.warnings
        if n_open:
            self.warn(note)
        try:
            frame = self.frame(summarized=ahead.start)
        except BaseException:
            if ahead.exception() is None:
                raise
        try:
            groups, inputs = ahead.result()
        except BaseException:
            if noted:
                self.warnings.remove(note)
            raise
        if isinstance(inputs, Exception):  # raised where the ops' inputs were made before
            raise inputs
        acts = self.trace.activities
        kernels = self._kernels
        rows, works, kernels_of = [], {}, {}
        ops = groups.ops if top is None else groups.ops.head(top)
        for name, op in ops.iterrows():
            rec = {"name": name, **op.to_dict()}
            idx, knames, critical, dtype, causal, stats, summed, has_kernel, under_graph, record = inputs[name]
            # The op's activities as a frame only for the sources that read one (counters, GPU
            # metrics, copies): an op of a long window holds up to every activity of it.
            member = Members(acts, idx)
            rec["distinct_kernels"] = len(knames)
            rec.update(grid.op_small_grid(idx, acts, self.small_grids, self.gpu.sm_count))
            rec["critical_fraction"] = critical
            precision = dtype.precision
            rec.update(stats)
            calls = int(op["count"])
            hint = groups.hints.get(name)
            # Best source first; exact copy bytes outrank a shape guess; judge() drops a source
            # whose numbers land above a roof and says so in the evidence. A range's summed aten
            # work comes where an op's own shapes would, before a hint, unless the sum covers
            # only part of the range (confidence "low": a lower bound on its work): then a hint
            # written for the whole range goes first.
            partial = summed is not None and summed.notes.get("aten_modelled_share", 1.0) < ev.ATEN_FULL_SHARE
            # (from_ncu and from_gpu_metrics find nothing without counters or samples)
            candidates = [lambda: ev.from_ncu(member(), self.trace.ncu, calls, self.gpu.l2_bytes,
                                              matched=kernels.ncu_rows(idx))
                          if has_kernel and not self.trace.ncu.empty else None,
                          lambda: gpu_metrics.from_gpu_metrics(member(), self.gpu_samples, calls,
                                                               self.peaks.memory_bandwidth)
                          if self.gpu_samples is not None else None,
                          lambda: None if has_kernel else ev.from_copies(member(), calls),
                          lambda: ev.from_shapes(str(name), dtype, causal=causal, record=record)
                          if by == "aten" else None,
                          lambda: None if partial else summed,
                          lambda: ev.from_hint(hint, precision),
                          lambda: summed if partial else None]
            verdict, work = judge(rec, candidates, self.peaks, knames[:20])
            if work is not None and work.precision is not None:
                precision = work.precision
            dropped = [w for w in verdict.evidence.get("warnings", [])
                       if w.startswith(f"{ev.Source.HINTS.value} evidence dropped")]
            if dropped:
                # The hint was dropped for landing above a roof: faster than the hardware allows,
                # so the hint (or the peaks) is wrong and the verdict rests on weaker evidence.
                verdict.confidence = "low"
                self.warn(f"op {name}: its FLOP/byte hint would run it faster than the roofline "
                           f"of {self.peaks.gpu} allows, which cannot be: check the hint in the "
                           "range name (or --peaks)")
            sug = advise(rec, verdict, work, self.peaks, knames[:20], under_graph, frame,
                         price=self._op_pricer(idx),
                         library_kernels=sum(bool(LIBRARY_KERNEL_RE.match(str(k)) or NCCL_RE.match(str(k)))
                                             for k in knames))
            rec.update({
                "class": verdict.bound.value, "confidence": verdict.confidence,
                "source": verdict.source.value, "reason": verdict.reason,
                "pct_of_roof": verdict.pct_of_roof, "evidence": verdict.evidence,
                "precision": precision, **suggestion_fields(sug),
            })
            rows.append(rec)
            works[name] = work
            kernels_of[name] = set(knames)
        if by == "aten":
            self._apply_pairs(rows, works, frame)
        df = pd.DataFrame(rows).set_index("name")
        df.attrs["level"] = by
        df.attrs["kernels_of"] = SharedKernels(kernels_of)  # for counting an action once (ranked_actions)
        return df

    def _grouped(self, by: str, innermost: bool, top: Optional[int]) -> tuple[OpGroups, object]:
        """The ops of level ``by`` (group_ops) and, per op, what its row is judged from that the
        run summary does not decide (_op_inputs), made on a thread while the rules run; an error
        of the latter is handed back, to be raised where the op table reads them."""
        groups = group_ops(self.trace, by=by, innermost=innermost)
        try:
            return groups, self._op_inputs(groups, by, top)
        except Exception as exc:
            return groups, exc

    def _op_inputs(self, groups: OpGroups, by: str, top: Optional[int]) -> dict:
        """Per op: its activities' positions, kernel names, critical fraction, element type and
        whether causal, launch statistics, summed aten work (range level), whether it holds a
        kernel, whether any of it ran in a CUDA graph, and its recorder's record (aten level)."""
        acts = self.trace.activities
        in_graph = acts["graphNodeId"].notna().to_numpy()
        members_by_op = groups.members_by_op()
        crit = self.critical
        kernels = self._kernels
        dur_all = kernels.dur
        # profkit's recorder writes each op's types and arguments: they outrank kernel names.
        records = (aten_record.records_by_key(groups.instances["name"], aten_key)
                   if by == "aten" else {})
        out = {}
        for name, op in (groups.ops if top is None else groups.ops.head(top)).iterrows():
            idx = members_by_op.get(name, np.empty(0, dtype=np.int64))
            knames = kernels.names_in(idx)
            d = dur_all[idx].sum()
            critical = (1.0 if self.gains == "gpu" else
                        float((crit[idx] * dur_all[idx]).sum() / d) if d > 0 else 0.0)
            # Element type from this op's own kernels (no trace-wide default: None = unknown).
            record = records.get(name)
            dtype, causal = shape_inputs(kernels, idx, knames, record)
            stats = kernel_launch_stats(kernels.durations(idx), self.peaks.launch_floor_ns) if len(idx) else {}
            # A range of a --aten capture: the work of the aten calls nested in it, summed.
            summed = (self._aten_sum(idx, int(op["count"]), float(op["busy_ns"]), dur_all)
                      if by == "range" else None)
            # (no kernel among the members: no counters; a kernel among them: not a copy op)
            has_kernel = bool(kernels.is_kernel[idx].any())
            out[name] = (idx, knames, critical, dtype, causal, stats, summed, has_kernel,
                         bool(in_graph[idx].any()), record)
        return out

    def _op_pricer(self, idx: np.ndarray):
        """``price(op_speedup)`` for advise(): the step model's replay with this op's kernels (the
        window's activities at positions ``idx``) that much faster, on the window's mean
        iteration at the calibrated CPU scale (None: no model, or none of its kernels in the
        modelled stretch)."""
        model = self.step_model()
        # Gains on GPU time (kernel benchmarks) are the GPU-time frame itself: no step to replay.
        if model is None or not len(idx) or self.gains == "gpu":
            return None
        acts = self.trace.activities

        def price(s: float):
            from profkit.run.step.transform import scale_ops
            ops = model.ops_of(acts["start"].to_numpy(np.int64)[idx],
                               acts["correlationId"].to_numpy(np.int64)[idx])
            if not len(ops):
                return None
            base = model.baseline.mean_iteration_ns
            new = model.simulate(scale_ops(model.graph, ops, s)).mean_iteration_ns
            if new <= 0:
                return None
            return max(base / new, 1.0), (f"step model: this op's kernels {s:.2f}x faster: iteration "
                                          f"{base / 1e6:.2f} -> {new / 1e6:.2f} ms")
        return price

    @cached_property
    def aten_groups(self) -> Optional[OpGroups]:
        """The window's ops at the aten level (run.ops.group_ops), computed once for the op
        table's range rows and the rules; None without aten ranges with GPU work."""
        if self.trace.ranges_of_level("aten").empty:
            return None
        try:
            return group_ops(self.trace, by="aten")
        except ProfkitError:
            return None

    @cached_property
    def _aten_calls(self) -> Optional[tuple[np.ndarray, np.ndarray, list, list]]:
        """For range rows of a ``--aten`` capture: per activity of the window, the aten call (its
        innermost aten range) that launched it and that call's op (-1: none); per op (as at
        ``--by aten``: name and input sizes) its name (``aten::mm``) and the shape model's work
        of one call, judged as at ``--by aten`` (None: no model, or a reading above a roof).
        None when the window has no aten ranges with GPU work."""
        groups = self.aten_groups
        if groups is None:
            return None
        acts = self.trace.activities
        kernels = self._kernels
        records = aten_record.records_by_key(groups.instances["name"], aten_key)
        m = groups.members
        keys = list(groups.ops.index)
        code = {k: i for i, k in enumerate(keys)}
        call_of = np.full(len(acts), -1, dtype=np.int64)
        op_of = np.full(len(acts), -1, dtype=np.int64)
        call_of[m["act_idx"].to_numpy(np.int64)] = m["instance"].to_numpy(np.int64)
        op_of[m["act_idx"].to_numpy(np.int64)] = m["op"].map(code).to_numpy(np.int64)
        by_op = {op: m["act_idx"].to_numpy()[ix] for op, ix in m.groupby("op", sort=False).indices.items()}
        works = []
        for key, op in groups.ops.iterrows():
            idx = by_op.get(key, np.empty(0, dtype=np.int64))
            knames = kernels.names_in(idx)
            record = records.get(key)
            dtype, causal = shape_inputs(kernels, idx, knames, record)
            rec = {"name": key, **op.to_dict(),
                   **(kernel_launch_stats(kernels.durations(idx), self.peaks.launch_floor_ns)
                      if len(idx) else {})}
            _, work = judge(rec, [lambda: ev.from_shapes(str(key), dtype, causal=causal, record=record)],
                            self.peaks, knames[:20])
            works.append(work)
        return call_of, op_of, [str(k).split(" ", 1)[0] for k in keys], works

    def _aten_sum(self, idx: np.ndarray, calls: int, busy_ns: float,
                  dur_all: np.ndarray) -> Optional[ev.Work]:
        """A range's work per call from the aten calls that launched its activities ``idx``
        (evidence.from_aten_calls; ``busy_ns``: the range's busy time over its calls), or None."""
        aten = self._aten_calls
        if aten is None or not len(idx):
            return None
        call_of, op_of, names, works = aten
        u = np.unique(idx)
        c, o, d = call_of[u], op_of[u], dur_all[u]
        inside = c >= 0
        if not inside.any():
            return None
        n_ops = len(works)
        time_of = np.bincount(o[inside], weights=d[inside], minlength=n_ops)
        distinct = np.unique(np.stack([o[inside], c[inside]]), axis=1)
        calls_of = np.bincount(distinct[0], minlength=n_ops)
        parts = [(names[k], works[k], int(calls_of[k]), float(time_of[k])) for k in np.nonzero(calls_of)[0]]
        return ev.from_aten_calls(parts, calls, float(d.sum()), busy_ns)

    def _apply_pairs(self, rows: list[dict], works: dict, frame: Frame) -> None:
        """Producer -> consumer pairs that a bundled kernel fuses get one joint suggestion."""
        by_name = {r["name"]: r for r in rows}
        names = self.trace.ranges_of_level("aten")["name"]
        for pair in patterns.fusable_pairs(names, aten_key):
            prod, cons = by_name.get(pair.producer), by_name.get(pair.consumer)
            if prod is None or cons is None or cons["class"] == "compute" \
                    or prod.get("_paired") or cons.get("_paired"):
                continue
            sp, sc = advise_pair(prod, cons, pair.kernel, pair.count, works.get(pair.producer),
                                 works.get(pair.consumer), self.peaks, frame)
            prod.update(suggestion_fields(sp), _paired=True)
            cons.update(suggestion_fields(sc), _paired=True)
        for r in rows:
            r.pop("_paired", None)

    def report(self, by: str = "range", innermost: bool = False, top: Optional[int] = None,
               ops: Optional[pd.DataFrame] = None) -> dict:
        """The stable JSON contract (see README): trace, gpu, total GPU time and one entry per op.

        ``ops``: the result of ``self.ops(by, innermost, top)`` if already computed.
        """
        df = self.ops(by=by, innermost=innermost, top=top) if ops is None else ops
        level = df.attrs.get("level", by)
        return {
            "schema_version": SCHEMA_VERSION,
            "trace": self.path,
            "nsys_version": self.trace.info.nsys_version,
            "level": level,
            "gpu": gpu_json(self.gpu.name, self.peaks),
            "run": self.run_json(df),
            "total_gpu_time_ns": self.trace.total_gpu_time_ns,
            "gpu_busy_ns": self.trace.gpu_busy_ns,
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "ops": [op_json(name, row, level) for name, row in df.iterrows()],
        }

    def run_json(self, ops: Optional[pd.DataFrame] = None) -> dict:
        """The `run` object: window, wall time, breakdown, verdict and the top three actions.

        With ``ops``, op-level suggestions that pay join the program-level actions, all ranked
        by expected gain on wall time.
        """
        out = self.run().as_dict()
        model = self.step_model()
        if model is not None:
            out.update(model.as_dict())
        findings = self.findings()
        results = self.trials()
        actions = ranked_actions(findings, ops, tried_of(findings, results), variants_measured(findings, results))
        # Every rule that fired, paying or not: "fused=True, but it will not shorten this step"
        # is advice too (profkit rules --explain CODE gives the reasoning).
        out["findings"] = [{"code": f.code, "rule": f.rule, "action": f.action,
                            "expected_end_to_end_speedup": round(float(f.expected_end_to_end_speedup), 3),
                            "bound": round(float(f.bound), 3)} for f in findings]
        out["actions"] = actions[:3]
        ranges = self.calibration_ranges()
        for a in out["actions"]:
            if a.get("code") in ranges:
                lo, hi, n = ranges[a["code"]]
                a["range"] = {"lo": round(lo, 3), "hi": round(hi, 3), "runs": n,
                              "estimate": model.calibration.source == "estimated"}
        if results:
            out["trials"] = trials_json(findings, results, out["actions"])
        unstepped = self.replacements().recorded("unstepped")
        if unstepped:
            out["unstepped"] = unstepped
        anomaly = [a for a in self.replacements().recorded("anomaly") if isinstance(a.get("ops"), int)]
        if anomaly:
            out["anomaly"] = anomaly[0]
        grad_ops = self.replacements().autograd_at_inference(self.backward_kernels)
        if grad_ops:
            out["autograd_at_inference"] = {"ops": grad_ops}
        rec = self.replacements().record
        # a record made before it looked for host-tensor ops has no such key
        unexplained = _unexplained_host(out, isinstance(rec, dict) and "host_ops" in rec)
        if unexplained:
            out["unexplained"] = unexplained
        out["combinations"] = self.combined_actions()
        if model is not None:
            _verdict_without_profiler(out["verdict"], model)
        # One source of truth: the verdict's action is the first of the ranked actions.
        out["verdict"]["action"] = actions[0]["action"] if actions else None
        out["verdict"]["expected_end_to_end_speedup"] = (actions[0]["expected_end_to_end_speedup"]
                                                         if actions else 1.0)
        return out


# The GPU's share of the unprofiled step's critical path from which the GPU sets its pace
GPU_PACED_PATH = 0.9


def _verdict_without_profiler(verdict: dict, model) -> None:
    """A verdict drawn from the profiled timeline (the GPU waiting for a CPU that tracing slowed)
    that the calibrated step model contradicts: without the profiler the GPU's work is the
    critical path. Said beside it (``without_profiler``), the class kept: it describes the trace."""
    if verdict.get("class") not in ("host-bound", "data-bound", "sync-bound") or \
            model.calibration.source != "measured":
        return
    parts = model.critical.per_iteration()
    total = sum(p["ns_per_iteration"] for p in parts)
    gpu = sum(p["ns_per_iteration"] for p in parts if str(p["kind"]).startswith("gpu:"))
    if total <= 0 or gpu / total < GPU_PACED_PATH:
        return
    verdict["without_profiler"] = "gpu-bound"
    verdict["reason"] += (f"; without the profiler the GPU sets the pace ({gpu / total:.0%} of the "
                          f"unprofiled step's critical path is GPU work): under it the host ran "
                          f"{model.calibration.host_inflation:.0%} slower and the GPU waited for it")


class SharedKernels(dict):
    """Each op's kernel names, kept in the op table's ``attrs``. pandas deep-copies ``attrs`` into
    every frame and column derived from the table (a column read, each row of ``iterrows``): a
    table of a few hundred ops spent more time copying these sets than being read. Never written
    to after the table is made, so derived frames share them."""

    def __deepcopy__(self, memo) -> "SharedKernels":
        return self


class _Later:
    """``fn(*args, **kwargs)`` on a thread (_in_thread) once ``start()`` is called, or when its
    result is first asked for."""

    def __init__(self, fn, *args, **kwargs) -> None:
        self._call, self._future = (fn, args, kwargs), None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:  # (two threads may ask: one thread starts)
            if self._future is None:
                fn, args, kwargs = self._call
                self._future = _in_thread(fn, *args, **kwargs)

    def result(self):
        self.start()
        return self._future.result()

    def exception(self) -> Optional[BaseException]:
        self.start()
        return self._future.exception()


def _ahead(*reads: Callable[[], object]) -> None:
    """Make what the cached ``reads`` read before it is asked for; an error is left to be raised
    where it is asked for (the read is made again there)."""
    for read in reads:
        try:
            read()
        except Exception:
            pass


def _in_thread(fn, *args, **kwargs) -> Future:
    """``fn(*args, **kwargs)`` started on a daemon thread (a command that fails before it needs
    the result does not wait for it); its result, or its error, from the Future."""
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to whoever takes the result
            future.set_exception(exc)

    threading.Thread(target=work, name="profkit-ahead", daemon=True).start()
    return future


def load(path: str | Path, peaks: Optional[str | Path] = None, window: str = "auto",
         attribution: str = "process", gains: str = "wall",
         shapes_from: Optional[str | Path] = None) -> Profile:
    """Open an Nsight Systems SQLite export for analysis (read-only; no torch or GPU needed).

    ``window="auto"`` judges the steady state (the iterations after the first); ``"all"`` the
    whole capture. See Profile for ``attribution`` and ``shapes_from``.
    """
    return Profile(path, peaks_file=peaks, window=window, attribution=attribution, gains=gains,
                   shapes_from=shapes_from)


# The host's own time between CUDA calls, as a share of the modelled iteration's path, at and
# above which a run with no priced action says what it cannot explain
UNEXPLAINED_HOST_SHARE = 0.5


def _unexplained_host(run: dict, looked: bool) -> Optional[dict]:
    """Where no action pays and the CPU time between CUDA calls is most of the iteration's path:
    its share and the ranges it runs in, and whether the capture's op record looked for
    host-tensor work (PK109) and found none. None otherwise."""
    # without a loop the host's time is the script's set-up, as the verdict says
    if not run.get("iterations") or any(a.get("expected_end_to_end_speedup", 1.0) >= 1.02
                                        for a in run.get("actions") or []):
        return None
    parts = run.get("critical_path") or []
    total = sum(p["ns_per_iteration"] for p in parts)
    cpu = [p for p in parts if p["kind"] == "cpu:python"]
    host = sum(p["ns_per_iteration"] for p in cpu)
    if total <= 0 or host < UNEXPLAINED_HOST_SHARE * total:
        return None
    return {"share": round(host / total, 3), "ns_per_iteration": int(host),
            "where": list(dict.fromkeys(p["where"] for p in cpu))[:3], "host_ops_looked_for": looked}

"""Pricing each (program, fix) pair: the trace that stands for the program, the price of the fix
by the rule that proposes it (``roles.FIX_RULES``) through the step model, and the rows the page
is made of.

Each pair is priced for the machine and day the fix was timed on: in each run folder the model
is calibrated to the baseline timed there (``Profile.findings_at``), as ``profkit capture``
calibrates it to its own run without the profiler, and, where the folder holds it, to the host's
time to issue one iteration timed in the same process (``issue_ns``: the CPU's speed where the
GPU set the baseline's pace). The price at the capture's own calibration is kept beside it.

Imports profkit (when a page is made, not at import): the harness's other commands run without it.
"""
from __future__ import annotations

import statistics

from . import registry, tried
from .roles import FIX_RULES, role
from .store import ROOT, measured_speedups, shared_folders, timed_baseline

# Which trace stands for each program: a calibrated `profkit capture` of it; for a program of
# several ranks, rank 0's of its per-rank traces (ranks.py): profkit prices a fix per rank
TRACES = {prog["name"]: (f"traces/corpus/{prog['name']}.sqlite.xz" if registry.ranks(prog) == 1
                         else f"traces/corpus/{prog['name']}/rank0.sqlite.xz") for prog in registry.PROGRAMS}


def predicted(prof, code: str | None, key: str | None, at: tuple | None = None) -> tuple[float, str]:
    """profkit's predicted gain for a fix: the finding of the rule that proposes it (1.0 when the
    rule does not fire or no rule proposes it). ``at``: (findings, CPU scale) of
    ``Profile.findings_at`` to price it there instead of at the capture's calibration."""
    if code is None:
        return 1.0, "no rule proposes it"
    findings, host = at if at is not None else (prof.findings(), None)
    if "+" in code:  # a fix that does what several rules propose: their edits replayed at once
        g = prof.price_together(code.split("+"), host, findings, key)
        return (g, code) if g is not None else (1.0, f"{code}: not every rule fires, or the edits "
                                                      "do not compose")
    for f in findings:
        if f.code == code:
            g = float(f.evidence.get(key, f.expected_end_to_end_speedup)) if key else f.expected_end_to_end_speedup
            # A refusal is of CUDA graphs: the pieces between the blocking calls are what can be
            # captured, and torch.compile's default mode (the fusion alone) needs no graph at all
            if f.evidence.get("refused") and key and key not in ("pieces_speedup", "compile_pieces_speedup",
                                                                   "fusion_speedup"):
                return 1.0, "refused as the program stands"
            # A rule's own price never goes below 1 (no gain); an alternative it prices in the
            # evidence may (bf16 where autocast's casts make the step slower)
            return (g if key else max(g, 1.0)), f.rule
    return 1.0, f"{code} does not fire"


def page_rows(measured: dict, load=None, only: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Per pair and per program, what the page says; ``load``: how a trace is loaded (default
    profkit.load; the tests hand in their shared, already judged Profiles); ``only``: these
    programs alone."""
    import profkit
    load = load or profkit.load
    meas = measured_speedups(measured)
    apart = measured_speedups(measured, interleaved=False)
    pairs, progs = [], []
    for prog in registry.PROGRAMS:
        name = prog["name"]
        if only is not None and name not in only:
            continue
        trace = TRACES.get(name)
        if trace is None or not (ROOT / trace).exists():
            continue
        # A program with a --aten capture beside its plain one: its GEMM shapes, the plain one's
        # timing (profkit classify --shapes-from)
        p = (profkit.load(ROOT / trace, shapes_from=ROOT / prog["shapes_from"]) if prog.get("shapes_from")
             else load(ROOT / trace))
        m = p.step_model()
        cal = m.calibration
        run = p.run_json(p.ops(by="range"))
        top = run["actions"][0] if run["actions"] else None
        best = None
        mine: list[dict] = []
        at_timed: dict[int, tuple] = {}

        def price_at(code: str | None, key: str | None, base_ns: float,
                     issue_ns: float | None = None) -> tuple[float, str]:
            # the model calibrated to a timed baseline (findings_at once per baseline and rule:
            # the rules are independent, so the fix's own rules give the same findings)
            codes = frozenset(code.split("+")) if code else frozenset()
            at = (round(base_ns), issue_ns, codes)
            if at not in at_timed:
                at_timed[at] = p.findings_at(base_ns, issue_ns, codes)
            return predicted(p, code, key, at_timed[at])

        # the GPU each run folder ran on, where the data names it (merge --gpu)
        trace_gpu = p.full_trace.primary_gpu().name
        timed_on = (measured.get("folder_gpu") or {}).get(name, {})

        def other_gpu(folder: str) -> bool:
            return folder in timed_on and timed_on[folder] != trace_gpu

        def by_folder(code: str | None, key: str | None, fix: str,
                      interleaved: bool | None) -> tuple[float, float, str] | None:
            # Each run folder priced at its own baseline (and the host's issue time beside it,
            # where timed), as a capture is at its own calibration run: (median price, median of
            # the folders' errors, why); None where no folder timed the baseline and the fix.
            base, mine = measured["runs"][name]["baseline"], measured["runs"][name][fix]
            folders = shared_folders(base, mine, interleaved)
            if not folders:
                return None
            prices, errors, why = [], [], ""
            for f in folders:
                gain = mine[f].get("gain", base[f]["median_ns"] / mine[f]["median_ns"])
                if other_gpu(f):
                    # timed on another GPU than the capture's: its baseline's time is that GPU's
                    # speed, which a calibration to it would take for the host's: the capture's price
                    price, why = predicted(p, code, key)
                else:
                    price, why = price_at(code, key, base[f]["median_ns"], base[f].get("issue_ns"))
                prices.append(price)
                errors.append(gain / price - 1.0)
            return float(statistics.median(prices)), float(statistics.median(errors)), why

        if name not in measured["runs"]:
            continue  # captured, its fixes not timed yet
        for fix in prog["fixes"]:
            if (name, fix) not in meas:
                continue
            ms, runs, ratios = meas[(name, fix)]
            code, key = FIX_RULES.get((name, fix), (None, None))
            ps_cap, _ = predicted(p, code, key)
            # Priced for the machine and day the fix was timed on: the model calibrated to the
            # baseline timed beside it, as to a capture's own calibration run.
            base = timed_baseline(measured, name, fix)
            folders = by_folder(code, key, fix, None)
            if folders:
                ps, error, why = folders
            else:  # never in one folder: the medians of different runs, priced at the baseline's
                ps, why = price_at(code, key, base)
                error = ms / ps - 1.0
            ab = bool(shared_folders(measured["runs"][name]["baseline"], measured["runs"][name][fix], True))
            apart_row = None
            if ab and (name, fix) in apart:
                # the separate runs' gain, against the price at their own baselines
                sep = by_folder(code, key, fix, False)
                if sep:
                    apart_row = (*apart[(name, fix)], sep[0], sep[1])
            row = {"program": name, "fix": fix, "rule": code or "-", "why": why, "predicted": ps,
                   "predicted_capture": ps_cap, "measured": ms, "runs": runs,
                   "spread": (min(ratios), max(ratios)), "base_ns": base, "pred_ns": base / ps,
                   "meas_ns": base / ms, "error": error, "error_capture": ms / ps_cap - 1.0,
                   "role": role(name, fix),
                   "interleaved": ab, "apart": apart_row}
            pairs.append(row)
            mine.append(row)
            if best is None or ms > best["measured"]:
                best = row
        tried.attach(mine, [t.as_dict() for t in p.trials()])
        # profkit's own trials are measurements of the program too (unprofiled, beside the
        # baseline): a switch no fix timed by hand may be the best fix there is
        for t in p.trials():
            if t.measured and (best is None or float(t.speedup) > best["measured"]):
                best = {"program": name, "fix": f"{t.switch} (tried)", "rule": "-",
                        "measured": float(t.speedup), "trial": True}
        progs.append({"program": name, "trace": trace, "calibration": cal.source,
                      "profiled_ns": cal.profiled_iteration_ns, "unprofiled_ns": cal.unprofiled_iteration_ns,
                      "predicted_ns": cal.predicted_iteration_ns, "top": top, "best": best,
                      "top_ok": top_is_right(top, best, mine)})
    return pairs, progs


def top_is_right(top: dict | None, best: dict | None, rows: list[dict]) -> tuple[bool, str]:
    """Whether profkit's top action is the measured best fix or within 5% of it (the fix of the
    same rule, timed by hand or by profkit's trial of it, measured at least 95% of the best), or, where no fix measured 1.05x, whether it
    promised under 1.10x; and the measured gain of the top action's fix."""
    if best is None:
        return False, "-"
    if best["measured"] < 1.05:
        ok = top is None or top["expected_end_to_end_speedup"] < 1.10
        return ok, "nothing pays"
    if top is None:
        return False, "no action"
    same = [r["measured"] for r in rows if r["rule"] != "-" and top["rule"] in map(rule_name, r["rule"].split("+"))]
    # what profkit's own trials measured of the fixes the action offers
    same += [float(t["speedup"]) for t in [top.get("tried") or {}, *top.get("tried_variants", ())]
             if t.get("applied") and not t.get("error") and t.get("speedup") is not None]
    if not same:
        return False, "not measured"
    got = max(same)
    return got >= 0.95 * best["measured"], f"{got:.2f}x"


def rule_name(code: str) -> str:
    from profkit.judge import rules
    return rules.get(code).RULE.name


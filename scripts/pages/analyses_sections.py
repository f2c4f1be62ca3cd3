"""The sections of a case-study page (analyses/<case>.md): the baseline's verdict, the diff's
predicted-vs-measured table, the evidence ladder, the survey of top opportunities and its swap
check, the timeline facts, a same-run pair, and the roofline images. make_analyses.py puts them
together in render_case; each returns its Markdown lines (and, where predictions are compared,
the disagreements over DISAGREEMENT_PCT and a headline for the index).
"""
from __future__ import annotations

import re
import sys
from functools import partial
from pathlib import Path
from typing import Optional

import numpy as np

import profkit
from profkit.compare.diff import DiffResult, diff, to_markdown
from profkit.judge import estimate, patterns
from profkit.read.compressed import trace_stem
from profkit.run.attribution import aten_key
from profkit.run.ops import group_ops
from profkit.show import render

from analyses_cases import Case, CaseError

ROOT = Path(__file__).resolve().parents[2]

# The case studies measure kernels in benchmark scripts: the whole capture, per-thread
# projection, and gains on GPU time (the scripts synchronise around each timed call).
load_case = partial(profkit.load, window="all", attribution="thread", gains="gpu")

DISAGREEMENT_PCT = 20.0   # predicted vs measured further apart than this needs a "why"


def fmt_x(v: Optional[float], nd: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}x"


def fmt_pct(v: Optional[float]) -> str:
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


def baseline_section(case: Case, prof) -> list[str]:
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


def prediction_table(res: DiffResult, ops: tuple[str, ...]) -> list[str]:
    lines = ["## Predicted vs measured", "",
             "| op | predicted op x | measured op x | off by | predicted e2e | measured e2e | off by |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for op in res.ops:
        if ops and op["name"] not in ops:
            continue
        label = op["name"] if op["after_name"] == op["name"] else f"{op['name']} → {op['after_name']}"
        lines.append(f"| {render.short_name(label, 60)} | {fmt_x(op['predicted_op_speedup'])} | "
                     f"{fmt_x(op['measured_op_speedup'])} | {fmt_pct(op['op_disagreement_pct'])} | "
                     f"{fmt_x(op['predicted_end_to_end_speedup'], 3)} | "
                     f"{fmt_x(op['measured_end_to_end_speedup'], 3)} | "
                     f"{fmt_pct(op['end_to_end_disagreement_pct'])} |")
    t = res.total
    p, m = t["predicted_end_to_end_speedup"], t["measured_end_to_end_speedup"]
    off = None if not p or m is None else (m / p - 1) * 100
    lines.append(f"| total (matched ops) | | | | {fmt_x(p, 3)} | {fmt_x(m, 3)} | {fmt_pct(off)} |")
    lines += ["",
              "Predicted = BEFORE's `expected_op_speedup` / `expected_gpu_time_speedup` (profkit "
              "classify on BEFORE). Measured op = BEFORE median / AFTER median GPU time per call. "
              "Measured end to end = BEFORE's total GPU time (sum of kernel, memcpy and memset "
              "durations) with the op's kernel time replaced by AFTER's (per op: calls x busy median; "
              "total: the matched ops' kernel time, scaled to BEFORE's call count) — the frame the "
              "prediction is made in. \"Off by\" = measured / predicted - 1.", ""]
    return lines


def roofline_section(case: Case, sides: list[tuple[str, object, list[str]]], img_dir: Path,
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


def trace_label(path: str) -> str:
    return trace_stem(path)


def disagree_text(off: list[tuple[str, str, float]]) -> str:
    return "; ".join(f"{render.short_name(o, 100)} {w} {d:+.1f}%" for o, w, d in off)


def _off(m: Optional[float], p: Optional[float]) -> Optional[float]:
    return None if m is None or not p else (m / p - 1) * 100


def ladder_section(case: Case, before, afters: list[tuple[str, object]], peaks) -> tuple[list[str], list, str]:
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
                    f"| {trace_label(bpath)} | {render.evidence_text(row)} | {row['basis']} | {trace_label(apath)} | {fmt_x(op['predicted_op_speedup'])} | "
                    f"{fmt_x(op['measured_op_speedup'])} | {fmt_pct(op['op_disagreement_pct'])} | "
                    f"{fmt_x(op['predicted_end_to_end_speedup'], 3)} | "
                    f"{fmt_x(op['measured_end_to_end_speedup'], 3)} | "
                    f"{fmt_pct(op['end_to_end_disagreement_pct'])} |")
                if bpath != case.before:
                    heads[bpath] = (f"predicted from {trace_label(bpath)} ({row['source']} only): "
                                    f"{fmt_x(op['predicted_op_speedup'])}")
                    off += [(f"{op['name']} (timeline-only BEFORE {trace_label(bpath)} → {trace_label(apath)})", w, d)
                            for o, w, d in disagreements(res, case.ops) if o == op["name"]]
    lines += ["", "Each row is `profkit diff BEFORE AFTER` for that pair: the prediction is BEFORE's, "
              "the measurement AFTER's median against BEFORE's. The BEFORE traces ran the same "
              "eager code; the first row's carries ncu counters (measured DRAM bytes), the others "
              "only the timeline.", ""]
    return lines, off, "; ".join(heads.values())


def survey_section(case: Case, peaks) -> tuple[list[str], Optional[dict], str]:
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
                     f"{fmt_x(row['expected_op_speedup'])} | "
                     f"{fmt_x(row['expected_gpu_time_speedup'], 3)} | "
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
                  f"would rank at {fmt_x(float(best['expected_gpu_time_speedup']), 3)} end to end.", ""]
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
    head = "profkit's top {} in {}: {}".format(case.survey_top, trace_label(case.survey), ", ".join(
        f"{str(n).split(' [')[0]} {fmt_x(float(r['expected_gpu_time_speedup']), 3)}"
        for n, r in top.iterrows()))
    return lines, swap_row, head


def swap_check_section(case: Case, swap: dict, before,
                       afters: list[tuple[str, object]]) -> tuple[list[str], list, str]:
    """The survey's prediction for the swapped op vs the GPU time the swap saved per call of
    ``case.ops[0]`` (kernel time, the frame of the prediction)."""
    op = case.ops[0]
    e2e = float(swap["expected_gpu_time_speedup"])
    saved_pred = swap["_total"] * (1 - 1 / e2e) / swap["_calls"]
    b = before.ops(by=case.by).loc[op]
    busy_b, span_b = float(b["busy_median_ns"]), float(b["gpu_time_median_ns"])
    pred_x = busy_b / (busy_b - saved_pred)
    lines = ["## The survey's prediction vs the measured swap", "",
             f"The survey predicts {fmt_x(float(swap['expected_op_speedup']))} on "
             f"{render.short_name(str(swap['name']), 60)} and {fmt_x(e2e, 3)} end to end: "
             f"{render.fmt_time(swap['_total'] * (1 - 1 / e2e))} of kernel time saved over "
             f"{swap['_calls']} `{op}` calls, {render.fmt_time(saved_pred)} per `{op}`. Applied to "
             f"`{trace_label(case.before)}`'s `{op}` (busy {render.fmt_time(busy_b)} per call, median) that "
             f"is {fmt_x(pred_x, 3)} on its kernel time.", ""]
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
        lines.append(f"| {trace_label(apath)} | {render.fmt_time(saved_pred)} | {render.fmt_time(saved)} | "
                     f"{fmt_pct(d1)} | {fmt_x(pred_x, 3)} | {fmt_x(mx, 3)} | {fmt_pct(d2)} | "
                     f"{fmt_x(span_b / float(a['gpu_time_median_ns']), 3)} |")
        heads.append(f"{render.fmt_time(saved)} {trace_label(apath)}")
        if d1 is not None and abs(d1) > DISAGREEMENT_PCT:
            off.append((f"{str(swap['name']).split(' [')[0]} pair → {trace_label(apath)}",
                        f"kernel time saved per {op}", d1))
        if d2 is not None and abs(d2) > DISAGREEMENT_PCT:
            off.append((f"{str(swap['name']).split(' [')[0]} pair → {trace_label(apath)}",
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


def facts_section(case: Case, sides: list[tuple[str, object]]) -> list[str]:
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


def pair_section(case: Case, bpath: str, apath: str, peaks) -> tuple[list[str], list, str]:
    """One more (BEFORE, AFTER) pair captured in the same run: its diff, prediction table and
    timeline facts, against its own BEFORE."""
    pb, pa = load_case(ROOT / bpath, peaks=peaks), load_case(ROOT / apath, peaks=peaks)
    res = diff(pb, pa, by=case.by, rename=case.renames)
    res.run = {}
    cmd = (f"profkit diff {bpath} {apath} --by {case.by} --window all --attribution thread"
           + (f" --peaks {case.peaks}" if case.peaks else "") + " --format markdown")
    suffix = f": {trace_label(bpath)} → {trace_label(apath)} (same run)"
    lines = [f"## Before → after{suffix}", "", f"`{cmd}`", "", to_markdown(res).rstrip(), ""]
    table = prediction_table(res, case.ops)
    table[0] += suffix
    lines += table
    off = [(f"{o} ({trace_label(bpath)} vs {trace_label(apath)})", w, d) for o, w, d in disagreements(res, case.ops)]
    head = ""
    for op in res.ops[:1] if not case.ops else [o for o in res.ops if o["name"] == case.ops[0]]:
        head = (f"{trace_label(apath)} vs {trace_label(bpath)}: {op['name']} "
                f"{render.fmt_time(op['before']['gpu_time_median_ns'])} → "
                f"{render.fmt_time(op['after']['gpu_time_median_ns'])} per call "
                f"({fmt_pct(op['median_change_pct'])}, {op['verdict']})")
    if case.facts:
        facts = facts_section(case, [(trace_label(bpath), pb), (trace_label(apath), pa)])
        facts[0] += suffix
        lines += facts
    return lines, off, head

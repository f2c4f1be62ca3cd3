"""Turn analysis results into text: a rich table, JSON, CSV or Markdown. No analysis here."""
from __future__ import annotations

import io
import textwrap
import json
import re
from typing import Callable

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit.read.text import visible
from profkit.run.step.calibrate import scales_text
from profkit.run.trials import trial_text

CLASS_STYLE = {"compute": "bold magenta", "memory": "bold cyan", "launch": "bold yellow",
               "latency": "bold blue", "unknown": "dim",
               "communication": "bold green"}
# gpu_time_ns is the op's projected span (nsys's "Total Proj Time"); gpu_busy_ns the union of its
# activities, which the table shows as "GPU time" (added last, so existing columns keep their place).
CSV_COLUMNS = ["name", "level", "count", "gpu_time_ns", "gpu_time_median_ns", "share", "cpu_time_ns",
               "class", "confidence", "source", "reason", "rung", "action", "expected_op_speedup",
               "expected_end_to_end_speedup", "expected_gpu_time_speedup", "gpu_busy_ns",
               "gpu_busy_median_ns"]


def short_name(name: str, width: int = 60) -> str:
    """A readable label for a C++ kernel name: namespaces, lambdas and argument lists dropped."""
    s = re.sub(r"^void ", "", name)
    s = re.sub(r"\[lambda\([^)]*\) \(instance \d+\)\]", "lambda", s)
    s = re.sub(r"\((int|bool|unsigned long|long)\)", "", s)
    s = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*::", "", s)
    s = re.sub(r"<unnamed>::?", "", s)
    if s.endswith(")") and "(" in s:  # drop the trailing parameter list
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    s = re.sub(r"\s+", " ", s).strip()
    return s if len(s) <= width else s[: width - 1] + "…"


def fmt_time(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def fmt_rate(x: float, unit: str) -> str:
    for div, pre in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if x >= div:
            return f"{x / div:.2f} {pre}{unit}"
    return f"{x:.0f} {unit}"


def evidence_text(row: pd.Series) -> str:
    """The key numbers behind a verdict, in one short line."""
    ev = row["evidence"]
    parts = []
    if row["class"] == "launch":
        parts.append(f"busy {ev.get('gpu_busy_fraction', 0):.0%}")
        parts.append(f"{ev.get('kernels_per_call', 0):.0f} kern/call")
        parts.append(f"med kern {fmt_time(ev.get('median_kernel_ns', 0))}")
    else:
        if ev.get("achieved_bytes_per_s") and row["class"] == "memory":
            pct = ev.get("pct_of_memory_roof")
            parts.append(fmt_rate(ev["achieved_bytes_per_s"], "B/s")
                         + (f" ({pct:.0%} of HBM)" if pct is not None else " (host link)"))
        if ev.get("achieved_flops_per_s") and row["class"] == "compute":
            parts.append(f"{fmt_rate(ev['achieved_flops_per_s'], 'FLOP/s')} "
                         f"({ev['pct_of_compute_roof']:.0%} of {ev.get('compute_roof')})")
        if ev.get("arithmetic_intensity") is not None:
            parts.append(f"AI {ev['arithmetic_intensity']:.3g}")
        if not parts:
            parts.append(row["reason"])
    source = row["source"]
    if source == "shapes" and ev.get("aten_modelled_calls_per_call"):  # a range: its aten calls summed
        source += f": {ev['aten_modelled_calls_per_call']:.3g} aten calls summed"
    return "; ".join(parts) + f" [{source}]"


_IDLE_LABELS = [("idle_host", "waiting for the CPU"), ("idle_sync", "after a sync"),
                ("idle_memcpy_wait", "in CPU copies"), ("idle_other", "GPU-side gaps")]


_ACTION_LINE = re.compile(r"^(actions| {7}) +\d\. ")


def run_lines(run: dict) -> list[str]:
    """The run summary as a few plain lines: window, what was left out, where the wall time
    goes, the verdict and the top actions (JSON ``run`` object in, text out)."""
    w, b = run["window"], run["breakdown"]
    wall = max(run["wall_time_ns"], 1)
    pct = lambda k: f"{b.get(k, 0) / wall:.0%}"
    it = (f"{run['iterations']} iterations, {fmt_time(run['iteration_time_median_ns'])} each (median), "
          if run["iterations"] else "")
    lines = [f"window   {w['source']}: {it}{fmt_time(wall)} wall"]
    for ex in w["excluded"]:
        lines.append(f"left out {fmt_time(ex['ns'])} {ex['what']}")
    busy = min(max(run["gpu_busy_ns"] / wall, 0.0), 1.0)  # a share, whatever the input says
    classes = ", ".join(f"{k} {pct(k)}" for k in ("compute", "memory", "launch", "communication")
                        if b.get(k, 0) > 0)
    idle = ", ".join(f"{label} {pct(k)}" for k, label in _IDLE_LABELS if b.get(k, 0) > 0)
    lines.append(f"wall     GPU busy {busy:.0%} ({classes or 'none'}); GPU idle "
                 f"{1 - busy:.0%} ({idle or 'none'})")
    where = [(k, v) for k, v in run.get("idle_host_by_range", {}).items() if v / wall >= 0.05]
    if where:
        lines.append("         waiting for the CPU in: " + ", ".join(
            f"{k} {v / wall:.0%}" for k, v in where[:3]))
    lines += model_lines(run)
    v = run["verdict"]
    lines.append(f"verdict  {v['class']}: {v['reason']}")
    u = run.get("unexplained")
    if u:
        record = ("the capture's op record found no ops on host tensors (PK109) either" if u["host_ops_looked_for"]
                  else "a capture by this version of profkit capture records the ops that compute on host "
                       "tensors, which PK109 prices")
        lines.append(f"actions  none priced: the host's own work between CUDA calls is {u['share']:.0%} of the "
                     f"iteration ({fmt_time(u['ns_per_iteration'])}, in {', '.join(u['where'])}) and no rule "
                     f"sees what it does; {record}; profile the CPU side (py-spy, nsys --sample=cpu) to see it")
    for i, a in enumerate(run["actions"], 1):
        t = a.get("tried")
        tried = ("" if not t else
                 # a trial of another of its fixes: what it ran, and that fix's price
                 f"tried: {(t.get('note') if t.get('applied') else None) or t['switch']} {trial_text(t)}, "
                 f"priced {t['model']:.2f}x; "
                 if t.get("model") is not None else f"tried: {trial_text(t)}; ")
        # the other fixes the action offers, as their trials measured them (what it is ranked by)
        tried += "".join(f"{v['switch']} tried: {trial_text(v)}; " for v in a.get("tried_variants") or [])
        if a.get("range"):
            tried = range_text(a["range"]) + "; " + tried
        lines.append(f"{'actions' if i == 1 else '':8} {i}. {a['action']} "
                     f"[{a['expected_end_to_end_speedup']:.2f}x end to end; {tried}{a['basis']}]")
    combos = [c for c in run.get("combinations") or [] if not c.get("overlap")]
    best_alone = max((a["expected_end_to_end_speedup"] for a in run["actions"]), default=1.0)
    if combos and combos[0]["expected_end_to_end_speedup"] >= 1.02 * best_alone:
        c = combos[0]
        lines.append(f"together {' + '.join(c['codes'])}: {c['expected_end_to_end_speedup']:.2f}x end to end "
                     f"(alone {', '.join(f'{g:.2f}x' for g in c['alone'])}; the step model replays the "
                     "fixes' edits at once)")
        wt = c.get("with_trials")
        if wt:
            lines.append(f"{'':8} with the trials: {wt['expected_end_to_end_speedup']:.2f}x ("
                         + ", ".join(f"{code}'s edit scaled to its measured {m:.2f}x"
                                     for code, (m, _) in wt["scaled"].items()) + ")")
    others = [t for t in run.get("trials") or [] if not t.get("action")]
    for i, t in enumerate(others):
        model = (f"; the model's price {t['model']:.2f}x ({t['code']})" if t.get("model") is not None
                 else "; not priced by the model")
        lines.append(f"{'tried' if i == 0 else '':8} {t['switch']}: {trial_text(t)}{model}")
    noticed = 0
    anomaly = run.get("anomaly")
    if anomaly:
        checks = ("and reads each backward node's gradients back to the host to look for NaNs (a wait for "
                  "the GPU each)" if anomaly.get("check_nan") else "(its NaN checks off)")
        lines.append(f"{'noticed':8} autograd anomaly detection is on ({anomaly['ops']} ops of the recorded "
                     f"iteration ran under it): a debugging mode that keeps a Python stack per autograd node "
                     f"{checks}; take out torch.autograd.detect_anomaly / set_detect_anomaly(True) (not "
                     "priced by the model; profkit capture --try no_anomaly measures it)")
        noticed += 1
    grad = run.get("autograd_at_inference")
    if grad:
        lines.append(f"{'noticed' if noticed == 0 else '':8} autograd records this inference step: {grad['ops']} ops of "
                     "the recorded iteration took inputs that require gradients, and no backward ran; run it "
                     "under torch.inference_mode() (or torch.no_grad()): no autograd graph nor saved tensors, "
                     "and nn.TransformerEncoderLayer can take its fast path (not priced by the model; profkit "
                     "capture --try inference_mode measures it)")
        noticed += 1
    # where PK206 priced their backward, its action says it
    priced = any(f.get("code") == "PK206" for f in run.get("findings") or [])
    for i, u in enumerate([] if priced else run.get("unstepped") or [], start=noticed):
        lines.append(f"{'noticed' if i == 0 else '':8} {u['elements'] / 1e6:.1f}M parameters of {u['module']} "
                     f"({u['tensors']} tensors) get gradients that no optimizer steps: if they are meant "
                     "to be frozen, requires_grad_(False) (or torch.no_grad() around their forward) removes "
                     "their backward (not priced by the model; profkit capture --try freeze_unstepped "
                     "measures it)")
    fired = run.get("findings") or []
    if fired:
        lines.append("rules    " + ", ".join(f"{f['code']} {f['rule']} {f['expected_end_to_end_speedup']:.2f}x"
                                             for f in fired) + " (profkit rules --explain CODE)")
    return lines


def wrapped_run_lines(run: dict, width: int) -> list[str]:
    """:func:`run_lines` wrapped to ``width`` columns (at least 40), each line's continuation
    under its text, not under its label ("verdict  "), as the terminal prints them."""
    out = []
    for line in run_lines(run):
        indent = " " * (12 if _ACTION_LINE.match(line) else 9)
        out.append(textwrap.fill(line, width=max(width, 40), subsequent_indent=indent,
                                 break_long_words=False, break_on_hyphens=False))
    return out


PATH_LABELS = {"gpu:compute": "GPU compute", "gpu:memory": "GPU memory", "gpu:launch": "GPU tiny kernels",
               "nccl": "NCCL", "gpu:gap": "GPU-side gaps", "cpu:launch": "launch calls",
               "cpu:python": "CPU between calls", "cpu:data": "data loading", "cpu:sync": "syncs and the refill after them",
               "cpu:alloc": "allocation/free", "cpu:pageable_copy": "pageable copies",
               "cpu:copy": "copies", "cpu:other": "other CUDA calls"}


def range_text(r: dict) -> str:
    """An action's prices over the speeds of a program whose own speed varied between its runs
    without the profiler (Profile.calibration_ranges)."""
    runs = "the run" if r["runs"] == 1 else f"the {r['runs']} runs"
    where = (f"the estimate and the speed of {runs} without the profiler" if r.get("estimate")
             else f"the speeds of {runs} without the profiler")
    return f"{r['lo']:.2f}-{r['hi']:.2f}x at {where}"


def model_lines(run: dict) -> list[str]:
    """The step model's lines: the iteration with and without the profiler, and its critical
    path by kind (largest first, with where each happens)."""
    cal = run.get("calibration")
    if not cal or run.get("iterations", 0) < 2:  # a whole capture is no step to model
        return []
    rep = run["replay"]
    how = ("measured without a profiler" if cal["source"] == "measured" else
           "estimated: the calibration run not used, see the warning" if cal.get("warning") else
           "estimated: no calibration run")
    lines = [f"model    iteration {fmt_time(cal['profiled_iteration_ns'])} under the profiler, "
             f"{fmt_time(cal['predicted_iteration_ns'])} without ({how}"
             + (f" {fmt_time(cal['unprofiled_iteration_ns'])}" if cal["source"] == "measured" else "")
             + f"; {cal['host_time_added_by_profiler']:+.0%} host time from tracing"
             + (", estimated: the GPU sets the pace" if cal["source"] == "measured"
                and cal.get("host_scale_from") == "estimate" else
                ": the run without it took as long, within a run's noise" if cal.get("host_scale_from") == "noise"
                else ": the profiled run lies within the spread of the runs without it"
                if cal.get("host_scale_from") == "spread" else "")
             + (f"; measured range by range: {scales_text(cal['range_scales'])} (the rest as above)"
                if cal.get("range_scales") else "") + "); "
             f"replay of the trace {fmt_time(rep['simulated_iteration_ns'])}"]
    parts = run.get("critical_path") or []
    total = sum(p["ns_per_iteration"] for p in parts)
    if total > 0:
        kinds: dict[str, list] = {}
        for p in parts:
            k = kinds.setdefault(p["kind"], [0, []])
            k[0] += p["ns_per_iteration"]
            k[1].append(p["where"])
        shown = [(k, v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0]) if v[0] / total >= 0.02]
        lines.append(f"path     {fmt_time(total)} an iteration: " + ", ".join(
            f"{PATH_LABELS.get(k, k)} {v[0] / total:.0%} ({', '.join(dict.fromkeys(v[1][:2]))})"
            for k, v in shown[:5]))
    return lines


def markdown_run(run: dict) -> list[str]:
    """The run summary as a Markdown list, escaped like every other Markdown cell (a range name
    is text, never HTML)."""
    return [f"- {markdown_cell(' '.join(line.split()))}" for line in run_lines(run)]


# Terminal table columns, (header, justify), and the order in which they go when the terminal is
# narrow: least useful first. The op, its time, share, class and next step always stay.
# "GPU time" is the op's busy GPU time (the union of its kernels, copies and memsets: what the
# share is of, and what the table sorts by); "median" the median call's busy time; "GPU span" the
# projected spans summed (first kernel start to last kernel end of each call, as nsys's
# nvtx_gpu_proj_sum gives it), which also counts the gaps while the GPU waited.
TABLE_COLUMNS = [("op", "left"), ("calls", "right"), ("GPU time", "right"), ("median", "right"),
                 ("GPU span", "right"), ("share", "right"), ("class", "left"), ("conf", "left"),
                 ("evidence", "left"), ("next step", "left"), ("op x", "right"), ("e2e x", "right")]
DROP_ORDER = ["GPU span", "median", "op x", "conf", "calls", "evidence", "e2e x"]
# Width each column needs to read well (the table's borders and padding come on top).
_NEEDS = {"op": 26, "calls": 5, "GPU time": 9, "median": 9, "GPU span": 9, "share": 6, "class": 8,
          "conf": 6, "evidence": 34, "next step": 30, "op x": 5, "e2e x": 6}


def table_columns(width: int, wide: bool = False) -> list[str]:
    """The columns that fit ``width`` characters (all of them with ``wide``)."""
    names = [c for c, _ in TABLE_COLUMNS]
    if wide:
        return names
    for drop in DROP_ORDER:
        if sum(_NEEDS[c] + 3 for c in names) <= width:
            break
        names.remove(drop)
    return names


def fit_columns(heads: list[str], needs: dict[str, int], drop_order: list[str], width: int,
                wide: bool = False) -> list[int]:
    """Indices of ``heads`` that fit ``width`` characters, dropping ``drop_order`` first to last
    until they do (all of them with ``wide``). ``needs`` is each column's readable width."""
    names = list(heads)
    if not wide:
        for drop in drop_order:
            if sum(needs.get(c, 8) + 3 for c in names) <= width:
                break
            if drop in names:
                names.remove(drop)
    return [heads.index(c) for c in names]


def wrap_name(name: str, width: int) -> str:
    """``name`` on lines of at most ``width``, broken after ``_ : , < ( space`` where it can be
    (a kernel name has no spaces, so wrapping on spaces alone would cut it mid-word)."""
    parts = re.split(r"(?<=[_:,<( ])", name)
    lines, cur = [], ""
    for p in parts:
        if cur and len(cur) + len(p) > width:
            lines.append(cur.rstrip())
            cur = ""
        cur += p
    lines.append(cur.rstrip())
    return "\n".join(lines)


def table(df: pd.DataFrame, header: dict, console_width: int = 200, wide: bool = False) -> str:
    """The terminal table, as text (rich renders it; colours only on a terminal).

    Columns that do not fit ``console_width`` are left out, least useful first (``wide`` keeps
    them all); op names wrap at word boundaries. Names are escaped: they are text, not markup.
    """
    cols = table_columns(console_width, wide)
    title = (f"{visible(header['trace'])} - {header['gpu']} - GPU time in the window "
             f"{fmt_time(header['total_gpu_time_ns'])} - by {header['level']}")
    t = Table(box=box.SIMPLE_HEAVY, show_lines=False, expand=False, title=escape(title))
    for col, just in TABLE_COLUMNS:
        if col in cols:
            t.add_column(col, justify=just, overflow="fold",
                         max_width=(None if wide or col != "op" else 48))
    op_width = 48 if wide or console_width >= 160 else _NEEDS["op"]
    for name, row in df.iterrows():
        cells = {"op": wrap_name(short_name(str(name), 48), op_width), "calls": str(int(row["count"])),
                 "GPU time": fmt_time(row["busy_ns"]), "median": fmt_time(row["busy_median_ns"]),
                 "GPU span": fmt_time(row["gpu_time_ns"]), "share": f"{row['share']:.1%}",
                 "class": row["class"], "conf": row["confidence"],
                 "evidence": evidence_text(row), "next step": f"{row['rung']}: {row['action']}",
                 "op x": f"{row['expected_op_speedup']:.2f}",
                 "e2e x": f"{row['expected_end_to_end_speedup']:.3f}"}
        t.add_row(*(f"[{CLASS_STYLE.get(row['class'], 'dim')}]{row['class']}[/]" if c == "class"
                    else escape(cells[c]) for c in cols))
    buf = io.StringIO()
    console = Console(file=buf, width=console_width, force_terminal=False, color_system=None,
                      soft_wrap=False)
    if header.get("run"):
        for wrapped in wrapped_run_lines(header["run"], console_width - 1):
            console.print(wrapped, markup=False, highlight=False, overflow="fold")
    console.print(t)
    dropped = [c for c, _ in TABLE_COLUMNS if c not in cols]
    if dropped:
        console.print(f"not shown at {console_width} columns: {', '.join(dropped)} (--wide shows "
                      "them; --format csv or json has everything)", markup=False, highlight=False)
    console.print(f"peaks: {header['peaks_source']}", markup=False, highlight=False)
    return buf.getvalue()


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, sort_keys=False) + "\n"


def to_csv(df: pd.DataFrame) -> str:
    out = df.reset_index().rename(columns={"busy_ns": "gpu_busy_ns", "busy_median_ns": "gpu_busy_median_ns"})
    for col in ("gpu_time_ns", "gpu_busy_ns"):
        out[col] = out[col].astype("int64")
    return out[CSV_COLUMNS].to_csv(index=False)


def markdown_cell(x: object) -> str:
    """A Markdown table cell: one line, pipes escaped, controls visible, and ``<`` as ``&lt;``:
    Markdown renderers pass raw HTML through, so a range named ``<script>`` must arrive as text
    (without a ``<`` no tag can open; the entity renders as ``<``)."""
    return visible(str(x).replace("\n", " ")).replace("<", "&lt;").replace("|", "\\|")


def markdown_ops_table(df: pd.DataFrame, cell: Callable[[object], str] = markdown_cell,
                       times: str = "x") -> list[str]:
    """The ops table as Markdown lines (header, rule, one line per op)."""
    lines = [f"| op | calls | GPU time | median | GPU span | share | class | confidence | evidence "
             f"| next step | op {times} | e2e {times} |",
             "|---|---:|---:|---:|---:|---:|---|---|---|---|---:|---:|"]
    for name, row in df.iterrows():
        lines.append("| " + " | ".join(cell(v) for v in [
            short_name(str(name), 60), int(row["count"]), fmt_time(row["busy_ns"]),
            fmt_time(row["busy_median_ns"]), fmt_time(row["gpu_time_ns"]), f"{row['share']:.1%}",
            row["class"], row["confidence"],
            evidence_text(row), f"{row['rung']}: {row['action']}",
            f"{float(row['expected_op_speedup']):.2f}",
            f"{float(row['expected_end_to_end_speedup']):.3f}"]) + " |")
    return lines


def to_markdown(df: pd.DataFrame, header: dict) -> str:
    cell = markdown_cell
    lines = [f"**{cell(header['trace'])}** on {cell(header['gpu'])}: total GPU time "
             f"{fmt_time(header['total_gpu_time_ns'])}, ops by {header['level']}", ""]
    if header.get("run"):
        lines += [*markdown_run(header["run"]), ""]
    lines += markdown_ops_table(df)
    return "\n".join(lines) + "\n"

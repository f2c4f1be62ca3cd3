"""The report's Run section as HTML: verdict, where the wall time goes, the step model, the
critical path and the ranked actions, built from the ``run`` object of the JSON
(``Profile.run_json``), with the terminal's text one click away.

Every share on the page is a part over the sum of the parts it is drawn with, clipped to 0-100%:
a bar's segments add up to its whole width and its legend says each segment's share. Every
string that comes from the trace (range names, kernel names in action texts) is shown with its
control characters made visible and is HTML-escaped.
"""
from __future__ import annotations

import html
import math
import re
from typing import Optional

from profkit.read.text import visible
from profkit.show.render import PATH_LABELS, fmt_time, range_text, wrapped_run_lines

# The wall time's parts, in the order the terminal names them: GPU busy by kernel family, then
# GPU idle by cause. GPU colours are the page's class colours (the badges of the ops tables).
WALL_PARTS = [("compute", "GPU compute", "#AA3377"), ("memory", "GPU memory", "#4477AA"),
              ("launch", "GPU tiny kernels", "#DDAA33"), ("communication", "GPU communication", "#228833"),
              ("idle_host", "idle: waiting for the CPU", "#EE6677"),
              ("idle_sync", "idle: after a sync", "#BB5566"),
              ("idle_memcpy_wait", "idle: in CPU copies", "#EE8866"),
              ("idle_other", "idle: GPU-side gaps", "#BBBBBB")]
PATH_COLOURS = {"gpu:compute": "#AA3377", "gpu:memory": "#4477AA", "gpu:launch": "#DDAA33",
                "nccl": "#228833", "gpu:gap": "#BBBBBB", "cpu:launch": "#EE7733",
                "cpu:python": "#EE6677", "cpu:data": "#CC3311", "cpu:sync": "#BB5566",
                "cpu:alloc": "#33BBEE", "cpu:pageable_copy": "#EE8866", "cpu:copy": "#009988",
                "cpu:other": "#999933"}
OTHER_COLOUR = "#DDDDDD"
PATH_MIN_SHARE = 0.02      # kinds below this share of the path are drawn together as "other kinds"
TEXT_WIDTH = 110           # columns of the full text (it wraps like the terminal's)

RUN_CSS = """
#run .verdict { border-left: 6px solid #444; background: #f4f4f4; padding: 10px 14px; margin: 10px 0;
                font-size: 1.05rem; }
#run .verdict .vclass { font-size: 1.3rem; font-weight: 700; margin-right: 10px; }
#run h3 { font-size: 1rem; margin: 18px 0 6px; }
.stack { display: flex; width: 100%; height: 24px; border-radius: 4px; overflow: hidden; background: #eee; }
.stack > span { flex: none; height: 100%; }
ul.legend { list-style: none; padding: 0; margin: 6px 0; display: flex; flex-wrap: wrap; gap: 4px 18px;
            font-size: 0.86rem; }
ul.legend .sw { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 5px;
                vertical-align: -1px; }
ul.legend .where { color: var(--muted); }
#run .cards .v { font-size: 1.15rem; }
#run td.act { min-width: 320px; overflow-wrap: anywhere; } #run td.rule { white-space: nowrap; }
#run caption { text-align: left; padding: 0 0 4px; }
#run td .sub, #run details.basis { color: var(--muted); font-size: 0.8rem; }
#run details.basis summary { cursor: pointer; }
#run-text summary { cursor: pointer; color: var(--muted); margin-top: 12px; }
#run-text pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.8rem;
                background: #f8f8f8; border: 1px solid #eee; border-radius: 6px; padding: 8px 12px;
                white-space: pre-wrap; overflow-wrap: anywhere; }
"""


def _t(x: object) -> str:
    """Text for the page: control characters shown as escapes, then HTML-escaped."""
    return html.escape(visible(str(x)), quote=True)


def share(part: float, whole: float) -> float:
    """``part / whole`` clipped to [0, 1] (0 for an empty whole): never a share below nothing or
    above the whole."""
    if not whole or whole <= 0 or not math.isfinite(part) or not math.isfinite(whole):
        return 0.0
    return min(max(part / whole, 0.0), 1.0)


def pct(x: float) -> str:
    """A share as a label, one decimal: "<0.1%" for a part too small to show, ">99.9%" for one
    that is not the whole but would round to it."""
    return "<0.1%" if 0 < x < 0.0005 else ">99.9%" if 0.9995 <= x < 1 else f"{100 * x:.1f}%"


def stack(parts: list[tuple[str, str, str, float, str]], label: str, bar_id: str) -> str:
    """A horizontal bar of ``parts`` (key, label, colour, value, detail), each as wide as its
    share of their sum; the widths add up to exactly 100% (the last segment takes what rounding
    left), and a legend with each share follows. ``label`` starts the bar's text alternative."""
    kept = [(k, lab, c, max(float(v), 0.0), d) for k, lab, c, v, d in parts
            if math.isfinite(v) and v > 0]
    total = sum(v for _, _, _, v, _ in kept)
    if total <= 0:
        return f'<p class="meta" id="{bar_id}">{_t(label)}: nothing to draw</p>\n'
    segs, items, alt, used = [], [], [], 0.0
    for i, (k, lab, c, v, d) in enumerate(kept):
        s = share(v, total)
        width = round(100 * s, 4) if i < len(kept) - 1 else max(round(100 - used, 4), 0.0)
        used += width
        text = f"{lab} {pct(s)}"
        segs.append(f'<span data-part="{_t(k)}" data-share="{s:.6f}" style="width:{width}%;'
                    f'background:{c}" title="{_t(text)}{_t(d and f" ({d})")}"></span>')
        where = f' <span class="where">({_t(d)})</span>' if d else ""
        items.append(f'<li data-part="{_t(k)}"><span class="sw" style="background:{c}" aria-hidden="true">'
                     f"</span>{_t(text)}{where}</li>")
        alt.append(text)
    return (f'<div class="stack" id="{bar_id}" role="img" aria-label="{_t(label)}: {_t(", ".join(alt))}">'
            + "".join(segs) + f'</div>\n<ul class="legend" id="{bar_id}-legend">' + "".join(items)
            + "</ul>\n")


def wall_bar(run: dict) -> str:
    """Where the window's wall time goes: GPU busy by kernel family, GPU idle by cause."""
    b = run.get("breakdown") or {}
    parts = [(k, lab, c, float(b.get(k) or 0), fmt_time(b.get(k) or 0)) for k, lab, c in WALL_PARTS]
    out = stack(parts, f"wall time {fmt_time(run['wall_time_ns'])}", "wall-bar")
    wall = max(run["wall_time_ns"], 1)
    where = [(k, v) for k, v in (run.get("idle_host_by_range") or {}).items() if share(v, wall) >= 0.05]
    if where:
        out += ('<p class="meta">Waiting for the CPU in: '
                + ", ".join(f"{_t(k)} {pct(share(v, wall))}" for k, v in where[:3]) + " of the wall time</p>\n")
    return out


def path_bar(run: dict) -> str:
    """The step model's critical path of one iteration, by kind (largest first)."""
    if (run.get("iterations") or 0) < 2:  # as the terminal: a whole capture is no iteration
        return ""
    parts = run.get("critical_path") or []
    kinds: dict[str, list] = {}
    for p in parts:
        k = kinds.setdefault(p["kind"], [0.0, []])
        k[0] += max(float(p["ns_per_iteration"]), 0.0)
        k[1].append(p["where"])
    total = sum(v[0] for v in kinds.values())
    if total <= 0:
        return ""
    big = [(k, v) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0]) if v[0] / total >= PATH_MIN_SHARE]
    small = [v[0] for k, v in kinds.items() if v[0] / total < PATH_MIN_SHARE]
    bars = [(k, PATH_LABELS.get(k, k), PATH_COLOURS.get(k, OTHER_COLOUR), v[0],
             f"{fmt_time(v[0])}: " + ", ".join(dict.fromkeys(v[1][:2]))) for k, v in big]
    if sum(small) > 0:
        bars.append(("other", f"{len(small)} other kind{'' if len(small) == 1 else 's'}", OTHER_COLOUR, sum(small), fmt_time(sum(small))))
    return (f"<h3>Critical path: {_t(fmt_time(total))} an iteration, by kind</h3>\n"
            + stack(bars, f"critical path {fmt_time(total)} an iteration", "path-bar"))


def model_cards(run: dict) -> str:
    """The step model's iteration under the profiler, without it (modelled and, with a
    calibration run, measured) and what the profiler added."""
    cal = run.get("calibration")
    if not cal or (run.get("iterations") or 0) < 2:  # a whole capture is no step to model
        return ""
    under, without = float(cal["profiled_iteration_ns"]), float(cal["predicted_iteration_ns"])
    measured = cal["source"] == "measured"
    how = ("calibrated on a run without the profiler" if measured else
           "estimated: the calibration run not used" if cal.get("warning") else "estimated: no calibration run")
    seen = (f"{fmt_time(cal['unprofiled_iteration_ns'])}"
            + (f" (median of {cal['unprofiled_iterations']} iterations)" if cal.get("unprofiled_iterations") else "")
            if measured else "not measured")
    # The fact where there is one: a measured run's iteration, else the model's.
    added = share(under - (float(cal["unprofiled_iteration_ns"]) if measured else without), under)
    host = cal.get("host_time_added_by_profiler")
    cards = [("iteration under the profiler", fmt_time(under), "median, as captured"),
             ("iteration without it", fmt_time(without), how),
             ("measured without a profiler", seen,
              "" if measured else "needs a calibration run (profkit capture)"),
             ("the profiler's added share", pct(added),
              "of the iteration" + (f"; {host:+.0%} host time from tracing"
                                                      if host is not None and math.isfinite(host) else ""))]
    out = ['<h3>Step model</h3>\n<div class="cards" id="step-model">\n']
    for k, v, sub in cards:
        out.append(f'<div class="card"><div class="k">{_t(k)}</div><div class="v">{_t(v)}</div>'
                   + (f'<div class="k">{_t(sub)}</div>' if sub else "") + "</div>\n")
    out.append("</div>\n")
    rep = run.get("replay") or {}
    notes = ([f"replay of the trace {fmt_time(rep['simulated_iteration_ns'])}"]
             if rep.get("simulated_iteration_ns") else [])
    notes += [x for x in (cal.get("warning"), cal.get("detail")) if x]
    if notes:
        out.append(f'<p class="meta">{_t("; ".join(notes))}</p>\n')
    return "".join(out)


# The step model's price of an action, as RuleContext.price writes it into the basis.
_MODEL_ITERATION = re.compile(r"\biteration (\d+(?:\.\d+)?) -> (\d+(?:\.\d+)?) ms\b")


def model_iteration(action: dict) -> Optional[tuple[float, float]]:
    """The step model's iteration before and after the action (ms), when the step model priced
    it (None for gains that another formula gave, such as an op's roofline bound)."""
    m = _MODEL_ITERATION.search(str(action.get("basis") or ""))
    return (float(m.group(1)), float(m.group(2))) if m and "step model" in action["basis"] else None


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def tried_text(t: Optional[dict]) -> str:
    """A trial of the fix on the program: "2.05× (4 runs, 1.92–2.19×)", its error, "not applied"
    with why, or "-" when there is none."""
    if not t:
        return "-"
    if t.get("error"):
        return f"failed: {t['error']}"
    if t.get("not_run"):
        return f"not run: {t['not_run']}"
    if t.get("applied") is False:
        return "not applied" + (f": {t['note']}" if t.get("note") else "")
    if not _finite(t.get("speedup")):
        return "no time measured"
    runs = t.get("runs")
    spread = [f"{runs} run{'' if runs == 1 else 's'}"] if isinstance(runs, int) and runs > 0 else []
    if _finite(t.get("lo")) and _finite(t.get("hi")) and t["lo"] <= t["hi"]:
        spread.append(f"{t['lo']:.2f}–{t['hi']:.2f}×")
    return f"{t['speedup']:.2f}×" + (f" ({', '.join(spread)})" if spread else "")


def _tried_cell(t: Optional[dict], variants: Optional[list] = None) -> str:
    sub = f'<div class="sub">switch: {_t(t["switch"])}</div>' if t and t.get("switch") else ""
    # the other fixes the action offers, as their trials measured them (what it is ranked by)
    more = "".join(f'<div class="sub">{_t(v.get("switch") or "")}: {_t(tried_text(v))}</div>'
                   for v in variants or [])
    return f'<td class="tried">{_t(tried_text(t)) if t or not variants else ""}{sub}{more}</td>'


def _range_note(a: dict) -> str:
    """The action's prices over the speeds of the runs without the profiler, where they varied."""
    r = a.get("range")
    return f'<br><span class="meta">{_t(range_text(r))}</span>' if r else ""


def actions_table(run: dict) -> str:
    acts = run.get("actions") or []
    if not acts:
        return ('<p id="run-actions">No action is expected to pay off end to end (1.02× or more on the '
                "wall time).</p>\n")
    rows = []
    for i, a in enumerate(acts, 1):
        it = model_iteration(a)
        rule = " ".join(x for x in (a.get("code"), a.get("rule")) if x)
        rows.append(f'<tr data-rank="{i}"><td class="num">{i}</td><td class="act">{_t(a["action"])}'
                    f'<details class="basis"><summary>basis</summary>{_t(a.get("basis", ""))}</details></td>'
                    f'<td class="rule">{_t(rule)}</td>'
                    f'<td class="num">{float(a["expected_end_to_end_speedup"]):.2f}×{_range_note(a)}</td>'
                    f'<td class="num">{f"{it[0]:.2f} → {it[1]:.2f} ms" if it else "-"}</td>'
                    f"{_tried_cell(a.get('tried'), a.get('tried_variants'))}</tr>\n")
    return ('<div class="wrap"><table id="run-actions">\n<caption class="meta">Ranked by expected gain on the '
            "wall time; each gain is the action's alone (they do not multiply). The step model's "
            "iteration: its mean over the window before and after the fix, as the basis prices it ('-': "
            "another formula priced it).</caption>\n<thead><tr>"
            '<th scope="col" class="num">#</th><th scope="col">action</th><th scope="col">rule</th>'
            '<th scope="col" class="num">predicted end to end</th>'
            '<th scope="col" class="num">step model iteration (before → after)</th>'
            '<th scope="col">tried</th></tr></thead>\n<tbody>\n' + "".join(rows) + "</tbody></table></div>\n")


def trials_table(run: dict) -> str:
    """Trials that matched no ranked action (a switch the user asked for, or one whose action
    did not make the top three)."""
    trials = run.get("trials") or []
    if not trials:
        return ""
    rows = "".join(f"<tr><td>{_t(t.get('switch') or '-')}</td>{_tried_cell(dict(t, switch=None, note=None))}"
                   f"<td>{_t(t.get('note') or '-')}</td></tr>\n" for t in trials)
    return ('<h3>Tried, matching no ranked action</h3>\n<table id="run-trials">\n<thead><tr>'
            '<th scope="col">switch</th><th scope="col">tried</th><th scope="col">note</th></tr></thead>\n'
            f"<tbody>\n{rows}</tbody></table>\n")


def together_line(run: dict) -> str:
    """The step model's price of the top fixes together, when it beats the best alone by 2%."""
    combos = [c for c in run.get("combinations") or [] if not c.get("overlap")]
    best = max((a["expected_end_to_end_speedup"] for a in run.get("actions") or []), default=1.0)
    if not combos or combos[0]["expected_end_to_end_speedup"] < 1.02 * best:
        return ""
    c = combos[0]
    return (f'<p id="run-together">Together, {_t(" + ".join(c["codes"]))}: '
            f'<b>{c["expected_end_to_end_speedup"]:.2f}× end to end</b> (alone '
            f'{", ".join(f"{g:.2f}×" for g in c["alone"])}; the step model replays the fixes\' edits at once).</p>\n')


def window_line(run: dict) -> str:
    w = run["window"]
    it = (f"{run['iterations']} iterations, {fmt_time(run['iteration_time_median_ns'])} each (median), "
          if run.get("iterations") else "")
    left = "".join(f"<li>{_t(fmt_time(ex['ns']))} {_t(ex['what'])}</li>" for ex in w.get("excluded") or [])
    return (f'<p class="meta" id="run-window">Window: {_t(w["source"])}: {_t(it)}'
            f'{_t(fmt_time(run["wall_time_ns"]))} wall</p>\n'
            + (f'<ul class="meta" id="run-left-out" aria-label="left out of the window">{left}</ul>\n'
               if left else ""))


def run_section(run: dict) -> str:
    """The whole Run section."""
    v = run["verdict"]
    wall = max(run["wall_time_ns"], 1)
    busy = share(run["gpu_busy_ns"], wall)
    fired = run.get("findings") or []
    rules = ('<p class="meta">Rules that fired: ' + _t(", ".join(
        f"{f['code']} {f['rule']} {f['expected_end_to_end_speedup']:.2f}×" for f in fired))
        + " (<code>profkit rules --explain CODE</code>)</p>\n") if fired else ""
    # Line by line: visible() would show the wrapping's own newlines as escapes.
    text = "\n".join(_t(line) for w in wrapped_run_lines(run, TEXT_WIDTH) for line in w.split("\n"))
    return ('<section id="run">\n<h2>Run</h2>\n' + window_line(run)
            + f'<div class="verdict" id="verdict" data-class="{_t(v["class"])}"><span class="vclass">'
              f'{_t(v["class"])}</span><span class="vreason">{_t(v["reason"])}</span></div>\n'
            + f"<h3>Where the wall time goes: GPU busy {pct(busy)}, idle {pct(1 - busy)}</h3>\n"
            + wall_bar(run) + model_cards(run) + path_bar(run)
            + "<h3>Actions</h3>\n" + actions_table(run) + together_line(run) + trials_table(run) + rules
            + '<details id="run-text"><summary>Full text, as <code>profkit classify</code> prints it</summary>'
            + f"<pre>{text}</pre></details>\n</section>\n")

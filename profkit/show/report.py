"""One page per trace: summary, top ops and their next steps, roofline, timeline and the full table.

``build(profile, out_dir, fmt="html")`` writes ``out_dir/index.html``: a single self-contained file
(pictures inline as base64 PNG, CSS inline, no script, no external fonts) that opens offline in any
browser. ``fmt="markdown"`` writes ``out_dir/report.md`` with ``roofline.png`` and ``timeline.png``
beside it. Every name that comes from the trace (kernels, NVTX ranges) is HTML-escaped.
"""
from __future__ import annotations

import base64
import datetime
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd

from profkit import __version__
from profkit.errors import ProfkitError
from profkit.show.render import (evidence_text, fmt_rate, fmt_time, markdown_ops_table, markdown_run,
                                 short_name)
from profkit.show.run_html import RUN_CSS, run_section

TOP_OPS = 10


@dataclass
class Summary:
    trace: str
    gpu: str
    level: str
    total_gpu_time_ns: int
    gpu_busy_ns: int
    gpu_span_ns: int
    busy_fraction: float
    n_ops: int
    n_kernels: int
    peaks_source: str
    peaks_text: str
    warnings: list[str]
    run: dict = field(default_factory=dict)                  # Profile.run_json: window, breakdown, verdict

    @property
    def actions(self) -> list[dict]:
        """The ranked actions of the run (``run.actions`` in the JSON): the Run section lists
        them, and the summary's headline is the first one's gain, so the page says one thing."""
        return list(self.run.get("actions") or [])

    @property
    def headline_speedup(self) -> float:
        """Expected end-to-end gain of the first ranked action (1.0 when none pays)."""
        return float(self.actions[0]["expected_end_to_end_speedup"]) if self.actions else 1.0


def summarize(profile, df: pd.DataFrame, by: str) -> Summary:
    tr = profile.trace
    span = tr.gpu_span_ns
    peaks = profile.peaks
    roofs = ", ".join(f"{k} {fmt_rate(v, 'FLOP/s')}" for k, v in peaks.flops.items())
    return Summary(trace=Path(profile.path).name, gpu=profile.gpu.name, level=by,
                   total_gpu_time_ns=tr.total_gpu_time_ns, gpu_busy_ns=tr.gpu_busy_ns, gpu_span_ns=span,
                   busy_fraction=tr.gpu_busy_ns / span if span else 0.0, n_ops=len(df),
                   n_kernels=int((tr.activities["kind"] == "kernel").sum()),
                   peaks_source=str(peaks.source),
                   peaks_text=f"memory {fmt_rate(peaks.memory_bandwidth, 'B/s')}; {roofs}",
                   warnings=list(profile.warnings), run=profile.run_json(df))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", pad_inches=0.15)
    return buf.getvalue()


def _figures(profile, df: pd.DataFrame, by: str, timeline_kw: Optional[dict]) -> tuple[bytes, bytes, str]:
    from profkit.show.plots import roofline, timeline

    rfig = roofline(profile, by=by, ops=df)
    not_placed = len(rfig.profkit_data.not_placed)
    tfig = timeline(profile, by=by, ops=df, **(timeline_kw if timeline_kw is not None
                                                 else _op_region(profile, by)))
    note = f"{len(rfig.profkit_data.points)} ops placed; not placed (no work counts): {not_placed} ops"
    return _png(rfig), _png(tfig), note


def _op_region(profile, by: str) -> dict:
    """The timeline window of the report: from just before the first range of the level (set-up
    before the profiled region, such as loading weights, is left out) to the end of the trace."""
    from profkit.show.plots.timeline import trace_origin

    if by == "kernel" or profile.trace.ranges.empty:
        return {}
    r = profile.trace.ranges_of_level(by)
    if r.empty:
        return {}
    t0, t_last = trace_origin(profile)
    first = int(r["start"].min()) - t0
    pad = int((t_last - t0 - first) * 0.02)
    return {"start": max(first - pad, 0)} if first - pad > 0 else {}


def build(profile, out_dir: str | Path, fmt: str = "html", by: str = "range",
          timeline_kw: Optional[dict] = None) -> Path:
    """Write the report into ``out_dir`` (created if missing); return the main file's path."""
    if fmt not in ("html", "markdown"):
        raise ProfkitError(f"unknown report format {fmt!r}: use html or markdown")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ProfkitError(f"{out} is a file; -o wants a directory for the report")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".profkit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ProfkitError(f"cannot write into {out}: {exc.strerror or exc}") from None
    notes: list[str] = []
    try:
        df = profile.ops(by=by)
    except ProfkitError as exc:
        if by == "kernel":
            raise
        notes.append(f"--by {by} is not possible here ({exc}); ops are kernels instead")
        by = "kernel"
        df = profile.ops(by=by)
    if df.attrs.get("level", by) != by:  # an unannotated trace: the profile chose another level
        notes.append(f"--by {by} is not possible here ({'; '.join(profile.notes)}); ops are "
                     f"{df.attrs['level']}s instead")
        by = df.attrs["level"]
    summary = summarize(profile, df, by)
    roof_png, tl_png, roof_note = _figures(profile, df, by, timeline_kw)
    if fmt == "html":
        path = out / "index.html"
        text = render_html(summary, df, roof_png, tl_png, roof_note, notes)
    else:
        (out / "roofline.png").write_bytes(roof_png)
        (out / "timeline.png").write_bytes(tl_png)
        path = out / "report.md"
        text = render_markdown(summary, df, roof_note, notes)
    path.write_text(text, encoding="utf-8")
    return path


# --- HTML -------------------------------------------------------------------------------------

CSS = """
:root { --compute: #AA3377; --memory: #4477AA; --launch: #DDAA33; --fg: #222; --muted: #666; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--fg); margin: 0 auto; max-width: 1680px; padding: 24px 32px 48px; line-height: 1.45; }
h1 { font-size: 1.55rem; margin: 0 0 4px; } h2 { font-size: 1.2rem; margin: 32px 0 8px;
     border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.meta { color: var(--muted); font-size: 0.9rem; margin: 0 0 16px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }
.card { border: 1px solid #ddd; border-radius: 8px; padding: 10px 16px; min-width: 170px; }
.card .v { font-size: 1.35rem; font-weight: 600; } .card .k { color: var(--muted); font-size: 0.82rem; }
table { border-collapse: collapse; width: 100%; font-size: 0.86rem; }
th, td { border-bottom: 1px solid #e6e6e6; padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.op { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.8rem; min-width: 200px;
        max-width: 420px; overflow-wrap: anywhere; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-size: 0.78rem;
         font-weight: 600; white-space: nowrap; }
.badge.compute { background: var(--compute); } .badge.memory { background: var(--memory); }
.badge.launch { background: var(--launch); color: #222; }
.badge.unknown { background: #777777; } .badge.communication { background: #228833; }
.badge.latency { background: #44AA99; }
figure { margin: 8px 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: var(--muted); font-size: 0.85rem; }
.warn { background: #fff4e5; border-left: 4px solid #e69500; padding: 6px 10px; margin: 6px 0; }
.gain { background: #eef6ee; border-left: 4px solid #228833; padding: 8px 12px; margin: 8px 0; }
td.ev { min-width: 190px; } td.next { min-width: 200px; }
.wrap { overflow-x: auto; }  /* a narrow window scrolls the table, not the page */
footer { color: var(--muted); font-size: 0.8rem; margin-top: 32px; }
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _op_cell(name: str, width: int = 60) -> str:
    return f'<td class="op" title="{_e(name)}">{_e(short_name(name, width))}</td>'


def _badge(cls: str) -> str:
    return f'<span class="badge {_e(cls)}">{_e(cls)}</span>'


def render_html(s: Summary, df: pd.DataFrame, roof_png: bytes, tl_png: bytes, roof_note: str,
                notes: list[str]) -> str:
    b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    p = []
    p.append("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
             "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
             f"<title>profkit report: {_e(s.trace)}</title>\n<style>{CSS}{RUN_CSS}</style>\n</head>\n<body>\n")
    p.append(f"<header><h1>profkit report: {_e(s.trace)}</h1>\n"
             f"<p class=\"meta\">{_e(s.gpu)} · ops by {_e(s.level)} · peaks: {_e(s.peaks_source)} · "
             f"profkit {_e(__version__)} · {_e(now)}</p></header>\n")
    if s.run:
        p.append(run_section(s.run))
    # Summary
    p.append('<section id="summary">\n<h2>Summary</h2>\n<div class="cards">\n')
    for k, v in [("GPU", s.gpu), ("total GPU time", fmt_time(s.total_gpu_time_ns)),
                 ("GPU busy", f"{s.busy_fraction:.1%} of {fmt_time(s.gpu_span_ns)}"),
                 ("ops", f"{s.n_ops} ({s.level})"), ("kernels", f"{s.n_kernels:,}"),
                 ("expected end-to-end gain", f"{s.headline_speedup:.2f}×")]:
        p.append(f'<div class="card"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div></div>\n')
    p.append("</div>\n")
    for w in s.warnings + notes:
        p.append(f'<p class="warn">{_e(w)}</p>\n')
    p.append(f"<p class=\"meta\">Peaks used: {_e(s.peaks_text)} ({_e(s.peaks_source)}).</p>\n")
    if s.actions:
        items = "".join(
            f"<li>{_e(a['action'])} — <b>{float(a['expected_end_to_end_speedup']):.2f}× end to "
            f"end</b></li>" for a in s.actions)
        p.append(f'<div class="gain" id="gain"><b>Expected end-to-end gain: '
                 f'<span id="headline-gain">{s.headline_speedup:.2f}×</span></b> from the first of '
                 f'the {len(s.actions)} ranked action(s) of the Run section (each on wall time, '
                 f'alone: their gains do not multiply)<ol>{items}</ol></div>\n')
    else:
        p.append('<div class="gain" id="gain">No suggestion is expected to pay off end to end: '
                 'the ops run near their roofs or are too small to matter.</div>\n')
    # Top ops
    p.append('<h3>Top ops by GPU time</h3>\n<table id="top-ops">\n<thead><tr><th>op</th>'
             '<th class="num">GPU time</th><th class="num">share</th><th>class</th><th>next step</th>'
             '<th class="num">e2e ×</th></tr></thead>\n<tbody>\n')
    for name, r in df.head(TOP_OPS).iterrows():
        p.append(f"<tr>{_op_cell(str(name))}<td class=\"num\">{_e(fmt_time(r['busy_ns']))}</td>"
                 f"<td class=\"num\">{r['share']:.1%}</td><td>{_badge(r['class'])}</td>"
                 f"<td>{_e(r['rung'])}: {_e(r['action'])}</td>"
                 f"<td class=\"num\">{float(r['expected_end_to_end_speedup']):.3f}</td></tr>\n")
    p.append("</tbody></table>\n</section>\n")
    # Pictures
    p.append('<section id="roofline">\n<h2>Roofline</h2>\n<figure>'
             f'<img alt="Roofline of the ops of {_e(s.trace)}" src="data:image/png;base64,{b64(roof_png)}">'
             f"<figcaption>Each op at its arithmetic intensity and achieved FLOP/s, sized by GPU time and "
             f"coloured by class. {_e(roof_note)}.</figcaption></figure>\n</section>\n")
    p.append('<section id="timeline">\n<h2>Timeline</h2>\n<figure>'
             f'<img alt="Timeline of {_e(s.trace)}" src="data:image/png;base64,{b64(tl_png)}">'
             "<figcaption>NVTX ranges and CUDA launch calls per CPU thread, kernels and copies per GPU "
             "stream, coloured by the class of their op; idle GPU time shaded. From the first NVTX range "
             "of the level to the end of the trace (set-up before it is left out). Zoom with "
             "<code>profkit timeline --range NAME --instance N</code> or export with "
             "<code>profkit export-perfetto</code>.</figcaption></figure>\n</section>\n")
    # Full table
    p.append('<section id="ops">\n<h2>All ops</h2>\n<div class="wrap"><table id="all-ops">\n<thead><tr><th>op</th>'
             '<th class="num">calls</th><th class="num">GPU time</th><th class="num">median</th>'
             '<th class="num">GPU span</th><th class="num">share</th><th>class</th><th>confidence</th>'
             '<th>evidence</th><th>next step</th><th class="num">op ×</th><th class="num">e2e ×</th>'
             '</tr></thead>\n<tbody>\n')
    for name, r in df.iterrows():
        p.append(f"<tr>{_op_cell(str(name))}<td class=\"num\">{int(r['count'])}</td>"
                 f"<td class=\"num\">{_e(fmt_time(r['busy_ns']))}</td>"
                 f"<td class=\"num\">{_e(fmt_time(r['busy_median_ns']))}</td>"
                 f"<td class=\"num\">{_e(fmt_time(r['gpu_time_ns']))}</td>"
                 f"<td class=\"num\">{r['share']:.1%}</td><td>{_badge(r['class'])}</td>"
                 f"<td>{_e(r['confidence'])}</td><td class=\"ev\">{_e(evidence_text(r))}</td>"
                 f"<td class=\"next\">{_e(r['rung'])}: {_e(r['action'])}</td>"
                 f"<td class=\"num\">{float(r['expected_op_speedup']):.2f}</td>"
                 f"<td class=\"num\">{float(r['expected_end_to_end_speedup']):.3f}</td></tr>\n")
    p.append("</tbody></table></div>\n</section>\n")
    p.append(f"<footer>Generated by profkit {_e(__version__)} from {_e(s.trace)}. GPU time is busy GPU "
             "time (the union of an op's kernels, copies and memsets; median: the median call's); GPU "
             "span sums each call's first kernel start to last kernel end, gaps included; share is busy "
             "GPU time over total GPU time.</footer>\n</body>\n</html>\n")
    return "".join(p)


# --- Markdown ---------------------------------------------------------------------------------

def _md(x: object) -> str:
    """A Markdown table cell: pipes escaped, HTML made inert, one line."""
    return html.escape(str(x), quote=False).replace("|", "\\|").replace("\n", " ")


def render_markdown(s: Summary, df: pd.DataFrame, roof_note: str, notes: list[str]) -> str:
    L = [f"# profkit report: {_md(s.trace)}", "",
         f"{_md(s.gpu)} · ops by {s.level} · peaks: {_md(s.peaks_source)} · profkit {__version__}", ""]
    if s.run:
        L += ["## Run", "", *markdown_run(s.run), ""]
    L += ["## Summary", "",
         f"- GPU: {_md(s.gpu)}",
         f"- Total GPU time: {fmt_time(s.total_gpu_time_ns)}",
         f"- GPU busy: {s.busy_fraction:.1%} of {fmt_time(s.gpu_span_ns)}",
         f"- Ops: {s.n_ops} ({s.level}); kernels: {s.n_kernels:,}",
         f"- Peaks used: {_md(s.peaks_text)}",
         (f"- Expected end-to-end gain: **{s.headline_speedup:.2f}×**, from the first of the "
          f"{len(s.actions)} ranked action(s) of the Run section (each on wall time, alone)"
          if s.actions else "- No suggestion is expected to pay off end to end")]
    for i, a in enumerate(s.actions, 1):
        L.append(f"  {i}. {_md(a['action'])} — {float(a['expected_end_to_end_speedup']):.2f}× end to end")
    for w in s.warnings + notes:
        L.append(f"- Warning: {_md(w)}")
    L += ["", "### Top ops by GPU time", "", "| op | GPU time | share | class | next step | e2e × |",
          "|---|---:|---:|---|---|---:|"]
    for name, r in df.head(TOP_OPS).iterrows():
        L.append(f"| {_md(short_name(str(name), 60))} | {fmt_time(r['busy_ns'])} | {r['share']:.1%} | "
                 f"{r['class']} | {_md(r['rung'])}: {_md(r['action'])} | "
                 f"{float(r['expected_end_to_end_speedup']):.3f} |")
    L += ["", "## Roofline", "", "![roofline](roofline.png)", "", f"{_md(roof_note)}.", "",
          "## Timeline", "", "![timeline](timeline.png)", "", "## All ops", "",
          *markdown_ops_table(df, cell=_md, times="×")]
    return "\n".join(L) + "\n"

"""The roofline picture: ops placed by arithmetic intensity and achieved FLOP/s under the GPU's roofs.

``roofline_data`` turns a profile's ops into what is drawn (no matplotlib); ``roofline`` draws it
and returns the Figure (for notebooks; the CLI saves it).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from profkit.read.peaks import PRECISION_ORDER
from profkit.show.plots import style
from profkit.show.render import fmt_rate, fmt_time, short_name

ROOF_NAMES = {"fp64": "fp64", "fp32": "fp32 (CUDA cores)", "tf32": "tf32 tensor",
              "bf16": "bf16 tensor", "fp16": "fp16 tensor", "fp8": "fp8 tensor"}


@dataclass
class Roof:
    precisions: tuple[str, ...]
    flops_per_s: float
    ridge: float             # FLOP/byte where this roof meets the memory roof

    @property
    def label(self) -> str:
        if len(self.precisions) > 1:
            base = "/".join(self.precisions)
            tensor = any(p in ("bf16", "fp16", "tf32", "fp8") for p in self.precisions)
            return base + (" tensor" if tensor else "")
        return ROOF_NAMES.get(self.precisions[0], self.precisions[0])


@dataclass
class RooflineData:
    """What the roofline shows: placed points, ops that cannot be placed, and the roofs."""
    points: pd.DataFrame                 # index op name; ai, flops_per_s, gpu_time_ns, class, ...
    not_placed: list[str]
    roofs: list[Roof]
    memory_bandwidth: float
    gpu: str
    peaks_source: str
    level: str
    trace: str
    warnings: list[str] = field(default_factory=list)


def _num(x: object) -> Optional[float]:
    try:
        f = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def roofline_data(profile, by: str = "range", top: Optional[int] = None,
                  ops: Optional[pd.DataFrame] = None) -> RooflineData:
    """Place each op with both FLOP and byte counts; list the rest as not placed.

    ``ops``: a DataFrame from ``profile.ops(by=...)`` already computed (the report reuses it).
    """
    df = profile.ops(by=by) if ops is None else ops
    if top is not None:
        df = df.head(top)
    rows, not_placed = [], []
    for name, r in df.iterrows():
        ev = r["evidence"] if isinstance(r["evidence"], dict) else {}
        flops_s = _num(ev.get("achieved_flops_per_s"))
        ai = _num(ev.get("arithmetic_intensity"))
        fpc, bpc = _num(ev.get("flops_per_call")), _num(ev.get("bytes_per_call"))
        if not (flops_s and ai and fpc and bpc) or flops_s <= 0 or ai <= 0:
            not_placed.append(str(name))
            continue
        rows.append({"name": str(name), "ai": ai, "flops_per_s": flops_s,
                     "bytes_per_s": _num(ev.get("achieved_bytes_per_s")),
                     "gpu_time_ns": float(r["gpu_time_ns"]), "share": float(r["share"]),
                     "class": r["class"], "precision": ev.get("compute_roof") or r.get("precision"),
                     "pct_of_roof": _num(r.get("pct_of_roof")), "source": r["source"],
                     "action": r["action"]})
    points = pd.DataFrame(rows, columns=["name", "ai", "flops_per_s", "bytes_per_s", "gpu_time_ns",
                                         "share", "class", "precision", "pct_of_roof", "source",
                                         "action"]).set_index("name")
    peaks = profile.peaks
    present = {str(p) for p in df["precision"].dropna()} | {str(p) for p in points["precision"].dropna()}
    present.add("fp32")
    roofs = _roofs(peaks, present) or _roofs(peaks, set(peaks.flops))
    return RooflineData(points=points, not_placed=not_placed, roofs=roofs,
                        memory_bandwidth=float(peaks.memory_bandwidth), gpu=profile.gpu.name,
                        peaks_source=str(peaks.source), level=by, trace=Path(profile.path).name,
                        warnings=list(profile.warnings))


def _roofs(peaks, present: set[str]) -> list[Roof]:
    """One roof per precision present (fp32 always); precisions with the same peak share a roof."""
    by_value: dict[float, list[str]] = {}
    for prec in PRECISION_ORDER:
        if prec in peaks.flops and prec in present:
            by_value.setdefault(float(peaks.flops[prec]), []).append(prec)
    # A precision with the same peak as a present one (fp16 beside bf16) is named on its roof too;
    # not fp64, whose tensor-core rate an H100's float32 CUDA cores happen to match.
    for prec in PRECISION_ORDER:
        v = peaks.flops.get(prec)
        if prec == "fp64" and prec not in present:
            continue
        if v is not None and float(v) in by_value and prec not in by_value[float(v)]:
            by_value[float(v)].append(prec)
    shown = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
    roofs = [Roof(tuple(sorted(p, key=lambda q: shown.index(q) if q in shown else 99)), v,
                  v / peaks.memory_bandwidth)
             for v, p in by_value.items()]
    return sorted(roofs, key=lambda r: r.flops_per_s)


def _decade_floor(x: float) -> float:
    return 10 ** math.floor(math.log10(x))


def _decade_ceil(x: float) -> float:
    return 10 ** math.ceil(math.log10(x))


def axis_limits(data: RooflineData) -> tuple[tuple[float, float], tuple[float, float]]:
    """Whole decades that hold every point, every ridge and the highest roof."""
    ai = list(data.points["ai"]) + [r.ridge for r in data.roofs]
    top = max([r.flops_per_s for r in data.roofs] + list(data.points["flops_per_s"]))
    xmin = _decade_floor(min(ai) / 10)
    xmax = _decade_ceil(max(ai) * 10)
    # The roofs need at most 6 decades below the top one; every point is shown, however low.
    ymin = max(_decade_floor(data.memory_bandwidth * xmin), _decade_floor(top) / 1e6)
    if len(data.points):
        ymin = min(ymin, _decade_floor(float(data.points["flops_per_s"].min())))
    ymax = _decade_ceil(top * 1.5)
    return (xmin, xmax), (ymin, ymax)


def marker_size(gpu_time_ns: np.ndarray | float, tmax: float) -> np.ndarray:
    """Marker area (pt²) proportional to GPU time: the eye reads area."""
    t = np.asarray(gpu_time_ns, dtype=float)
    return 30.0 + 1400.0 * t / max(tmax, 1.0)


def _rate_tick(y: float, _pos: object = None) -> str:
    return fmt_rate(y, "FLOP/s").replace(".00 ", " ")


def _ai_tick(x: float, _pos: object = None) -> str:
    return f"{x:g}"


def roofline(profile=None, by: str = "range", top: Optional[int] = None, *,
             data: Optional[RooflineData] = None, ops: Optional[pd.DataFrame] = None,
             label_top: int = 8, figsize: tuple[float, float] = (11.5, 6.8)):
    """Draw the roofline of ``profile`` (or of ready ``data``) and return the matplotlib Figure."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if data is None:
        data = roofline_data(profile, by=by, top=top, ops=ops)
    with matplotlib.rc_context(style.RC):
        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        ax = fig.add_axes((0.105, 0.20, 0.60, 0.70))
        (xmin, xmax), (ymin, ymax) = axis_limits(data)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(xmin, xmax)
        ax.set_ylim(ymin, ymax)
        ax.grid(True, which="major", color="#E5E5E5", linewidth=0.8)
        ax.set_axisbelow(True)
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=20))
        ax.yaxis.set_major_locator(LogLocator(base=10, numticks=20))
        ax.xaxis.set_major_formatter(FuncFormatter(_ai_tick))
        ax.yaxis.set_major_formatter(FuncFormatter(_rate_tick))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("Arithmetic intensity (FLOP / byte of DRAM traffic)")
        ax.set_ylabel("Achieved performance (FLOP/s)")
        ax.set_title(f"Roofline: {data.trace}, ops by {data.level} on {data.gpu}", loc="left")

        pts = data.points
        tmax = float(pts["gpu_time_ns"].max()) if len(pts) else 1.0
        marker_boxes = _marker_boxes(fig, ax, pts, tmax)
        # Roofs: the memory roof up to the highest compute roof, each compute roof from its ridge.
        bw = data.memory_bandwidth
        top_roof = data.roofs[-1]
        xs = np.array([xmin, top_roof.ridge])
        ax.plot(xs, bw * xs, color=style.ROOF_COLOR, linewidth=2.0, gid="roof-memory",
                solid_capstyle="butt")
        for i, roof in enumerate(data.roofs):
            ax.plot([roof.ridge, xmax], [roof.flops_per_s, roof.flops_per_s], color=style.ROOF_COLOR,
                    linewidth=2.0 if roof is top_roof else 1.3,
                    linestyle="-" if roof is top_roof else (0, (6, 2)),
                    gid=f"roof-{'-'.join(roof.precisions)}")
            ax.plot([roof.ridge], [roof.flops_per_s], marker="D", markersize=5.5,
                    color=style.ROOF_COLOR, zorder=4, gid=f"ridge-{'-'.join(roof.precisions)}")
            ax.plot([roof.ridge, roof.ridge], [ymin, roof.flops_per_s], color="#999999",
                    linewidth=0.8, linestyle=":", zorder=1)
            _roof_label(fig, ax, f"{roof.label}  {fmt_rate(roof.flops_per_s, 'FLOP/s')}  ·  ridge "
                             f"{roof.ridge:.3g} FLOP/B", roof, xmax, marker_boxes)
        # The memory roof's label along the diagonal, near its left end.
        x_lab = max(xmin * 1.3, min(xmin * 3, data.roofs[0].ridge / 15))  # clear of the first ridge
        p0 = ax.transData.transform((x_lab, bw * x_lab))
        p1 = ax.transData.transform((x_lab * 10, bw * x_lab * 10))
        angle = math.degrees(math.atan2(p1[1] - p0[1], p1[0] - p0[0]))
        ax.annotate(f"memory (DRAM) {fmt_rate(bw, 'B/s')}", (x_lab, bw * x_lab), xytext=(0, 5),
                    textcoords="offset points", rotation=angle, rotation_mode="anchor",
                    fontsize=8.5, color=style.ROOF_COLOR, transform_rotates_text=True)

        order = pts.sort_values("gpu_time_ns", ascending=False)  # big first, small drawn on top
        for cls in style.CLASSES:
            sub = order[order["class"] == cls]
            if len(sub):
                ax.scatter(sub["ai"], sub["flops_per_s"], s=marker_size(sub["gpu_time_ns"], tmax),
                           c=style.class_color(cls), alpha=0.85, edgecolors="white", linewidths=0.8,
                           zorder=5, gid=f"points-{cls}", label=style.CLASS_LABELS[cls])

        if pts.empty:
            ax.text(0.58, 0.2, "No op has both FLOP and byte counts, so none can be placed.\n"
                    "Add work hints to NVTX ranges (profkit.annotate), capture with --aten\n"
                    "for shape-based counts, or add Nsight Compute counters (capture --ncu).",
                    transform=ax.transAxes, ha="center", va="center", fontsize=10, color="#555555",
                    bbox=dict(boxstyle="round,pad=0.5", fc="#F7F7F7", ec="#CCCCCC"), gid="no-points")
        unlabelled, numbered = _label_points(fig, ax, pts, order.head(label_top), tmax)

        # Legends outside the axes: classes, then marker sizes.
        handles = [Line2D([], [], marker="o", linestyle="", markersize=9, markerfacecolor=style.class_color(c),
                          markeredgecolor="white", label=style.CLASS_LABELS[c]) for c in style.CLASSES]
        handles.append(Line2D([], [], color=style.ROOF_COLOR, linewidth=2, label="roofs (peaks below)"))
        handles.append(Line2D([], [], marker="D", linestyle="", color=style.ROOF_COLOR, markersize=5.5,
                              label="ridge point"))
        leg1 = fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.73, 0.90),
                          title="op class (colour)", frameon=False, alignment="left")
        size_handles = []
        if len(pts):
            for frac in (1.0, 0.1, 0.01):
                t = tmax * frac
                size_handles.append(Line2D([], [], marker="o", linestyle="",
                                           markersize=math.sqrt(float(marker_size(t, tmax))),
                                           markerfacecolor="#999999", markeredgecolor="white",
                                           label=fmt_time(t)))
        fig.legend(handles=size_handles or [Line2D([], [], linestyle="", label="no ops placed")],
                   loc="upper left", bbox_to_anchor=(0.73, 0.56), title="GPU time (area)",
                   frameon=False, labelspacing=1.6, borderpad=0.9, handletextpad=1.8, alignment="left")
        fig.add_artist(leg1)

        n_np = len(data.not_placed)
        np_text = (f"not placed (no work counts): {n_np} ops"
                   + (f" — {', '.join(point_label(n, 28) for n in data.not_placed[:4])}"
                      + (", …" if n_np > 4 else "") if n_np else ""))
        fig.text(0.73, 0.20, f"{len(pts)} op{'s' if len(pts) != 1 else ''} placed\n" + _wrap(np_text, 44), fontsize=8.5,
                 va="bottom", ha="left", color="#444444", gid="not-placed")
        peaks_txt = ", ".join(f"{r.label} {fmt_rate(r.flops_per_s, 'FLOP/s')}" for r in data.roofs)
        caption = (f"GPU: {data.gpu}. Peaks used: memory {fmt_rate(bw, 'B/s')}; {peaks_txt}. "
                   f"Source of peaks: {data.peaks_source}. Points: achieved FLOP/s and FLOP/byte per "
                   "op from its work counts (hints, shapes or ncu) over its GPU time.")
        if numbered:
            caption += " Numbered points: " + "; ".join(f"{n} = {point_label(name, 60)} ({detail})"
                                                        for n, name, detail in numbered) + "."
        if unlabelled:
            caption += " Unlabelled for lack of room: " + ", ".join(point_label(n, 40) for n in unlabelled) + "."
        for w in data.warnings:
            caption += f" Warning: {w}"
        # Below the x label; a long caption grows downwards (saved with bbox_inches="tight").
        fig.text(0.015, 0.095, _wrap(caption, 175), fontsize=8, va="top", ha="left", color="#444444",
                 gid="caption")
    fig.profkit_data = data  # for tests and notebooks: what was drawn
    return fig


def _marker_boxes(fig, ax, pts: pd.DataFrame, tmax: float) -> list[tuple]:
    scale = fig.dpi / 72.0
    boxes = []
    for _, r in pts.iterrows():
        cx, cy = ax.transData.transform((r["ai"], r["flops_per_s"]))
        rad = math.sqrt(float(marker_size(r["gpu_time_ns"], tmax)) / math.pi) * scale
        boxes.append((cx - rad, cy - rad, cx + rad, cy + rad))
    return boxes


def _roof_label(fig, ax, text: str, roof: Roof, xmax: float, avoid: list[tuple]) -> None:
    """Write a compute roof's label along it, where no point is: right end, after the ridge, above
    or below the line, in that order of preference."""
    renderer = fig.canvas.get_renderer()
    y = roof.flops_per_s
    tries = []
    for dy in (3, 14, 28, 44):
        tries += [((xmax, y), (-4, dy), "right", "bottom"), ((roof.ridge, y), (8, dy), "left", "bottom"),
                  ((xmax, y), (-4, -dy), "right", "top"), ((roof.ridge, y), (8, -dy), "left", "top")]
    for xy, off, ha, va in tries:
        t = ax.annotate(text, xy, xytext=off, textcoords="offset points", ha=ha, va=va, fontsize=8.5,
                        color=style.ROOF_COLOR, gid="roof-label")
        b = t.get_window_extent(renderer)
        box = (b.x0, b.y0, b.x1, b.y1)
        if not any(_overlap(box, o) for o in avoid):
            avoid.append(box)
            return
        t.remove()
    t = ax.annotate(text, (xmax, y), xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom",
                    fontsize=8.5, color=style.ROOF_COLOR, gid="roof-label",
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.8), zorder=6)


def _wrap(text: str, width: int) -> str:
    import textwrap
    return "\n".join(textwrap.wrap(text, width)) or text


def _label_points(fig, ax, pts: pd.DataFrame, top: pd.DataFrame, tmax: float
                  ) -> tuple[list[str], list[tuple[int, str, str]]]:
    """Label the top ops without overlap: try spots around each point, nearest first, and keep the
    first one that is free of markers, other labels and roof labels and inside the axes."""
    if top.empty:
        return [], []
    renderer = fig.canvas.get_renderer()
    axbox = ax.get_window_extent(renderer)
    scale = fig.dpi / 72.0
    taken = []  # display-space boxes: markers, roof texts and placed labels
    for _, r in pts.iterrows():
        cx, cy = ax.transData.transform((r["ai"], r["flops_per_s"]))
        rad = math.sqrt(float(marker_size(r["gpu_time_ns"], tmax)) / math.pi) * scale
        taken.append((cx - rad, cy - rad, cx + rad, cy + rad))
    n_markers = len(taken)
    for t in ax.texts:
        b = t.get_window_extent(renderer)
        taken.append((b.x0, b.y0, b.x1, b.y1))
    fixed = len(taken)
    angles = [math.radians(a) for a in (45, -45, 135, -135, 90, -90, 0, 180, 20, -20, 160, -160, 65, -65,
                                        115, -115)]
    unlabelled: list[str] = []
    numbered: list[tuple[int, str, str]] = []
    placed: list[tuple] = []  # leader-line samples

    def find_spot(cx, cy, rad, w, h, strict, dists):
        obstacles = (taken[n_markers:] if strict else taken[fixed:]) + placed
        for dist in dists:
            for a in angles:
                d = (rad + 5 * scale) * dist
                ax_, ay_ = cx + d * math.cos(a), cy + d * math.sin(a)
                # Anchor the box on the side facing the point.
                bx0 = ax_ if math.cos(a) > 0.3 else (ax_ - w if math.cos(a) < -0.3 else ax_ - w / 2)
                by0 = ay_ if math.sin(a) > 0.3 else (ay_ - h if math.sin(a) < -0.3 else ay_ - h / 2)
                box = (bx0, by0, bx0 + w, by0 + h)
                inside = box[0] >= axbox.x0 + 2 and box[2] <= axbox.x1 - 2 and \
                    box[1] >= axbox.y0 + 2 and box[3] <= axbox.y1 - 2
                if inside and not any(_overlap(box, t) for t in taken) and \
                        (dist == 1.0 or not _line_hits(cx, cy, box, rad, obstacles)):
                    return box, dist
        return None

    def size_of(text, **kw):
        probe = ax.text(0, 0, text, fontsize=8, transform=None, **kw)
        ext = probe.get_window_extent(renderer)
        probe.remove()
        return ext.width + 4, ext.height + 4

    full_dists = (1.0, 2.0, 3.2, 4.6, 6.5, 9.0, 12.0)
    for name, r in top.iterrows():
        pct = r["pct_of_roof"]
        detail = fmt_time(r["gpu_time_ns"]) + (f" · {pct:.0%} of roof" if pct is not None and pct == pct else "")
        label = f"{point_label(str(name))}\n{detail}"
        cx, cy = ax.transData.transform((r["ai"], r["flops_per_s"]))
        rad = math.sqrt(float(marker_size(r["gpu_time_ns"], tmax)) / math.pi) * scale
        w, h = size_of(label)
        num = str(len(numbered) + 1)
        nw, nh = size_of(num, fontweight="bold")
        # Prefer: full label with a clean leader; a number with a clean leader (named in the
        # caption); then either one with a leader that may cross a roof's label.
        spot, text = None, label
        for strict in (True, False):
            spot = find_spot(cx, cy, rad, w, h, strict, full_dists)
            if spot:
                text = label
                break
            spot = find_spot(cx, cy, rad, nw, nh, strict, (1.0, 2.0, 3.2, 4.6))
            if spot:
                text = num
                numbered.append((len(numbered) + 1, str(name), detail))
                break
        if spot is None:
            unlabelled.append(str(name))
            continue
        box, dist = spot
        taken.append(box)
        if dist > 1.0:
            # Keep later leader lines off this one: a few small boxes along it.
            rx, ry = _relpos(box, cx, cy)
            ex, ey = box[0] + rx * (box[2] - box[0]), box[1] + ry * (box[3] - box[1])
            for f in np.linspace(0.15, 0.9, 6):
                px_, py_ = cx + f * (ex - cx), cy + f * (ey - cy)
                placed.append((px_ - 2, py_ - 2, px_ + 2, py_ + 2))
        # Place the text by its lower-left corner in display space, converted to offset points.
        ox, oy = (box[0] + 2 - cx) / scale, (box[1] + 2 - cy) / scale
        ax.annotate(text, (r["ai"], r["flops_per_s"]), xytext=(ox, oy), textcoords="offset points",
                    ha="left", va="bottom", fontsize=8, color="#222222", zorder=6,
                    gid="point-label" if text is label else "point-number",
                    fontweight="normal" if text is label else "bold",
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.85),
                    arrowprops=dict(arrowstyle="-", color="#777777", linewidth=0.7, shrinkA=1,
                                    shrinkB=rad / scale, relpos=_relpos(box, cx, cy)) if dist > 1.0 else None)
    return unlabelled, numbered


def point_label(name: str, width: int = 34) -> str:
    """A short label: C++ names shortened; aten shapes written compactly (mm 2048×2048, 2048×6144)."""
    s = short_name(name, 200)
    m = re.match(r"^(.*?)\s*\[\[(.*)\]\]\s*$", s)
    if m:
        shapes = [x.strip() for x in re.findall(r"\[([^\[\]]*)\]", "[" + m.group(2) + "]")]
        dims = ["×".join(d.strip() for d in x.split(",")) for x in shapes if x]
        s = f"{m.group(1)} {', '.join(dims)}" if dims else m.group(1)
    return s if len(s) <= width else s[: width - 1] + "…"


def _line_hits(cx: float, cy: float, box: tuple, rad: float, others: list) -> bool:
    """Would the leader line from the point to ``box`` cross another label or leader line?"""
    rx, ry = _relpos(box, cx, cy)
    ex, ey = box[0] + rx * (box[2] - box[0]), box[1] + ry * (box[3] - box[1])
    length = math.hypot(ex - cx, ey - cy)
    if length <= rad:
        return False
    for f in np.linspace(rad / length, 1.0, 24)[:-1]:
        x, y = cx + f * (ex - cx), cy + f * (ey - cy)
        if any(o[0] <= x <= o[2] and o[1] <= y <= o[3] for o in others):
            return True
    return False


def _relpos(box: tuple, cx: float, cy: float) -> tuple[float, float]:
    """Where on the label's box the leader line starts: the side nearest the point."""
    x = 0.0 if cx <= box[0] else (1.0 if cx >= box[2] else 0.5)
    y = 0.0 if cy <= box[1] else (1.0 if cy >= box[3] else 0.5)
    return x, y


def _overlap(a: tuple, b: tuple) -> bool:
    return not (a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1])

"""Shared look of profkit's pictures: one colour per bound class, fonts, time formatting.

Colours are Paul Tol's colour-blind-safe "bright"/"high-contrast" set, so compute, memory and
launch stay apart for readers with red-green colour blindness and in greyscale print.
"""
from __future__ import annotations

import matplotlib

CLASSES = ("compute", "memory", "launch", "latency", "unknown")
CLASS_COLORS = {
    "compute": "#AA3377",   # purple
    "memory": "#4477AA",    # blue
    "launch": "#DDAA33",    # amber
    "latency": "#44AA99",   # teal: a grid too small for the GPU
    "unknown": "#777777",   # dark grey: the evidence could not decide
}
OTHER_COLOR = "#BBBBBB"     # GPU work outside any op of the chosen level
API_COLOR = "#66CCEE"       # CUDA API calls on the CPU
IDLE_COLOR = "#EE6677"      # idle GPU gaps (shaded lightly)
ROOF_COLOR = "#333333"
CLASS_LABELS = {
    "compute": "compute-bound",
    "memory": "memory-bound",
    "launch": "launch-bound",
    "latency": "latency-bound",
    "unknown": "bound unknown",
}

RC = {
    "font.size": 10,
    "axes.titlesize": 12,
    "axes.labelsize": 10.5,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",
}


def class_color(cls: object) -> str:
    return CLASS_COLORS.get(str(cls), OTHER_COLOR)


def use_agg() -> None:
    """Draw off-screen (CLI, tests, CI): no display needed."""
    matplotlib.use("Agg", force=True)


def fmt_ns_axis(ns: float) -> str:
    """A compact time label for axis ticks and annotations."""
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3g} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"

"""Pictures of a profile: the roofline and the timeline, as matplotlib Figures.

    >>> import profkit, profkit.show.plots
    >>> prof = profkit.load("traces/micro_hinted.sqlite.xz")
    >>> fig = profkit.show.plots.roofline(prof, by="range")
    >>> fig.savefig("roofline.png")

Plotting stays out of the analysis: ``roofline_data`` / ``timeline_data`` return what is drawn,
``roofline`` / ``timeline`` draw it. Figures are built without pyplot (no display needed, no
global figure registry), so they work the same in a notebook, a script or CI.
"""
from profkit.show.plots.roofline import RooflineData, roofline, roofline_data
from profkit.show.plots.timeline import TimelineData, parse_time, timeline, timeline_data

__all__ = ["roofline", "roofline_data", "RooflineData", "timeline", "timeline_data", "TimelineData",
           "parse_time"]

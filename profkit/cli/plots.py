"""`profkit roofline`, `profkit timeline`, `profkit report` and `profkit export-perfetto`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import click

from profkit.cli.common import by_option, fail, load_options, one_line_errors, peaks_option, window_options
from profkit.errors import ProfkitError

IMAGE_SUFFIXES = {".png", ".svg", ".pdf"}


def _load(trace: str, peaks_file: Optional[str]):
    from profkit.api import load

    if not Path(trace).exists():
        raise ProfkitError(f"trace not found: {trace}")
    if Path(trace).is_dir():
        raise ProfkitError(f"{trace} is a directory; give an Nsight Systems .sqlite export")
    return load(trace, peaks=peaks_file, **load_options())


def _check_output(output: str, trace: str, suffixes: Optional[set[str]] = None) -> Path:
    out = Path(output)
    if out.exists() and os.path.samefile(out, trace):
        raise ProfkitError(f"refusing to write over the input trace {trace}; choose another -o file")
    if suffixes and out.suffix.lower() not in suffixes:
        raise ProfkitError(f"-o {output}: use a file ending in {', '.join(sorted(suffixes))}")
    if not out.parent.exists():
        raise ProfkitError(f"directory {out.parent} does not exist; create it or choose another -o file")
    if out.is_dir():
        raise ProfkitError(f"-o {output} is a directory; give a file name")
    return out


def _save(fig, out: Path) -> None:
    try:
        fig.savefig(out, dpi=100, bbox_inches="tight", pad_inches=0.15)
    except OSError as exc:
        raise ProfkitError(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(f"wrote {out}", err=True)


@click.command()
@click.argument("trace", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Picture to write: .png, .svg or .pdf.")
@by_option
@click.option("--top", type=click.IntRange(min=1), default=None, help="Only the N ops with the most GPU time.")
@click.option("--labels", type=click.IntRange(min=0), default=8, show_default=True,
              help="Label this many ops (the largest), without overlap.")
@peaks_option
@window_options
@one_line_errors
def roofline(trace: str, output: str, by: str, top: Optional[int], labels: int,
             peaks_file: Optional[str]) -> None:
    """Draw the roofline of TRACE: each op by arithmetic intensity and achieved FLOP/s under the
    GPU's memory roof and one compute roof per precision present."""
    from profkit.show.plots import roofline as draw, style

    style.use_agg()
    out = _check_output(output, trace, IMAGE_SUFFIXES)
    prof = _load(trace, peaks_file)
    fig = draw(prof, by=by, top=top, label_top=labels)
    _save(fig, out)
    d = fig.profkit_data
    n = len(d.points)
    click.echo(f"{n} op{'' if n == 1 else 's'} placed; not placed (no work counts): {len(d.not_placed)} ops",
               err=True)


@click.command()
@click.argument("trace", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Picture to write: .png, .svg or .pdf.")
@by_option
@click.option("--start", default=None, help="Window start, from the trace's first event: ns, or with a unit (1.5ms).")
@click.option("--end", default=None, help="Window end, from the trace's first event: ns, or with a unit (250ms).")
@click.option("--range", "range_name", default=None, help="Zoom to one instance of the NVTX range NAME.")
@click.option("--instance", type=int, default=1, show_default=True, help="With --range: which instance (1 = first).")
@peaks_option
@window_options
@one_line_errors
def timeline(trace: str, output: str, by: str, start: Optional[str], end: Optional[str],
             range_name: Optional[str], instance: int, peaks_file: Optional[str]) -> None:
    """Draw the timeline of TRACE: NVTX ranges and CUDA calls per CPU thread, kernels and copies
    per GPU stream coloured by their op's class, idle GPU time shaded."""
    from profkit.show.plots import style, timeline as draw
    from profkit.show.plots.timeline import parse_time

    style.use_agg()
    _check_window_options(start, end, range_name, instance, parse_time)
    out = _check_output(output, trace, IMAGE_SUFFIXES)
    prof = _load(trace, peaks_file)
    fig = draw(prof, by=by, start=start, end=end, range_name=range_name, instance=instance)
    _save(fig, out)


@click.command()
@click.argument("trace", type=click.Path())
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(),
              help="Directory to write the report into (created if missing).")
@click.option("--format", "fmt", type=click.Choice(["html", "markdown"]), default="html", show_default=True,
              help="html: DIR/index.html, one self-contained page; markdown: DIR/report.md with PNGs beside it.")
@by_option
@peaks_option
@window_options
@one_line_errors
def report(trace: str, out_dir: str, fmt: str, by: str, peaks_file: Optional[str]) -> None:
    """Write a report of TRACE: summary, top ops and next steps, roofline, timeline, full table."""
    from profkit.show import report as rep
    from profkit.show.plots import style

    style.use_agg()
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        fail(f"{out_dir} is a file; -o wants a directory for the report")
    prof = _load(trace, peaks_file)
    path = rep.build(prof, out_dir, fmt=fmt, by=by)
    click.echo(f"wrote {path}", err=True)


@click.command("export-perfetto")
@click.argument("trace", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="JSON file to write (open it in ui.perfetto.dev or chrome://tracing).")
@by_option
@click.option("--start", default=None, help="Only events from here (as for `profkit timeline`).")
@click.option("--end", default=None, help="Only events up to here (as for `profkit timeline`).")
@click.option("--range", "range_name", default=None, help="Only one instance of the NVTX range NAME.")
@click.option("--instance", type=int, default=1, show_default=True, help="With --range: which instance (1 = first).")
@peaks_option
@window_options
@one_line_errors
def export_perfetto(trace: str, output: str, by: str, start: Optional[str], end: Optional[str],
                    range_name: Optional[str], instance: int, peaks_file: Optional[str]) -> None:
    """Export the timeline of TRACE as Chrome trace-event JSON, with each GPU event's op, class
    and next step in its args."""
    from profkit.show import perfetto
    from profkit.show.plots.timeline import parse_time, resolve_window

    _check_window_options(start, end, range_name, instance, parse_time)
    _check_output(output, trace)
    prof = _load(trace, peaks_file)
    window = None
    if start is not None or end is not None or range_name is not None:
        w0, w1, *_ = resolve_window(prof, start, end, range_name, instance)
        window = (w0, w1)
    n = perfetto.write(prof, output, by=by, window=window)
    click.echo(f"wrote {output} ({n:,} events)", err=True)


def _check_window_options(start, end, range_name, instance, parse_time) -> None:
    if range_name is not None and (start is not None or end is not None):
        fail("give --range or --start/--end, not both")
    if range_name is None and instance != 1:
        fail("--instance needs --range NAME")
    for opt, val in (("--start", start), ("--end", end)):
        if val is not None:
            try:
                parse_time(val)
            except ProfkitError as exc:
                fail(f"{opt}: {exc}")

"""`profkit diff`: compare two traces op by op, with a verdict and a CI gate."""
from __future__ import annotations

import sys
from typing import Optional

import click

from profkit.cli.classify import table_width, write_output
from profkit.cli.common import by_option, fail, load_options, one_line_errors, peaks_option, warn, window_options

EXIT_GATE = 1


def _renames(pairs: tuple[str, ...]) -> dict:
    out = {}
    for p in pairs:
        old, sep, new = p.partition("=")
        if not sep or not old or not new:
            fail(f"--match takes BEFORE_OP=AFTER_OP, not {p!r}")
        out[old] = new
    return out


@click.command()
@click.argument("before", type=click.Path(dir_okay=True))
@click.argument("after", type=click.Path(dir_okay=True))
@by_option
@click.option("--match", "matches", multiple=True, metavar="BEFORE_OP=AFTER_OP",
              help="Compare BEFORE's op with a differently named AFTER op (repeatable), e.g. "
                   "--match eager_chain=graph_replay to compare two ranges of one trace.")
@click.option("--gate", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Exit 1 when any matched op (median per call) or the total regresses by more than "
                   "PCT percent and by more than its noise threshold; prints what regressed.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True, help="Output format.")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="Write to this file instead of standard output.")
@click.option("--before-also", "before_also", multiple=True, type=click.Path(dir_okay=False),
              metavar="TRACE", help="Another capture of the BEFORE program (repeatable): the run's "
              "wall time per iteration becomes the median over the captures, and its noise "
              "threshold covers how far they lie apart.")
@click.option("--after-also", "after_also", multiple=True, type=click.Path(dir_okay=False),
              metavar="TRACE", help="Another capture of the AFTER program (repeatable), likewise.")
@click.option("--wide", is_flag=True,
              help="Table: keep every column, however narrow the terminal (lines may then be wider "
                   "than the terminal).")
@peaks_option
@window_options
@one_line_errors
def diff(before: str, after: str, by: str, matches: tuple[str, ...], gate: Optional[float], fmt: str,
         output: Optional[str], peaks_file: Optional[str], before_also: tuple[str, ...],
         after_also: tuple[str, ...], wide: bool) -> None:
    """Compare the ops of two Nsight Systems SQLite traces, BEFORE and AFTER a change.

    Ops are matched by name (at --by range: the NVTX range name, so kernels that fusion renamed
    are compared through their range; the kernels removed or added inside it are listed). Per op:
    median GPU time per call and totals, the change against a noise threshold
    (max(3%, 2 x IQR/median of the calls)), class and kernels per call, and profkit's predicted
    speedup for BEFORE's op next to the measured one. Exit codes: 0 ok, 1 --gate tripped, 2 bad input.
    """
    # Imported here: `import profkit.cli` stays free of pandas (profkit classify reads its
    # trace while the analysis modules load).
    from profkit.api import load
    from profkit.compare import diff as diff_lib
    from profkit.show import render
    renames = _renames(matches)
    opts = dict(peaks=peaks_file, **load_options())
    res = diff_lib.diff(load(before, **opts), load(after, **opts), by=by, rename=renames,
                        before_also=[load(p, **opts) for p in before_also],
                        after_also=[load(p, **opts) for p in after_also])
    if fmt == "json":
        text = render.to_json(res.to_json())
    elif fmt == "markdown":
        text = diff_lib.to_markdown(res)
    else:
        text = diff_lib.to_table(res, console_width=table_width(output, wide), wide=wide)
    if fmt != "table":
        for w in res.warnings:
            warn(w)
    write_output(text, output, [before, after])
    if gate is not None:
        bad = res.regressions(gate)
        for line in bad:
            click.echo(f"profkit: gate: regression: {line}", err=True)
        if bad:
            sys.exit(EXIT_GATE)
        click.echo(f"profkit: gate: passed (nothing regressed by more than {gate:g}%)", err=True)

"""`profkit classify`: one row per op with its GPU time, bound class, evidence and next step."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

import click

from profkit import render
from profkit.api import load
from profkit.cli.common import by_option, fail, one_line_errors, output_options, peaks_option
from profkit.errors import ProfkitError

EXAMPLE = Path(__file__).resolve().parent.parent / "data" / "example.sqlite"


def write_output(text: str, output: Optional[str], inputs: list[str]) -> None:
    """Print, or write ``output``; refuse to overwrite an input trace."""
    if output is None:
        click.echo(text, nl=False)
        return
    out = Path(output)
    for src in inputs:
        if out.exists() and os.path.samefile(out, src):
            raise ProfkitError(f"refusing to write over the input trace {src}; choose another -o file")
    if out.parent and not out.parent.exists():
        raise ProfkitError(f"directory {out.parent} does not exist; create it or choose another -o file")
    try:
        out.write_text(text)
    except OSError as exc:
        raise ProfkitError(f"cannot write {out}: {exc.strerror}") from None
    click.echo(f"wrote {out}", err=True)


@click.command()
@click.argument("trace", required=False, type=click.Path(dir_okay=True))
@click.option("--example", is_flag=True, help="Classify the real H200 trace that ships with profkit.")
@by_option
@click.option("--innermost", is_flag=True,
              help="--by range: count each GPU activity only for the innermost range around its launch.")
@click.option("--top", type=click.IntRange(min=1), default=None, help="Show the N ops with the most GPU time.")
@output_options
@peaks_option
@one_line_errors
def classify(trace: Optional[str], example: bool, by: str, innermost: bool, top: Optional[int],
             fmt: str, output: Optional[str], peaks_file: Optional[str]) -> None:
    """Classify each op of an Nsight Systems SQLite TRACE as compute-, memory- or launch-bound.

    With no TRACE (or --example), classify the example trace that ships with profkit.
    """
    if trace is not None and example:
        fail("give a TRACE or --example, not both")
    path = str(EXAMPLE) if trace is None else trace
    prof = load(path, peaks=peaks_file)
    df = prof.ops(by=by, innermost=innermost, top=top)
    header = {"trace": Path(path).name, "gpu": prof.gpu.name,
              "total_gpu_time_ns": prof.trace.total_gpu_time_ns, "level": by,
              "warnings": prof.warnings,
              "peaks_source": f"{prof.peaks.source}; HBM {render.fmt_rate(prof.peaks.memory_bandwidth, 'B/s')}"}
    if fmt == "json":
        text = render.to_json(prof.report(by=by, innermost=innermost, top=top))
    elif fmt == "csv":
        text = render.to_csv(df)
    elif fmt == "markdown":
        text = render.to_markdown(df, header)
    else:
        width = shutil.get_terminal_size((200, 40)).columns if output is None else 200
        text = render.table(df, header, console_width=max(width, 120))
    if fmt != "table" or output is not None:
        pass
    for w in prof.warnings:
        if fmt != "table":
            click.echo(f"profkit: warning: {w}", err=True)
    write_output(text, output, [path])

"""`profkit classify`: one row per op with its GPU time, bound class, evidence and next step.

One TRACE file: that trace (unchanged output). Several files, or a directory of them: one trace
per rank, analysed in parallel and merged (profkit.compare.multirank; docs/multirank.md).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import click

from profkit.cli.common import (EXIT_USAGE, by_option, fail, load_options, numpy_without_hugepage_advice,
                                one_line_errors, output_options, peaks_option, warn, window_options)
from profkit.errors import ProfkitError
from profkit.read.text import one_line

# The class that profkit.judge.comm adds (NCCL collectives); render's table styles it like the others.

EXAMPLE = Path(__file__).resolve().parent.parent / "data" / "example.sqlite.xz"


def refuse_overwriting_inputs(out: Path, inputs: list) -> None:
    for src in inputs:
        if out.exists() and Path(src).exists() and os.path.samefile(out, src):
            raise ProfkitError(f"refusing to write over the input trace {src}; choose another -o file")


def table_width(output: Optional[str], wide: bool) -> int:
    """Columns for the table: the terminal's (or $COLUMNS; 80 fits), 200 into a file or a pipe;
    at least 200 with --wide."""
    width = shutil.get_terminal_size((200, 40)).columns if output is None else 200
    return max(width, 200) if wide else width


def write_output(text: str, output: Optional[str], inputs: list[str]) -> None:
    """Print, or write ``output``; refuse to overwrite an input trace."""
    if output is None:
        click.echo(text, nl=False)
        return
    out = Path(output)
    refuse_overwriting_inputs(out, inputs)
    if out.parent and not out.parent.exists():
        raise ProfkitError(f"directory {out.parent} does not exist; create it or choose another -o file")
    try:
        out.write_text(text)
    except OSError as exc:
        raise ProfkitError(f"cannot write {out}: {exc.strerror}") from None
    click.echo(f"wrote {out}", err=True)


@click.command()
@click.argument("trace", nargs=-1, type=click.Path(dir_okay=True))
@click.option("--example", is_flag=True, help="Classify the real H200 trace that ships with profkit.")
@by_option
@click.option("--innermost", is_flag=True,
              help="--by range: count each GPU activity only for the innermost range around its launch.")
@click.option("--top", type=click.IntRange(min=1), default=None, help="Show the N ops with the most GPU time.")
@output_options
@peaks_option
@window_options
@click.option("--wide", is_flag=True,
              help="Table: keep every column even when the terminal is narrow (the table may then "
                   "be wider than the terminal).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Several ranks: local worker processes (default: CPU count); 1 runs in this process.")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Several ranks: run on this Dask scheduler (tcp://host:8786), or 'local' to start "
                   "a LocalCluster here (--workers workers).")
@click.option("--shapes-from", "shapes_from", type=click.Path(dir_okay=False), default=None,
              metavar="ATEN_TRACE",
              help="A `capture --aten` trace of the same program: its GEMM shapes are used where "
                   "TRACE has none (kernels matched by name and launch shape), so TRACE keeps the "
                   "timing of a run without the recorder.")
@one_line_errors
def classify(trace: tuple[str, ...], example: bool, by: str, innermost: bool, top: Optional[int],
             fmt: str, output: Optional[str], peaks_file: Optional[str], wide: bool,
             workers: Optional[int], dask_address: Optional[str], shapes_from: Optional[str]) -> None:
    """Classify each op of an Nsight Systems SQLite TRACE as compute-, memory- or launch-bound.

    NCCL collectives get their own class, communication. With no TRACE (or --example),
    classify the example trace that ships with profkit.

    Several TRACE files (one per rank) or a directory of them: analyse each rank in parallel
    and merge: time per op across ranks, stragglers, and communication (NCCL) time, bus
    bandwidth and exposed time.
    """
    if trace and example:
        fail("give a TRACE or --example, not both")
    if len(trace) > 1 or (len(trace) == 1 and Path(trace[0]).is_dir()):
        if shapes_from:
            fail("--shapes-from takes one TRACE, not several ranks")
        _classify_ranks(list(trace), by, innermost, top, fmt, output, peaks_file, workers,
                        dask_address, wide)
        return
    path = str(EXAMPLE) if not trace else trace[0]
    numpy_without_hugepage_advice()
    # The trace's API table, its largest read, starts now: the analysis modules imported below
    # take about half a second, and SQLite reads on another core meanwhile.
    from profkit.read.runtime import prefetch
    prefetch(path)
    from profkit.api import load
    from profkit.show import render
    prof = load(path, peaks=peaks_file, shapes_from=shapes_from, **load_options())
    df = prof.ops(by=by, innermost=innermost, top=top)
    level = df.attrs.get("level", by)
    if fmt == "json":  # the report holds what the header would (made once, not twice)
        text = render.to_json(prof.report(by=level, innermost=innermost, top=top, ops=df))
    else:
        header = {"trace": Path(path).name, "gpu": prof.gpu.name,
                  "total_gpu_time_ns": prof.trace.total_gpu_time_ns, "level": level,
                  "warnings": prof.warnings + prof.notes, "run": prof.run_json(df),
                  "peaks_source": f"{prof.peaks.source}; HBM {render.fmt_rate(prof.peaks.memory_bandwidth, 'B/s')}"}
        if fmt == "csv":
            text = render.to_csv(df)
        elif fmt == "markdown":
            text = render.to_markdown(df, header)
        else:
            text = render.table(df, header, console_width=table_width(output, wide), wide=wide)
    for w in prof.warnings + prof.notes:  # stderr, so that stdout holds only the answer
        warn(w)
    write_output(text, output, [path])


def _classify_ranks(paths: list[str], by: str, innermost: bool, top: Optional[int], fmt: str,
                    output: Optional[str], peaks_file: Optional[str], workers: Optional[int],
                    dask_address: Optional[str], wide: bool = False) -> None:
    """Several ranks: merged output of the good ones; one error line per bad one, then exit 2."""
    from profkit.compare import multirank as mr
    from profkit.read.compressed import expand_inputs
    from profkit.show import render

    files = expand_inputs(paths)
    if output is not None:  # before the work, not only when writing
        refuse_overwriting_inputs(Path(output), files)
    cb, close = mr.progress_printer()
    try:
        res = mr.classify_ranks(files, by=by, innermost=innermost, top=top, peaks_file=peaks_file,
                                workers=workers, dask=dask_address, progress=cb, **load_options())
    finally:
        close()
    if res.good:
        if fmt == "json":
            text = render.to_json(res.report())
        elif fmt == "csv":
            text = mr.ops_csv(res)
        elif fmt == "markdown":
            text = mr.to_markdown(res)
        else:
            text = mr.to_table(res, console_width=table_width(output, wide), wide=wide)
        warned = set()
        for r in res.good:
            for w in r.warnings:
                if w not in warned and fmt != "table":
                    warned.add(w)
                    warn(w)
        write_output(text, output, [str(f) for f in files])
    for r in res.errors:
        where = "" if r.path in (r.error or "") else f" ({r.path})"  # the message names its file
        click.echo(f"profkit: error: rank {r.rank}{where}: {one_line(r.error)}", err=True)
    if res.errors:
        sys.exit(EXIT_USAGE)

"""The profkit command line: a thin layer over the library (one module per subcommand)."""
from __future__ import annotations

import sys

import click

from profkit import __version__


class _OneLineErrors(click.Group):
    """Click's usage errors (a bad option, a value out of range, a missing argument) as one line,
    ``profkit: error: WHAT (see `profkit CMD --help`)``, exit status 2, as profkit's own errors
    read; click prints three lines (the usage, a hint, the error) by default."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as exc:
            # bare `profkit`: the help, as click shows it (click 8.2+ raises this for it)
            if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                exc.show()
                sys.exit(exc.exit_code)
            # the subcommand's path under profkit's own name, whatever the program was called as
            sub = exc.ctx.command_path.split(" ", 1)[1:] if exc.ctx is not None else []
            where = " ".join(["profkit", *sub])
            click.echo(f"profkit: error: {exc.format_message()} (see `{where} --help`)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"profkit: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("profkit: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="profkit")
def main() -> None:
    """profkit: find out why your PyTorch GPU work is slow, and what to do next.

    \b
    profkit capture script.py      profile a script with Nsight Systems into an SQLite trace
    profkit classify trace.sqlite  one row per op: GPU time, bound class, evidence, next step
    profkit diff before after      what changed, and predicted vs measured speedups
    profkit report trace -o DIR    an HTML page with the roofline, the timeline and the table
    profkit rules [--explain CODE] the rules behind the advice
    """


def _register() -> None:
    # One module per subcommand (plots holds the four picture/report commands).
    from profkit.cli import capture, classify, diff, estimate, peaks, plots, rules

    for command in (classify.classify, capture.capture, diff.diff, estimate.estimate,
                    plots.report, plots.roofline, plots.timeline, plots.export_perfetto,
                    peaks.peaks, rules.rules):
        main.add_command(command)


_register()


def entry() -> None:
    """The ``profkit`` program: the allocator tuned for this process (which the command owns),
    then the command line, then a quick exit.

    Once the command has written its output, the interpreter's teardown would free every array
    and frame one by one (70 ms after a million-kernel classify) only for the process to end:
    the exit handlers run, the standard streams are flushed, and the process ends at once, as
    multiprocessing's children do. An error that escapes the command is raised as usual."""
    import atexit
    import os

    from profkit.cli.common import keep_freed_memory

    keep_freed_memory()
    try:
        main(prog_name="profkit")
        code = 0
    except SystemExit as exc:
        code = exc.code
    atexit._run_exitfuncs()
    if not isinstance(code, int):  # sys.exit("message"), as Python prints it
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)

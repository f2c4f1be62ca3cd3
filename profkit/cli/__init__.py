"""The profkit command line: a thin layer over the library (one module per subcommand)."""
from __future__ import annotations

import click

from profkit import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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

"""``profkit peaks``: measure this GPU's ceilings into a JSON file for ``classify --peaks``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from profkit.cli.common import fail, one_line_errors


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the JSON here (default: standard output).")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@one_line_errors
def peaks(output: Optional[str], force: bool) -> None:
    """Measure copy bandwidth, GEMM FLOP/s (bf16/fp16/tf32/fp32 at 8192^3) and the launch floor.

    Needs PyTorch and a CUDA GPU; takes about a minute. Use the file with
    `profkit classify --peaks FILE`.
    """
    if output and Path(output).exists() and not force:
        fail(f"output {output} exists; pass --force to replace it")
    from profkit.capture.measure_peaks import measure

    data = measure(say=lambda m: click.echo(m, err=True))
    text = json.dumps(data, indent=2) + "\n"
    if output:
        Path(output).write_text(text)
        click.echo(f"profkit peaks: wrote {output}", err=True)
    else:
        click.echo(text, nl=False)

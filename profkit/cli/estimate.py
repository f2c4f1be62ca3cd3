"""`profkit estimate`: the four decision calculations behind the advisor, on numbers you give.

Each subcommand calls the same function of profkit/judge/estimate.py that the advisor uses.
"""
from __future__ import annotations

import math
import click

from profkit.judge import estimate as est
from profkit.cli.common import fail


class _Number(click.ParamType):
    """A float or int; anything else is one line `profkit: error: ...` and exit 2."""

    def __init__(self, kind: type = float) -> None:
        self.kind = kind
        self.name = "integer" if kind is int else "number"

    def convert(self, value, param, ctx):
        if isinstance(value, self.kind):
            return value
        label = param.opts[0] if param is not None and param.opts else "--kernel-us"
        try:
            x = float(str(value))
        except ValueError:
            fail(f"{label}: {value!r} is not a number")
        if not math.isfinite(x):
            fail(f"{label}: {value!r} is not a finite number")
        if self.kind is int:
            if not x.is_integer():
                fail(f"{label}: {value!r} is not a whole number")
            return int(x)
        return x


NUMBER, INTEGER = _Number(float), _Number(int)


def _run(func, *args):
    """Call an estimate function; its ValueError on bad numbers becomes one line and exit 2."""
    try:
        return func(*args)
    except ValueError as exc:
        fail(str(exc))


def _g(x: float) -> str:
    return f"{x:g}"


def _ms(ms: float) -> str:
    """A duration given in milliseconds, in the unit that reads best."""
    if ms >= 1000.0:
        return f"{ms / 1000.0:g} s"
    if 0 < ms < 1.0:
        return f"{ms * 1000.0:g} us"
    return f"{ms:g} ms"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def estimate() -> None:
    """The decision calculations behind profkit's suggestions, on your numbers.

    \b
    profkit estimate fusion --kernel-us 40 40 40 --launch-us 5 --fused-us 70
    profkit estimate programs -n 1000000 --block 1024
    profkit estimate amdahl --share 0.25 --speedup 4
    profkit estimate autotune --configs 12 --runs 20 --ms 0.2 --saved-us 5 --calls 1000000
    """


@estimate.command(context_settings={"ignore_unknown_options": True})
@click.option("--kernel-us", "kernel_us", type=str, required=True, metavar="US [US ...]",
              help="Duration of each kernel to fuse, in microseconds (several values, or comma-separated).")
@click.argument("more_kernel_us", nargs=-1, type=str, metavar="")
@click.option("--launch-us", type=NUMBER, required=True,
              help="Launch cost (gap between kernels) per kernel, in microseconds.")
@click.option("--fused-us", type=NUMBER, required=True,
              help="Expected duration of the one fused kernel, in microseconds.")
def fusion(kernel_us: str, more_kernel_us: tuple[str, ...], launch_us: float, fused_us: float) -> None:
    """Upper bound of fusing kernels into one.

    (sum of kernels + one launch each) / (fused kernel + one launch). Example:
    three 40 us kernels with 5 us launches, fused into one 70 us kernel: 135/75 = 1.80x.
    """
    for t in more_kernel_us:
        if t.startswith("--"):
            fail(f"no such option: {t}")
    tokens = [t for s in (kernel_us, *more_kernel_us) for t in s.split(",") if t.strip()]
    kernels = [NUMBER.convert(t.strip(), None, None) for t in tokens]
    for k in kernels:
        if k <= 0:
            fail(f"--kernel-us: kernel times must be positive, not {k:g}")
    s = _run(est.fusion_ceiling, kernels, launch_us, fused_us)
    n = len(kernels)
    unfused = sum(kernels) + launch_us * n
    fused = fused_us + launch_us
    click.echo(f"unfused: {n} kernels, {_g(sum(kernels))} us + {n} x {_g(launch_us)} us launch = {_g(unfused)} us")
    click.echo(f"fused:   1 kernel, {_g(fused_us)} us + 1 x {_g(launch_us)} us launch = {_g(fused)} us")
    click.echo(f"fusion ceiling: {_g(unfused)}/{_g(fused)} = {s:.2f}x")
    click.echo("(an upper bound: it holds only if the fused kernel really runs in "
               f"{_g(fused_us)} us; measure it)")


@estimate.command()
@click.option("-n", "n", type=INTEGER, required=True, help="Number of elements (1-D launch).")
@click.option("--block", type=INTEGER, required=True, help="BLOCK_SIZE: elements per program.")
def programs(n: int, block: int) -> None:
    """Programs a 1-D Triton launch needs: ceil(n / BLOCK); the last one is partly masked."""
    pc = _run(est.triton_programs, n, block)
    click.echo(f"programs: ceil({n} / {block}) = {pc.programs}")
    click.echo(f"last program: {pc.last_program_lanes} of {block} lanes live, {pc.masked_lanes} masked")


@estimate.command()
@click.option("--share", type=NUMBER, required=True,
              help="Share of the run's time spent in the op (0..1).")
@click.option("--speedup", type=NUMBER, required=True, help="How many times faster the op gets (> 0).")
def amdahl(share: float, speedup: float) -> None:
    """Whole-run speedup when a share of the time gets faster (Amdahl's law).

    1 / ((1 - share) + share / speedup). Example: an op at 25% made 4x faster is 1.23x overall.
    """
    s = _run(est.amdahl, share, speedup)
    click.echo(f"end to end: 1 / ((1 - {_g(share)}) + {_g(share)} / {_g(speedup)}) = {s:.2f}x")
    limit = "unbounded" if share >= 1.0 else f"{est.amdahl(share, math.inf):.2f}x"
    click.echo(f"limit with the op made infinitely fast: {limit}")


@estimate.command()
@click.option("--configs", type=INTEGER, required=True, help="Autotune configurations tried.")
@click.option("--runs", type=INTEGER, required=True, help="Benchmark runs per configuration.")
@click.option("--ms", "ms", type=NUMBER, required=True, help="Time of one benchmark run, in milliseconds.")
@click.option("--saved-us", type=NUMBER, required=True,
              help="Time the tuned kernel saves per call, in microseconds (> 0).")
@click.option("--calls", type=INTEGER, required=True, help="Calls over which the tuning pays back.")
def autotune(configs: int, runs: int, ms: float, saved_us: float, calls: int) -> None:
    """Is autotuning worth it? Tuning costs configs x runs x time; it pays back per call."""
    a = _run(est.autotune_amortisation, configs, runs, ms, saved_us, calls)
    click.echo(f"tuning: {configs} configs x {runs} runs x {_g(ms)} ms = {_ms(a.tuning_ms)}")
    click.echo(f"saved: {_g(saved_us)} us x {calls} calls = {_ms(a.saved_ms)}")
    click.echo(f"break-even: {a.break_even_calls} calls")
    if a.worth_it:
        click.echo(f"worth it: {_ms(a.tuning_ms)} of tuning saves {_ms(a.saved_ms)}")
    else:
        click.echo(f"not worth it: {_ms(a.tuning_ms)} of tuning saves only {_ms(a.saved_ms)}")

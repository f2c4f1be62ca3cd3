"""``profkit capture``: profile a script into an SQLite trace that ``profkit classify`` reads."""
from __future__ import annotations

import sys
from typing import Optional

import click

from profkit.cli.common import fail, one_line_errors
from profkit.model import Switch

_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False,
            "help_option_names": ["-h", "--help"]}


def _say(msg: str) -> None:
    if sys.stderr.isatty():
        from rich.console import Console
        Console(stderr=True, highlight=False, soft_wrap=True).print(msg, markup=False)
    else:
        click.echo(msg, err=True)


def _command_line(output, force, nsys_args, aten, ncu, ncu_range, ncu_count, ncu_args, script,
                  script_args, gpu_metrics_hz=None, aten_source="recorder",
                  calibrate=True, calibrate_runs=1, max_iterations=None, trials=None,
                  try_runs=2, try_timeout=None, replacements=True, try_budget=None,
                  try_alternate=True) -> list[str]:
    argv = ["profkit", "capture"]
    if output:
        argv += ["-o", output]
    argv += ["--force"] if force else []
    argv += [] if calibrate else ["--no-calibrate"]
    argv += ["--calibrate-runs", str(calibrate_runs)] if calibrate and calibrate_runs != 1 else []
    argv += [] if replacements else ["--no-replacements"]
    argv += ["--max-iterations", str(max_iterations)] if max_iterations else []
    if trials is not None:
        argv += [f"--try={trials}"] + (["--try-runs", str(try_runs)] if try_runs != 2 else [])
        argv += ["--try-timeout", f"{try_timeout:g}"] if try_timeout else []
        argv += ["--try-budget", f"{try_budget:g}"] if try_budget else []
        argv += [] if try_alternate else ["--try-separate"]
    argv += ["--nsys-args", nsys_args] if nsys_args else []
    argv += ["--aten"] if aten else []
    argv += ["--aten-source", aten_source] if aten and aten_source != "recorder" else []
    argv += ["--gpu-metrics", "--gpu-metrics-frequency", str(gpu_metrics_hz)] if gpu_metrics_hz else []
    if ncu:
        argv += ["--ncu"] + (["--ncu-count", str(ncu_count)] if ncu_count else [])
        argv += ["--ncu-range", ncu_range] if ncu_range else []
        argv += ["--ncu-args", ncu_args] if ncu_args else []
    return [*argv, script, *script_args]


def _is_script(value: str) -> bool:
    """Whether --try's value is the script (``--try train.py``) rather than switches."""
    from pathlib import Path

    from profkit.model import parse_trial
    if value == "auto":
        return False
    try:
        [parse_trial(t) for t in value.split(",") if t.strip()]
        return False
    except ValueError:
        return value.endswith(".py") or Path(value).is_file()


def _auto_trials(trace) -> list[str]:
    """``--try auto``: the trials behind the rules that fired on the profiled trace (the
    analysis of `profkit classify`, profkit.judge.trials.auto_trials)."""
    from profkit.api import load
    from profkit.judge.trials import auto_trials
    prof = load(trace)
    return auto_trials(prof.findings(), prof, prof.run())


@click.command(context_settings=_CONTEXT)
@click.option("-o", "--output", type=click.Path(), default=None,
              help="Trace to write (.sqlite added). Default: traces/STEM.sqlite when ./traces "
                   "exists, else ./STEM.sqlite. The .nsys-rep is kept beside it.")
@click.option("--force", is_flag=True,
              help="Replace existing output files. With --merge-ncu: also merge when no kernel, or "
                   "fewer kernels than the counters already there, match, and merge only the "
                   "ncu/nsys pairs that line up when some do not (otherwise refused).")
@click.option("--nsys-args", default=None, metavar="TEXT",
              help='Extra nsys profile flags, shell-split: --nsys-args "--delay 5".')
@click.option("--aten", is_flag=True,
              help="One NVTX range per aten:: op (for classify --by aten): with profkit's "
                   "recorder, its input shapes, element types, contiguity and cost-changing "
                   "arguments (is_causal, dim, out=).")
@click.option("--aten-source", type=click.Choice(["recorder", "emit_nvtx"]), default="recorder",
              show_default=True,
              help="What writes the --aten ranges: profkit's recorder, or "
                   "torch.autograd.profiler.emit_nvtx(record_shapes=True) (shapes only).")
@click.option("--ncu", is_flag=True,
              help="Add a second run under Nsight Compute and merge per-kernel counters "
                   "(FLOPs per precision, DRAM bytes, throughputs) into the trace.")
@click.option("--ncu-range", default=None, metavar="NAME",
              help="Profile with ncu only kernels inside this NVTX push/pop range "
                   "(ncu --nvtx-include NAME/; 'regex:PATTERN' works too).")
@click.option("--ncu-count", type=int, default=None,
              help="Profile at most this many kernels with ncu (default: one whole iteration of "
                   "the script's repeated top-level NVTX range, else 200).")
@click.option("--gpu-metrics", is_flag=True,
              help="Sample GPU metrics (DRAM, SM, tensor activity) on device 0 during the nsys "
                   "pass: measured utilisation per op without replay. Costs about 0.2 M rows "
                   "(~7 MB of SQLite) per second at 10 kHz.")
@click.option("--gpu-metrics-frequency", type=int, default=10_000, show_default=True,
              help="Samples per second for --gpu-metrics.")
@click.option("--ncu-args", default=None, metavar="TEXT", help="Extra ncu flags, shell-split.")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="First run the script once without any profiler, timing its top-level NVTX "
                   "ranges, so predictions are for the program as it runs unprofiled (the "
                   "profiler slows the host by 20-70%).")
@click.option("--replacements/--no-replacements", default=True, show_default=True,
              help="Record the shapes of the ops the replacement rules need during the first "
                   "calibration run (one iteration) and time their replacements at those shapes "
                   "(SDPA, fused optimizer, cuDNN RNN, pinned copies, TF32/bf16 GEMMs) in a short "
                   "process of its own: about 1 s a shape, at most 2 minutes; needs CUDA.")
@click.option("--calibrate-runs", type=click.IntRange(1, 20), default=1, show_default=True,
              metavar="N",
              help="Run the script N times without the profiler and calibrate to the median run: "
                   "on a machine whose speed changes from run to run (a shared or virtual host), "
                   "one run can be off by 30% or more; the spread of the N runs is reported.")
@click.option("--max-iterations", type=int, default=None, metavar="N",
              help="End every run of the script (calibration, profiled, trials) cleanly after N "
                   "iterations of its step range (the top-level NVTX range it repeats): "
                   "SystemExit(0) once the Nth one closes, so a run costs seconds, not the "
                   "program's length. At least 5.")
@click.option("--try", "trials", is_flag=False, flag_value="auto", default=None,
              metavar="[auto|SWITCH,...]",
              help="After profiling, run the script again once per trial with one fix applied by "
                   "profkit (no edit of your code) and time it beside runs of the script as it is: "
                   f"{', '.join(s.value for s in Switch)} "
                   "(several at once "
                   "joined by +). auto (the default): the switches behind the rules that fired. "
                   "The script runs again, with its side effects (checkpoints, logs).")
@click.option("--try-runs", type=click.IntRange(1, 20), default=2, show_default=True, metavar="K",
              help="Runs per trial, each round followed by a run of the unchanged script.")
@click.option("--try-timeout", type=float, default=None, metavar="SECONDS",
              help="The most one trial run may take (default: 300 s plus ten times the "
                   "calibration run); a run that takes longer is stopped and its trial recorded "
                   "as timed out.")
@click.option("--try-budget", type=float, default=None, metavar="SECONDS",
              help="Start no trial run once the trials have taken this long (the run under way "
                   "finishes, then the baseline that closes its round); the trials left are "
                   "recorded as not run. Bounds the time --try auto adds where many rules fire.")
@click.option("--try-alternate/--try-separate", "try_alternate", default=True, show_default=True,
              help="A trial whose switches can be turned off and on while the script runs (tf32, "
                   "bf16, compile, compile_graphs, compile_frozen, inference_mode, cudnn_benchmark, no_empty_cache, "
                   "fused_optim) "
                   "alternates with the script unchanged in blocks of iterations inside one run, "
                   "twice as long, so that both are timed in the same process (separate runs of "
                   "one program can differ in host speed by 1.5x); --try-separate times it in runs "
                   "of its own, as the other trials are.")
@click.option("--merge-ncu", "merge_csv", type=click.Path(dir_okay=False), default=None,
              metavar="RAW.csv",
              help="Do not run anything: merge an ncu raw-page CSV into the existing trace "
                   "given as SCRIPT (profkit capture --merge-ncu RAW.csv TRACE.sqlite [-o COPY]).")
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@one_line_errors
def capture(output: Optional[str], force: bool, nsys_args: Optional[str], aten: bool,
            aten_source: str, ncu: bool,
            ncu_range: Optional[str], ncu_count: Optional[int], gpu_metrics: bool,
            gpu_metrics_frequency: int, ncu_args: Optional[str], calibrate: bool,
            calibrate_runs: int, max_iterations: Optional[int], trials: Optional[str],
            try_runs: int, try_timeout: Optional[float], try_budget: Optional[float],
            try_alternate: bool, replacements: bool, merge_csv: Optional[str],
            script: Optional[str], script_args: tuple[str, ...]) -> None:
    """Profile SCRIPT (with its ARGS) under Nsight Systems into an SQLite trace.

    \b
      profkit capture train.py --epochs 1
      profkit capture --aten -o traces/step.sqlite train.py
      profkit capture --ncu --ncu-range step train.py
      profkit capture --merge-ncu step.ncu.csv traces/step.sqlite
      profkit capture --try --max-iterations 30 train.py

    Options go before SCRIPT; everything after it is passed to the script. The script's own
    output is shown as it runs, and its exit status becomes profkit's.
    """
    from profkit.capture import runner as cap

    if trials is not None and _is_script(trials):  # `--try train.py`: --try without a value
        script_args = (script, *script_args) if script is not None else script_args
        script, trials = trials, "auto"
    if script is None:
        fail("missing SCRIPT: profkit capture [OPTIONS] SCRIPT [ARGS]...")

    if merge_csv is not None:
        if script_args:
            fail(f"--merge-ncu takes one trace, not {' '.join((script, *script_args))}")
        target, summary = cap.merge_existing(merge_csv, script, output, force, ncu_range)
        click.echo(f"profkit: {summary}; wrote {target}", err=True)
        return
    hz = gpu_metrics_frequency if gpu_metrics else None
    result = cap.capture(script, list(script_args), output=output, force=force,
                         nsys_args=nsys_args, aten=aten, ncu=ncu, ncu_range=ncu_range,
                         ncu_count=ncu_count, ncu_args=ncu_args, gpu_metrics_hz=hz,
                         aten_source=aten_source, say=_say, calibrate=calibrate,
                         calibrate_runs=calibrate_runs, max_iterations=max_iterations,
                         trials=trials, try_runs=try_runs, try_timeout=try_timeout,
                         try_budget=try_budget, choose_trials=_auto_trials,
                         replacements=replacements, try_alternate=try_alternate,
                         command_line=_command_line(output, force, nsys_args, aten, ncu, ncu_range,
                                                    ncu_count, ncu_args, script, script_args, hz,
                                                    aten_source, calibrate, calibrate_runs,
                                                    max_iterations, trials, try_runs, try_timeout,
                                                    replacements, try_budget, try_alternate))
    for note in result.notes:
        _say(f"profkit: {note}")
    if result.trace is None:
        _say("profkit: interrupted in the calibration run, before profiling: nothing was captured")
        sys.exit(result.exit_code or 130)
    extra = ", ".join(str(p) for k, p in result.files.items() if k != "sqlite")
    _say(f"profkit: wrote {result.trace}" + (f" (and {extra})" if extra else ""))
    if result.interrupted:
        _say(f"profkit: interrupted: {result.trace} holds what ran until then")
    elif result.exit_code != 0:
        _say(f"profkit: the script exited with status {result.exit_code}; "
             f"{result.trace} holds what ran until then")
    if result.exit_code != 0:
        sys.exit(result.exit_code)

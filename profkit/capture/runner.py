"""``profkit capture``: run a Python script under Nsight Systems (and optionally Nsight Compute).

Pass 1 (always)::

    nsys profile -t cuda,nvtx,cublas,cudnn -s none --cpuctxsw none --cuda-graph-trace=node \\
        --export sqlite -o DIR/.STEM.profkit-tmp-PID [--nsys-args …] \\
        PYTHON -m profkit.capture.bootstrap [--aten=recorder|emit_nvtx] --exit-code-file F -- script.py args…

Pass 2 (``--ncu``)::

    ncu --clock-control none --target-processes all --nvtx [--nvtx-include RANGE/] \\
        --launch-count N --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \\
        --metrics <NCU_METRICS> --export DIR/.STEM.profkit-tmp-PID --force-overwrite \\
        [--ncu-args …] PYTHON -m profkit.capture.bootstrap … script.py args…
    ncu --import DIR/.STEM.profkit-tmp-PID.ncu-rep --csv --page raw --print-units base \\
        --print-kernel-base demangled > STEM.ncu.csv

``--gpu-metrics`` adds ``--gpu-metrics-devices=0 --gpu-metrics-frequency=F`` to pass 1 (default
10 kHz; see :mod:`profkit.judge.gpu_metrics` for what it costs).

Without ``--ncu-range``, pass 2 profiles one complete steady-state iteration when the script
has a repeated top-level NVTX range (``step``, ``iteration``...): the nsys pass names the
instance (the second-to-last: the first is warm-up) and the kernels launched before it and in
it, from every thread (backward runs on autograd's own thread, outside the range's per-thread
NVTX stack), so ncu gets ``--launch-skip K --launch-count M`` and the merge only considers
that instance's kernels. Without such a range it profiles the first ``--ncu-count`` kernels.

Everything is written under temporary names beside the output and renamed at the end:
``STEM.sqlite`` (+ ``PROFKIT_META``, ``PROFKIT_NCU_METRICS``), ``STEM.nsys-rep`` and, with
``--ncu``, ``STEM.ncu-rep`` and ``STEM.ncu.csv``.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from profkit import __version__
from profkit.errors import ProfkitError
from profkit.capture import nsys_locate
from profkit.read.compressed import decompressed, is_compressed
from profkit.capture.ncu_merge import (NCU_METRICS, NCU_SECTIONS, TENSOR_METRICS, merge_ncu,
                                ncu_range_expression, read_raw_csv, write_meta)

NSYS_TRACE_FLAGS = ["-t", "cuda,nvtx,cublas,cudnn", "-s", "none", "--cpuctxsw", "none",
                    "--cuda-graph-trace=node"]
DEFAULT_NCU_COUNT = 200
# A top-level NVTX range repeated at least this often is taken as the script's iteration.
HEARTBEAT_S = 30.0
# --max-iterations at least this: three of a run's periods are warm-up, one is timed
MIN_ITERATIONS = 5
INTERRUPT_GRACE_S = 300.0

QDSTRM_MESSAGE = (
    "nsys wrote only {qdstrm} and no .nsys-rep: its importer (QdstrmImporter) could not run "
    "(\"Unable to retrieve the importer version\" usually means libdw.so.1 is missing). "
    "Install it (`apt-get install libdw1`, or put a libdw.so.1 on LD_LIBRARY_PATH) and capture "
    "again, or convert by hand with `QdstrmImporter -i {qdstrm}` then "
    "`nsys export --type sqlite`"
)

Say = Callable[[str], None]


def _default_say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- inputs ---------------------------------------------------------------------------------------
def check_script(script: str | Path) -> Path:
    """The script as a Path, or a ProfkitError: not found, a directory, not Python."""
    p = Path(script)
    if not p.exists():
        raise ProfkitError(f"script not found: {script}")
    if p.is_dir():
        raise ProfkitError(f"{script} is a directory, not a Python script")
    if p.suffix == ".py":
        return p
    try:
        head = p.open("rb").read(256)
    except OSError as exc:
        raise ProfkitError(f"cannot read script {script}: {exc.strerror or exc}") from None
    first = head.split(b"\n", 1)[0]
    if first.startswith(b"#!") and b"python" in first:
        return p
    raise ProfkitError(f"{script} is not a Python script: expected a .py file "
                       "(or a file starting with a #!...python line)")


def resolve_output(script: Path, output: Optional[str | Path], cwd: Optional[Path] = None) -> Path:
    """The ``.sqlite`` path: ``-o`` (``.sqlite`` added; a directory gets ``STEM.sqlite``), else
    ``traces/STEM.sqlite`` when ``./traces`` exists, else ``./STEM.sqlite``."""
    cwd = Path.cwd() if cwd is None else cwd
    if output is None:
        base = cwd / "traces" if (cwd / "traces").is_dir() else cwd
        return base / f"{script.stem}.sqlite"
    out = Path(output)
    if str(output).endswith(os.sep) or out.is_dir():
        return out / f"{script.stem}.sqlite"
    if out.suffix == ".sqlite":
        return out
    if out.suffix in (".nsys-rep", ".qdrep"):
        return out.with_suffix(".sqlite")
    return out.with_name(out.name + ".sqlite")


def companions(out: Path) -> dict[str, Path]:
    stem = out.name[: -len(".sqlite")] if out.name.endswith(".sqlite") else out.name
    d = out.parent
    return {"sqlite": out, "nsys-rep": d / f"{stem}.nsys-rep", "ncu-rep": d / f"{stem}.ncu-rep",
            "ncu-csv": d / f"{stem}.ncu.csv"}


def check_output(out: Path, force: bool, with_ncu: bool) -> None:
    """Refuse to overwrite without --force; the folder must exist and be writable."""
    files = companions(out)
    keys = ["sqlite", "nsys-rep"] + (["ncu-rep", "ncu-csv"] if with_ncu else [])
    if not force:
        for k in keys:
            if files[k].exists():
                raise ProfkitError(f"output {files[k]} exists; pass --force to replace it "
                                   "or -o to name another")
    d = out.parent
    if not d.exists():
        raise ProfkitError(f"output directory {d} does not exist")
    if not d.is_dir():
        raise ProfkitError(f"output directory {d} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".profkit-probe-", dir=str(d))
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ProfkitError(f"output directory {d} is not writable ({exc.strerror or exc})") from None


def split_extra(text: Optional[str | Sequence[str]], option: str) -> list[str]:
    if not text:
        return []
    if not isinstance(text, str):
        return [str(t) for t in text]
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ProfkitError(f"{option}: cannot split {text!r} ({exc})") from None


# --- commands -------------------------------------------------------------------------------------
def _profkit_root() -> str:
    return str(Path(__file__).resolve().parents[2])


ATEN_SOURCES = ("recorder", "emit_nvtx")


def script_command(python: str, script: Path, args: Sequence[str], aten: bool,
                   exit_code_file: Path, aten_source: str = "recorder",
                   max_iterations: Optional[int] = None, step: Optional[str] = None) -> list[str]:
    flag = ["--aten"] if aten_source == "recorder" else [f"--aten={aten_source}"]
    return [python, "-m", "profkit.capture.bootstrap", *(flag if aten else []),
            "--exit-code-file", str(exit_code_file), *cut_flags(max_iterations, step), "--",
            str(script), *args]


def cut_flags(max_iterations: Optional[int], step: Optional[str]) -> list[str]:
    """The bootstrap's flags that end a run after ``max_iterations`` iterations of ``step``."""
    if not max_iterations:
        return []
    return ["--max-iterations", str(max_iterations), *(["--step", step] if step else [])]


def gpu_metrics_flags(frequency_hz: Optional[int]) -> list[str]:
    """nsys flags for GPU-metrics sampling of device 0 at ``frequency_hz`` (None: off)."""
    if not frequency_hz:
        return []
    return ["--gpu-metrics-devices=0", f"--gpu-metrics-frequency={int(frequency_hz)}"]


def build_nsys_command(nsys: str, out_base: Path, app: Sequence[str],
                       extra: Sequence[str] = (), gpu_metrics_hz: Optional[int] = None) -> list[str]:
    """The nsys argv (no shell): profile with SQLite export to ``out_base``.{nsys-rep,sqlite}."""
    return [nsys, "profile", *NSYS_TRACE_FLAGS, *gpu_metrics_flags(gpu_metrics_hz), "--export",
            "sqlite", "-o", str(out_base), *extra, *app]


@dataclass(frozen=True)
class Iteration:
    """One instance of the script's repeated top-level NVTX range, as ncu should profile it."""
    name: str
    index: int          # which instance (0-based) of ``instances``
    instances: int
    start: int          # ns, the range on the thread that pushed it
    end: int
    skip: int           # kernels launched (any thread) before ``start``
    count: int          # kernels launched (any thread) in [start, end]


def choose_iteration(sqlite_path: str | Path) -> Optional[Iteration]:
    """The steady-state iteration to profile with ncu, from the nsys pass (see module doc).

    The iterations are the ones the analysis judges (profkit.run.window: the repeated top-level
    range of the main thread); the instance is the second-to-last (the first carries warm-up,
    the last may be cut short). Kernels are counted in launch order over all threads, so the
    autograd thread's backward kernels are inside ``skip``/``count`` too."""
    import numpy as np

    from profkit.read.trace import Trace
    from profkit.run.window import iteration_instances

    try:
        trace = Trace(sqlite_path)
        found = iteration_instances(trace)
    except ProfkitError:
        return None
    if found is None:
        return None
    name, inst = found
    i = len(inst) - 2 if len(inst) >= 3 else len(inst) - 1
    start, end = int(inst["start"].iat[i]), int(inst["end"].iat[i])
    acts = trace.activities
    t = np.sort(acts.loc[acts["kind"] == "kernel", "api_start"].dropna().to_numpy())
    skip = int(np.searchsorted(t, start, side="left"))
    count = int(np.searchsorted(t, end, side="right")) - skip
    return Iteration(name, i, len(inst), start, end, skip, count) if count > 0 else None


def build_ncu_command(ncu: str, report_base: Path, app: Sequence[str],
                      ncu_range: Optional[str] = None, count: int = DEFAULT_NCU_COUNT,
                      metrics: Sequence[str] = tuple(NCU_METRICS),
                      extra: Sequence[str] = ()) -> list[str]:
    nvtx = ["--nvtx"]
    if ncu_range:
        nvtx += ["--nvtx-include", ncu_range_expression(ncu_range)]
    sections: list[str] = []
    for s in NCU_SECTIONS:
        sections += ["--section", s]
    return [ncu, "--clock-control", "none", "--target-processes", "all", *nvtx,
            "--launch-count", str(count), *sections, "--metrics", ",".join(metrics),
            "--export", str(report_base), "--force-overwrite", *extra, *app]


def build_ncu_export_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base",
            "--print-kernel-base", "demangled"]


def available_metrics(ncu: str, wanted: Sequence[str]) -> list[str]:
    """``wanted`` less the tensor-core counters ``ncu --query-metrics`` says this GPU lacks
    (all of them when the query fails, so a failed query never drops a counter)."""
    try:
        res = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return list(wanted)
    names = {ln.split()[0] for ln in res.stdout.splitlines() if ln.strip() and "__" in ln.split()[0]}
    if res.returncode != 0 or len(names) < 20:
        return list(wanted)
    # only the per-architecture tensor counters vary; the rest exist on every GPU ncu supports
    return [m for m in wanted if m not in TENSOR_METRICS or m.split(".")[0] in names]


# --- running --------------------------------------------------------------------------------------
@dataclass
class PassResult:
    returncode: int
    elapsed_s: float
    interrupted: bool = False


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = _profkit_root()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        parts.append(root)  # last: profkit's bootstrap is importable, the user's modules win
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def run_pass(cmd: Sequence[str], label: str, say: Say, heartbeat: Optional[float] = None) -> PassResult:
    """Run ``cmd`` with the terminal's stdin/stdout/stderr; Ctrl-C lets the tool stop cleanly."""
    say(f"profkit: {label}: {shlex.join(cmd)}")
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(list(cmd), env=_child_env())
    except OSError as exc:
        raise ProfkitError(f"cannot run {cmd[0]}: {exc.strerror or exc}") from None
    stop = threading.Event()
    if heartbeat is None:
        heartbeat = HEARTBEAT_S if sys.stderr.isatty() else 0
    if heartbeat:
        def beat() -> None:
            while not stop.wait(heartbeat):
                say(f"profkit: {label}: still running, {time.monotonic() - t0:.0f} s")
        threading.Thread(target=beat, daemon=True).start()
    interrupted = False
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                if interrupted:  # second Ctrl-C: stop waiting for a clean shutdown
                    say(f"profkit: {label}: interrupted again, killing it")
                    proc.kill()
                    rc = proc.wait()
                    break
                interrupted = True
                say(f"profkit: {label}: interrupted; letting it stop and write what it has "
                    "(Ctrl-C again to kill)")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2.0)
                if proc.poll() is None:
                    with contextlib.suppress(OSError):
                        proc.send_signal(signal.SIGINT)
    finally:
        stop.set()
    elapsed = time.monotonic() - t0
    say(f"profkit: {label}: finished in {elapsed:.1f} s (exit status {rc})")
    return PassResult(rc, elapsed, interrupted)


def _read_exit_code(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().strip().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_cut(path: Path) -> str:
    """The bootstrap's ``cut after N NAME`` (its exit-code file's second line), or ''."""
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return ""
    return lines[1].strip() if len(lines) > 1 else ""


@dataclass
class CaptureResult:
    trace: Optional[Path]
    exit_code: int
    files: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False


def _nsys_sqlite(nsys: str, base: Path, say: Say, keep_as: Optional[Path] = None) -> Path:
    """The SQLite that pass 1 left, exporting it from the .nsys-rep when needed."""
    sqlite = base.with_name(base.name + ".sqlite")
    rep = base.with_name(base.name + ".nsys-rep")
    qdstrm = base.with_name(base.name + ".qdstrm")
    if sqlite.is_file() and sqlite.stat().st_size > 0:
        return sqlite
    if rep.is_file():
        cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
               "-o", str(sqlite), str(rep)]
        res = run_pass(cmd, "nsys export", say, heartbeat=0)
        if res.returncode == 0 and sqlite.is_file():
            return sqlite
        raise ProfkitError(f"nsys export could not turn {rep} into SQLite (exit status "
                           f"{res.returncode}); see its messages above")
    if qdstrm.is_file():
        final = keep_as if keep_as is not None else qdstrm
        with contextlib.suppress(OSError):
            os.replace(qdstrm, final)
        raise ProfkitError(QDSTRM_MESSAGE.format(qdstrm=final if final.exists() else qdstrm))
    raise ProfkitError("nsys wrote no report; see its messages above")


def capture(script: str | Path, script_args: Sequence[str] = (), *, output: Optional[str | Path] = None,
            force: bool = False, nsys_args: Optional[str | Sequence[str]] = None, aten: bool = False,
            ncu: bool = False, ncu_range: Optional[str] = None,
            ncu_count: Optional[int] = None, ncu_args: Optional[str | Sequence[str]] = None,
            gpu_metrics_hz: Optional[int] = None, aten_source: str = "recorder",
            python: Optional[str] = None, say: Say = _default_say,
            command_line: Optional[Sequence[str]] = None, calibrate: bool = True,
            calibrate_runs: int = 1, max_iterations: Optional[int] = None,
            trials: Optional[str | Sequence[str]] = None, try_runs: int = 2,
            try_timeout: Optional[float] = None, try_budget: Optional[float] = None,
            choose_trials: Optional[Callable[[Path], list[str]]] = None,
            replacements: bool = True, try_alternate: bool = True) -> CaptureResult:
    """Profile ``script`` and leave ``STEM.sqlite`` (+ ``.nsys-rep``); see the module docstring.

    ``calibrate``: first run the script with no profiler attached (``calibrate_runs`` times),
    timing its top-level NVTX ranges (profkit.capture.calibrate); the times go into the trace's
    PROFKIT_META as ``calibration`` (several runs as ``{"runs": [...]}``), so the step model can
    predict the program as it runs unprofiled.

    ``max_iterations``: every run (calibration, profiled, trials) ends cleanly after that many
    iterations of the script's step range (profkit.capture.calibrate, "Cutting a run short"); the
    range is the one the first run repeated most, passed on to the later runs by name.

    ``trials``: after the profiled run, time these switches (profkit.capture.switches; a list,
    or ``"auto"``: ``choose_trials(trace)`` picks them from the profiled trace, the caller's
    analysis), each ``try_runs`` times, taking turns with runs of the script unchanged
    (profkit.capture.trials); the record goes into PROFKIT_META as ``trials``. ``try_timeout``:
    the most one trial run may take (default: 300 s plus ten times the calibration run).
    ``try_budget``: no trial run starts once the trials have taken this many seconds (the run
    under way finishes, then the baseline run that closes its round). ``try_alternate``: a trial
    whose switches can be turned off and on while the script runs alternates with the script
    unchanged inside its own runs (profkit.capture.alternate); False: runs of its own.

    ``replacements`` (with ``calibrate``): the first calibration run also records the shapes of
    the ops the replacement rules need (profkit.capture.oprecord), and a short process of its own
    then times those replacements at those shapes (profkit.capture.replacements); both go into
    PROFKIT_META as ``replacements``.

    Returns the script's exit status (130 after Ctrl-C) with the files written. Problems the
    user can fix raise :class:`ProfkitError` before anything runs.
    """
    if aten_source not in ATEN_SOURCES:
        raise ProfkitError(f"--aten-source must be one of {', '.join(ATEN_SOURCES)}, "
                           f"not {aten_source!r}")
    script_p = check_script(script)
    out = resolve_output(script_p, output)
    if ncu_count is not None and ncu_count < 1:
        raise ProfkitError(f"--ncu-count must be at least 1, not {ncu_count}")
    if calibrate_runs < 1:
        raise ProfkitError(f"--calibrate-runs must be at least 1, not {calibrate_runs}")
    if gpu_metrics_hz is not None and gpu_metrics_hz < 1:
        raise ProfkitError(f"--gpu-metrics-frequency must be at least 1 Hz, not {gpu_metrics_hz}")
    if max_iterations is not None and max_iterations < MIN_ITERATIONS:
        raise ProfkitError(f"--max-iterations must be at least {MIN_ITERATIONS}, not {max_iterations} "
                           "(the first iterations of a run are warm-up)")
    trial_list = check_trials(trials, calibrate, try_runs, choose_trials)
    if try_budget is not None and not try_budget > 0:
        raise ProfkitError(f"--try-budget must be more than 0 seconds, not {try_budget:g}")
    check_output(out, force, ncu)
    extra_nsys = split_extra(nsys_args, "--nsys-args")
    extra_ncu = split_extra(ncu_args, "--ncu-args")
    nsys = nsys_locate.find_nsys()
    ncu_exe = nsys_locate.find_ncu() if ncu else None
    python = python or sys.executable

    files = companions(out)
    tmp_base = out.parent / f".{files['nsys-rep'].name[:-len('.nsys-rep')]}.profkit-tmp-{os.getpid()}"
    code_file = tmp_base.with_name(tmp_base.name + ".exit")
    calib_file = tmp_base.with_name(tmp_base.name + ".calib.json")
    ops_file = tmp_base.with_name(tmp_base.name + ".ops.json")
    repl_file = tmp_base.with_name(tmp_base.name + ".replacements.json")
    temps = [tmp_base.with_name(tmp_base.name + s)
             for s in (".sqlite", ".nsys-rep", ".ncu-rep", ".ncu.csv", ".exit", ".calib.json",
                       ".ops.json", ".replacements.json")]
    result = CaptureResult(trace=None, exit_code=0)
    passes = 1 + int(ncu) + (calibrate_runs if calibrate else 0)
    step = iter(range(1, passes + 1))
    try:
        calibration = None
        replaced: Optional[str] = None
        texts: list[str] = []
        started = _dt.datetime.now(_dt.timezone.utc)
        step_range: Optional[str] = None    # named by the first run, for the cut of the others
        calib_runs: list[tuple[Optional[str], float]] = []

        def calibration_runs(label: Callable[[str], str], record: Optional[Path]) -> None:
            """The calibration runs (the first with the op record ``record``), into texts."""
            nonlocal step_range
            for k in range(calibrate_runs):
                which = f" {k + 1} of {calibrate_runs}" if calibrate_runs > 1 else ""
                text, secs = _calibration_pass(python, script_p, script_args, calib_file,
                                               label(f"calibration run{which} (no profiler)"),
                                               say, result, cut_flags(max_iterations, step_range),
                                               record if k == 0 else None)
                if result.interrupted:
                    return
                if text is not None:
                    texts.append(text)
                    step_range = step_range or _repeated_range(text)
                calib_runs.append((text, secs))

        def numbered(what: str) -> str:
            return f"[{next(step)}/{passes}] {what}"

        if calibrate:
            calibration_runs(numbered, ops_file if replacements else None)
            if result.interrupted:  # Ctrl-C before profiling: nothing to keep
                result.exit_code = 130
                return result
            calibration = combine_calibrations(texts)
            if replacements:
                replaced = replacement_pass(python, ops_file, repl_file, say, result)
                if result.interrupted:
                    result.exit_code = 130
                    return result

        def profiled_run(label: str) -> tuple[list[str], list[str], Path, str]:
            """The run under nsys: (its command, the app's, the exported trace, the cut)."""
            app = script_command(python, script_p, script_args, aten, code_file, aten_source,
                                 max_iterations, step_range)
            cmd = build_nsys_command(nsys, tmp_base, app, extra_nsys, gpu_metrics_hz)
            p1 = run_pass(cmd, label, say)
            code = _read_exit_code(code_file)
            result.exit_code = code if code is not None else (130 if p1.interrupted else p1.returncode)
            # 130: the script stopped on KeyboardInterrupt (Ctrl-C reached it, maybe not us)
            result.interrupted = p1.interrupted or result.exit_code == 130
            return cmd, app, _nsys_sqlite(nsys, tmp_base, say, keep_as=out.with_suffix(".qdstrm")), \
                _read_cut(code_file)

        nsys_cmd, app, sqlite_tmp, cut = profiled_run(numbered("nsys profile"))
        if cut and max_iterations and not result.interrupted and ended_in_warm_up(sqlite_tmp):
            # A run cut inside its first pass over new shapes shows compilation, not the step the
            # program runs afterwards (profkit.run.warmup): once more, longer, before judging it.
            longer = max_iterations * WARM_UP_LONGER
            note = (f"every iteration of the profiled run up to its cut after {max_iterations} loaded "
                    "new GPU code (a library compiling a kernel per new shape): it ended inside its "
                    f"warm-up; captured again with --max-iterations {longer}")
            result.notes.append(note)   # said with the others once the capture ends
            first_cut, max_iterations = max_iterations, longer
            ended = None
            if calibrate:
                texts.clear()
                calib_runs.clear()
                calibration_runs(lambda what: f"[again] {what}", None)
                if result.interrupted:
                    result.exit_code = 130
                    return result
                calibration = combine_calibrations(texts)
                ended = script_iterations(texts, step_range, first_cut)
            if ended is not None:
                # The script has no more iterations than the first cut (its own loop ends there):
                # profiled again, it would load code in every iteration again. The loads are what
                # it runs (a new shape every step), and the first trace is kept.
                result.notes[-1] = note.replace(
                    f"; captured again with --max-iterations {longer}",
                    f"; run again without the profiler, the script ended on its own after {ended} "
                    "iterations: the loads are its steady state, and the first capture is kept")
            else:
                for first in (sqlite_tmp, tmp_base.with_name(tmp_base.name + ".nsys-rep"), code_file):
                    with contextlib.suppress(OSError):
                        first.unlink()   # nsys does not overwrite a report; the exit file is re-read
                nsys_cmd, app, sqlite_tmp, cut = profiled_run("[again] nsys profile")
        if cut:
            result.notes.append(f"the profiled run was {cut} (--max-iterations)")
        if calibrate and calibrate_runs == 1 and len(texts) == 1 and not result.interrupted:
            slower = calibration_slower(texts[0], sqlite_tmp)
            if slower is not None:
                # Tracing only adds host time: a run without the profiler that took longer means
                # the program's own speed (or the machine's) varies. One more run says by how much.
                result.notes.append(
                    f"the calibration run took {slower[0] / 1e6:.2f} ms an iteration, longer than the "
                    f"profiled run's {slower[1] / 1e6:.2f} ms, which the profiler cannot cause: a "
                    "second calibration run after the profiled one (prices are given over both)")
                text, secs = _calibration_pass(python, script_p, script_args, calib_file,
                                               "calibration run 2 (no profiler)", say, result,
                                               cut_flags(max_iterations or SECOND_RUN_ITERATIONS, step_range))
                if text is not None and not result.interrupted:
                    texts.append(text)
                    calib_runs.append((text, secs))
                    calibration = combine_calibrations(texts)
        meta: dict[str, object] = {
            "profkit_version": __version__,
            "command": shlex.join(command_line) if command_line else "",
            "captured_at": started.isoformat(timespec="seconds"),
            "script": str(script_p), "script_args": shlex.join(script_args),
            "script_exit_code": result.exit_code, "aten": int(aten),
            "aten_source": aten_source if aten else "",
            "nsys_command": shlex.join(nsys_cmd), "nsys_path": nsys,
            "nsys_version": nsys_locate.tool_version(nsys),
            "python": f"{platform.python_implementation()} {platform.python_version()} ({python})",
            "host": platform.node(), "interrupted": int(result.interrupted),
        }
        if calibration is not None:
            meta["calibration"] = calibration
        if replaced is not None:
            meta["replacements"] = replaced
        if max_iterations:
            meta.update({"max_iterations": max_iterations, "profiled_run_cut": cut})
        if ncu and ncu_exe and not result.interrupted:
            rep_tmp = tmp_base.with_name(tmp_base.name + ".ncu-rep")
            csv_tmp = tmp_base.with_name(tmp_base.name + ".ncu.csv")
            with contextlib.suppress(OSError):
                code_file.unlink()
            metrics = available_metrics(ncu_exe, NCU_METRICS)
            it = None if ncu_range else choose_iteration(sqlite_tmp)
            window = None
            if it is not None:
                count = it.count if ncu_count is None else min(ncu_count, it.count)
                ncu_cmd = build_ncu_command(ncu_exe, tmp_base, app, None, count, metrics,
                                            ["--launch-skip", str(it.skip), *extra_ncu])
                window = (it.start, it.end)
                result.notes.append(
                    f"ncu: profiling iteration {it.index + 1} of {it.instances} of the NVTX range "
                    f"'{it.name}' ({count} of its {it.count} kernels, after {it.skip} earlier "
                    "launches)")
                meta.update({"ncu_iteration": f"{it.name}#{it.index}", "ncu_window":
                             f"{it.start},{it.end}", "ncu_launch_skip": it.skip})
            else:
                count = ncu_count or DEFAULT_NCU_COUNT
                ncu_cmd = build_ncu_command(ncu_exe, tmp_base, app, ncu_range, count, metrics,
                                            extra_ncu)
                if not ncu_range:
                    result.notes.append(
                        f"ncu: no repeated top-level NVTX range to pick one iteration from: "
                        f"profiling the first {count} kernels (warm-up included); wrap each "
                        "step in an NVTX range or pass --ncu-range")
            meta.update({"ncu_command": shlex.join(ncu_cmd), "ncu_path": ncu_exe,
                         "ncu_version": nsys_locate.tool_version(ncu_exe),
                         "ncu_range": ncu_range or "", "ncu_count": count})
            ncu_label = f"[{next(step)}/{passes}] ncu"
            p2 = run_pass(ncu_cmd, ncu_label, say)
            result.interrupted = result.interrupted or p2.interrupted
            if rep_tmp.is_file():
                export = build_ncu_export_command(ncu_exe, rep_tmp)
                say(f"profkit: {ncu_label} export: {shlex.join(export)} > {csv_tmp}")
                with open(csv_tmp, "w") as fh:
                    res = subprocess.run(export, stdout=fh, stderr=subprocess.PIPE, text=True)
                if res.returncode != 0:
                    result.notes.append(f"ncu --import failed (exit status {res.returncode}): "
                                        f"{res.stderr.strip()[:300]}; the trace has no counters")
                else:
                    try:  # a counter problem must not cost the nsys trace
                        # both runs are ours: keep the pairs that line up, report the rest
                        merged = merge_ncu(sqlite_tmp, read_raw_csv(csv_tmp), ncu_range, window,
                                           allow_mismatch=True)
                        result.notes.append(f"ncu: {merged.summary()}")
                        meta["ncu_merge"] = merged.summary()
                    except ProfkitError as exc:
                        result.notes.append(f"ncu counters not merged: {exc}; merge later with "
                                            f"`profkit capture --merge-ncu {files['ncu-csv']} "
                                            f"{files['sqlite']}`")
            else:
                result.notes.append(f"ncu wrote no report (exit status {p2.returncode}); the "
                                    "trace has no counters: see ncu's messages above (it needs "
                                    "access to GPU performance counters)")
        write_meta(sqlite_tmp, meta)
        if trial_list is not None and not result.interrupted:
            record = _trials(trial_list, sqlite_tmp, python, script_p, script_args, step_range,
                             calib_runs, max_iterations, try_runs, try_timeout, choose_trials,
                             out.parent, say, result, try_budget, try_alternate)
            if record is not None:
                write_meta(sqlite_tmp, {"trials": json.dumps(record, separators=(",", ":"))})

        # Rename into place last, so nothing half-written ever sits under the final names.
        moves = {"sqlite": sqlite_tmp,
                 "nsys-rep": tmp_base.with_name(tmp_base.name + ".nsys-rep"),
                 "ncu-rep": tmp_base.with_name(tmp_base.name + ".ncu-rep"),
                 "ncu-csv": tmp_base.with_name(tmp_base.name + ".ncu.csv")}
        for kind, src in moves.items():
            if src.is_file():
                os.replace(src, files[kind])
                result.files[kind] = files[kind]
        result.trace = files["sqlite"]
        return result
    finally:
        for t in temps:
            with contextlib.suppress(OSError):
                t.unlink()


def _calibration_pass(python: str, script: Path, args: Sequence[str], calib_file: Path, label: str,
                      say: Say, result: CaptureResult,
                      cut: Sequence[str] = (), record_ops: Optional[Path] = None) -> tuple[Optional[str], float]:
    """Run the script once with no profiler, timing its top-level NVTX ranges: (the JSON text,
    or None (with a note) when the run failed or timed no range; the run's seconds). With
    ``record_ops``, the run also leaves the op record of one iteration there."""
    record = ["--record-ops", str(record_ops)] if record_ops is not None else []
    cmd = [python, "-m", "profkit.capture.bootstrap", "--calibrate", str(calib_file), *record, *cut,
           "--", str(script), *args]
    p = run_pass(cmd, label, say)
    if p.interrupted:
        result.interrupted = True
        return None, p.elapsed_s
    try:
        text = calib_file.read_text()
        data = json.loads(text)
    except (OSError, ValueError):
        result.notes.append(f"the calibration run (no profiler) wrote no timings (exit status "
                            f"{p.returncode}); predictions will use an estimated tracing cost")
        return None, p.elapsed_s
    if p.returncode != 0 or not data.get("ranges"):
        why = (f"the script exited with status {p.returncode}" if p.returncode != 0 else
               "the script opened no NVTX range (wrap each step in one)")
        result.notes.append(f"calibration run (no profiler): {why}; predictions will use an "
                            "estimated tracing cost")
    return text, p.elapsed_s


# The replacement timing process may take this long beyond its own budget (torch's import and
# CUDA's start-up) before it is stopped.
REPLACEMENT_SLACK_S = 120.0


def replacement_pass(python: str, record_file: Path, out_file: Path, say: Say,
                     result: CaptureResult) -> Optional[str]:
    """Time the replacements the op record of the calibration run calls for, in a process of its
    own (profkit.capture.replacements); the ``replacements`` JSON text for PROFKIT_META (the record,
    the timed entries, notes), or None when the calibration run left no record. Never raises: a
    failure is a note, in the result and in the JSON."""
    from profkit.capture.replacements import DEFAULT_BUDGET_S, FORMAT, jobs
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError):
        result.notes.append("replacements: the calibration run left no op record; the rules that "
                            "replace work price it from the trace alone")
        return None
    data: dict = {"format": FORMAT, "record": record, "entries": [],
                  "notes": list(record.get("notes") or [])}
    todo = jobs(record)
    shown = len(data["notes"])   # the record's own notes stay in the JSON; the log gets the timing's
    if not todo:
        data["notes"].append("nothing the replacement rules time ran in the recorded iteration")
        shown = len(data["notes"])
    elif record.get("device") != "cuda":
        data["notes"].append("the recorded iteration ran no CUDA op: the replacements were not timed")
    else:
        cmd = [python, "-m", "profkit.capture.replacements", str(record_file), str(out_file)]
        label = f"replacement timing ({len(todo)} shape(s), no profiler)"
        say(f"profkit: {label}: {shlex.join(cmd)}")
        t0 = time.monotonic()
        try:
            res = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True,
                                 timeout=DEFAULT_BUDGET_S + REPLACEMENT_SLACK_S)
            for line in res.stderr.splitlines():
                if line.startswith("profkit: "):
                    say(line)
            timed = json.loads(out_file.read_text())
            data.update({k: v for k, v in timed.items() if k not in ("format", "notes", "entries")})
            data["entries"] = timed.get("entries") or []
            data["notes"] += timed.get("notes") or []
            if res.returncode != 0 and not data["entries"]:
                tail = res.stderr.strip().splitlines()[-1:] or [""]
                data["notes"].append(f"the timing process exited with status {res.returncode}: {tail[0][:200]}")
        except KeyboardInterrupt:   # Ctrl-C before profiling, as in a calibration run
            result.interrupted = True
            data["notes"].append("interrupted: the replacements were not timed")
        except subprocess.TimeoutExpired:
            data["notes"].append(f"the timing process took longer than "
                                 f"{DEFAULT_BUDGET_S + REPLACEMENT_SLACK_S:.0f} s and was stopped")
        except (OSError, ValueError) as exc:
            data["notes"].append(f"the timing process left no result ({type(exc).__name__}: {exc})"[:200])
        n_ok = sum(1 for e in data["entries"] if not e.get("error"))
        say(f"profkit: {label}: {n_ok} of {len(todo)} timed in {time.monotonic() - t0:.1f} s")
    for note in data["notes"][shown:]:
        result.notes.append(f"replacements: {note}")
    return json.dumps(data, separators=(",", ":"))


def _repeated_range(text: str) -> Optional[str]:
    """The range a calibration run was cut at, else the top-level range it repeated most."""
    from profkit.run.iterations import most_frequent_range
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    cut = data.get("cut") or {}
    return cut.get("range") or most_frequent_range(data)


# --- trials ---------------------------------------------------------------------------------------
def check_trials(trials: Optional[str | Sequence[str]], calibrate: bool, try_runs: int,
                 choose: Optional[Callable]) -> Optional[list[str] | str]:
    """The trials asked for: None, ``"auto"``, or the trial names (each checked); a ProfkitError
    for what cannot run."""
    if trials is None:
        return None
    if try_runs < 1:
        raise ProfkitError(f"--try-runs must be at least 1, not {try_runs}")
    if not calibrate:
        raise ProfkitError("--try times each trial against the calibration run: it cannot be "
                           "used with --no-calibrate")
    if isinstance(trials, str):
        if trials.strip() == "auto":
            if choose is None:
                raise ProfkitError("--try auto needs the analysis to choose the trials: run it "
                                   "through `profkit capture`")
            return "auto"
        trials = [t for t in trials.split(",") if t.strip()]
    from profkit.model import parse_trial
    names = []
    for t in trials:
        try:
            names.append("+".join(s.value for s in parse_trial(t)))
        except ValueError as exc:
            raise ProfkitError(f"--try: {exc}") from None
    if not names:
        raise ProfkitError("--try: no switch named (auto, or switches separated by commas)")
    return list(dict.fromkeys(names))


def _trials(trial_list: list[str] | str, sqlite: Path, python: str, script: Path,
            args: Sequence[str], step_range: Optional[str],
            calib_runs: list[tuple[Optional[str], float]], max_iterations: Optional[int],
            try_runs: int, try_timeout: Optional[float],
            choose: Optional[Callable[[Path], list[str]]], workdir: Path, say: Say,
            result: CaptureResult, budget_s: Optional[float] = None,
            alternate: bool = True) -> Optional[dict]:
    """Choose (``auto``) and run the trials; the ``trials`` record, or None (with a note)."""
    from profkit.capture.trials import Plan, calibration_run, run_trials
    if trial_list == "auto":
        try:
            trial_list = list(choose(sqlite)) if choose is not None else []
        except Exception as exc:  # noqa: BLE001 - the analysis must not cost the trace
            result.notes.append(f"--try auto: the trace could not be analysed to choose the "
                                f"trials ({type(exc).__name__}: {exc}); no trial was run")
            return None
        if not trial_list:
            result.notes.append("--try auto: no rule that a switch can try fired on this trace; "
                                "no trial was run (name switches with --try SWITCH,...)")
            return None
        say(f"profkit: --try auto: {', '.join(trial_list)} (from the rules that fired)")
    # What the trials will cost, from the calibration run's length (each trial run is cut the
    # same way, by --max-iterations or the script's own end): a budget asked for is said beside.
    n_runs = try_runs * (len(trial_list) + 1)
    secs = statistics.median(s for _, s in calib_runs) if calib_runs else 0.0
    cost = (f"up to {n_runs} runs ({len(trial_list)} trial{'s' if len(trial_list) != 1 else ''} and "
            f"the script unchanged, {try_runs} round{'s' if try_runs != 1 else ''}), about "
            f"{n_runs * secs:.0f} s at the calibration run's {secs:.1f} s a run"
            + (f"; --try-budget {budget_s:g} s" if budget_s is not None else ""))
    from profkit.capture.trials import alternates
    alt = [t for t in trial_list if alternate and alternates(t)]
    if alt:
        cost += (f"; {', '.join(alt)} alternate{'s' if len(alt) == 1 else ''} with the script unchanged "
                 "inside each run, twice the iterations")
    say("profkit: --try: the script runs again for each trial and between them, with its side "
        f"effects (files it writes, logs): {cost}")
    step = _trial_step(sqlite, step_range, calib_runs)
    if step is None:
        result.notes.append("--try: the calibration run timed no repeated NVTX range, so no "
                            "iteration can be timed: wrap each step in one; no trial was run")
        return None
    base = [calibration_run(i, text, secs, step) for i, (text, secs) in enumerate(calib_runs)]
    if not any(b.iteration_ns for b in base):
        result.notes.append(f"--try: the calibration run timed too few iterations of `{step}` "
                            "for a steady time; the trials are timed against the later baseline runs")
    longest = max((secs for _, secs in calib_runs), default=0.0)
    plan = Plan(python, script, list(args), list(trial_list), step, try_runs, max_iterations,
                try_timeout if try_timeout else 300.0 + 10.0 * longest, _child_env(),
                workdir, len(calib_runs), base, budget_s, alternate)
    record, interrupted = run_trials(plan, say)
    result.interrupted = result.interrupted or interrupted
    from profkit.run.trials import summarize
    for t in summarize(json.dumps(record)):
        result.notes.append(f"tried {t.switch}: {t.text()}")
    return record


def _trial_step(sqlite: Path, step_range: Optional[str],
                calib_runs: list[tuple[Optional[str], float]]) -> Optional[str]:
    """The range whose iterations the trials time: the one the analysis's window is built on
    when the calibration run timed it, else the calibration run's most repeated range."""
    names: set[str] = set()
    for text, _ in calib_runs:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            names |= {str(r.get("name")) for r in json.loads(text).get("ranges", [])}
    from profkit.read.trace import Trace
    from profkit.run.window import iteration_instances
    try:
        found = iteration_instances(Trace(sqlite))
    except ProfkitError:
        found = None
    if found is not None and found[0] in names:
        return found[0]
    if step_range:
        return step_range
    return next((r for text, _ in calib_runs if text and (r := _repeated_range(text))), None)


# A run cut while it still compiled is captured again with this many times its iterations (once)
WARM_UP_LONGER = 4


def script_iterations(texts: Sequence[str], step_range: Optional[str], cut: int) -> Optional[int]:
    """How many iterations of ``step_range`` the calibration runs in ``texts`` ran, where none ran
    more than ``cut`` (the script's own loop ended there, not a cut); else None."""
    from profkit.run.iterations import range_starts
    from profkit.run.step.calibrate import calibration_runs
    runs = [calibration_runs(text) for text in texts]
    if not step_range or not runs or not all(runs):   # a run that wrote no record says nothing
        return None
    counts = [len(range_starts(r, step_range)) for rs in runs for r in rs]
    return max(counts) if 0 < max(counts) <= cut else None


def ended_in_warm_up(sqlite_path: Path) -> bool:
    """Whether nearly every iteration of the profiled trace loaded new GPU code, its last ones
    included (profkit.run.warmup); False where the trace cannot say."""
    from profkit.read.trace import Trace
    from profkit.run.warmup import still_loading
    try:
        return still_loading(Trace(sqlite_path))
    except ProfkitError:
        return False


# The second calibration run of a program whose first ran slower than its profiled run stops
# after this many iterations (or --max-iterations): enough past the warm-up for a median.
SECOND_RUN_ITERATIONS = 40


def calibration_slower(text: str, sqlite_path: Path) -> Optional[tuple[float, float]]:
    """(calibration run's, profiled run's) median iteration in ns where the calibration run took
    longer than the profiled run by more than the step model's NOISE_SLACK (a GPU-paced step's
    period varies by a few percent between runs; within it the step model takes the run as the
    profiled speed), which tracing cannot cause; else None (also where either has too few
    iterations of the profiled run's step range)."""
    from profkit.read.trace import Trace
    from profkit.run.step.calibrate import NOISE_SLACK
    from profkit.run.iterations import iteration_times, steady_median
    from profkit.run.window import iteration_instances
    try:
        trace = Trace(sqlite_path)
        found = iteration_instances(trace)
        data = json.loads(text)
    except (ProfkitError, ValueError):
        return None
    if found is None:
        return None
    name, inst = found
    starts = np.sort(inst["start"].to_numpy(np.int64))
    profiled, _ = steady_median(list(np.diff(starts)))
    # A GPU-paced step whose host runs ahead (no sync in it, a run cut before the launch queue
    # fills) starts its ranges faster than the GPU finishes them: the GPU's busy time per
    # iteration is the profiled run's period too, and the calibration run, paced by the GPU,
    # is not slower than that (a float64 MLP: ranges 3.4 ms apart, the GPU busy 14.4 ms each).
    busy, _ = steady_median(gpu_busy_per_iteration(trace, starts))
    if profiled is not None and busy is not None:
        profiled = max(profiled, busy)
    calibrated, _ = steady_median(iteration_times(data, name))
    if profiled is None or calibrated is None or calibrated <= NOISE_SLACK * profiled:
        return None
    return float(calibrated), float(profiled)


def gpu_busy_per_iteration(trace, starts: np.ndarray) -> list[int]:
    """For each iteration between consecutive ``starts`` (host times), the GPU time (the union of
    its kernels', copies' and memsets' intervals) of the work launched in it."""
    from profkit.run.window import _primary_pid
    acts = trace.activities
    sel = acts["api_start"].notna().to_numpy()
    pid = _primary_pid(trace)
    if pid is not None:   # the profiled process's own work, not another rank's
        sel = sel & (np.right_shift(acts["globalPid"].to_numpy(np.int64), 24) == pid)
    acts = acts[sel]
    if not len(acts) or len(starts) < 2:
        return []
    from profkit.read.intervals import busy_union
    launch = acts["api_start"].to_numpy(np.int64)
    which = np.searchsorted(starts, launch, side="right") - 1
    keep = (which >= 0) & (which < len(starts) - 1)
    which, begin, end = which[keep], acts["start"].to_numpy(np.int64)[keep], acts["end"].to_numpy(np.int64)[keep]
    order = np.lexsort((begin, which))
    out = np.zeros(len(starts) - 1, dtype=np.int64)
    # busy_union gives one length per iteration that launched work, in iteration order
    out[np.unique(which)] = busy_union(which[order], begin[order], end[order])
    return out.tolist()


def combine_calibrations(texts: Sequence[str]) -> Optional[str]:
    """The calibration runs' JSON texts as the one text PROFKIT_META keeps: a single run as it is,
    several as ``{"runs": [run, ...]}`` (profkit.run.step.calibrate reads both)."""
    if not texts:
        return None
    if len(texts) == 1:
        return texts[0]
    return json.dumps({"runs": [json.loads(t) for t in texts]})


def merge_existing(raw_csv: str | Path, trace: str | Path, output: Optional[str | Path] = None,
                   force: bool = False, ncu_range: Optional[str] = None) -> tuple[Path, str]:
    """Merge an ncu raw CSV into an existing trace (in place, or into a copy at ``output``).

    ``force``: replace an existing ``output``, and merge even when the merge would lose counters
    (no kernel matched, or fewer than already merged); without it such a merge changes nothing.
    """
    src = Path(trace)
    if not src.is_file():
        raise ProfkitError(f"trace not found: {trace}")
    if is_compressed(src):
        if output is None:
            raise ProfkitError(f"{src} is compressed: merge into a decompressed copy with "
                               f"-o COPY.sqlite")
        src = decompressed(src)  # the copy below is made from the decompressed export
    frame = read_raw_csv(raw_csv)
    if output is None:
        target = src
        merged = merge_ncu(target, frame, ncu_range, force=force)
    else:
        target = Path(output)
        if target.exists() and not force:
            raise ProfkitError(f"output {target} exists; pass --force to replace it")
        if target.resolve() == src.resolve():
            merged = merge_ncu(target, frame, ncu_range, force=force)
        else:
            if not target.parent.is_dir():
                raise ProfkitError(f"output directory {target.parent} does not exist")
            tmp = target.with_name(f".{target.name}.profkit-tmp-{os.getpid()}")
            try:
                shutil.copyfile(src, tmp)
                os.chmod(tmp, 0o644)  # the copy is ours to write, even of a read-only input
                merged = merge_ncu(tmp, frame, ncu_range, force=force)
                write_meta(tmp, _merge_meta(merged.summary(), raw_csv, ncu_range))
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            return target, merged.summary()
    write_meta(target, _merge_meta(merged.summary(), raw_csv, ncu_range))
    return target, merged.summary()


def _merge_meta(summary: str, raw_csv: str | Path, ncu_range: Optional[str]) -> dict[str, str]:
    return {"ncu_merge": summary, "ncu_merged_from": str(raw_csv), "ncu_range": ncu_range or ""}

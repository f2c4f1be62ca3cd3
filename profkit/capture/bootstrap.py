"""Bootstrap that runs a user's script the way ``python script.py args…`` would, under the profiler.

    python -m profkit.capture.bootstrap [--aten[=recorder|emit_nvtx]] [--exit-code-file FILE]
                                        [--calibrate FILE] [--max-iterations N [--step NAME]]
                                        [--try SWITCH [--alternate K]] [--record-ops FILE]
                                        [--] script.py [args…]

* ``sys.argv`` is ``[script.py, args…]``, ``sys.path[0]`` is the script's folder and the script
  runs as ``__main__`` (through :func:`runpy.run_path`), so the script needs no edits.
* ``--aten`` (``--aten=recorder``) runs the script under profkit's aten recorder
  (:mod:`profkit.capture.recorder`): every aten:: op becomes an NVTX range with its input shapes, element
  types, contiguity and cost-changing arguments; it first measures its own host cost per op and
  leaves it in the trace (an NVTX mark) for the step model. ``--aten=emit_nvtx`` uses
  ``torch.autograd.profiler.emit_nvtx(record_shapes=True)`` instead (shapes only).
* ``--exit-code-file`` records the script's exit status, which nsys/ncu do not pass on reliably.
* ``--calibrate FILE`` times the script's top-level NVTX ranges with no profiler attached
  (:mod:`profkit.capture.calibrate`) and writes them to FILE as JSON.
* ``--max-iterations N`` ends the script cleanly once N iterations of its step range have run
  (``--step NAME``; without it, whichever top-level range first closes N times): ``SystemExit(0)``
  raised from NVTX's pop hook after the Nth range closed (:mod:`profkit.capture.calibrate`,
  "Cutting a run short"). The exit-code file's second line then says ``cut after N NAME``.
* ``--try SWITCH[+SWITCH...]`` applies a switch of :mod:`profkit.capture.switches` to the script
  (no edit of its code), installed when the script imports torch; with ``--calibrate`` what it
  touched goes into FILE as ``trial``, else it is said on stderr.
* ``--alternate K`` (with ``--try``, ``--calibrate`` and ``--step``): the trial's switches turned
  off and on again in blocks of at least K iterations of the step range, so that the run times
  the program unchanged beside its trial (:mod:`profkit.capture.alternate`); the blocks go into
  FILE as ``alternation``. Ignored where a switch of the trial cannot be turned off while the
  program runs.
* ``--record-ops FILE`` (with ``--calibrate``): the op record of one iteration, the shapes the
  replacement timings need (:mod:`profkit.capture.oprecord`), written to FILE as JSON.
"""
from __future__ import annotations

import contextlib
import os
import runpy
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional


ATEN_SOURCES = ("recorder", "emit_nvtx")


@dataclass
class Options:
    aten: Optional[str] = None
    code_file: Optional[str] = None
    calibrate: Optional[str] = None
    max_iterations: Optional[int] = None
    step: Optional[str] = None
    trial: Optional[str] = None
    record_ops: Optional[str] = None
    alternate: Optional[int] = None
    rest: list = field(default_factory=list)


_VALUED = {"--exit-code-file": "code_file", "--calibrate": "calibrate",
           "--max-iterations": "max_iterations", "--step": "step", "--try": "trial",
           "--record-ops": "record_ops", "--alternate": "alternate"}


def _parse(argv: list[str]) -> Options:
    opts = Options()
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, _, value = arg.partition("=")
        if arg == "--aten":
            opts.aten = "recorder"
        elif key == "--aten" and value in ATEN_SOURCES:
            opts.aten = value
        elif key in _VALUED and (value or "=" in arg or i + 1 < len(argv)):
            if "=" not in arg:
                i += 1
                value = argv[i]
            if key in ("--max-iterations", "--alternate"):
                try:
                    setattr(opts, _VALUED[key], int(value))
                except ValueError:
                    raise SystemExit(f"profkit: error: {key} takes a number, not {value!r}")
            else:
                setattr(opts, _VALUED[key], value)
        elif arg == "--":
            i += 1
            break
        else:
            break
        i += 1
    opts.rest = argv[i:]
    return opts


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # what Python itself does with sys.exit("message")
    return 1


def _print_user_traceback(exc: BaseException, script: str) -> None:
    """The traceback as ``python script.py`` would show it (bootstrap and runpy frames dropped)."""
    tb = exc.__traceback__
    target = os.path.realpath(script)
    probe = tb
    while probe is not None:
        if os.path.realpath(probe.tb_frame.f_code.co_filename) == target:
            tb = probe
            break
        probe = probe.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _aten_context(source: str) -> contextlib.AbstractContextManager:
    try:
        import torch  # noqa: F401
        from torch.autograd.profiler import emit_nvtx
        from profkit.capture.recorder import recorder
    except Exception as exc:  # ImportError, or a broken install
        print(f"profkit: error: --aten needs PyTorch in this Python ({sys.executable}): {exc}",
              file=sys.stderr)
        raise SystemExit(2)
    return emit_nvtx(record_shapes=True) if source == "emit_nvtx" else recorder(probe=True)


def run(script: str, args: list[str], aten: Optional[str] = None,
        calibrate: Optional[str] = None, max_iterations: Optional[int] = None,
        step: Optional[str] = None, trial: Optional[str] = None,
        cut: Optional[list] = None, record_ops: Optional[str] = None,
        alternate: Optional[int] = None) -> int:
    """Run ``script`` as ``__main__`` with ``args``; return its exit status.

    ``aten``: None, ``"recorder"`` or ``"emit_nvtx"`` (True: the recorder). ``calibrate``: a
    file to write the script's top-level NVTX range times to (profkit.capture.calibrate).
    ``max_iterations``/``step``: end the run after that many iterations of the step range.
    ``trial``: switches to apply (profkit.capture.switches). ``cut``: a list that receives the
    cut (``{"range", "iterations"}``) when the run was cut short. ``record_ops``: with
    ``calibrate``, a file to write the op record of one iteration to (profkit.capture.oprecord).
    ``alternate``: with ``trial``, ``calibrate`` and ``step``, the trial's switches taking turns
    with the program unchanged in blocks of that many iterations (profkit.capture.alternate)."""
    if aten is True:
        aten = "recorder"
    if calibrate is None and not max_iterations and not trial:
        return _run(script, args, aten)
    from profkit.capture.calibrate import RangeClock, write
    the_trial = None
    if trial:
        from profkit.capture.switches import Trial
        the_trial = Trial(trial)
        the_trial.start()
    clock = RangeClock(max_iterations, step, events=calibrate is not None)
    ops = None
    if record_ops and calibrate is not None:
        from profkit.capture.oprecord import OpRecord
        ops = OpRecord(step)
        clock.listeners.append(ops.on_push)
    alt = None
    if (alternate and the_trial is not None and the_trial.toggles and step
            and calibrate is not None):
        from profkit.capture.alternate import Alternation
        # a run cut at N iterations has its blocks by count (K of N); an uncut one also by time
        alt = Alternation(the_trial, step, alternate, 0.0 if max_iterations else None)
        clock.listeners.append(alt.on_push)
    if calibrate is not None or max_iterations:
        clock.install()
    t0 = time.perf_counter_ns()
    code = 1
    errors: list[str] = []
    try:
        code = _run(script, args, aten, errors)
        return code
    finally:
        wall = time.perf_counter_ns() - t0
        if calibrate is not None:
            clock.finish()
        if ops is not None:
            with contextlib.suppress(Exception):
                from profkit.capture.oprecord import write as write_ops
                write_ops(record_ops, ops.finish())
        if alt is not None and not alt.on:
            # the switches as installed again: what they report is checked against them
            with contextlib.suppress(Exception):
                the_trial.toggle(True)
        record = the_trial.record() if the_trial is not None else None
        if clock.cut is not None:
            if cut is not None:
                cut.append(clock.cut)
            print(f"profkit: stopped the script after {clock.cut['iterations']} iterations of "
                  f"`{clock.cut['range']}` (--max-iterations)", file=sys.stderr, flush=True)
        if calibrate is not None:
            data = clock.as_dict(script, list(args), wall, code)
            if record is not None:
                data["trial"] = record
            if alt is not None:
                data["alternation"] = alt.as_dict()
            if errors:
                data["error"] = errors[0]
            with contextlib.suppress(OSError):
                write(calibrate, data)
        elif record is not None:
            print(f"profkit: --try {record['switch']}: "
                  f"{'applied' if record['applied'] else 'not applied'}"
                  + (f" ({record['note']})" if record["note"] else ""), file=sys.stderr, flush=True)


def _run(script: str, args: list[str], aten: Optional[str], errors: Optional[list] = None) -> int:
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    try:
        ctx = _aten_context(str(aten)) if aten else contextlib.nullcontext()
        try:
            ctx.__enter__()
        except Exception as exc:  # e.g. torch without CUDA
            what = ("torch.autograd.profiler.emit_nvtx" if aten == "emit_nvtx"
                    else "the aten recorder")
            print(f"profkit: error: --aten: {what} could not start "
                  f"({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            ctx.__exit__(None, None, None)
        return 0
    except SystemExit as exc:
        return _exit_status(exc)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return 130
    except BaseException as exc:  # noqa: BLE001 - report like the interpreter, keep the status
        _print_user_traceback(exc, script)
        if errors is not None:
            from profkit.capture.switches import one_line
            errors.append(one_line(exc))
        return 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()


def main(argv: Optional[list[str]] = None) -> int:
    opts = _parse(list(sys.argv[1:] if argv is None else argv))
    if not opts.rest:
        print("usage: python -m profkit.capture.bootstrap [--aten[=recorder|emit_nvtx]] "
              "[--exit-code-file FILE] [--calibrate FILE] [--max-iterations N [--step NAME]] "
              "[--try SWITCH [--alternate K]] [--record-ops FILE] script.py [args...]", file=sys.stderr)
        return 2
    if opts.trial:
        from profkit.model import parse_trial
        try:
            parse_trial(opts.trial)
        except ValueError as exc:
            print(f"profkit: error: --try: {exc}", file=sys.stderr)
            return 2
    cut: list = []
    code = run(opts.rest[0], opts.rest[1:], aten=opts.aten, calibrate=opts.calibrate,
               max_iterations=opts.max_iterations, step=opts.step, trial=opts.trial, cut=cut,
               record_ops=opts.record_ops, alternate=opts.alternate)
    if opts.code_file:
        with contextlib.suppress(OSError):
            with open(opts.code_file, "w") as fh:
                fh.write(str(code) + (f"\ncut after {cut[0]['iterations']} {cut[0]['range']}"
                                      if cut else ""))
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Bootstrap that runs a user's script the way ``python script.py args…`` would, under the profiler.

    python -m profkit.capture.bootstrap [--aten[=recorder|emit_nvtx]] [--exit-code-file FILE]
                                        [--calibrate FILE] [--] script.py [args…]

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
"""
from __future__ import annotations

import contextlib
import os
import runpy
import sys
import time
import traceback
from typing import Optional


ATEN_SOURCES = ("recorder", "emit_nvtx")


def _parse(argv: list[str]) -> tuple[Optional[str], Optional[str], Optional[str], list[str]]:
    aten: Optional[str] = None
    code_file: Optional[str] = None
    calib: Optional[str] = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--aten":
            aten = "recorder"
        elif arg.startswith("--aten=") and arg.split("=", 1)[1] in ATEN_SOURCES:
            aten = arg.split("=", 1)[1]
        elif arg == "--exit-code-file" and i + 1 < len(argv):
            i += 1
            code_file = argv[i]
        elif arg.startswith("--exit-code-file="):
            code_file = arg.split("=", 1)[1]
        elif arg == "--calibrate" and i + 1 < len(argv):
            i += 1
            calib = argv[i]
        elif arg.startswith("--calibrate="):
            calib = arg.split("=", 1)[1]
        elif arg == "--":
            i += 1
            break
        else:
            break
        i += 1
    return aten, code_file, calib, argv[i:]


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
        calibrate: Optional[str] = None) -> int:
    """Run ``script`` as ``__main__`` with ``args``; return its exit status.

    ``aten``: None, ``"recorder"`` or ``"emit_nvtx"`` (True: the recorder). ``calibrate``: a
    file to write the script's top-level NVTX range times to (profkit.capture.calibrate)."""
    if aten is True:
        aten = "recorder"
    if calibrate is None:
        return _run(script, args, aten)
    from profkit.capture.calibrate import RangeClock, write
    clock = RangeClock()
    clock.install()
    t0 = time.perf_counter_ns()
    code = 1
    try:
        code = _run(script, args, aten)
        return code
    finally:
        wall = time.perf_counter_ns() - t0
        clock.finish()
        with contextlib.suppress(OSError):
            write(calibrate, clock.as_dict(script, list(args), wall, code))


def _run(script: str, args: list[str], aten: Optional[str]) -> int:
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
        return 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()


def main(argv: Optional[list[str]] = None) -> int:
    aten, code_file, calib, rest = _parse(list(sys.argv[1:] if argv is None else argv))
    if not rest:
        print("usage: python -m profkit.capture.bootstrap [--aten[=recorder|emit_nvtx]] "
              "[--exit-code-file FILE] [--calibrate FILE] "
              "script.py [args...]", file=sys.stderr)
        return 2
    code = run(rest[0], rest[1:], aten=aten, calibrate=calib)
    if code_file:
        with contextlib.suppress(OSError):
            with open(code_file, "w") as fh:
                fh.write(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())

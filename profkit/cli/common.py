"""Pieces shared by the subcommands: one-line errors and shared options."""
from __future__ import annotations

import functools
import os
import sqlite3
import sys
from typing import Any, Callable

import click

from profkit.errors import ProfkitError
from profkit.read.text import one_line

EXIT_USAGE = 2

# What reading a damaged trace can raise from below profkit's own checks.
UNEXPECTED = (sqlite3.Error, UnicodeError, ValueError, TypeError, ArithmeticError, KeyError,
              IndexError, AttributeError)


def numpy_without_hugepage_advice() -> None:
    """Import numpy with its advice to back large arrays by transparent huge pages turned off,
    unless numpy is loaded already or the user set NUMPY_MADVISE_HUGEPAGE. With the kernel's
    usual THP defrag setting (madvise), a page fault in memory so advised compacts memory on the
    spot when no huge page is free: an analysis makes and drops arrays of a million rows by the
    hundred, and on a busy 2-core machine that cost a million-kernel classify 0.4 s of system
    time (numpy issue #31590). The variable is set for the import alone, so that no process this
    one starts inherits it."""
    if "numpy" in sys.modules or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["NUMPY_MADVISE_HUGEPAGE"]


# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def keep_freed_memory() -> None:
    """Tell glibc's allocator to keep the memory a command frees for its next arrays: one arena
    for every thread, arrays up to 256 MiB from the heap rather than each from a fresh mapping,
    and no heap returned to the system under 1 GiB. A command makes and drops arrays of a million
    rows by the hundred; each fresh one costs a page fault per 4 KiB touched. On a
    million-kernel classify: half the page faults (363k to 190k), 14% less peak memory (one arena
    where each thread had its own), about 0.15 s less on 2 cores. For the command line's own process
    only (a library does not tune its host's allocator); a no-op where the C library has no
    mallopt."""
    try:
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return
    for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, 256 << 20), (_M_TRIM_THRESHOLD, 1 << 30)):
        mallopt(param, value)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print one line on stderr and exit; never a traceback."""
    click.echo(f"profkit: error: {one_line(message)}", err=True)
    sys.exit(code)


def warn(message: str) -> None:
    """A warning: one line on stderr, names made harmless."""
    click.echo(f"profkit: warning: {one_line(message)}", err=True)


def one_line_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors (and the usual OS errors on user files) into one line and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ProfkitError as exc:
            fail(str(exc))
        except (OSError, MemoryError) as exc:
            fail(f"{exc.__class__.__name__}: {exc}")
        except UNEXPECTED as exc:
            # A file damaged in a way no check foresaw must still end in one line, not a
            # traceback; PROFKIT_DEBUG=1 shows the traceback for a bug report.
            if os.environ.get("PROFKIT_DEBUG"):
                raise
            fail(f"unexpected {exc.__class__.__name__} while analysing the input ({exc}); if the "
                 "file is a fresh nsys export, please report it (PROFKIT_DEBUG=1 shows the traceback)")

    return wrapper


def by_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--by",
        type=click.Choice(["range", "kernel", "aten"]),
        default="range",
        show_default=True,
        help="Level of attribution: NVTX range name, kernel name, or aten:: op (emit_nvtx).",
    )(func)


def peaks_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--peaks",
        "peaks_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="JSON file of measured peaks (from `profkit peaks`) that overrides the spec table.",
    )(func)


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
        help="Write to this file instead of standard output.",
    )(func)
    func = click.option(
        "--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]),
        default="table", show_default=True, help="Output format.",
    )(func)
    return func


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"profkit.{param.name}"] = value
    return value


def window_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--window and --attribution: what part of the run is judged, and how GPU work finds its
    range. Read them back with ``load_options()``, so commands keep their own signatures."""
    func = click.option(
        "--attribution", type=click.Choice(["process", "thread"]), default="process",
        show_default=True, expose_value=False, callback=_remember, is_eager=False,
        help="process: GPU work launched from helper threads (autograd) also counts for the "
             "ranges open on the main thread; thread: Nsight Systems' per-thread projection.",
    )(func)
    func = click.option(
        "--window", default="auto", show_default=True, metavar="auto|all|RANGE|RANGE[i:j]|T0:T1",
        expose_value=False, callback=_remember,
        help="The stretch to judge: auto = the iterations after the first (set-up is listed, not "
             "counted); all = the whole capture; a range name (its instances after the first), "
             "RANGE[i:j] (instances i..j-1) or T0:T1 in seconds.",
    )(func)
    return func


def load_options() -> dict[str, str]:
    """The --window/--attribution values of the running command (defaults outside click)."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    return {"window": meta.get("profkit.window", "auto"),
            "attribution": meta.get("profkit.attribution", "process")}

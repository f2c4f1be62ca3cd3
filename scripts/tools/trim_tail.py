"""Shrink a capture by dropping the iterations after the first KEEP of its loop, so it can live in
a repository.

Every CUDA API call and NVTX range that starts after the start of instance KEEP + 2 of the NVTX
range NAME is deleted (instance KEEP + 1 stays whole, the partial iteration profkit leaves out),
and with them the GPU work they launched: GPU activities are cut by their launch, not by when they
ran, since the GPU of a loop with no sync runs iterations behind the CPU (cut by its own clock, a
GPU-bound step would lose most of the kernels of the iterations it keeps);
NVTX marks stay, being notes about the whole run rather than work of an iteration (the aten
recorder's cost, left when the program ends),
the cut is recorded in PROFKIT_META (``trimmed_after_ns``), and the file is vacuumed. What is
kept is the capture as it ran; the window profkit finds is shorter, so figures read from the
trace change with it: trim before anything is read from it. Only for traces this project
captured itself: never run it on a trace someone else owns.

    python scripts/tools/trim_tail.py TRACE.sqlite NAME KEEP
    python scripts/tools/trim_tail.py TRACE.sqlite --kernel-repeats KEEP

The second form is for a loop with no NVTX range per iteration (HF generate()), whose window
profkit finds by the launches of one repeated kernel (profkit.run.window.kernel_period): the cut
is the launch call of that kernel's launch KEEP + 2, found by profkit's own function so that the
kernel is the one whose repeats delimit the window it reports (another kernel, repeating at a
layer's period, would cut mid-iteration). KEEP + 1 repeats stay; the window ends at the last, so
it holds the iterations between the warm-up profkit skips and repeat KEEP, and what was launched
after that repeat, up to the cut, stays as the partial iteration it leaves out. Then everything
is deleted as in the first form. Keep enough repeats that the warm-up stays the early share of
the run profkit looks for it in (profkit.run.window.warm_up_regime): a trimmed trace whose
warm-up (a first generate() call, several times slower per token) fills most of what is left
would no longer have it told apart from the steady state.
"""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from trim_setup import delete_rows

# GPU activities carry the correlation id of the API call that launched them
LAUNCHED = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def main(path: str, name: str, keep: int) -> None:
    con = sqlite3.connect(path)
    starts = [r[0] for r in con.execute("SELECT start FROM NVTX_EVENTS WHERE text = ? ORDER BY start", (name,))]
    if len(starts) < keep + 2:
        sys.exit(f"trim_tail: {path} has {len(starts)} ranges named {name!r}, not more than {keep + 1}")
    cut_at(con, starts[keep + 1])


def kernel_repeats(path: str, keep: int) -> None:
    """The second form: cut at the launch of the window's repeated kernel's launch KEEP + 2."""
    from profkit.read.trace import Trace
    from profkit.run.window import kernel_period

    found = kernel_period(Trace(path))
    if found is None:
        sys.exit(f"trim_tail: {path} has no kernel whose repeats mark iterations")
    kname, starts, _ = found
    if len(starts) < keep + 2:
        sys.exit(f"trim_tail: {path} launches its repeated kernel {len(starts)} times, "
                 f"not more than {keep + 1}")
    print(f"cut at launch {keep + 2} of {len(starts)} of {kname[:80]}")
    # launch times in order (kernel_period sorts them by their launch call's start)
    cut_at(sqlite3.connect(path), int(starts[keep + 1]))


def cut_at(con: sqlite3.Connection, cut: int) -> None:
    """Delete what starts at or after ``cut`` (GPU work by its launch), record it, vacuum."""
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in have:
        for t in LAUNCHED:
            if t in have:
                # launched after the cut (the rest, with no launch call recorded: by their own start)
                n = con.execute(
                    f"DELETE FROM {t} WHERE correlationId IN (SELECT correlationId FROM "
                    "CUPTI_ACTIVITY_KIND_RUNTIME WHERE start >= ?) OR (start >= ? AND correlationId NOT IN "
                    "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME))", (cut, cut)).rowcount
                print(f"{t}: {n} rows launched after the cut deleted")
    # marks (instant events) have no end; GPU work launched before the cut stays, whenever it ran
    delete_rows(con, 'start >= ? AND "end" IS NOT NULL', cut, "after", "trimmed_after_ns",
                skip=LAUNCHED if "CUPTI_ACTIVITY_KIND_RUNTIME" in have else ())


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    # sqlite3.connect would create a missing file, and the reader raises on it: one line instead
    if not Path(sys.argv[1]).is_file():
        sys.exit(f"trim_tail: {sys.argv[1]}: no such file; pass a decompressed .sqlite export")
    if sys.argv[2] == "--kernel-repeats":
        kernel_repeats(sys.argv[1], int(sys.argv[3]))
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

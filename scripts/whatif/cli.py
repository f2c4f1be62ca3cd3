"""The commands of ``scripts/whatif_accuracy.py`` and their options; each command's work is in
the module of its phase (``registry``, ``timing``, ``table``, ``merge``, ``page``)."""
from __future__ import annotations

import argparse
import sys

from . import __doc__ as overview
from . import firstsight, merge, page, ranks, registry, replacements, store, table, timing


def timing_options(p: argparse.ArgumentParser, unit: str, min_left: float, reps_help: str) -> None:
    """What ``measure`` and ``interleave`` share: OUTDIR, the programs, the reps, the budget, the
    interpreter and --fresh."""
    p.add_argument("outdir")
    p.add_argument("--programs", help="comma-separated program names (default: all)")
    p.add_argument("--reps", type=int, default=3, help=reps_help)
    p.add_argument("--budget", type=float, default=0, help="seconds for the whole measurement (0: no limit)")
    p.add_argument("--min-left", type=float, default=min_left,
                   help=f"skip a {unit} when fewer seconds than this are left in the budget")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the programs")
    p.add_argument("--fresh", action="store_true",
                   help="start a new OUTDIR/measured.json instead of resuming the one there")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=overview.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list", help="print name<TAB>script<TAB>args... for each program's baseline")
    p.add_argument("--capture", action="store_true",
                   help="the arguments `profkit capture` gets (capture_args: fewer steps, a smaller trace)")
    p.add_argument("--fixed", action="store_true",
                   help="with --capture, also one line NAME__FIX per fix (the fix's arguments appended)")
    p.add_argument("--variants", action="store_true",
                   help="one line per variant: name<TAB>variant<TAB>script<TAB>args...")
    p.add_argument("--multirank", action="store_true",
                   help="the programs of several ranks alone (the others list one GPU's): "
                        "name<TAB>ranks<TAB>launcher<TAB>script<TAB>capture args...")
    p.add_argument("--first-sight", nargs="*", metavar="SET|NAME",
                   help="the one-GPU first-sight programs of a set (a to z, no c) not captured yet, or those named: "
                        "their names on one line (scripts/gpu/firstsight.sh)")
    p.add_argument("--ranges", action="store_true", help="name<TAB>step range, a line each (with --first-sight: of those programs)")
    p.set_defaults(func=registry.cmd_list)
    p = sub.add_parser("capture-ranks", help="capture each program of several ranks, one nsys trace per "
                       "rank, calibrated (a machine with that many GPUs)")
    p.add_argument("outdir")
    p.add_argument("--programs", help="comma-separated program names (default: every one of several ranks)")
    p.add_argument("--budget", type=float, default=0, help="seconds for all the captures (0: no limit)")
    p.add_argument("--min-left", type=float, default=60, help="skip a program when fewer seconds are left")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the programs")
    p.add_argument("--nsys", default="nsys", help="the nsys to run")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.set_defaults(func=ranks.cmd_capture_ranks)
    p = sub.add_parser("measure", help="time every (program, variant) without a profiler (GPU machine)")
    timing_options(p, "run", 20, "runs of each variant")
    p.add_argument("--fixes", help="comma-separated fix names to time beside the baseline (default: all)")
    p.add_argument("--prime", action="store_true",
                   help="first run each compiling variant once, untimed, so that every timed run finds "
                        "Inductor's caches warm")
    p.set_defaults(func=timing.cmd_measure)
    p = sub.add_parser("interleave", help="time each program's variants side by side in one process, "
                       "alternating blocks (GPU machine; the programs whose entry has `interleave`)")
    timing_options(p, "process", 30, "processes per program")
    p.add_argument("--rounds", type=int, default=15, help="rounds of blocks a process")
    p.set_defaults(func=timing.cmd_interleave)
    p = sub.add_parser("page", help="write analyses/whatif.md: predicted against measured (CPU)")
    p.add_argument("--check", action="store_true", help="fail when the committed page is stale")
    p.set_defaults(func=page.cmd_page)
    p = sub.add_parser("firstsight", help="score each first-sight program's first capture and timed fixes once, "
                       "with the committed code, into analyses/data/whatif/first_sight.json.xz (CPU)")
    p.add_argument("--programs", help="comma-separated first-sight programs (default: all not scored yet)")
    p.set_defaults(func=firstsight.cmd_firstsight)
    p = sub.add_parser("replacements", help="the replacement timings against captures of the fixed programs: "
                       "analyses/replacement_check.md (CPU)")
    p.add_argument("--add", metavar="DIR", help="read DIR/PROGRAM.sqlite.xz and DIR/PROGRAM__FIX.sqlite.xz "
                   "(scripts/gpu/replacement_check.sh) into the page's data")
    p.add_argument("--check", action="store_true", help="fail when the committed page is stale")
    p.set_defaults(func=replacements.cmd_replacements)
    p = sub.add_parser("merge", help=f"add a measured.json's reps to {store.MEASURED.relative_to(store.ROOT)} "
                       "as run folders")
    p.add_argument("measured")
    p.add_argument("--folder", required=True, help="label of the allocation: rep N becomes folder LABEL_rN")
    p.add_argument("--note", default="", help="appended to the data's 'how'")
    p.add_argument("--gpu", default="", help="the GPU these runs (and their programs' captures) ran on, "
                   "where it is not the data's own (its 'gpu')")
    p.set_defaults(func=merge.cmd_merge)
    p = sub.add_parser("table", help="print the speedups from a measured.json")
    p.add_argument("measured")
    p.set_defaults(func=table.cmd_table)
    args = ap.parse_args(argv)
    args.func(args)


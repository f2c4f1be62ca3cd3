"""The registry: every program of the what-if corpus and the fixes an expert would try on it.

``PROGRAMS`` is the registry: per program its script (relative to the repository root), the
baseline arguments, the NVTX range that marks one iteration (``step_range``), the fixes (extra
arguments each, and whether the fix is expected to pay: ``pays`` True / False / None for not
sure), the kind of program, and notes on what to expect (for people reading results).

The fields of an entry:

- ``name``, ``script``, ``args``: the program and its baseline's arguments (what ``measure`` times)
- ``capture_args``: the arguments ``profkit capture`` gets instead (fewer steps, a smaller trace);
  ``capture_flags``: profkit capture's own flags, where it needs any
- ``step_range``: the top-level NVTX range that marks one iteration
- ``kind``: training | inference | decode | data
- ``fixes``: {fix name: {"args": extra arguments, "pays": ..., "what": what the fix does}}; ``pays``:
  True (expected > 1.05x), False (expected < 1.05x), None (not sure)
- ``compiles`` (on the program or on a fix): the variant runs torch.compile (longer time limit; see
  ``measure --prime``); ``timeout_s``: a time limit of its own
- ``interleave``: its script can build the variants side by side in one process and time them in
  blocks that take turns (``--interleave``, scripts/workloads/_corpus.py), "all" of its fixes or
  those listed (not DataLoader workers, which would prepare batches in the background while the
  other variants run, nor cuDNN's benchmark mode, a process-wide setting)
- ``shapes_from``: a ``--aten`` capture of the same program that lends the plain capture its GEMM
  shapes (``profkit classify --shapes-from``)
- ``expect``: per variant, what to expect. "h200" in the notes: one unprofiled run of each variant
  on an H200 (torch 2.11, transformers 5.17), iteration medians timed as ``measure`` does; a first
  look, not a result.

The entries live in one module per group of programs, and ``PROGRAMS`` is their concatenation:
a new file of programs is one import and one ``*module.PROGRAMS`` at the end of the list. The
page's tables follow this order.
"""
from __future__ import annotations

import argparse

from . import programs_first, programs_firstsight_a, programs_firstsight_b, programs_models

PROGRAMS: list[dict] = [
    *programs_first.PROGRAMS,
    *programs_models.PROGRAMS,
    *programs_first.LISTED_LAST,
    # kinds the corpus lacked, scored the first time profkit sees them (firstsight.py)
    *programs_firstsight_a.PROGRAMS,
    *programs_firstsight_b.PROGRAMS,
]
for _p in (*programs_firstsight_a.PROGRAMS, *programs_firstsight_b.PROGRAMS):
    _p["first_sight"] = True


def variants(prog: dict, only: set[str] | None = None) -> list[tuple[str, list[str], dict]]:
    """[(variant name, full argument list, fix entry or {} for the baseline), ...], baseline first;
    ``only``: the fixes to keep (the baseline always stays, since a fix is timed against it)."""
    out = [("baseline", list(prog["args"]), {})]
    for name, fix in prog["fixes"].items():
        if only is None or name in only:
            out.append((name, list(prog["args"]) + list(fix["args"]), fix))
    return out


def select(names: str | None) -> list[dict]:
    """The programs named in a comma-separated list (all of them for none)."""
    if not names:
        return PROGRAMS
    want = [n.strip() for n in names.split(",") if n.strip()]
    known = {p["name"]: p for p in PROGRAMS}
    bad = [n for n in want if n not in known]
    if bad:
        raise SystemExit(f"unknown program(s) {', '.join(bad)}; known: {', '.join(known)}")
    return [known[n] for n in want]


def cmd_list(args: argparse.Namespace) -> None:
    for prog in PROGRAMS:
        if args.capture:  # fewer steps where a full run would make a large trace
            cargs = prog.get("capture_args", prog["args"])
            # profkit capture's own flags ("-" for none: an empty field would vanish in the shell's read)
            flags = " ".join(prog.get("capture_flags", [])) or "-"
            print("\t".join([prog["name"], flags, prog["script"], *cargs]))
            if args.fixed:  # NAME__FIX: the program with one fix applied, to see where the time went
                for fname, fix in prog["fixes"].items():
                    print("\t".join([f"{prog['name']}__{fname}", flags, prog["script"], *cargs, *fix["args"]]))
        elif args.variants:
            for vname, vargs, _ in variants(prog):
                print("\t".join([prog["name"], vname, prog["script"], *vargs]))
        else:
            print("\t".join([prog["name"], prog["script"], *prog["args"]]))

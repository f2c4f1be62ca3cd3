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
- ``ranks``, ``launcher``: a data-parallel program runs as ``ranks`` processes, one GPU each,
  started by ``launcher`` (``torchrun``; ``launch`` builds the command line); without them, one
  process on one GPU. The single-GPU paths leave such a program out: ``list`` prints it only with
  ``--multirank`` (``list --capture`` feeds ``profkit capture``, one process), ``measure`` refuses
  it, ``interleave`` times it only when named in ``--programs``, through its launcher; it is
  captured one trace per rank by ``capture-ranks`` (ranks.py; scripts/gpu/firstsight_ddp.sh)
- ``expect``: per variant, what to expect. "h200" in the notes: one unprofiled run of each variant
  on an H200 (torch 2.11, transformers 5.17), iteration medians timed as ``measure`` does; a first
  look, not a result.

The entries live in one module per group of programs, and ``PROGRAMS`` is their concatenation:
a new file of programs is one import and one ``*module.PROGRAMS`` at the end of the list. The
page's tables follow this order.
"""
from __future__ import annotations

import argparse

from . import (programs_first, programs_firstsight_a, programs_firstsight_b, programs_firstsight_c,
               programs_firstsight_d, programs_firstsight_e, programs_firstsight_f,
               programs_firstsight_g, programs_firstsight_h, programs_firstsight_i,
               programs_firstsight_j, programs_firstsight_k, programs_firstsight_l,
               programs_firstsight_m, programs_firstsight_n, programs_firstsight_o,
               programs_firstsight_p, programs_firstsight_q, programs_firstsight_r,
               programs_firstsight_s, programs_firstsight_t, programs_firstsight_u,
               programs_firstsight_v, programs_firstsight_w, programs_firstsight_x,
               programs_firstsight_y, programs_firstsight_z, programs_firstsight_za, programs_models)

# Kinds the corpus lacked, scored the first time profkit sees them (firstsight.py): each set's
# programs, by its letter (set c's are data-parallel, two GPUs each)
FIRST_SIGHT_SETS: dict[str, list[dict]] = {
    m.__name__.rsplit("_", 1)[1]: m.PROGRAMS
    for m in (programs_firstsight_a, programs_firstsight_b, programs_firstsight_c, programs_firstsight_d,
              programs_firstsight_e, programs_firstsight_f, programs_firstsight_g, programs_firstsight_h,
              programs_firstsight_i, programs_firstsight_j, programs_firstsight_k, programs_firstsight_l,
              programs_firstsight_m, programs_firstsight_n, programs_firstsight_o, programs_firstsight_p,
              programs_firstsight_q, programs_firstsight_r, programs_firstsight_s, programs_firstsight_t,
              programs_firstsight_u, programs_firstsight_v, programs_firstsight_w,
              programs_firstsight_x, programs_firstsight_y, programs_firstsight_z, programs_firstsight_za)}

PROGRAMS: list[dict] = [
    *programs_first.PROGRAMS,
    *programs_models.PROGRAMS,
    *programs_first.LISTED_LAST,
    *(p for progs in FIRST_SIGHT_SETS.values() for p in progs),
]
for _progs in FIRST_SIGHT_SETS.values():
    for _p in _progs:
        _p["first_sight"] = True

# How a program of several ranks is started: its launcher's command line before the script
LAUNCHERS = {"torchrun": lambda python, n: [python, "-m", "torch.distributed.run", "--standalone",
                                            "--nproc-per-node", str(n)]}


def ranks(prog: dict) -> int:
    """The processes (one GPU each) the program runs as: 1 unless its entry says ``ranks``."""
    return int(prog.get("ranks", 1))


def launch(prog: dict, python: str, args: list[str], no_python: bool = False) -> list[str]:
    """The command line that runs the program's script with ``args``: ``python SCRIPT ARGS`` for a
    one-process program, else its launcher's (``torchrun``: ``python -m torch.distributed.run
    --standalone --nproc-per-node N SCRIPT ARGS``). ``no_python``: ``args`` is a whole command
    (a profiler or a wrapper before the script) that the launcher starts once per rank as it is
    (torchrun's ``--no-python``)."""
    n = ranks(prog)
    if n == 1:
        return list(args) if no_python else [python, prog["script"], *args]
    head = LAUNCHERS[prog.get("launcher", "torchrun")](python, n)
    return [*head, "--no-python", *args] if no_python else [*head, prog["script"], *args]


def single(progs: list[dict]) -> list[dict]:
    """The programs that run on one GPU."""
    return [p for p in progs if ranks(p) == 1]


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


def first_sight(which: list[str], root) -> list[dict]:
    """The one-GPU first-sight programs ``which`` names: ``a`` to ``w`` (no ``c``) (that file's
    programs with no committed trace yet) or program names (whatever is committed)."""
    sets = {k: v for k, v in FIRST_SIGHT_SETS.items() if k != "c"}   # set c: two GPUs a program
    out: list[dict] = []
    for w in which:
        if w in sets:
            out += [p for p in single(sets[w])
                    if not (root / "traces" / "corpus" / f"{p['name']}.sqlite.xz").exists()]
        else:
            prog = select(w)[0]
            if not prog.get("first_sight") or ranks(prog) > 1:
                raise SystemExit(f"{w} is not a one-GPU first-sight program")
            out.append(prog)
    return out


def cmd_list(args: argparse.Namespace) -> None:
    if args.first_sight is not None:  # names (one line), or name<TAB>step range with --ranges
        from .store import ROOT
        progs = first_sight(args.first_sight, ROOT)
        if args.ranges:
            for prog in progs:
                print(f"{prog['name']}\t{prog['step_range']}")
        else:
            print(" ".join(p["name"] for p in progs))
        return
    if args.multirank:  # name<TAB>ranks<TAB>launcher<TAB>script<TAB>capture args...
        for prog in PROGRAMS:
            if ranks(prog) > 1:
                print("\t".join([prog["name"], str(ranks(prog)), prog.get("launcher", "torchrun"),
                                 prog["script"], *prog.get("capture_args", prog["args"])]))
        return
    for prog in single(PROGRAMS):
        if args.capture:  # fewer steps where a full run would make a large trace
            cargs = prog.get("capture_args", prog["args"])
            # profkit capture's own flags ("-" for none: an empty field would vanish in the shell's read)
            flags = " ".join(prog.get("capture_flags", [])) or "-"
            print("\t".join([prog["name"], flags, prog["script"], *cargs]))
            if args.fixed:  # NAME__FIX: the program with one fix applied, to see where the time went
                for fname, fix in prog["fixes"].items():
                    print("\t".join([f"{prog['name']}__{fname}", flags, prog["script"], *cargs, *fix["args"]]))
        elif args.ranges:  # name<TAB>step range (the range trim_tail.py cuts at)
            print(f"{prog['name']}\t{prog.get('step_range', '')}")
        elif args.variants:
            for vname, vargs, _ in variants(prog):
                print("\t".join([prog["name"], vname, prog["script"], *vargs]))
        else:
            print("\t".join([prog["name"], prog["script"], *prog["args"]]))

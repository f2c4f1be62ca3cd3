"""Timing each (program, fix) pair without a profiler, on the GPU machine: ``measure`` (separate
runs, alternated) and ``interleave`` (the variants side by side in one process), and the run
harness they share.

``measure`` runs on a GPU machine, from the repository root. For each program, ``reps`` times,
it runs the baseline and then every fix, each as

    python3 -m profkit.capture.bootstrap --calibrate OUTDIR/calib/NAME__VARIANT__REP.json -- SCRIPT ARGS...

(no profiler: the bootstrap records the host and GPU start of every top-level NVTX range on the
main thread). An iteration's time is the distance between consecutive starts of ``step_range``
(``iteration_times``), on the GPU timeline when every instance has a GPU timestamp, else on the
host clock; the first 20 % of the periods (at least 3) are warm-up and the median of the rest is
the run's iteration time (``steady_median``). The runs alternate: baseline, then each fix, rep
after rep, so that slow drifts of the machine hit every variant alike.

``OUTDIR/measured.json`` is rewritten after every run, and a later ``measure`` into the same
OUTDIR resumes it: runs already measured (or failed) are kept and not repeated (``--fresh``
starts over). ``--budget`` bounds one call: once it is spent the remaining runs are skipped and
listed, and a run never gets more time than is left (a run cut short by the budget counts as
skipped, not failed). So the corpus can be measured in several calls of a few minutes each,
e.g. ``--programs`` subsets or the same command repeated until nothing is skipped. One rep of
all 53 variants took about 15 minutes on an H200 (each run imports torch and builds its model:
5-25 s, 15-45 s for variants that compile).

Variants that ``torch.compile`` (``compiles`` in the registry) compile in their first run on a
machine and find Inductor's on-disk caches warm afterwards; host-bound compiled programs ran
measurably slower in the run that compiled (bert_b1_infer: 0.75x against 1.15-1.5x). The median
over 3 reps then follows the warm runs; ``--prime`` runs each compiling variant once, untimed,
before the timed runs, so that all of them find the caches warm.

``--fixes`` times only the fixes named (and the baseline beside them), for a fix added to the
registry after the others were timed.

``interleave`` times the programs whose entry has ``interleave`` another way: per program and
rep, one process builds the baseline and the fixes side by side (the script's ``--interleave``,
``scripts/workloads/_corpus.py``) and times them in blocks of 0.2 s (10 iterations or more) that
take turns, the order reversed each round. Separate runs of a host-bound program seconds apart ran
at CPU speeds up to 1.9x apart on the timing machines (TF32 on EfficientNet-B0 at batch 4, a fix
that changes one small GEMM: 0.58-1.96x over six alternated reps), so its small fixes could not be
resolved to 15%; in one process the variants share the CPU's state, and a fix's gain is paired
round by round (``merge.paired_gain``). A process also times, after each round, the host's issue
time of an iteration of each variant (after one untimed iteration, not waited for: ``issue_ns``,
see _corpus.interleave), the CPU's speed in that process where the GPU sets the baseline's pace.
A program whose step is slow gives its own ``rounds`` in its entry (fewer than ``--rounds``), so
that one process fits a call's time. A fix that fails inside the process (an error where
torch.compile compiles, an out-of-memory) is recorded as that fix's failure; the others are timed.

A program of several ranks (``ranks`` in its entry: DistributedDataParallel, one GPU a rank) is
timed by ``interleave`` alone, and only when named in ``--programs``: its launcher starts every
rank (``registry.launch``: ``python -m torch.distributed.run --standalone --nproc-per-node N
SCRIPT ... --interleave OUT``), the ranks run the same blocks and rank 0 writes the timings
(scripts/workloads/_ddp.py). ``measure`` refuses it, and leaves it out of a run of all programs.

Both write OUTDIR/measured.json in one format (per variant the reps' medians), which ``table``
prints and ``merge`` adds to the committed data.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from . import registry, store
from .registry import select, variants

DEFAULT_TIMEOUT_S = 120   # a run (imports, model build, warm-up, steps) took 5-25 s on an H200
COMPILE_TIMEOUT_S = 300   # variants that torch.compile: 15-45 s there with cold Inductor caches


# --------------------------------------------------------------------------- iteration times
# One definition of an iteration's time, shared with `profkit capture --try` (its module imports
# the standard library alone, so the harness still runs where nothing else is installed).
sys.path.insert(0, str(store.ROOT))
from profkit.run.iterations import iteration_times, steady_median  # noqa: E402,F401


# --------------------------------------------------------------------------- the run harness

def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _run_once(args: argparse.Namespace, prog: dict, vargs: list[str], stem: str, limit: float,
              env: dict) -> tuple[int | None, float, Path]:
    """One unprofiled run under the calibrating bootstrap: (exit status or None if killed at
    ``limit`` seconds, wall seconds, calibration path)."""
    out = Path(args.outdir).resolve()
    calib_path = out / "calib" / f"{stem}.json"
    calib_path.unlink(missing_ok=True)
    cmd = [args.python, "-m", "profkit.capture.bootstrap", "--calibrate", str(calib_path), "--",
           prog["script"], *vargs]
    rc, wall = _run_logged(cmd, out, stem, limit, env)
    return rc, wall, calib_path


def _run_logged(cmd: list[str], out: Path, stem: str, limit: float, env: dict) -> tuple[int | None, float]:
    """``cmd`` run from the repository root, its output in OUTDIR/logs/STEM.out and .err: (exit
    status or None if killed at ``limit`` seconds, wall seconds)."""
    t0 = time.monotonic()
    with open(out / "logs" / f"{stem}.out", "w") as so, open(out / "logs" / f"{stem}.err", "w") as se:
        try:
            rc = subprocess.run(cmd, cwd=store.ROOT, env=env, stdout=so, stderr=se,
                                stdin=subprocess.DEVNULL, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return rc, time.monotonic() - t0


def limit_for(prog: dict, fix: dict) -> float:
    """The seconds a run of this variant may take: longer for one that compiles."""
    compiles = fix.get("compiles", prog.get("compiles", False))
    return float(fix.get("timeout_s", prog.get("timeout_s",
                                              COMPILE_TIMEOUT_S if compiles else DEFAULT_TIMEOUT_S)))


def _open_result(args: argparse.Namespace, mj: Path, progs: list[dict],
                 chosen: Callable[[dict], list[tuple[str, list[str], dict]]]) -> dict:
    """OUTDIR/measured.json to resume (a new one with --fresh or none there), this call recorded
    in its ``runs`` and an entry made for each program's ``chosen(prog)`` variants."""
    result = (json.loads(mj.read_text()) if (mj.exists() and not args.fresh)
              else {"format": "profkit-whatif-measured/1", "runs": [], "programs": {}, "skipped": []})
    result["skipped"] = []
    result["runs"].append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "host": platform.node(), "python": args.python, "reps": args.reps,
                           "budget_s": args.budget, "programs": [p["name"] for p in progs]})
    for prog in progs:
        entry = result["programs"].setdefault(prog["name"], {
            "script": prog["script"], "step_range": prog["step_range"], "kind": prog["kind"],
            "variants": {}})
        for v, a, f in chosen(prog):
            entry["variants"].setdefault(v, {
                "args": a, "pays": f.get("pays"), "what": f.get("what", "as written"),
                "reps": [], "median_ns": [], "n_used": [], "wall_s": [], "failures": []})
    return result


# --------------------------------------------------------------------------- measure

def cmd_measure(args: argparse.Namespace) -> None:
    out = Path(args.outdir).resolve()
    (out / "calib").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    progs = select(args.programs)
    many = [p["name"] for p in progs if registry.ranks(p) > 1]
    if many and args.programs:
        raise SystemExit(f"{', '.join(many)}: several ranks, timed by `interleave --programs` through "
                         "their launcher, not by `measure`")
    progs = registry.single(progs)
    only = {f.strip() for f in args.fixes.split(",") if f.strip()} if args.fixes else None
    if only and only - {f for p in progs for f in p["fixes"]}:
        raise SystemExit(f"unknown fix(es) {', '.join(sorted(only - {f for p in progs for f in p['fixes']}))} "
                         "for the programs selected")
    mj = out / "measured.json"
    # Resume: results already in OUTDIR/measured.json are kept, and the runs they hold (measured
    # or failed) are not repeated; runs skipped for lack of budget are tried again.
    result = _open_result(args, mj, progs, lambda prog: variants(prog, only))

    t_start = time.monotonic()
    deadline = t_start + args.budget if args.budget else math.inf
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def stamp() -> str:
        return f"[{time.monotonic() - t_start:7.1f}s]"

    if args.prime:  # one untimed run of each compiling variant: later runs find Inductor's caches warm
        for prog in progs:
            for vname, vargs, fix in variants(prog, only):
                if not fix.get("compiles", prog.get("compiles", False)):
                    continue
                left = deadline - time.monotonic()
                if left < args.min_left:
                    print(f"{stamp()} prime {prog['name']} {vname}: skipped (budget spent)", flush=True)
                    continue
                rc, wall, _ = _run_once(args, prog, vargs, f"{prog['name']}__{vname}__prime",
                                        min(limit_for(prog, fix), left), env)
                print(f"{stamp()} prime {prog['name']} {vname}: exit {rc} in {wall:.1f}s", flush=True)

    runs = [(prog, rep, v) for prog in progs for rep in range(1, args.reps + 1) for v in variants(prog, only)]
    for k, (prog, rep, (vname, vargs, fix)) in enumerate(runs, 1):
        name = prog["name"]
        v = result["programs"][name]["variants"][vname]
        label = f"{k}/{len(runs)} {name} {vname} rep {rep}/{args.reps}"
        if rep in v["reps"] or any(f["rep"] == rep for f in v["failures"]):
            print(f"{stamp()} {label}: already in {mj.name}", flush=True)
            continue
        own = limit_for(prog, fix)
        left = deadline - time.monotonic()
        if left < args.min_left:
            result["skipped"].append({"program": name, "variant": vname, "rep": rep})
            print(f"{stamp()} {label}: skipped (budget spent)", flush=True)
            continue
        stem = f"{name}__{vname}__{rep}"
        rc, wall, calib_path = _run_once(args, prog, vargs, stem, min(own, left), env)
        failure = None
        if rc is None and left < own:  # cut short by the budget, not by its own limit: try again later
            result["skipped"].append({"program": name, "variant": vname, "rep": rep})
            print(f"{stamp()} {label}: stopped at the end of the budget after {wall:.1f}s", flush=True)
            store.write_json(mj, result)
            continue
        if rc is None:
            failure = f"timed out after {own:.0f} s"
        elif rc != 0:
            failure = f"exit status {rc}"
        else:
            try:
                calib = json.loads(calib_path.read_text())
                med, n = steady_median(iteration_times(calib, prog["step_range"]))
                if med is None:
                    failure = f"too few '{prog['step_range']}' ranges in {calib_path.name}"
            except (OSError, ValueError) as e:
                failure = f"no calibration: {e}"
        if failure:
            v["failures"].append({"rep": rep, "rc": rc, "reason": failure, "wall_s": round(wall, 1),
                                  "stderr_tail": _tail(Path(args.outdir).resolve() / "logs" / f"{stem}.err")})
            print(f"{stamp()} {label}: FAILED ({failure}) after {wall:.1f}s", flush=True)
        else:
            v["reps"].append(rep)
            v["median_ns"].append(med)
            v["n_used"].append(n)
            v["wall_s"].append(round(wall, 1))
            print(f"{stamp()} {label}: {med / 1e6:.3f} ms ({n} iterations) in {wall:.1f}s", flush=True)
        store.write_json(mj, result)
    store.write_json(mj, result)
    if result["skipped"]:
        print(f"budget of {args.budget:.0f} s spent: {len(result['skipped'])} run(s) skipped; "
              f"run the same command again to continue", flush=True)
    print(f"wrote {mj}", flush=True)


# --------------------------------------------------------------------------- interleave

def cmd_interleave(args: argparse.Namespace) -> None:
    """Per program and rep, one process that builds the baseline and every fix and times them in
    alternating blocks; OUTDIR/measured.json holds per variant the rep's median, as ``measure``
    writes it (so ``table`` and ``merge`` read it alike). A later call into the same OUTDIR keeps
    the reps measured and tries the failed ones again."""
    # Programs of several ranks (one GPU each) only when named: a run of all of them is a one-GPU run
    progs = (select(args.programs) if args.programs else
             [p for p in registry.single(registry.PROGRAMS) if p.get("interleave")])
    bad = [p["name"] for p in progs if not p.get("interleave")]
    if bad:
        raise SystemExit(f"{', '.join(bad)}: the script cannot interleave its variants; these can: "
                         + ", ".join(p["name"] for p in registry.PROGRAMS if p.get("interleave")))
    out = Path(args.outdir).resolve()
    for sub in ("calib", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    mj = out / "measured.json"

    def chosen(prog: dict) -> list[tuple[str, list[str], dict]]:
        want = prog["interleave"]
        return variants(prog, None if want == "all" else set(want))

    result = _open_result(args, mj, progs, chosen)
    result["interleaved"] = True
    deadline = time.monotonic() + args.budget if args.budget else math.inf
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for rep in range(1, args.reps + 1):
        for prog in progs:
            name, vs = prog["name"], chosen(prog)
            entry = result["programs"][name]
            if rep in entry["variants"]["baseline"]["reps"]:
                continue
            left = deadline - time.monotonic()
            own = max(limit_for(prog, f) for _, _, f in vs)
            if left < args.min_left:
                result["skipped"].append({"program": name, "rep": rep})
                print(f"{name} rep {rep}: skipped (budget spent)", flush=True)
                continue
            stem = f"{name}__interleaved__{rep}"
            path = out / "calib" / f"{stem}.json"
            path.unlink(missing_ok=True)
            # through the program's launcher where it runs as several ranks (rank 0 writes the timings)
            cmd = registry.launch(prog, args.python, [*prog["args"], "--interleave", str(path),
                                                      "--variants", ",".join(v for v, _, _ in vs),
                                                      "--rounds", str(min(args.rounds, prog.get("rounds", args.rounds)))])
            rc, wall = _run_logged(cmd, out, stem, min(own, left), env)
            try:
                got = json.loads(path.read_text()) if rc == 0 else None
                timed, broke = (got["variants"], got.get("failed", {})) if got else (None, {})
            except (OSError, ValueError, KeyError):
                timed, broke = None, {}
            if timed is None:
                reason = "timed out" if rc is None else f"exit status {rc}"
                for vname, _, _ in vs:
                    entry["variants"][vname]["failures"].append(
                        {"rep": rep, "rc": rc, "reason": reason, "wall_s": round(wall, 1),
                         "stderr_tail": _tail(out / "logs" / f"{stem}.err")})
                print(f"{name} rep {rep}: FAILED ({reason}) after {wall:.1f}s", flush=True)
            else:
                for vname, t in timed.items():
                    v = entry["variants"][vname]
                    v["reps"].append(rep)
                    v["median_ns"].append(int(t["median_ns"]))
                    v["n_used"].append(int(t["n_used"]) * int(t["block_iterations"]))
                    v["wall_s"].append(round(wall, 1))
                for vname, why in broke.items():
                    # one fix failed in the process (the others timed): a failure of that rep
                    entry["variants"][vname]["failures"].append(
                        {"rep": rep, "rc": rc, "reason": why, "wall_s": round(wall, 1), "stderr_tail": ""})
                    print(f"{name} rep {rep}: {vname} FAILED ({why})", flush=True)
                base = timed["baseline"]["median_ns"]
                print(f"{name} rep {rep} ({wall:.0f}s): " + ", ".join(
                    f"{k} {t['median_ns'] / 1e6:.3f} ms" + ("" if k == "baseline" else f" {base / t['median_ns']:.2f}x")
                    for k, t in timed.items()), flush=True)
            store.write_json(mj, result)
    store.write_json(mj, result)
    print(f"wrote {mj}", flush=True)


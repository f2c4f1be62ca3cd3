"""``capture-ranks``: the registry's programs of several ranks (``ranks`` in the entry:
DistributedDataParallel, one GPU a rank) captured as ``profkit capture`` captures a one-GPU
program, one Nsight Systems trace per rank, on a machine with that many GPUs.

For each program (``--programs``, default every one of several ranks), from the repository root,
its launcher (``registry.launch``: torchrun) starting one command per rank, ``{R}`` the rank
(``per_rank.py`` puts it in place):

1. a calibration run, no profiler: ``python -m profkit.capture.bootstrap --calibrate
   OUTDIR/calib/NAME.rank{R}.json -- SCRIPT CAPTURE_ARGS`` (the top-level NVTX ranges of each
   rank's main thread timed, as ``profkit capture`` times them);
2. the profiled run: each rank under its own ``nsys profile`` with profkit capture's trace flags,
   ``-o OUTDIR/traces/NAME/rank{R}``, the script again under the bootstrap;
3. each rank's report exported to ``OUTDIR/traces/NAME/rank{R}.sqlite``, with its calibration
   run's timings and the capture's facts in its ``PROFKIT_META`` as ``profkit capture`` leaves
   them (``calibration``, ``command``, ``script``, ``nsys_version``..., and ``rank``,
   ``world_size``), so that each rank's step model is calibrated to its own unprofiled run.

``--budget`` bounds the call: a run never gets more time than is left, and the programs the
budget does not reach are listed as skipped. ``--dry-run`` prints the commands and runs nothing.
OUTDIR/captured.json says per program what each pass did. The traces go to the repository as
``traces/corpus/NAME/rank{R}.sqlite.xz`` (``xz -9``); rank 0's stands for the program on the
page (pricing.TRACES). Imports profkit (its capture's flags and meta) only when it runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import time
from pathlib import Path

from . import registry, store

PER_RANK = "scripts/whatif/per_rank.py"
CALIBRATE_S, PROFILE_S, EXPORT_S = 240.0, 300.0, 240.0
NSYS_FLAGS_FALLBACK = ["-t", "cuda,nvtx,cublas,cudnn", "-s", "none", "--cpuctxsw", "none",
                       "--cuda-graph-trace=node"]


def nsys_flags() -> list[str]:
    """profkit capture's own trace flags (profkit.capture.runner), so a rank's trace reads as a
    one-GPU capture does."""
    try:
        from profkit.capture.runner import NSYS_TRACE_FLAGS
        return list(NSYS_TRACE_FLAGS)
    except ImportError:
        return list(NSYS_FLAGS_FALLBACK)


def commands(prog: dict, out: Path, python: str, nsys: str = "nsys") -> dict[str, list]:
    """The commands of one program's capture: ``calibrate`` and ``profile`` (each one launcher
    command; ``{RANK}`` is put in place in each rank), and ``export`` (one per rank)."""
    name, n = prog["name"], registry.ranks(prog)
    cargs = list(prog.get("capture_args", prog["args"]))
    per_rank = [python, PER_RANK]
    boot = [python, "-m", "profkit.capture.bootstrap"]
    calib = registry.launch(prog, python, [*per_rank, *boot, "--calibrate",
                                           str(out / "calib" / f"{name}.rank{{RANK}}.json"), "--",
                                           prog["script"], *cargs], no_python=True)
    tdir = out / "traces" / name
    prof = registry.launch(prog, python, [*per_rank, nsys, "profile", *nsys_flags(), "--force-overwrite", "true",
                                          "-o", str(tdir / "rank{RANK}"), *boot, "--exit-code-file",
                                          str(out / "logs" / f"{name}.rank{{RANK}}.exit"), "--",
                                          prog["script"], *cargs], no_python=True)
    export = [[nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o",
               str(tdir / f"rank{r}.sqlite"), str(tdir / f"rank{r}.nsys-rep")] for r in range(n)]
    return {"calibrate": calib, "profile": prof, "export": export}


def _run(cmd: list[str], log: Path, limit: float, env: dict) -> tuple[int | None, float]:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=store.ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=max(limit, 1.0)).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return rc, round(time.monotonic() - t0, 1)


def _meta(prog: dict, rank: int, cmds: dict, calib: str | None, started: str, python: str, nsys: str,
          exit_code: int | None) -> dict:
    """What ``profkit capture`` writes into PROFKIT_META, for one rank's trace."""
    from profkit import __version__
    try:
        from profkit.capture.nsys_locate import tool_version
        version = tool_version(nsys)
    except Exception:  # noqa: BLE001 (the version is a fact for the reader, not needed)
        version = ""
    meta = {"profkit_version": __version__, "command": shlex.join(cmds["profile"]),
            "captured_at": started, "script": str(store.ROOT / prog["script"]),
            "script_args": shlex.join(prog.get("capture_args", prog["args"])),
            "script_exit_code": exit_code if exit_code is not None else "", "aten": 0, "aten_source": "",
            "nsys_command": shlex.join(cmds["profile"]), "nsys_path": nsys, "nsys_version": version,
            "python": f"{platform.python_implementation()} {platform.python_version()} ({python})",
            "host": platform.node(), "interrupted": 0, "rank": rank, "world_size": registry.ranks(prog)}
    if calib is not None:
        meta["calibration"] = calib
    return meta


def capture(prog: dict, out: Path, python: str, nsys: str, deadline: float, env: dict) -> dict:
    """One program's three passes (the module docstring); what each did, for captured.json."""
    name, n = prog["name"], registry.ranks(prog)
    cmds = commands(prog, out, python, nsys)
    (out / "traces" / name).mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    rec: dict = {"ranks": n, "started": started}
    left = deadline - time.monotonic()
    rec["calibrate_rc"], rec["calibrate_s"] = _run(cmds["calibrate"], out / "logs" / f"{name}.calibrate.log",
                                                   min(CALIBRATE_S, left), env)
    left = deadline - time.monotonic()
    rec["profile_rc"], rec["profile_s"] = _run(cmds["profile"], out / "logs" / f"{name}.profile.log",
                                               min(PROFILE_S, left), env)
    t0 = time.monotonic()
    limit = max(min(EXPORT_S, deadline - t0), 1.0)
    logs = [open(out / "logs" / f"{name}.export{r}.log", "w") for r in range(n)]
    procs = [subprocess.Popen(c, cwd=store.ROOT, env=env, stdin=subprocess.DEVNULL, stdout=logs[r],
                              stderr=subprocess.STDOUT)
             for r, c in enumerate(cmds["export"]) if Path(c[-1]).exists()]
    for p in procs:  # the ranks' exports side by side
        try:
            p.wait(timeout=max(limit - (time.monotonic() - t0), 1.0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for fh in logs:
        fh.close()
    rec["export_s"] = round(time.monotonic() - t0, 1)
    from profkit.capture.ncu_merge import write_meta
    rec["traces"], rec["calibrated"] = [], []
    for r in range(n):
        trace = out / "traces" / name / f"rank{r}.sqlite"
        if not trace.exists():
            continue
        cpath = out / "calib" / f"{name}.rank{r}.json"
        try:
            calib = cpath.read_text()
            json.loads(calib)
        except (OSError, ValueError):
            calib = None
        try:
            code = int((out / "logs" / f"{name}.rank{r}.exit").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            code = None
        write_meta(trace, _meta(prog, r, cmds, calib, started, python, nsys, code))
        rec["traces"].append(str(trace.relative_to(out)))
        rec["calibrated"].append(calib is not None)
        trace.with_suffix(".nsys-rep").unlink(missing_ok=True)
    return rec


def cmd_capture_ranks(args: argparse.Namespace) -> None:
    progs = registry.select(args.programs) if args.programs else \
        [p for p in registry.PROGRAMS if registry.ranks(p) > 1]
    one = [p["name"] for p in progs if registry.ranks(p) == 1]
    if one:
        raise SystemExit(f"{', '.join(one)}: one GPU: `profkit capture` captures it "
                         "(scripts/gpu/corpus_capture.sh)")
    out = Path(args.outdir).resolve()
    if args.dry_run:
        for prog in progs:
            cmds = commands(prog, out, args.python, args.nsys)
            print(f"# {prog['name']} ({registry.ranks(prog)} ranks)")
            for c in (cmds["calibrate"], cmds["profile"], *cmds["export"]):
                print(shlex.join(c))
        return
    for sub in ("calib", "logs", "traces"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    mj = out / "captured.json"
    result = json.loads(mj.read_text()) if mj.exists() else {"format": "profkit-whatif-ranks/1", "programs": {}}
    deadline = time.monotonic() + args.budget if args.budget else math.inf
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for prog in progs:
        name = prog["name"]
        if deadline - time.monotonic() < args.min_left:
            result.setdefault("skipped", []).append(name)
            print(f"{name}: skipped (budget spent)", flush=True)
            continue
        rec = capture(prog, out, args.python, args.nsys, deadline, env)
        result["programs"][name] = rec
        store.write_json(mj, result)
        print(f"{name}: calibration exit {rec['calibrate_rc']} ({rec['calibrate_s']}s), profile exit "
              f"{rec['profile_rc']} ({rec['profile_s']}s), export {rec['export_s']}s: "
              f"{len(rec['traces'])} of {rec['ranks']} traces, calibrated {rec['calibrated']}", flush=True)
    store.write_json(mj, result)
    print(f"wrote {mj}", flush=True)

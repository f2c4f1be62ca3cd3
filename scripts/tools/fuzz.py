"""Long fuzz runs: damaged copies of committed traces through the CLI, checking each answer.

    python scripts/tools/fuzz.py --count 10000 --seed 1 [--trace traces/micro_addnorm.sqlite.xz ...]

Every run must exit 0 or 2 and print no traceback; on stderr, one line per message, each a
profkit warning or error (at most one error) or the line naming the file written, with no
control characters, and no more than MAX_STDERR_LINES of them (a damaged trace may warn of
several things it lacks). Runs in this process through click's test runner (a subprocess per run would
spend most of its time importing). Prints one line per failure and a summary at the end; exits 1
when any run failed. The CI test (tests/test_fuzz.py) runs the same checks on a few hundred.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import platform
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from mutate import mutate  # noqa: E402  (tests/ is put on the path just above)
from synth import plain  # noqa: E402


def decompressed_bytes(path: Path) -> bytes:
    return plain(path).read_bytes()

DEFAULT_TRACES = ["traces/micro_addnorm.sqlite.xz", "traces/micro_hinted.sqlite.xz",
                  "traces/micro_memcpy.sqlite.xz", "traces/micro_addnorm_gemm_ncu.sqlite.xz"]
# The damaged trace is appended to each; GOOD stands for the unmutated trace, OUT for a file in
# a temporary directory.
COMMANDS = [["classify"], ["classify", "--by", "kernel", "--format", "json"],
            ["classify", "--format", "markdown"], ["classify", "--format", "csv"],
            ["classify", "--by", "aten", "--innermost"], ["diff", "GOOD"],
            ["diff", "--by", "kernel", "--format", "markdown", "GOOD"],
            ["export-perfetto", "-o", "OUT"]]


RUN_LIMIT_S = 60
# What a line on stderr may be: a profkit message, or the file a command wrote.
MESSAGE_RE = re.compile(r"profkit: (warning|error): \S|profkit: aborted$|wrote \S")
MAX_STDERR_LINES = 6


def _too_long(signum, frame) -> None:
    raise TimeoutError(f"run took more than {RUN_LIMIT_S} s")


def check(result) -> str | None:
    """Why a CLI result breaks the contract, or None when it keeps it."""
    from profkit.read.text import CONTROL_RE

    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"exception {type(result.exception).__name__}: {result.exception}"
    if result.exit_code not in (0, 2):
        return f"exit status {result.exit_code}"
    err = result.stderr
    if "Traceback" in err or "Traceback" in result.stdout:
        return "traceback printed"
    lines = err.splitlines()
    if len(lines) > MAX_STDERR_LINES:
        return f"{len(lines)} lines on stderr"
    odd = [line for line in lines if not MESSAGE_RE.match(line)]
    if odd:
        return f"a line on stderr that is not one profkit message: {odd[0][:80]!r}"
    if sum(line.startswith("profkit: error:") for line in lines) > 1:
        return "more than one error on stderr"
    if any(CONTROL_RE.search(line) for line in lines):
        return "control characters on stderr"
    return None


def run(count: int, seed: int, traces: list[str], verbose: bool = False) -> tuple[int, int, dict]:
    """Run ``count`` mutations; (runs, failures, exit-status histogram)."""
    from profkit.read import livefile
    from profkit.cli import main

    # Every damaged file is watched for a writer still appending before it is called damaged;
    # the mutated files are complete, so the wait would only slow the run down.
    saved_wait, livefile.GROWTH_WAIT_S = livefile.GROWTH_WAIT_S, 0.0
    saved_handler = signal.signal(signal.SIGALRM, _too_long)
    try:
        return _run(count, seed, traces, verbose, main)
    finally:
        livefile.GROWTH_WAIT_S = saved_wait
        signal.signal(signal.SIGALRM, saved_handler)


def _run(count: int, seed: int, traces: list[str], verbose: bool, main) -> tuple[int, int, dict]:
    from click.testing import CliRunner

    rng = random.Random(seed)
    # Mutations hit the SQLite bytes, not a compressed stream: committed traces are read decompressed.
    goods = [(t, decompressed_bytes(ROOT / t)) for t in traces]
    runner = CliRunner()
    failures = 0
    codes: dict[int, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(count):
            name, good = rng.choice(goods)
            data, what = mutate(good, rng)
            path = Path(tmp) / f"m{i}.sqlite"
            path.write_bytes(data)
            cmd = [{"GOOD": str(ROOT / name), "OUT": str(Path(tmp) / "out.json")}.get(a, a)
                   for a in rng.choice(COMMANDS)]
            signal.alarm(RUN_LIMIT_S)  # a run that never ends is a failure too, not a stuck fuzzer
            try:
                result = runner.invoke(main, [*cmd, str(path)])
            finally:
                signal.alarm(0)
            codes[result.exit_code] = codes.get(result.exit_code, 0) + 1
            why = check(result)
            if why or verbose:
                print(f"#{i} {name} [{what}] {' '.join(cmd)}: {why or 'ok'} "
                      f"(exit {result.exit_code})", flush=True)
                if why and result.exc_info and not isinstance(result.exception, SystemExit):
                    import traceback
                    traceback.print_exception(*result.exc_info, limit=-4)
            failures += why is not None
            path.unlink()
    return count, failures, codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10_000, help="mutations to run (default 10000)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--trace", action="append", default=None,
                    help="a good trace to mutate (repeatable; default: four committed traces)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per run")
    args = ap.parse_args()
    t0 = time.perf_counter()
    n, bad, codes = run(args.count, args.seed, args.trace or DEFAULT_TRACES, args.verbose)
    took = time.perf_counter() - t0
    hist = ", ".join(f"exit {k}: {v}" for k, v in sorted(codes.items()))
    print(f"fuzz: {n} mutations, seed {args.seed}, {bad} failures ({hist}); {took:.0f} s on "
          f"{platform.node() or 'unknown'} ({platform.machine()}, {platform.python_version()}), "
          f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

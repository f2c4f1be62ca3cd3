"""The ``profkit`` program itself (profkit.cli.entry): what it prints reaches a pipe whole, and
its exit status is the command's, though it skips the interpreter's teardown."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from synth import TID, make_trace

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = [(110, 120, 1), (210, 220, 2), (310, 320, 3), (410, 420, 4)]
KERNELS = [(200, 300, 1, 1), (300, 400, 2, 1), (400, 500, 3, 1), (500, 600, 4, 1)]


def _profkit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Block-buffered streams, as a user's pipe has them: the output is only whole if it is flushed.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "profkit", *args], capture_output=True, text=True,
                          cwd=cwd, env=env)


def test_the_program_flushes_what_it_prints_and_keeps_the_exit_status(tmp_path):
    path = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME,
                      nvtx=[(100, 700, "mm", TID)])
    csv = _profkit("classify", "--format", "csv", str(path), cwd=tmp_path)
    assert csv.returncode == 0, csv.stderr
    lines = csv.stdout.splitlines()
    assert lines[0].startswith("name,level,") and lines[1].startswith("mm,range,") and csv.stdout.endswith("\n")
    out = _profkit("classify", "--format", "json", "-o", "r.json", str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ops"][0]["name"] == "mm"
    missing = _profkit("classify", "missing.sqlite", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.splitlines() == ["profkit: error: missing.sqlite: no such file; pass the .sqlite "
                                           "that `nsys export --type sqlite` wrote"]
    usage = _profkit("classify", "--by", "nope", str(path), cwd=tmp_path)
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1

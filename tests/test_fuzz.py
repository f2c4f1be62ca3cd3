"""Damaged traces get one clear line, never a traceback (issue: no traceback, ever, on a file).

A fixed-seed sample of byte- and SQL-level mutations of committed traces (tests/mutate.py) runs
through the CLI in this process; ``scripts/tools/fuzz.py`` runs the same checks for long runs.
"""
from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mutate import mutate
from profkit.cli import main
from profkit.read.compressed import trace_stem
from profkit.read.text import CONTROL_RE
from synth import plain

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
sys.path.insert(0, str(ROOT / "scripts" / "tools"))
import fuzz  # noqa: E402  (scripts/tools/ is not a package)


def damaged_copy(tmp_path: Path, sql: str, params: tuple = (), src: str = "micro_addnorm.sqlite.xz") -> Path:
    """A copy of a committed trace with ``sql`` applied (NOT NULL constraints lifted first)."""
    path = tmp_path / trace_stem(src)
    shutil.copyfile(plain(TRACES / src), path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA writable_schema = ON")
    with conn:
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') WHERE type='table'")
    conn.close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, params)
    conn.close()
    return path


def classify(*args: str):
    return CliRunner().invoke(main, ["classify", *args])


def assert_one_line_error(r, *needles: str) -> str:
    assert r.exit_code == 2, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("profkit: error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("sql,needles", [
    ('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = NULL WHERE rowid = 3',
     ["CUPTI_ACTIVITY_KIND_KERNEL.end", "1 NULL", "export the trace again"]),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'abc' WHERE rowid < 3",
     ["CUPTI_ACTIVITY_KIND_KERNEL.start", "2 text"]),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 1.5", ["CUPTI_ACTIVITY_KIND_KERNEL.deviceId", "real"]),
    ("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = x'ff00' WHERE correlationId = "
     "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1)",
     ["CUPTI_ACTIVITY_KIND_RUNTIME.start", "blob"]),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = -5 WHERE rowid = 1", ["impossible timestamp", "-5"]),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = 2000000000000000000 WHERE rowid = 1",
     ["CUPTI_ACTIVITY_KIND_KERNEL.end", "impossible timestamp"]),
    ('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = "end" + 5 WHERE rowid = 2', ["end before they start"]),
    ("UPDATE NVTX_EVENTS SET start = 'x' WHERE rowid IN (SELECT rowid FROM NVTX_EVENTS LIMIT 1)",
     ["NVTX_EVENTS.start"]),
])
def test_damaged_column_is_named(tmp_path, sql, needles):
    path = damaged_copy(tmp_path, sql)
    assert_one_line_error(classify(str(path)), *needles)


def test_undecodable_and_blob_names_are_replaced_not_raised(tmp_path):
    path = damaged_copy(tmp_path, "UPDATE StringIds SET value = CAST(x'ff41fe' AS TEXT) "
                                  "WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    r = classify("--by", "kernel", "--format", "csv", str(path))
    assert r.exit_code == 0, r.output
    assert "\ufffdA\ufffd" in r.stdout
    (tmp_path / "b").mkdir()
    path2 = damaged_copy(tmp_path / "b", "UPDATE StringIds SET value = x'00ff1b5b33316d' WHERE id IN "
                         "(SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    r = classify("--by", "kernel", str(path2))
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout


@pytest.mark.long
@pytest.mark.parametrize("seed", [13, 14, 15, 16])
def test_fuzz_sample_keeps_the_contract(seed):
    """240 mutations (four seeded chunks, so parallel workers share them): exit 0 or 2,
    no traceback, stderr one clean profkit message a line (fuzz.check)."""
    n, failures, codes = fuzz.run(60, seed=seed, traces=fuzz.DEFAULT_TRACES)
    assert failures == 0
    assert codes.get(2, 0) > 10 and codes.get(0, 0) > 10  # both good and refused runs happened


def test_fuzz_sample_through_a_real_process(tmp_path):
    """A few runs as a user runs them: the real stderr, with Python's own error printing."""
    rng = random.Random(7)
    good = plain(TRACES / "micro_addnorm.sqlite.xz").read_bytes()
    for i in range(4):
        data, what = mutate(good, rng)
        path = tmp_path / f"m{i}.sqlite"
        path.write_bytes(data)
        p = subprocess.run([sys.executable, "-m", "profkit", "classify", str(path)],
                           capture_output=True, text=True, errors="replace", cwd=ROOT)
        assert p.returncode in (0, 2), (what, p.stderr)
        assert "Traceback" not in p.stderr, (what, p.stderr)
        lines = p.stderr.splitlines()
        assert len(lines) <= fuzz.MAX_STDERR_LINES and all(fuzz.MESSAGE_RE.match(x) for x in lines), \
            (what, p.stderr)
        assert not any(CONTROL_RE.search(x) for x in lines), (what, p.stderr)


def test_the_contract_takes_one_clean_message_a_line():
    """Several warnings, each a line, keep it (a trace without its API table, its NVTX table and
    its GPU's name warns of each); a line that is not a profkit message, a second error, or a
    message that runs over lines break it."""
    import types

    def result(err: str, code: int = 0):
        return types.SimpleNamespace(exception=None, exit_code=code, stderr=err, stdout="")

    three = ("profkit: warning: unknown GPU is not in the spec table\n"
             "profkit: warning: the step model could not be built for this window\n"
             "profkit: warning: no user NVTX ranges in the window: showing --by kernel\n")
    assert fuzz.check(result(three)) is None
    assert fuzz.check(result("profkit: error: damaged export\n", 2)) is None
    assert fuzz.check(result("wrote out.json\nprofkit: warning: x\n")) is None
    assert "not one profkit message" in fuzz.check(result("profkit: error: damaged\n  at line 3\n", 2))
    assert "more than one error" in fuzz.check(result("profkit: error: a\nprofkit: error: b\n", 2))
    assert "lines on stderr" in fuzz.check(result("profkit: warning: w\n" * 7))


def test_a_trace_without_its_api_table_says_why_there_is_no_step_model(tmp_path):
    path = damaged_copy(tmp_path, "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    r = classify(str(path))
    assert r.exit_code == 0, r.stderr
    assert "the step model could not be built for this window (the window holds no CUDA API call of " \
           "the program: capture with `nsys profile -t cuda` or `profkit capture`)" in r.stderr


def test_rowids_far_apart_are_read_in_one_pass(tmp_path):
    """A damaged rowid (1 ... 2**62) must not make the chunked reader walk the gap."""
    path = damaged_copy(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET rowid = 4611686018427387904 "
                                  "WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    r = classify("--by", "kernel", "--format", "csv", str(path))
    assert r.exit_code == 0, r.output
    assert r.stdout == classify("--by", "kernel", "--format", "csv", str(TRACES / "micro_addnorm.sqlite.xz")).stdout

"""Live and crashed writers: "still being written" is not "damaged", and a hot journal left by a
crashed writer is recovered in a private snapshot, never beside the input."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from click.testing import CliRunner

from profkit.read import livefile
from profkit.cli import main
from synth import plain

TRACES = Path(__file__).resolve().parent.parent / "traces"
SRC = plain(TRACES / "micro_addnorm.sqlite.xz")  # these tests write to copies of it


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def classify(path: Path):
    return CliRunner().invoke(main, ["classify", "--format", "csv", str(path)])


def test_a_write_lock_held_elsewhere_means_still_being_written(tmp_path):
    t = tmp_path / "t.sqlite"
    shutil.copyfile(SRC, t)
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         f"c = sqlite3.connect({str(t)!r}, isolation_level=None)\n"
         "c.execute('BEGIN IMMEDIATE')\n"
         "c.execute(\"UPDATE StringIds SET value = value || '' WHERE id = 1\")\n"
         "print('ready', flush=True)\n"
         "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        r = classify(t)
        assert r.exit_code == 2
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and "still being written" in lines[0] and "wait for nsys" in lines[0]
        assert "damaged" not in lines[0]
    finally:
        writer.kill()
        writer.wait()


def _crash_mid_transaction(t: Path) -> None:
    """A writer that dies inside a transaction after spilling changed pages into the file."""
    code = (
        "import os, sqlite3\n"
        f"c = sqlite3.connect({str(t)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size = 1')\n"
        "c.execute('BEGIN')\n"
        "c.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 7, \"end\" = \"end\" + 7')\n"
        "c.execute(\"UPDATE StringIds SET value = value || ' changed'\")\n"
        "c.execute('CREATE TABLE filler (x)')\n"
        "c.executemany('INSERT INTO filler VALUES (?)', [('x' * 900,) for _ in range(2000)])\n"
        "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hot_journal_is_recovered_in_a_private_snapshot(tmp_path):
    t = tmp_path / "t.sqlite"
    shutil.copyfile(SRC, t)
    _crash_mid_transaction(t)
    journal = tmp_path / "t.sqlite-journal"
    assert journal.exists() and livefile.writer_state(t)[0] == "crashed"
    before = {p.name: sha(p) for p in tmp_path.iterdir()}
    r = classify(t)
    assert r.exit_code == 0, r.output
    assert r.stdout == classify(SRC).stdout  # the rolled-back state is the original trace
    assert {p.name: sha(p) for p in tmp_path.iterdir()} == before  # nothing changed or added


def test_a_file_that_keeps_growing_is_still_being_written(tmp_path):
    data = SRC.read_bytes()
    t = tmp_path / "t.sqlite"
    t.write_bytes(data[: len(data) // 3])
    stop = threading.Event()

    def append() -> None:
        with t.open("ab") as fh:
            while not stop.is_set():
                fh.write(b"\0" * 512)
                fh.flush()
                time.sleep(0.02)

    th = threading.Thread(target=append)
    th.start()
    try:
        r = classify(t)
    finally:
        stop.set()
        th.join()
    assert r.exit_code == 2
    assert "still being written" in r.stderr and "changed within" in r.stderr


def test_a_truncated_file_at_rest_is_damaged(tmp_path):
    data = SRC.read_bytes()
    t = tmp_path / "t.sqlite"
    t.write_bytes(data[: len(data) // 3])
    r = classify(t)
    assert r.exit_code == 2 and "damaged" in r.stderr and "still being written" not in r.stderr

"""Names cannot inject: escape sequences and HTML in NVTX names reach no output as they are."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from synth import plain
from profkit.cli import main
from profkit.read.text import CONTROL_RE, one_line, visible

TRACES = Path(__file__).resolve().parent.parent / "traces"
EVIL = "\x1b[2J\x1b]0;pwned\x07<script>alert(1)</script>\x9b31m\u202e|x"


def evil_copy(tmp_path: Path, name: str = "t.sqlite") -> Path:
    """micro_addnorm with its NVTX range renamed to EVIL (a copy: inputs are never written)."""
    path = tmp_path / name
    shutil.copyfile(plain(TRACES / "micro_addnorm.sqlite.xz"), path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE StringIds SET value = ? WHERE id = "
                     "(SELECT textId FROM NVTX_EVENTS LIMIT 1)", (EVIL,))
    conn.close()
    return path


def test_visible_shows_controls_as_escapes():
    assert visible("a\x1bb\x9bc\u202ed\x00") == "a\\x1bb\\x9bc\\u202ed\\x00"
    assert visible("plain <b> text") == "plain <b> text"
    assert one_line("two\nlines\x1b[0m") == "two lines\\x1b[0m"


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown", "json"])
def test_no_control_characters_in_any_format(tmp_path, fmt):
    r = CliRunner().invoke(main, ["classify", "--format", fmt, str(evil_copy(tmp_path))])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out
    assert not any(CONTROL_RE.search(line) for line in out.splitlines())
    if fmt == "markdown":
        assert "<script>" not in out and "&lt;script>" in out
    if fmt == "json":
        names = [op["name"] for op in json.loads(out)["ops"]]
        assert any(n.startswith("\\x1b[2J") for n in names)


def test_diff_markdown_escapes_html(tmp_path):
    a = evil_copy(tmp_path, "a.sqlite")
    b = evil_copy(tmp_path, "b.sqlite")
    r = CliRunner().invoke(main, ["diff", str(a), str(b), "--format", "markdown"])
    assert r.exit_code == 0, r.output
    assert "<script>" not in r.stdout and "\x1b" not in r.stdout


def test_error_lines_are_clean(tmp_path):
    bad = tmp_path / "\x1b[31mred\nname.sqlite"
    r = CliRunner().invoke(main, ["classify", str(bad)])
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and not CONTROL_RE.search(lines[0]) and "\\x1b[31mred" in lines[0]


def test_rich_markup_in_a_name_is_text(tmp_path):
    path = tmp_path / "m.sqlite"
    shutil.copyfile(plain(TRACES / "micro_addnorm.sqlite.xz"), path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE StringIds SET value = '[/bold][red]op' WHERE id = "
                     "(SELECT textId FROM NVTX_EVENTS LIMIT 1)")
    conn.close()
    r = CliRunner().invoke(main, ["classify", str(path)])
    assert r.exit_code == 0, r.output
    assert "[/bold][red]op" in r.stdout

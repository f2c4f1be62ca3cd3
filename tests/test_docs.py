"""Every command and option of the CLI is documented in docs/, and the README stays short."""
from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from profkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(main)
    return [(name, main.get_command(ctx, name)) for name in main.list_commands(ctx)]


def _options() -> list[tuple[str, str]]:
    """(command, "-o/--output") for every option; documented when any of its spellings is."""
    out = []
    for name, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and "--help" not in p.opts:
                out.append((name, "/".join(p.opts + p.secondary_opts)))
    return out


@pytest.mark.parametrize("name", [n for n, _ in _commands()])
def test_every_command_is_documented(name):
    assert f"profkit {name}" in DOCS, f"`profkit {name}` is not mentioned in docs/"


@pytest.mark.parametrize("command,option", _options())
def test_every_option_is_documented(command, option):
    assert any(re.search(r"(?<![\w-])" + re.escape(o) + r"(?![\w-])", DOCS) for o in option.split("/")), \
        f"`profkit {command} {option}` is not mentioned in docs/"


def test_readme_is_short_and_links_the_reference():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for page in ("classify", "capture", "diff", "report", "multirank", "kernels", "benchmarks"):
        assert f"docs/{page}.md" in text
        assert (ROOT / "docs" / f"{page}.md").exists()

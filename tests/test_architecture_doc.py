"""docs/architecture.md stays true: the modules it names exist, every command has its data flow,
and its table of the import contract is the one tests/test_layers.py enforces."""
from __future__ import annotations

import re
from pathlib import Path

import click

from profkit.cli import main
from test_layers import ALLOWED

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
LAYERS = ("read", "run", "capture", "judge", "show", "api", "compare", "cli")


def test_every_module_it_names_exists():
    named = set(re.findall(r"`((?:read|run|capture|judge|show|compare|cli)/[\w/]+)", DOC))
    assert named
    missing = [m for m in sorted(named) if not ((ROOT / "profkit" / m).with_suffix(".py").exists()
                                               or (ROOT / "profkit" / m).is_dir())]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_command_has_its_flow():
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        if name in ("roofline", "timeline", "export-perfetto"):  # with report, under one heading
            assert f"`{name}`" in DOC, name
        else:
            assert f"**`profkit {name}" in DOC, f"docs/architecture.md has no data flow for `profkit {name}`"


def test_its_import_table_is_the_enforced_one():
    for layer in LAYERS:
        row = re.search(rf"^\| `{layer}` \| ([^|]+) \|$", DOC, re.M)
        assert row, layer
        doc = {w.strip() for w in row.group(1).split(",")}
        enforced = ALLOWED[layer] - {layer}
        if doc == {"everything", "capture included"}:
            assert enforced == set(ALLOWED) - {layer}, layer
        else:
            assert doc == enforced, (layer, doc, enforced)

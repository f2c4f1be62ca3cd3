"""Suite-wide set-up for running the tests in parallel worker processes (pytest-xdist).

It sits at the top of the repository, not in tests/: a conftest in tests/ would put tests/ on
sys.path before the kernel tests import the bundled ``kernels`` package, and tests/kernels/
(a folder without __init__.py) would then be imported in its place.

Work that tests share stays in one process: tests that use a module-scoped fixture run in the
worker that built it (one xdist group per module), and the tests of one committed trace (the
sweeps parametrized by trace) run in the worker that loaded it (one group per trace; see
tests/shared.py). Every other test goes to whichever worker is free.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parent / "traces"

# Importing readline in the controlling process (some pytest plugins do) exports COLUMNS=80 and
# LINES=24 to the C environment that worker processes start with, though Python's os.environ
# never shows them. The tables the CLI prints wrap at $COLUMNS: a worker must see the
# controller's terminal size, not readline's.
TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["profkit_terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_VARS}


def pytest_configure(config):
    env = getattr(config, "workerinput", {}).get("profkit_terminal_env")
    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _group(item: pytest.Item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    for value in params.values():
        if isinstance(value, Path) and value.is_relative_to(TRACES):
            return f"trace:{value.relative_to(TRACES)}"
    defs = getattr(item, "_fixtureinfo", None)
    for fixturedefs in (defs.name2fixturedefs.values() if defs else ()):
        if any(d.scope in ("module", "class") for d in fixturedefs):
            return f"module:{item.path.relative_to(TRACES.parent)}"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    # A wrapper, so the groups are marked before every plugin's own modifyitems runs: xdist's
    # reads the marks there, and the order among plain (even tryfirst) hooks changes between
    # pytest releases.
    if getattr(config.option, "loadgroup", False):
        # The long tests first (their groups with them): the workers hand out work in collection
        # order, and a long test collected late would run on one worker after the others are done.
        items[:] = sorted(items, key=lambda item: item.get_closest_marker("long") is None)
        for item in items:
            group = _group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    return (yield)

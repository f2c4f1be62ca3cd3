"""The import contract between profkit's layers: imports only go down.

    read  <  run  <  judge  <  show  <  api  <  compare  <  cli
              \\-- capture (beside judge: it may use read and run, nothing above uses it)

``profkit.errors`` and ``profkit.model`` (closed categories) are the base every layer may use.
Imports under ``if TYPE_CHECKING:`` are type hints, not dependencies, and are not counted;
imports inside functions are.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "profkit"

BASE = {"base"}
ALLOWED = {
    "base": BASE,
    "read": BASE | {"read"},
    "run": BASE | {"read", "run"},
    "capture": BASE | {"read", "run", "capture"},
    "judge": BASE | {"read", "run", "judge"},
    "show": BASE | {"read", "run", "judge", "show"},
    "api": BASE | {"read", "run", "judge", "show", "api"},
    "compare": BASE | {"read", "run", "judge", "show", "api", "compare"},
    "cli": BASE | {"read", "run", "capture", "judge", "show", "api", "compare", "cli"},
}


def layer_of(module: str) -> str:
    """The layer of a dotted profkit module name."""
    parts = module.split(".")
    if parts == ["profkit"] or parts[1] in ("errors", "model"):
        return "base"  # the package itself is only imported for __version__
    if parts[1] == "__main__":
        return "cli"
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def profkit_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every profkit import in ``path``, type-checking blocks left out."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "profkit":  # from profkit import x: x is a module or __version__
                out += [(node.lineno, f"profkit.{a.name}" if a.name != "__version__" else "profkit")
                        for a in node.names]
            elif node.module.startswith("profkit."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "profkit"]
    return out


MODULES = sorted(p for p in PKG.rglob("*.py") if p.name != "__init__.py" or p.parent != PKG)


def test_every_module_is_in_a_layer():
    for path in MODULES:
        assert layer_of(module_name(path)) in ALLOWED, path


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_only_go_down(path):
    mine = layer_of(module_name(path))
    bad = [(line, m) for line, m in profkit_imports(path) if layer_of(m) not in ALLOWED[mine]]
    assert not bad, f"{path.relative_to(ROOT)} ({mine}) imports from above: {bad}"


def test_the_reading_layer_imports_nothing_from_judging_or_showing():
    for path in (PKG / "read").rglob("*.py"):
        layers = {layer_of(m) for _, m in profkit_imports(path)}
        assert layers <= {"base", "read"}, (path.name, layers)


def test_the_contract_test_catches_an_upward_import(tmp_path):
    # The check itself must be able to fail: a reading module that imports a rule.
    bad = tmp_path / "bad.py"
    bad.write_text("from profkit.judge.rules import base\nfrom profkit import api\n")
    found = {layer_of(m) for _, m in profkit_imports(bad)}
    assert found == {"judge", "api"} and not found <= ALLOWED["read"]


def test_rules_never_render():
    for f in (PKG / "judge" / "rules").glob("*.py"):
        bad = {m for _, m in profkit_imports(f) if layer_of(m) in ("show", "cli", "api")}
        assert not bad, (f.name, bad)


def test_top_level_reads_as_the_pipeline():
    entries = sorted(p.name for p in PKG.iterdir() if not p.name.startswith(("_", ".")) or
                     p.name in ("__init__.py", "__main__.py"))
    assert len([e for e in entries if e != "__pycache__"]) <= 14, entries

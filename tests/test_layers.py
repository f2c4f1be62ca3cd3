"""The import contract between profkit's layers: imports only go down.

    read  <  run  <  judge  <  show  <  api  <  compare  <  cli
              \\-- capture (beside judge: it may use read and run, nothing above uses it)

``profkit.errors`` and ``profkit.model`` (closed categories) are the base every layer may use.
Imports under ``if TYPE_CHECKING:`` are type hints, not dependencies, and are not counted by the
layer check; imports inside functions are. Two checks count the type hints too: nothing below the
facade imports ``profkit.api`` at all (the rules read a ``ProfileView``, which Profile has), and
the static import graph, type hints included, has no cycle that crosses a layer boundary.
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


# What ``from profkit import x`` gives besides submodules: the version, and the facade's names
# that profkit/__init__.py fetches from profkit.api when asked.
PACKAGE_NAMES = {"__version__": "profkit", "load": "profkit.api", "Profile": "profkit.api"}


def _absolute(node: ast.ImportFrom, path: Path) -> str | None:
    """The module an ImportFrom names, relative imports resolved against ``path``'s package."""
    if not node.level:
        return node.module
    try:
        package = module_name(path).split(".")
    except ValueError:  # a file outside the repository: no package to be relative to
        return None
    if path.name != "__init__.py":
        package.pop()
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def profkit_imports(path: Path, hints: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every profkit import in ``path``; ``hints``: with those under ``if
    TYPE_CHECKING:`` too. ``from profkit import x`` names profkit.x (a module, or the facade's
    load and Profile: profkit.api; the version: profkit)."""
    tree = ast.parse(path.read_text())
    skip = set() if hints else _type_checking_lines(tree)
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            if module == "profkit":
                out += [(node.lineno, PACKAGE_NAMES.get(a.name, f"profkit.{a.name}")) for a in node.names]
            elif module and module.startswith("profkit."):
                out.append((node.lineno, module))
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


BELOW_THE_FACADE = ("read", "run", "judge")


def facade_imports(path: Path) -> list[tuple[int, str]]:
    """The imports of profkit.api in ``path``, type hints included."""
    return [(line, m) for line, m in profkit_imports(path, hints=True)
            if m == "profkit.api" or m.startswith("profkit.api.")]


@pytest.mark.parametrize("layer", BELOW_THE_FACADE)
def test_nothing_below_the_facade_imports_it_not_even_for_type_hints(layer):
    bad = {str(p.relative_to(ROOT)): found for p in sorted((PKG / layer).rglob("*.py"))
           if (found := facade_imports(p))}
    assert not bad, f"modules below the facade import profkit.api (a rule reads a ProfileView): {bad}"


def test_the_facade_check_catches_a_type_hint_import(tmp_path):
    # The check must be able to fail: a rule that names Profile for its type hints, as the rules
    # once did, and one that reaches the facade through the package.
    bad = tmp_path / "rule.py"
    bad.write_text("from typing import TYPE_CHECKING\n"
                   "if TYPE_CHECKING:\n    from profkit.api import Profile\n"
                   "def detect(ctx):\n    from profkit import load\n")
    assert [line for line, _ in facade_imports(bad)] == [3, 5]
    assert profkit_imports(bad) == [(5, "profkit.api")]  # the layer check alone misses line 3


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the profkit modules it imports, every import counted (in functions and under
    TYPE_CHECKING too). ``from pkg import sub`` is an import of the submodule; a name that is
    not a module is an import of the nearest module above it (``profkit`` for the version)."""
    def resolve(name: str) -> str:
        while name not in files and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text())
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, path)
                if base is None or base.split(".")[0] != "profkit":
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.add(sub if sub in files else resolve(base))
            elif isinstance(node, ast.Import):
                out |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == "profkit"}
        graph[module] = out - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan's
    algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def cross_layer_cycles(graph: dict[str, set[str]]) -> list[dict[str, list[str]]]:
    """Each cycle whose modules lie in more than one layer, as layer -> its modules there."""
    out = []
    for comp in cycles(graph):
        by_layer: dict[str, list[str]] = {}
        for m in sorted(comp):
            by_layer.setdefault(layer_of(m), []).append(m)
        if len(by_layer) > 1:
            out.append(by_layer)
    return out


PACKAGE_FILES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def test_no_import_cycle_crosses_a_layer_boundary():
    bad = cross_layer_cycles(import_graph(PACKAGE_FILES))
    assert not bad, f"import cycles across layers (type hints included): {bad}"


def test_the_cycle_check_catches_a_cycle_through_the_facade(tmp_path):
    # The check must be able to fail: the rules' base naming the facade's Profile for its type
    # hints, as it once did, closes a cycle rules -> base -> api -> rules.
    base = tmp_path / "base.py"
    real = PACKAGE_FILES["profkit.judge.rules.base"].read_text()
    base.write_text(real + "\nif TYPE_CHECKING:\n    from profkit.api import Profile\n")
    bad = cross_layer_cycles(import_graph({**PACKAGE_FILES, "profkit.judge.rules.base": base}))
    assert len(bad) == 1 and set(bad[0]) == {"api", "judge"}
    assert {"profkit.judge.rules", "profkit.judge.rules.base"} <= set(bad[0]["judge"])
    # A cycle inside one layer is the layer's own business, and is not reported.
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from profkit.judge import b\n")
    b.write_text("def f():\n    from profkit.judge import a\n")
    inside = {**PACKAGE_FILES, "profkit.judge.a": a, "profkit.judge.b": b}
    assert {"profkit.judge.a", "profkit.judge.b"} in cycles(import_graph(inside))
    assert not cross_layer_cycles(import_graph(inside))


def _members(cls: ast.ClassDef, init_attrs: bool = False) -> set[str]:
    """Names a class defines: methods and properties, and with ``init_attrs`` the attributes
    its ``__init__`` sets on self."""
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init_attrs and init is not None:
        targets = [t for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
        targets += [e for t in targets if isinstance(t, ast.Tuple) for e in t.elts]  # a, b = ...
        names |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                  and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return names - {"__init__"}


def _class(path: Path, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"{path.relative_to(ROOT)} defines no class {name}"
    return found[0]


@pytest.fixture
def view() -> set[str]:
    """What the rules may read of a profile: the members of ProfileView."""
    return _members(_class(PKG / "judge" / "rules" / "base.py", "ProfileView"))


def profile_reads(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each use of a rule context's profile (``ctx.prof``, ``self.prof``) other
    than reading one of its members: the member's name, or ``prof`` itself when it is handed on
    or aliased (which would let a rule reach past the view unseen)."""
    tree = ast.parse(path.read_text())
    used_as_base = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "prof" and not isinstance(node.ctx, ast.Store):
            if id(node) not in used_as_base:
                out.append((node.lineno, "prof"))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "prof":
            out.append((node.lineno, node.attr))
    return sorted(out)


def test_the_rules_read_of_a_profile_only_what_the_view_declares(view):
    bad = {p.name: [(line, m) for line, m in profile_reads(p) if m not in view]
           for p in sorted((PKG / "judge" / "rules").glob("*.py"))}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"rules read of the profile what ProfileView does not declare: {bad}"
    assert {m for p in (PKG / "judge" / "rules").glob("*.py") for _, m in profile_reads(p)} == view, \
        "ProfileView declares members no rule reads"


def test_the_view_check_catches_a_rule_that_reaches_past_it(tmp_path, view):
    bad = tmp_path / "rule.py"
    bad.write_text("def detect(ctx):\n    r = ctx.prof.report()\n    p = ctx.prof\n"
                   "    return ctx.prof.trace, helper(ctx.prof)\n")
    assert [(line, m) for line, m in profile_reads(bad) if m not in view] == \
        [(2, "report"), (3, "prof"), (4, "prof")]


def test_the_profile_has_all_the_view_declares(view):
    profile = _members(_class(PKG / "api.py", "Profile"), init_attrs=True)
    assert view and view <= profile, f"Profile lacks {sorted(view - profile)} of ProfileView"


def test_rules_never_render():
    for f in (PKG / "judge" / "rules").glob("*.py"):
        bad = {m for _, m in profkit_imports(f) if layer_of(m) in ("show", "cli", "api")}
        assert not bad, (f.name, bad)


def test_top_level_reads_as_the_pipeline():
    entries = sorted(p.name for p in PKG.iterdir() if not p.name.startswith(("_", ".")) or
                     p.name in ("__init__.py", "__main__.py"))
    assert len([e for e in entries if e != "__pycache__"]) <= 14, entries

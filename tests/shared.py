"""Profiles of committed traces, loaded and judged once per test process.

Loading a trace, building its step model and running the rules is most of the suite's time, and
many tests read the same traces with the same options. ``profile`` gives each caller its own
shallow copy of one Profile that was loaded and run (``Profile.run()``) once in this process: the
trace, the run summary, the findings and the step model are shared (nothing writes to them after
``run()``); the warning and note lists are the copy's own, so what ``ops()`` adds to them in one
test is not seen by another. ``ops`` keeps each op table once and returns a copy per call.

Only for tests that read a Profile: a test that changes one, or checks what a fresh load warns
about, loads its own with ``profkit.load``.
"""
from __future__ import annotations

import ast
import copy
import functools
import json
import lzma
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
import pytest

import profkit
from profkit.api import Profile


@functools.lru_cache(maxsize=None)
def _judged(path: str, peaks: Optional[str], window: str, attribution: str, gains: str) -> Profile:
    p = profkit.load(path, peaks=peaks, window=window, attribution=attribution, gains=gains)
    p.run()
    return p


def _key(path, peaks) -> tuple[str, Optional[str]]:
    return str(Path(path).resolve()), (None if peaks is None else str(Path(peaks).resolve()))


CORPUS = Path(__file__).resolve().parents[1] / "traces" / "corpus"


def corpus(name: str) -> Profile:
    """``profile`` of the what-if corpus's committed trace ``traces/corpus/NAME.sqlite.xz``."""
    return profile(CORPUS / f"{name}.sqlite.xz")


def profile(path, peaks=None, window: str = "auto", attribution: str = "process",
            gains: str = "wall") -> Profile:
    """``profkit.load(path, ...)`` after ``run()``: a copy of the one loaded in this process."""
    p = copy.copy(_judged(*_key(path, peaks), window, attribution, gains))
    p.warnings, p.notes = list(p.warnings), list(p.notes)
    return p


@functools.lru_cache(maxsize=None)
def _ops(path: str, peaks: Optional[str], window: str, attribution: str, gains: str, by: str,
         innermost: bool) -> pd.DataFrame:
    return profile(path, peaks, window, attribution, gains).ops(by=by, innermost=innermost)


def ops(path, by: str = "range", innermost: bool = False, peaks=None, window: str = "auto",
        attribution: str = "process", gains: str = "wall") -> pd.DataFrame:
    """``profile(path, ...).ops(by, innermost)``, computed once in this process. Each call gets a
    copy of the table (the evidence dicts in it are shared: read them, do not change them). A
    level the trace lacks raises ProfkitError on every call, as ``ops`` does."""
    return _ops(*_key(path, peaks), window, attribution, gains, by, innermost).copy()


def declared(script: Path, name: str) -> tuple[str, ...]:
    """A module-level tuple of strings (a workload's FIXES, CUDA_ONLY) read from its source,
    without importing it (it may need what the test machine lacks)."""
    for node in ast.parse(script.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"{script.name} has no {name}")


@pytest.fixture()
def one_thread():
    """One intra-op thread: the corpus programs' tiny CPU models only lose time to more on a
    shared machine. Import it into a test module to use it (``from shared import one_thread``)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(before)


def loop_and_interleave(mod, script: str, variants: str, monkeypatch, tmp_path: Path, capsys) -> None:
    """A corpus program (an imported workload module) on the CPU, on its ``--small`` model: its
    own loop for 2 steps, then ``--interleave`` of ``variants`` for 3 rounds, each variant's
    timings kept (2 used a variant)."""
    import json
    import sys
    base = ["prog", "--device", "cpu", "--small"]
    monkeypatch.setattr(sys, "argv", [*base, "--steps", "2"])
    mod.main()
    assert f"{script}: 2 " in capsys.readouterr().out
    out = tmp_path / "ab.json"
    monkeypatch.setattr(sys, "argv", [*base, "--steps", "2", "--interleave", str(out), "--variants", variants,
                                      "--rounds", "3"])
    mod.main()
    got = json.loads(out.read_text())["variants"]
    assert list(got) == variants.split(",") and all(v["n_used"] == 2 for v in got.values())


def compile_through_dynamo(torch, mod, script: str, monkeypatch, capsys, fix: str = "compile",
                           more: tuple[str, ...] = ()) -> None:
    """A corpus program's compiling ``--fix`` (``compile`` unless named) on its --small model on
    the CPU, traced by Dynamo and run through AOTAutograd eagerly (no Inductor build: minutes on a
    CPU), for 2 steps; a ``mode`` the program asks for is dropped (a backend and a mode cannot be
    given together)."""
    import sys
    torch._dynamo.reset()
    compile_ = torch.compile

    def eager_compile(model=None, **kw):
        kw.pop("mode", None)
        return compile_(model, backend="aot_eager", **kw)
    monkeypatch.setattr(torch, "compile", eager_compile)
    monkeypatch.setattr(sys, "argv", ["prog", "--device", "cpu", "--small", "--steps", "2", "--fix", fix, *more])
    mod.main()
    out = capsys.readouterr().out
    assert script in out and f"fixes ['{fix}']" in out, out
    torch._dynamo.reset()


def check_first_sight_set(programs: list[dict], scripts: list[str], letter: str, root: Path) -> None:
    """A first-sight set's registry entries (``PROGRAMS`` of one ``whatif.programs_firstsight_*``
    module): one per script of ``scripts``, each checked against its program
    (check_first_sight_entry) and naming only that program's fixes, registered as first sight,
    and listed by ``letter``."""
    import whatif.registry as registry
    assert sorted(Path(p["script"]).stem for p in programs) == sorted(scripts)
    for prog in programs:
        check_first_sight_entry(prog, root)
        assert set(prog["fixes"]) == set(declared(root / prog["script"], "FIXES"))
    assert all(registry.select(p["name"])[0].get("first_sight") is True for p in programs)
    assert [p["name"] for p in registry.first_sight([letter], root / "no-such-root")] == [p["name"] for p in programs]


def check_first_sight_entry(prog: dict, root: Path) -> None:
    """A first-sight registry entry against the program it names: its fixes the program's own
    (2 to 4, each ``--fix NAME``), what is expected of each, the iteration range the program
    opens, a capture of 30-60 iterations, the compiling variants marked, and no variant listed
    for interleaving that the program refuses to interleave."""
    path = root / prog["script"]
    src = path.read_text()
    fixes = set(declared(path, "FIXES"))
    assert set(declared(path, "CUDA_ONLY")) <= fixes, prog["name"]
    assert 2 <= len(prog["fixes"]) <= 4 and set(prog["fixes"]) <= fixes, prog["name"]
    for name, fix in prog["fixes"].items():
        assert fix["args"] == ["--fix", name] and fix["pays"] in (True, False, None), (prog["name"], name)
    assert set(prog["expect"]) == {"baseline", *prog["fixes"]}, prog["name"]
    # the program's iteration range is the one named (_corpus.train_step and body_step open
    # "train_step"), and a capture runs 30-60 iterations (up to 200 for a decode loop whose first
    # pass over its shapes compiles: a beam search's 48 tokens a search, cheap once compiled)
    opens = f'nvtx("{prog["step_range"]}")' in src
    assert opens or (prog["step_range"] == "train_step" and ("train_step(" in src or "body_step(" in src)), \
        prog["name"]
    assert prog["capture_args"][:1] == ["--steps"] and 30 <= int(prog["capture_args"][1]) <= 200
    # compiling variants are marked so (the harness gives them longer): a program compiled
    # in every variant at the program's level, else the fixes that compile
    always = "torch.compile(model" in src and "compile" not in fixes
    assert prog.get("compiles", False) == always, prog["name"]
    for name, fix in prog["fixes"].items():
        assert fix.get("compiles", always) == (always or "compile" in name), (prog["name"], name)
    # a fix the program refuses to interleave is never listed for it
    refused = set(re.findall(r'not_interleaved=\{"(\w+)"', src))
    want = prog.get("interleave") or ()
    listed = fixes if want == "all" else set(want)
    assert not refused & listed and listed <= set(prog["fixes"]), prog["name"]


def with_meta(trace: Path, dst_dir: Path, key: str, edit: Callable[[dict], None]) -> Path:
    """A decompressed copy of the committed capture ``trace`` whose PROFKIT_META entry ``key`` (a
    JSON object: ``replacements``, ``calibration``) ``edit`` changed in place."""
    dst = dst_dir / trace.name.removesuffix(".xz")
    with lzma.open(trace) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out)
    con = sqlite3.connect(dst)
    with con:
        meta = json.loads(con.execute("SELECT value FROM PROFKIT_META WHERE key = ?", (key,)).fetchone()[0])
        edit(meta)
        con.execute("UPDATE PROFKIT_META SET value = ? WHERE key = ?", (json.dumps(meta), key))
    con.close()
    return dst


def with_replacements(trace: Path, dst_dir: Path, edit: Callable[[dict], None]) -> Path:
    """A decompressed copy of the committed capture ``trace`` whose PROFKIT_META ``replacements``
    (the op record and the timed entries) ``edit`` changed in place."""
    return with_meta(trace, dst_dir, "replacements", edit)


def with_record_items(trace: Path, dst_dir: Path, kind: str, items: Optional[list]) -> Path:
    """A copy of the committed capture ``trace`` whose op record holds ``items`` as its ``kind``
    entry (None: no such entry, as a record written before it had one), its other entries kept."""
    def edit(meta: dict) -> None:
        if items is None:
            meta["record"].pop(kind, None)
        else:
            meta["record"][kind] = items
    return with_replacements(trace, dst_dir, edit)

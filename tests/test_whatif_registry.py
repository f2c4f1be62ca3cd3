"""The what-if corpus's registry (scripts/whatif/registry.py): the concatenation of its files of
programs, each program once."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from whatif import registry  # noqa: E402  (scripts/whatif/: scripts/whatif_accuracy.py's harness)


def test_every_file_of_programs_is_in_the_registry_once():
    # A file of programs that registry.py does not concatenate would be measured and priced by nothing
    files = sorted((ROOT / "scripts" / "whatif").glob("programs_*.py"))
    assert len(files) >= 2
    listed = [id(p) for p in registry.PROGRAMS]
    for f in files:
        mod = importlib.import_module(f"whatif.{f.stem}")
        entries = [p for name in ("PROGRAMS", "LISTED_LAST") for p in getattr(mod, name, [])]
        assert entries, f.name
        assert all(listed.count(id(p)) == 1 for p in entries), f"{f.name}: not in registry.PROGRAMS once"
    names = [p["name"] for p in registry.PROGRAMS]
    assert len(names) == len(set(names))


def test_a_program_keeps_its_place_and_its_variants():
    # The page's tables follow the registry's order: the first programs, then the later models
    names = [p["name"] for p in registry.PROGRAMS if not p.get("first_sight")]
    assert names[0] == "train_llama" and names[-2:] == ["varlen_empty_cache", "sync_loop"]
    # the first-sight programs come after the corpus's own
    first = [i for i, p in enumerate(registry.PROGRAMS) if p.get("first_sight")]
    assert first and first[0] == len(names) and first == list(range(len(names), len(registry.PROGRAMS)))
    assert names.index("handwritten_block_train") + 1 == names.index("gpt2_fp32_train")
    prog = registry.select("sync_loop")[0]
    assert [v for v, _, _ in registry.variants(prog)] == ["baseline", "no_sync", "graph"]
    assert registry.variants(prog, {"graph"})[1][1] == ["--steps", "40", "--graph"]

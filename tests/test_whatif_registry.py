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


def test_first_sight_lists_a_set_not_captured_yet_or_the_programs_named(tmp_path, capsys):
    # scripts/gpu/firstsight.sh takes its programs from here: a set's programs without a committed
    # trace (none of set b is committed in tmp_path), or the one-GPU first-sight programs named
    import pytest
    import whatif.programs_firstsight_b as set_b
    assert [p["name"] for p in registry.first_sight(["b"], tmp_path)] == [p["name"] for p in set_b.PROGRAMS]
    (tmp_path / "traces" / "corpus").mkdir(parents=True)
    (tmp_path / "traces" / "corpus" / f"{set_b.PROGRAMS[0]['name']}.sqlite.xz").write_bytes(b"")
    assert [p["name"] for p in registry.first_sight(["b"], tmp_path)] == [p["name"] for p in set_b.PROGRAMS[1:]]
    assert [p["name"] for p in registry.first_sight(["d2h_logits_numpy"], tmp_path)] == ["d2h_logits_numpy"]
    for not_one in ("train_llama", "ddp_accum_train"):  # not first sight; two GPUs
        with pytest.raises(SystemExit, match="not a one-GPU first-sight program"):
            registry.first_sight([not_one], tmp_path)
    from whatif import cli
    cli.main(["list", "--ranges", "--first-sight", "d2h_logits_numpy", "recsys_embbag_train"])
    assert capsys.readouterr().out == "d2h_logits_numpy\tscore_batch\nrecsys_embbag_train\ttrain_step\n"

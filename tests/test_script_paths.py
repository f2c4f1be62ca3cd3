"""Every script that the documentation, the pages and the scripts themselves name exists, and
scripts/README.md lists every script."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_PATH = re.compile(r"(?<![\w/.-])scripts/[\w./-]+?\.(?:py|sh)(?![\w])")
TEXTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "analyses").glob("*.md"),
                *(ROOT / "traces").rglob("README.md"), *(ROOT / "tests" / "data").rglob("README.md"),
                *(ROOT / "scripts").rglob("*.py"), *(ROOT / "scripts").rglob("*.sh"),
                *(ROOT / "kernels").glob("*.py"), *(ROOT / "tests").glob("*.py")])
LISTED = ("pages", "bench", "gpu", "tools", "whatif")  # every file in these folders has its line in scripts/README.md


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_scripts_exist(path):
    missing = sorted({m for m in SCRIPT_PATH.findall(path.read_text(errors="replace"))
                      if not (ROOT / m).exists()})
    assert not missing, f"{path.relative_to(ROOT)} names scripts that do not exist: {missing}"


def test_scripts_readme_lists_every_script():
    readme = (ROOT / "scripts" / "README.md").read_text()
    scripts = [p for folder in LISTED for p in sorted((ROOT / "scripts" / folder).iterdir())
               if p.suffix in (".py", ".sh")]
    scripts += [p for p in sorted((ROOT / "scripts").iterdir()) if p.suffix in (".py", ".sh")]
    unlisted = [str(p.relative_to(ROOT / "scripts")) for p in scripts if f"`{p.name}`" not in readme]
    assert not unlisted, f"scripts/README.md has no line for {unlisted}"
    for folder in (*LISTED, "workloads"):
        assert f"`{folder}/`" in readme, folder

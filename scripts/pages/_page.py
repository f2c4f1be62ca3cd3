"""Write or check generated pages: the one place where every page generator in scripts/pages/
writes what it made, or compares it with the committed files.

    from _page import write_or_check
    return write_or_check({PAGE: render()}, check=args.check,
                          command="python scripts/pages/make_loop_page.py")

Write: each page is written (folders created) and named on stdout. Check (``--check``, what the
drift tests run): nothing is written; every page that differs from its file, or has none, is
named on stderr with a unified diff from the file to the fresh text, and the exit status is 1.
"""
from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Mapping, Union

ROOT = Path(__file__).resolve().parents[2]
DRIFT, OK = 1, 0  # exit statuses


def shown(path: Union[str, Path]) -> str:
    """``path`` relative to the repository root when it lies under it, else as given."""
    p = Path(path)
    return str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p)


def page_diff(path: Union[str, Path], text: str) -> str:
    """The unified diff from the file at ``path`` (empty when there is none) to ``text``; ''
    when they are equal."""
    p = Path(path)
    old = p.read_text() if p.exists() else ""
    if old == text:
        return ""
    return "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                        shown(p), "fresh run"))


def write_or_check(pages: Mapping[Union[str, Path], str], check: bool, command: str) -> int:
    """Write each page (path -> text), or with ``check`` compare each with the file at its path.

    Check: prints ``PATH: differs from a fresh run`` (or ``PATH: not committed``) and the
    unified diff on stderr for each page that differs, then ``run `COMMAND` and commit``, and
    returns 1; when every page matches, prints ``N page(s) checked, no drift`` and returns 0.
    Write: writes every page, prints ``wrote PATH`` for each, returns 0."""
    if not check:
        for path, text in pages.items():
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            print(f"wrote {shown(p)}")
        return OK
    stale = 0
    for path, text in pages.items():
        d = page_diff(path, text)
        if d:
            stale += 1
            what = "differs from a fresh run" if Path(path).exists() else "not committed"
            print(f"{shown(path)}: {what}", file=sys.stderr)
            sys.stderr.write(d if d.endswith("\n") else d + "\n")
    if stale:
        print(f"{stale} of {len(pages)} page(s) stale: run `{command}` and commit", file=sys.stderr)
        return DRIFT
    print(f"{len(pages)} page(s) checked, no drift")
    return OK

"""The report page in a real headless Chromium: loads offline, no console errors, a screenshot.

Needs Debian's chromium (`apt-get install -y chromium`) and the `playwright` Python package; it
never lets playwright download a browser. Skips (with the reason) when either is missing.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=True)

import pytest  # noqa: E402

import profkit  # noqa: E402
from profkit.show import report  # noqa: E402
from test_report import EVIL, evil_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_path() -> str | None:
    for cand in (os.environ.get("PROFKIT_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium",
                 shutil.which("chromium-browser")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


@pytest.fixture(scope="module")
def browser():
    exe = chromium_path()
    if exe is None:
        pytest.skip("no chromium binary (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        yield b
        b.close()


def open_page(browser, path: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:80]}"))
    page.on("request", lambda r: problems.append(f"outside request: {r.url[:80]}")
            if not r.url.startswith(("file:", "data:")) else None)
    page.goto(path.resolve().as_uri(), wait_until="load")
    return page, problems


@pytest.mark.parametrize("which", ["evil", "real"])
def test_report_loads_without_console_errors_and_screenshots(browser, tmp_path, which):
    if which == "evil":
        trace = evil_trace(tmp_path / "evil.sqlite")
    else:
        trace = ROOT / "traces" / "model_tiny_llama_aten.sqlite.xz"
    index = report.build(profkit.load(trace), tmp_path / "out", by="aten" if which == "real" else "range")
    page, problems = open_page(browser, index)
    assert problems == []
    assert page.title().startswith("profkit report:")
    # Both pictures decoded (inline PNGs), no script ran or exists.
    widths = page.evaluate("[...document.images].map(i => i.complete ? i.naturalWidth : 0)")
    assert len(widths) == 2 and all(w > 500 for w in widths)
    assert page.evaluate("document.querySelectorAll('script').length") == 0
    for section in ("summary", "roofline", "timeline", "ops"):
        assert page.locator(f"section#{section}").count() == 1
    if which == "evil":
        assert EVIL in page.inner_text("body")
    shot = tmp_path / f"{which}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    page.close()

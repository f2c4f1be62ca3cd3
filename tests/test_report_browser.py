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


def test_llama_report_agrees_with_itself_and_fits_1400px(browser, tmp_path):
    """A plain capture of a Llama training step: the summary's headline is the gain of the first
    action that the Run section ranks (one list, the JSON's run.actions), and nothing on the
    page is wider than a 1400 px window (the Run section's long action lines wrap)."""
    prof = profkit.load(ROOT / "traces" / "real" / "train_llama.sqlite.xz")
    index = report.build(prof, tmp_path / "out")
    actions = report.summarize(prof, prof.ops(by="range"), "range").actions
    assert actions, "this capture has actions that pay"
    gain = f"{actions[0]['expected_end_to_end_speedup']:.2f}"
    page, problems = open_page(browser, index)
    assert problems == []
    shot = tmp_path / "llama_1400.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Nothing wider than the window: no horizontal scrolling, no element past the right edge.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    wide = page.evaluate("""[...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
        .map(e => e.tagName + '.' + e.className)""")
    assert wide == []
    # One story: the card, the gain box and the Run section's first action all say the same gain.
    card = page.locator(".card", has_text="expected end-to-end gain").locator(".v").inner_text()
    assert card == f"{gain}×"
    assert page.inner_text("#headline-gain") == f"{gain}×"
    run_text = page.inner_text("section#run")
    first = next(line for line in run_text.splitlines() if line.startswith("actions"))
    assert f"[{gain}x end to end" in first
    assert page.locator("#gain li").first.inner_text().endswith(f"{gain}× end to end")
    assert "No suggestion is expected to pay off" not in page.inner_text("body")
    assert page.locator("section#run pre").count() == 0
    page.close()

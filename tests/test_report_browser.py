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
from profkit.read.text import visible  # noqa: E402
from profkit.show.render import wrapped_run_lines  # noqa: E402
from profkit.show.run_html import TEXT_WIDTH, model_iteration  # noqa: E402
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


@pytest.fixture(scope="module")
def llama_report(tmp_path_factory):
    """A plain capture of a Llama training step: its report and its run JSON."""
    prof = profkit.load(ROOT / "traces" / "real" / "train_llama.sqlite.xz")
    index = report.build(prof, tmp_path_factory.mktemp("llama") / "out")
    return index, report.summarize(prof, prof.ops(by="range"), "range").run


def test_llama_report_agrees_with_itself_and_fits_1400px(browser, tmp_path, llama_report):
    """The summary's headline is the gain of the first action that the Run section ranks (one
    list, the JSON's run.actions), and nothing on the page is wider than a 1400 px window (the
    Run section's long action texts wrap), the full text unfolded or not."""
    index, run = llama_report
    actions = run["actions"]
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
    assert page.inner_text("#run-actions tbody tr:first-child td:nth-child(4)") == f"{gain}×"
    assert page.locator("#gain li").first.inner_text().endswith(f"{gain}× end to end")
    assert "No suggestion is expected to pay off" not in page.inner_text("body")
    page.click("#run-text summary")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.close()


def test_run_section_in_the_browser(browser, llama_report):
    """The Run section as a reader sees it: the verdict, bars whose segments fill them exactly
    and as wide as the shares they say, the actions table row for row as run.actions, and the
    terminal's text behind one click."""
    index, run = llama_report
    page, problems = open_page(browser, index)
    assert page.inner_text("#verdict .vclass") == run["verdict"]["class"]
    assert page.inner_text("#verdict .vreason") == visible(run["verdict"]["reason"])
    assert page.locator("#verdict").is_visible()
    for bar in ("wall-bar", "path-bar"):
        geo = page.evaluate(f"""(() => {{
            const bar = document.getElementById('{bar}');
            return {{width: bar.getBoundingClientRect().width,
                     label: bar.getAttribute('aria-label'), role: bar.getAttribute('role'),
                     segs: [...bar.children].map(s => ({{w: s.getBoundingClientRect().width,
                                                        share: parseFloat(s.dataset.share)}}))}};
        }})()""")
        assert geo["width"] > 1000 and geo["role"] == "img" and geo["label"]
        assert abs(sum(s["w"] for s in geo["segs"]) - geo["width"]) < 1.0
        assert abs(sum(s["share"] for s in geo["segs"]) - 1) < 1e-4
        for s in geo["segs"]:
            assert abs(s["w"] - s["share"] * geo["width"]) < 1.0
        legend = page.locator(f"#{bar}-legend li")
        assert legend.count() == len(geo["segs"])
    wall = run["wall_time_ns"]
    drawn = [k for k, v in run["breakdown"].items() if v > 0]
    assert page.evaluate("[...document.getElementById('wall-bar').children].map(s => s.dataset.part)") == drawn
    for k in drawn:
        item = page.inner_text(f'#wall-bar-legend li[data-part="{k}"]')
        assert f"{100 * run['breakdown'][k] / wall:.1f}%" in item
    # The actions table: one row per ranked action, in their order, with their numbers.
    rows = page.locator("#run-actions tbody tr")
    assert rows.count() == len(run["actions"]) > 0
    assert page.locator("#run-actions thead th").count() == 6
    for i, a in enumerate(run["actions"]):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).inner_text() == str(i + 1)
        assert cells.nth(1).inner_text().startswith(visible(a["action"]))
        assert cells.nth(2).inner_text() == f"{a['code']} {a['rule']}"
        assert cells.nth(3).inner_text() == f"{a['expected_end_to_end_speedup']:.2f}×"
        before, after = model_iteration(a)
        assert cells.nth(4).inner_text() == f"{before:.2f} → {after:.2f} ms"
        assert cells.nth(5).inner_text() == "-"   # no trial in this capture
    # The full text: folded, then one click shows it, line for line the terminal's.
    pre = page.locator("#run-text pre")
    assert not pre.is_visible()
    page.click("#run-text summary")
    assert pre.is_visible()
    lines = [visible(ln) for w in wrapped_run_lines(run, TEXT_WIDTH) for ln in w.split("\n")]
    assert pre.inner_text().rstrip("\n").split("\n") == lines
    assert any(ln.startswith("verdict  ") for ln in lines) and len(lines) > 10
    assert problems == []
    page.close()

"""`profkit report`: one self-contained, valid, escaped HTML page (and a Markdown variant)."""
from __future__ import annotations

from functools import partial

import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=True)

import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import profkit  # noqa: E402
from profkit.show import report  # noqa: E402
from profkit.cli import main  # noqa: E402
from profkit.errors import ProfkitError  # noqa: E402
from synth import TID, make_trace  # noqa: E402

# Golden numbers here are over the whole capture with Nsight Systems' per-thread projection.
load_all = partial(profkit.load, window="all", attribution="thread")

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
EVIL = "<script>alert(1)</script>"
LONG_KERNEL = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::AddFunctor<float>, "
               "at::detail::Array<char *, (int)3>>(int, at::native::AddFunctor<float>, at::detail::Array<char *, (int)3>)")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def evil_trace(path: Path) -> Path:
    """A hand-made trace whose range is named like an XSS attempt and whose kernel has a long C++ name."""
    strings = {1: LONG_KERNEL, 2: "gemm<&\"quoted\">", 9: "cudaLaunchKernel"}
    kernels = [(1_000, 21_000, 1, 1), (30_000, 90_000, 2, 2), (200_000, 201_000, 3, 1)]
    runtime = [(500, 900, 1), (25_000, 25_400, 2), (150_000, 150_400, 3)]
    nvtx = [(0, 28_000, EVIL, TID), (24_000, 100_000, "mm {flops=4e9, bytes=2e7, precision=bf16}", TID)]
    return make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings)


class Page(HTMLParser):
    """Collect tags, attributes and text; check that every tag closes in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl.lower() == "doctype html"

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html_text: str) -> Page:
    p = Page()
    p.feed(html_text)
    p.close()
    return p


@pytest.fixture(scope="module")
def evil_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("evil")
    trace = evil_trace(d / "evil.sqlite")
    path = report.build(load_all(trace), d / "out")
    return path, path.read_text(encoding="utf-8")


def test_html_is_valid_and_self_contained(evil_report):
    path, text = evil_report
    assert path.name == "index.html"
    page = parse(text)
    assert page.doctype and not page.errors and page.stack == []
    tags = [t for t, _ in page.tags]
    assert tags.count("html") == 1 and tags.count("body") == 1 and "title" in tags
    # No script, no external stylesheet, font or image: opens offline.
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    for tag, attrs in page.tags:
        for k in ("src", "href"):
            if k in attrs:
                assert attrs[k].startswith("data:image/png;base64,"), (tag, attrs[k][:40])
    assert not re.search(r"url\(|@import|https?://", "".join(t for t, a in page.tags if t == "style") +
                         text.split("<style>")[1].split("</style>")[0])
    imgs = [a["src"] for t, a in page.tags if t == "img"]
    assert len(imgs) == 2
    for src in imgs:
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_sections(evil_report):
    _, text = evil_report
    page = parse(text)
    ids = [a.get("id") for _, a in page.tags if a.get("id")]
    for section in ("summary", "gain", "top-ops", "roofline", "timeline", "ops", "all-ops"):
        assert section in ids
    body = " ".join(page.text)
    for words in ("NVIDIA H200", "total GPU time", "GPU busy", "Top ops by GPU time", "expected end-to-end gain",
                  "Roofline", "Timeline", "All ops", "not placed (no work counts): 1 ops"):
        assert words in body, words
    # The full table has one row per op.
    n_rows = text.split('id="all-ops"')[1].split("</table>")[0].count("<tr>") - 1
    assert n_rows == len(load_all(evil_trace_path(evil_report)).ops())


def evil_trace_path(evil_report) -> Path:
    return evil_report[0].parent.parent / "evil.sqlite"


def test_user_strings_are_escaped(evil_report):
    _, text = evil_report
    page = parse(text)
    assert "script" not in [t for t, _ in page.tags]
    assert EVIL not in text
    assert html_escaped(EVIL) in text
    assert EVIL in " ".join(page.text)            # shown to the reader as text
    assert '<span class="badge' in text           # and the page's own markup is intact


def html_escaped(s: str) -> str:
    import html
    return html.escape(s, quote=True)


def test_long_kernel_names_are_short_with_the_full_name_on_hover(tmp_path):
    trace = evil_trace(tmp_path / "k.sqlite")
    text = report.build(load_all(trace), tmp_path / "out", by="kernel").read_text()
    page = parse(text)
    cells = [a for t, a in page.tags if t == "td" and a.get("class") == "op"]
    titles = [a["title"] for a in cells]
    assert LONG_KERNEL in titles and 'gemm<&"quoted">' in titles
    body = " ".join(page.text)
    assert "vectorized_elementwise_kernel" in body and "at::detail::Array" not in body


def test_markdown_report_has_pngs_beside_it(tmp_path):
    trace = evil_trace(tmp_path / "m.sqlite")
    path = report.build(load_all(trace), tmp_path / "md", fmt="markdown")
    assert path.name == "report.md"
    md = path.read_text()
    for png in ("roofline.png", "timeline.png"):
        assert f"]({png})" in md
        assert (tmp_path / "md" / png).read_bytes()[:4] == b"\x89PNG"
    assert "## Summary" in md and "## All ops" in md
    assert EVIL not in md and "&lt;script&gt;" in md


@pytest.mark.parametrize("name", ["fused_softmax_torch_ncu", "micro_graph", "micro_chain", "real/train_llama"])
def test_headline_is_the_first_ranked_action_of_the_run(name, tmp_path):
    """One source of truth: the summary's headline gain is the first of the run's ranked actions
    (run.actions in the JSON), which the Run section lists in the same order."""
    prof = profkit.load(TRACES / f"{name}.sqlite.xz")
    df = prof.ops(by="range")
    actions = prof.run_json(df)["actions"]
    s = report.summarize(prof, df, "range")
    assert s.actions == actions and actions
    assert s.headline_speedup == actions[0]["expected_end_to_end_speedup"] == \
        max(a["expected_end_to_end_speedup"] for a in actions)
    text = report.render_html(s, df, b"", b"", "", [])
    assert not parse(text).errors
    assert f'<span id="headline-gain">{s.headline_speedup:.2f}×</span>' in text
    assert f'expected end-to-end gain</div><div class="v">{s.headline_speedup:.2f}×</div>' in text
    assert "No suggestion is expected to pay off" not in text
    items = text.split('id="gain"')[1].split("</ol>")[0].count("<li>")
    assert items == len(actions)
    # The Run section: the same actions in a table, in the same order; the terminal's text
    # folded away in one details element.
    run = text.split('<section id="run">')[1].split("</section>")[0]
    rows = run.split('<table id="run-actions">')[1].split("</table>")[0].split('<tr data-rank="')[1:]
    assert [int(r.split('"')[0]) for r in rows] == list(range(1, len(actions) + 1))
    for row, a in zip(rows, actions):
        assert f'<td class="num">{a["expected_end_to_end_speedup"]:.2f}×</td>' in row
    assert run.count("<details id=\"run-text\">") == 1 and run.count("<pre>") == 1
    md = report.render_markdown(s, df, "", [])
    assert f"- Expected end-to-end gain: **{s.headline_speedup:.2f}×**" in md


def test_no_action_says_so(tmp_path):
    trace = evil_trace(tmp_path / "quiet.sqlite")
    prof = load_all(trace)
    df = prof.ops(by="range")
    s = report.summarize(prof, df.assign(worth_it=False), "range")
    s.run["actions"] = []
    assert s.headline_speedup == 1.0
    text = report.render_html(s, df, b"", b"", "", [])
    assert "No suggestion is expected to pay off end to end" in text and "1.00×" in text
    assert "- No suggestion is expected to pay off end to end" in report.render_markdown(s, df, "", [])


def test_report_on_a_real_trace_via_cli(tmp_path):
    trace = TRACES / "micro_graph.sqlite.xz"
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    res = CliRunner().invoke(main, ["report", "--window", "all", "--attribution", "thread", str(trace), "-o", str(tmp_path / "r")], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    text = (tmp_path / "r" / "index.html").read_text()
    page = parse(text)
    assert not page.errors
    assert "eager_chain" in text and "graph_replay" in text and "launch" in text
    res = CliRunner().invoke(main, ["report", "--window", "all", "--attribution", "thread", str(trace), "-o", str(tmp_path / "m"), "--format", "markdown"],
                             catch_exceptions=False)
    assert res.exit_code == 0 and (tmp_path / "m" / "report.md").exists()
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before


def test_report_timeline_leaves_out_the_set_up_before_the_first_range():
    from profkit.show.plots.timeline import trace_origin
    prof = load_all(TRACES / "micro_graph.sqlite.xz")
    t0, _ = trace_origin(prof)
    first = int(prof.trace.ranges["start"].min()) - t0
    region = report._op_region(prof, "range")
    assert 0.9 * first < region["start"] < first
    assert report._op_region(prof, "kernel") == {}


def test_report_falls_back_to_kernels_without_ranges(tmp_path):
    trace = make_trace(tmp_path / "n.sqlite", kernels=[(0, 1000, 1, 1)], runtime=[(0, 10, 1)], with_nvtx=False)
    text = report.build(load_all(trace), tmp_path / "out").read_text()
    assert "ops are kernels instead" in text and "kernel_a" in text


@pytest.mark.parametrize("make_out, message", [
    (lambda tmp: tmp / "afile", "is a file"),
    (lambda tmp: tmp / "afile" / "sub", "cannot write"),
])
def test_report_output_errors(tmp_path, make_out, message):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ProfkitError, match=message):
        report.build(load_all(TRACES / "micro_hinted.sqlite.xz"), make_out(tmp_path))
    res = CliRunner().invoke(main, ["report", "--window", "all", "--attribution", "thread", str(TRACES / "micro_hinted.sqlite.xz"), "-o", str(make_out(tmp_path))])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profkit: error:"), res.stderr


def test_report_missing_trace_is_one_line(tmp_path):
    res = CliRunner().invoke(main, ["report", "--window", "all", "--attribution", "thread", str(tmp_path / "nope.sqlite"), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and res.stderr.strip() == f"profkit: error: trace not found: {tmp_path / 'nope.sqlite'}"

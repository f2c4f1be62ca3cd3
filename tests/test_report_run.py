"""The report's Run section (profkit.show.run_html): built from the run JSON, bars that add up,
shares that are never impossible, tried gains beside predicted ones, every name escaped."""
from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import pytest

import profkit
from profkit.show.render import wrapped_run_lines
from profkit.show.run_html import TEXT_WIDTH, model_iteration, run_section, tried_text
from test_report import parse

TRACES = Path(__file__).resolve().parents[1] / "traces"


@pytest.fixture(scope="module")
def llama_run() -> dict:
    prof = profkit.load(TRACES / "real" / "train_llama.sqlite.xz")
    return prof.run_json(prof.ops(by="range"))


def part(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def widths(section: str, bar_id: str) -> list[float]:
    bar = part(section, f'<div class="stack" id="{bar_id}"', "</div>")
    return [float(w) for w in re.findall(r"width:([0-9.]+)%", bar)]


def test_bars_add_up_and_say_their_shares(llama_run):
    run = llama_run
    text = run_section(run)
    assert not parse(text).errors
    wall = run["wall_time_ns"]
    assert sum(run["breakdown"].values()) == wall  # the contract the bar draws on
    w = widths(text, "wall-bar")
    drawn = [k for k, v in run["breakdown"].items() if v > 0]
    assert len(w) == len(drawn) and abs(sum(w) - 100) < 1e-6 and min(w) > 0
    # Each legend entry says its part's share of the wall time, as the terminal's line does.
    legend = part(text, '<ul class="legend" id="wall-bar-legend">', "</ul>")
    for k in drawn:
        item = part(legend, f'<li data-part="{k}">', "</li>")
        shown = float(re.search(r"([0-9.]+)%", item).group(1))
        assert abs(shown - 100 * run["breakdown"][k] / wall) <= 0.05
    busy = 100 * run["gpu_busy_ns"] / wall
    assert f"GPU busy {busy:.1f}%, idle {100 - busy:.1f}%" in text
    # The critical path: one bar by kind, the same total as the terminal's path line.
    pw = widths(text, "path-bar")
    assert abs(sum(pw) - 100) < 1e-6 and min(pw) > 0
    path_line = next(line for line in wrapped_run_lines(run, 1000) if line.startswith("path"))
    total = path_line.split()[1] + " " + path_line.split()[2]
    assert f"<h3>Critical path: {total} an iteration, by kind</h3>" in text


def test_impossible_inputs_give_no_impossible_number(llama_run):
    """A part below zero is not drawn, a busy time past the wall is clipped to it: no share on
    the page is below 0% or above 100%, and the bars still fill exactly their width."""
    run = copy.deepcopy(llama_run)
    run["breakdown"]["idle_other"] = -5_000_000
    run["gpu_busy_ns"] = 2 * run["wall_time_ns"]
    run["calibration"]["predicted_iteration_ns"] = 2 * run["calibration"]["profiled_iteration_ns"]
    text = run_section(run)
    assert "GPU busy 100.0%, idle 0.0%" in text
    w = widths(text, "wall-bar")
    assert abs(sum(w) - 100) < 1e-6 and 'data-part="idle_other"' not in part(text, 'id="wall-bar"', "</ul>")
    shares = [float(x) for x in re.findall(r"(-?[0-9.]+)%", re.sub(r"<style>.*?</style>", "", text))]
    assert shares and all(0 <= x <= 100 for x in shares)
    # The model says the iteration is longer without the profiler: it added nothing, not -100%.
    assert part(text, "the profiler&#x27;s added share</div>", "</div>") == '<div class="v">0.0%'


def test_actions_table_with_tried_gains_and_unmatched_trials(llama_run):
    run = copy.deepcopy(llama_run)
    acts = run["actions"]
    assert len(acts) == 3
    acts[0]["tried"] = {"speedup": 2.05, "runs": 4, "lo": 1.92, "hi": 2.19, "applied": True,
                        "error": None, "switch": "reduce-overhead"}
    acts[1]["tried"] = {"speedup": None, "runs": 0, "lo": None, "hi": None, "applied": False,
                        "error": "RuntimeError: <overwritten> by a subsequent run\x1b[0m", "switch": "fused-adamw"}
    run["trials"] = [
        {"switch": "tf32", "speedup": 1.31, "runs": 1, "lo": 1.31, "hi": 1.31, "applied": True,
         "error": None, "note": "no ranked action names it"},
        {"switch": "channels-last", "speedup": None, "runs": 0, "lo": None, "hi": None, "applied": False,
         "error": None, "note": "no 4-D input"}]
    text = run_section(run)
    assert not parse(text).errors
    table = part(text, '<table id="run-actions">', "</table>")
    rows = table.split('<tr data-rank="')[1:]
    assert len(rows) == len(acts)
    for row, a in zip(rows, acts):
        assert html.escape(a["action"]) in row
        assert f'<td class="rule">{a["code"]} {a["rule"]}</td>' in row
        assert f'{a["expected_end_to_end_speedup"]:.2f}×' in row
        before, after = model_iteration(a)
        assert f"{before:.2f} → {after:.2f} ms" in row
    assert '<td class="tried">2.05× (4 runs, 1.92–2.19×)<div class="sub">switch: reduce-overhead</div>' in rows[0]
    # The error as text, its controls visible: nothing in it is markup or a terminal escape.
    assert ("failed: RuntimeError: &lt;overwritten&gt; by a subsequent run\\x1b[0m" in rows[1]
            and "\x1b" not in text)
    assert '<td class="tried">-</td>' in rows[2]
    trials = part(text, '<table id="run-trials">', "</table>")
    assert ('<td>tf32</td><td class="tried">1.31× (1 run, 1.31–1.31×)</td><td>no ranked action names it</td>'
            in trials)
    assert "<td>channels-last</td><td class=\"tried\">not applied</td><td>no 4-D input</td>" in trials
    assert tried_text({"applied": False, "note": "no 4-D input", "error": None}) == "not applied: no 4-D input"
    assert tried_text({"speedup": float("nan"), "runs": 3, "applied": True}) == "no time measured"
    assert tried_text(None) == "-"
    # Without trials, no trials table and every tried cell says "-".
    plain = run_section(llama_run)
    assert 'id="run-trials"' not in plain and plain.count('<td class="tried">-</td>') == len(acts)


@pytest.mark.parametrize("name", ["real/train_llama", "real/sync_loop", "real/cnn_infer"])
def test_model_iteration_is_the_step_models_price(name):
    """The before -> after column reads the iteration the step model priced each action at
    (RuleContext.price writes it into the basis): their ratio is the action's gain."""
    prof = profkit.load(TRACES / f"{name}.sqlite.xz")
    acts = prof.run_json(prof.ops(by="range"))["actions"]
    priced = [a for a in acts if "step model" in a["basis"]]
    assert priced
    for a in priced:
        before, after = model_iteration(a)
        if "capped" not in a["basis"]:
            # The basis rounds to 0.01 ms; the gain to 0.001.
            assert before / after == pytest.approx(a["expected_end_to_end_speedup"], abs=0.01 * before / after)
    assert model_iteration({"basis": "wall / max(GPU busy 1.0 ms, ...)"}) is None


def test_names_are_text_and_the_full_text_is_one_click_away(llama_run):
    run = copy.deepcopy(llama_run)
    evil = "<img src=x onerror=alert(1)>\x1b[2J\u202e"
    run["window"]["source"] = f"nvtx {evil}[1:12] of 12"
    run["idle_host_by_range"] = {evil: run["wall_time_ns"] // 2}
    run["critical_path"][0]["where"] = evil
    run["actions"][0]["action"] = f"{evil}: fuse it"
    text = run_section(run)
    page = parse(text)
    assert not page.errors and "img" not in [t for t, _ in page.tags]
    assert "\x1b" not in text and "\u202e" not in text
    shown = "<img src=x onerror=alert(1)>\\x1b[2J\\u202e"
    assert text.count(html.escape(shown)) >= 5      # window, waiting-for line, path, action, full text
    # The terminal's lines, wrapped as it wraps them, in one pre inside a details element.
    pre = part(text, '<details id="run-text"><summary>', "</details>").split("<pre>")[1].split("</pre>")[0]
    lines = [line for w in wrapped_run_lines(run, TEXT_WIDTH) for line in w.split("\n")]
    assert html.unescape(pre).split("\n") == [ln.replace("\x1b", "\\x1b").replace("\u202e", "\\u202e")
                                              for ln in lines]


def test_a_whole_capture_has_no_step_model(llama_run):
    run = copy.deepcopy(llama_run)
    run["iterations"] = 0
    run["actions"] = []
    text = run_section(run)
    assert 'id="step-model"' not in text and 'id="path-bar"' not in text
    assert "Window: nvtx train_step[1:12] of 12: " in text
    assert "No action is expected to pay off end to end" in text and 'id="run-actions"' in text


def test_an_action_priced_over_the_runs_speeds_shows_its_range(llama_run):
    run = copy.deepcopy(llama_run)
    run["actions"][0]["range"] = {"lo": 1.31, "hi": 1.70, "runs": 2, "estimate": False}
    rows = part(run_section(run), '<table id="run-actions">', "</table>").split('<tr data-rank="')[1:]
    assert "1.31-1.70x at the speeds of the 2 runs without the profiler" in rows[0]
    assert "runs without the profiler" not in rows[1]

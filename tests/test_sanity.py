"""Sanity of timelines and inputs: unclosed ranges, hints and peaks files."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import profkit
from profkit.cli import main
from profkit.errors import ProfkitError
from profkit.read.hints import HintError, check_range_name, parse_range_name
from profkit.run.ops import group_ops
from profkit.read.trace import Trace
from synth import TID, make_trace

RUNTIME = [(110, 120, 1), (210, 220, 2), (310, 320, 3), (410, 420, 4)]
KERNELS = [(200, 300, 1, 1), (300, 400, 2, 1), (400, 500, 3, 1), (500, 600, 4, 1)]


def test_unclosed_ranges_end_at_the_end_of_the_capture(tmp_path):
    # "step" pushed three times and never popped (a crash inside a loop), "tail" never popped
    nvtx = [(100, None, "step", TID), (200, None, "step", TID), (300, None, "step", TID),
            (400, None, "tail", TID)]
    path = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME, nvtx=nvtx)
    tr = Trace(path)
    assert list(tr.ranges["end"]) == [600, 600, 600, 600]  # the last kernel's end, not 400
    assert tr.unclosed_ranges == 4
    ops = group_ops(tr).ops
    assert ops["share"].max() <= 1.0
    assert ops.loc["tail", "share"] == pytest.approx(0.25)  # kernel 4 (launched at 410)
    # each kernel counts once for "step", though the three open instances overlap (was 225%)
    assert ops.loc["step", "share"] == pytest.approx(1.0)
    prof = profkit.load(path)
    prof.ops()
    assert any("never closed" in w for w in prof.warnings)


def test_hint_values_are_checked():
    assert parse_range_name("mm {flops=1e30}") == ("mm {flops=1e30}", None)
    for bad in ("mm {flops=1e30}", "mm {flops=-5}", "mm {bytes=nan}", "mm {flops=inf}",
                "mm {flops=12x}", "mm {flops=1e9, precision=int3}"):
        with pytest.raises(HintError) as e:
            check_range_name(bad)
        assert "\n" not in str(e.value) and "fix the range name" in str(e.value)
    check_range_name("mm {flops=1e12, bytes=3e9, precision=bf16}")
    check_range_name("dict {a=1}")  # the user's own braces
    check_range_name("plain")


def test_a_bad_hint_is_one_line_in_the_cli(tmp_path):
    path = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME,
                      nvtx=[(100, 700, "mm {flops=1e99}", TID)])
    r = CliRunner().invoke(main, ["classify", str(path)])
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [r.stderr.strip()] and "flops=1e99" in r.stderr


def test_a_hint_faster_than_the_roof_is_not_trusted(tmp_path):
    # 1e15 FLOP in 400 ns would be ~2.5e21 FLOP/s: far beyond any GPU
    path = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME,
                      nvtx=[(100, 700, "mm {flops=1e15, bytes=1e6}", TID)])
    prof = profkit.load(path)
    op = prof.ops().loc["mm"]
    assert op["confidence"] == "low"
    assert any("cannot be" in w for w in prof.warnings)


@pytest.mark.parametrize("content,needle", [
    ({"bandwidth": 4e12}, "unknown key"),
    ({"memory_bandwidth": "fast"}, "must be a number"),
    ({"memory_bandwidth": -1}, "not a plausible peak"),
    ({"flops": {"bf61": 1e15}}, "unknown precision"),
    ({"flops": {"bf16": 0}}, "not a plausible peak"),
    ({"flops": [1e15]}, "flops must be an object"),
    ({"gpu": "x"}, "sets none of"),
    ([1, 2], "JSON object"),
])
def test_bad_peaks_files_are_refused_in_one_line(tmp_path, content, needle):
    peaks = tmp_path / "peaks.json"
    peaks.write_text(json.dumps(content))
    path = make_trace(tmp_path / "t.sqlite", kernels=KERNELS, runtime=RUNTIME,
                      nvtx=[(100, 700, "mm", TID)])
    with pytest.raises(ProfkitError, match=needle):
        profkit.load(path, peaks=peaks)
    r = CliRunner().invoke(main, ["classify", "--peaks", str(peaks), str(path)])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and needle in r.stderr

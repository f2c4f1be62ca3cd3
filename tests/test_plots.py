"""Roofline and timeline pictures: what is drawn (points, roofs, axes, lanes, gaps), not pixels."""
from __future__ import annotations

from functools import partial

import hashlib
import itertools
import time
from pathlib import Path

import matplotlib
import matplotlib.text

matplotlib.use("Agg", force=True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import profkit  # noqa: E402
from profkit.cli import main  # noqa: E402
from profkit.errors import ProfkitError  # noqa: E402
from profkit.read.peaks import Peaks  # noqa: E402
from profkit.show.plots import roofline, roofline_data, timeline, timeline_data  # noqa: E402
from profkit.show.plots.roofline import _roofs  # noqa: E402
from profkit.show.plots.timeline import (COMPUTE, LAUNCH, MEMORY, OTHER, Lane, TimelineData,  # noqa: E402
                                    _coverage, _idle_gaps, parse_time)
from synth import TID, make_trace, whole  # noqa: E402

# Golden numbers here are over the whole capture with Nsight Systems' per-thread projection.
load_all = partial(profkit.load, window="all", attribution="thread")

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
H200_BW = 4.8e12


def by_gid(fig, prefix):
    ax = fig.axes[0]
    return [a for a in itertools.chain(ax.collections, ax.lines, ax.texts, ax.patches)
            if (a.get_gid() or "").startswith(prefix)]


def hinted_trace(path: Path) -> Path:
    """Two hinted ranges (a GEMM and an elementwise op), one plain range, a kernel outside ranges."""
    strings = {1: "void gemm_kernel<float, 128>(float*, float const*)", 2: "elementwise_add",
               3: "tiny", 9: "cudaLaunchKernel"}
    kernels = [(1_000, 101_000, 1, 1), (200_000, 210_000, 2, 2), (300_000, 301_000, 3, 3),
               (500_000, 501_000, 4, 3)]
    runtime = [(500, 900, 1), (150_000, 150_400, 2), (250_000, 250_400, 3), (450_000, 450_400, 4)]
    nvtx = [(0, 120_000, "gemm {flops=8e10, bytes=4e7, precision=bf16}", TID),
            (140_000, 220_000, "add {flops=1e6, bytes=1.2e7, precision=bf16}", TID),
            (240_000, 260_000, "plain", TID)]
    return make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings)


# --- roofline ------------------------------------------------------------------------------------

def test_roofline_real_hinted_trace_places_the_matmul_under_the_bf16_roof():
    prof = load_all(TRACES / "micro_hinted.sqlite.xz")
    fig = roofline(prof, by="range")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    d = fig.profkit_data
    assert list(d.points.index) == ["my_matmul"] and d.not_placed == []
    offsets = np.concatenate([c.get_offsets() for c in by_gid(fig, "points-")])
    assert len(offsets) == 1
    ev = prof.ops(by="range").loc["my_matmul", "evidence"]
    assert offsets[0][0] == pytest.approx(ev["arithmetic_intensity"])
    assert offsets[0][1] == pytest.approx(ev["achieved_flops_per_s"])
    assert by_gid(fig, "points-compute")
    # Roofs: memory roof y = bandwidth * x; bf16/fp16 tensor roof at 989.5 TFLOP/s from its ridge.
    mem = by_gid(fig, "roof-memory")[0]
    x, y = mem.get_data()
    assert np.allclose(np.asarray(y) / np.asarray(x), H200_BW)
    bf16 = by_gid(fig, "roof-bf16-fp16")[0]
    assert set(bf16.get_ydata()) == {989.5e12}
    assert bf16.get_xdata()[0] == pytest.approx(989.5e12 / H200_BW)
    fp32 = by_gid(fig, "roof-fp32")[0]
    assert set(fp32.get_ydata()) == {67e12}
    ridges = sorted(line.get_xdata()[0] for line in by_gid(fig, "ridge-"))
    assert ridges == pytest.approx(sorted([67e12 / H200_BW, 989.5e12 / H200_BW]))
    # Axis limits: whole decades holding every point and ridge, and the highest roof.
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    assert x0 <= min(ridges) and x1 >= offsets[0][0] and y1 > 989.5e12 and y0 < offsets[0][1]
    for v in (x0, x1, y0, y1):
        assert np.log10(v) == pytest.approx(round(np.log10(v)))
    assert "Arithmetic intensity" in ax.get_xlabel() and "FLOP/byte" in ax.get_xlabel().replace(" ", "")
    assert "FLOP/s" in ax.get_ylabel()
    caption = by_text(fig, "caption")
    assert "NVIDIA H200" in caption and "spec table" in caption and "4.80 TB/s" in caption


def by_text(fig, gid):
    return " ".join(t.get_text() for t in fig.texts if t.get_gid() == gid).replace("\n", " ")


def test_roofline_aten_places_ops_with_counts_and_lists_the_rest():
    prof = load_all(TRACES / "model_tiny_llama_aten.sqlite.xz")
    df = prof.ops(by="aten")
    fig = roofline(prof, by="aten", ops=df)
    d = fig.profkit_data
    n_points = sum(len(c.get_offsets()) for c in by_gid(fig, "points-"))
    assert n_points == len(d.points) == len(df) - len(d.not_placed)
    no_counts = [n for n, ev in df["evidence"].items()
                 if not (ev.get("flops_per_call") and ev.get("bytes_per_call") and ev.get("achieved_flops_per_s"))]
    assert d.not_placed == no_counts and 0 < len(no_counts) < len(df)
    assert f"not placed (no work counts): {len(d.not_placed)} ops" in by_text(fig, "not-placed")
    # Marker area grows with GPU time.
    offs = np.concatenate([c.get_offsets() for c in by_gid(fig, "points-")])
    sizes = np.concatenate([np.broadcast_to(c.get_sizes(), len(c.get_offsets())) for c in by_gid(fig, "points-")])
    pts = d.points.sort_values("gpu_time_ns")
    s = []
    for r in pts.itertuples():
        k = np.flatnonzero(np.isclose(offs[:, 0], r.ai) & np.isclose(offs[:, 1], r.flops_per_s))
        s.append(sizes[k[0]])
    assert s == sorted(s) and s[0] < s[-1]


def test_roofline_labels_do_not_overlap_each_other_or_roof_labels():
    prof = load_all(TRACES / "model_tiny_llama_aten.sqlite.xz")
    fig = roofline(prof, by="aten", label_top=10)
    r = fig.canvas.get_renderer()
    fig.canvas.draw()

    def text_box(t, r):  # the text alone, not its leader line
        t.update_positions(r)
        return matplotlib.text.Text.get_window_extent(t, r)

    labels = [text_box(t, r) for t in by_gid(fig, "point-label") + by_gid(fig, "point-number")]
    roof_labels = [text_box(t, r) for t in by_gid(fig, "roof-label")]
    assert len(labels) >= 5
    for a, b in itertools.combinations(labels + roof_labels, 2):
        assert not a.overlaps(b), (a, b)
    axbox = fig.axes[0].get_window_extent(r)
    for b in labels:
        assert axbox.x0 <= b.x0 and b.x1 <= axbox.x1 and axbox.y0 <= b.y0 and b.y1 <= axbox.y1


def test_point_labels_are_short():
    from profkit.show.plots.roofline import point_label
    assert point_label("aten::mm [[2048, 2048], [2048, 11264]]") == "mm 2048×2048, 2048×11264"
    assert point_label("aten::fill_ [[4, 512, 2048], []]") == "fill_ 4×512×2048"
    assert point_label("my_matmul") == "my_matmul"
    long = point_label("void at::native::vectorized_elementwise_kernel<(int)4, at::native::AddFunctor<float>>(int)")
    assert len(long) <= 34 and long.startswith("vectorized_elementwise_kernel")


def test_roofline_numbered_points_are_named_in_the_caption():
    prof = load_all(TRACES / "model_tiny_llama_aten.sqlite.xz")
    fig = roofline(prof, by="aten", label_top=10)
    for t in by_gid(fig, "point-number"):
        assert f"{t.get_text()} = " in by_text(fig, "caption")


def test_roofline_without_work_counts_places_nothing_and_says_so():
    prof = load_all(TRACES / "micro_gemm.sqlite.xz")
    fig = roofline(prof, by="range")
    assert fig.profkit_data.points.empty
    assert by_gid(fig, "points-") == []
    assert by_gid(fig, "no-points")
    assert "not placed (no work counts): 3 ops" in by_text(fig, "not-placed")


def test_roofline_synthetic_points_classes_and_roofs(tmp_path):
    prof = load_all(hinted_trace(tmp_path / "h.sqlite"))
    d = roofline_data(prof, by="range")
    assert sorted(d.points.index) == ["add", "gemm"]
    assert d.not_placed == ["plain"]
    assert d.points.loc["gemm", "ai"] == pytest.approx(8e10 / 4e7)
    assert d.points.loc["gemm", "flops_per_s"] == pytest.approx(8e10 / 100_000e-9)
    assert d.points.loc["add", "class"] == "memory"
    assert [r.label for r in d.roofs] == ["fp32 (CUDA cores)", "bf16/fp16 tensor"]


def test_axis_limits_hold_every_point_however_far_from_the_roofs():
    from profkit.show.plots.roofline import RooflineData, axis_limits
    import pandas as pd
    pts = pd.DataFrame({"ai": [1e-4, 5e4], "flops_per_s": [1e3, 5e14], "gpu_time_ns": [1.0, 2.0]},
                       index=["slow", "fast"])
    peaks = Peaks(gpu="H200", memory_bandwidth=H200_BW, flops={"fp32": 67e12, "bf16": 989.5e12})
    d = RooflineData(points=pts, not_placed=[], roofs=_roofs(peaks, {"bf16"}), memory_bandwidth=H200_BW,
                     gpu="H200", peaks_source="spec", level="range", trace="t")
    (x0, x1), (y0, y1) = axis_limits(d)
    assert x0 <= 1e-4 and x1 >= 5e4 and y0 <= 1e3 and y1 >= 989.5e12


def test_one_roof_per_precision_present():
    peaks = Peaks(gpu="H200", memory_bandwidth=H200_BW,
                  flops={"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12})
    roofs = _roofs(peaks, {"fp32", "tf32", "bf16", "fp8"})
    assert [r.label for r in roofs] == ["fp32 (CUDA cores)", "tf32 tensor", "bf16/fp16 tensor", "fp8 tensor"]
    assert [r.flops_per_s for r in roofs] == [67e12, 494.5e12, 989.5e12, 1979e12]
    assert [r.ridge for r in roofs] == pytest.approx([v / H200_BW for v in (67e12, 494.5e12, 989.5e12, 1979e12)])
    assert [r.label for r in _roofs(peaks, {"fp32"})] == ["fp32 (CUDA cores)"]


def test_peaks_file_without_the_precisions_used_still_draws_its_roofs(tmp_path):
    import json
    f = tmp_path / "peaks.json"
    f.write_text(json.dumps({"memory_bandwidth": 3e12, "flops": {"fp8": 2e15}, "source": "hand-written"}))
    prof = load_all(TRACES / "micro_gemm.sqlite.xz", peaks=f)
    d = roofline_data(prof)
    assert d.memory_bandwidth == 3e12 and d.peaks_source == "hand-written"
    assert d.roofs  # the spec table's roofs merged under the file's
    fig = roofline(prof)
    assert "hand-written" in by_text(fig, "caption") and "3.00 TB/s" in by_text(fig, "caption")


# --- timeline ------------------------------------------------------------------------------------

def test_parse_time_units():
    assert parse_time("1500") == 1500
    assert parse_time("1.5ms") == 1.5e6
    assert parse_time("2 us") == 2000
    assert parse_time("0.25s") == 2.5e8
    assert parse_time("10ns") == 10
    for bad in ("abc", "1.5 minutes", "", "ms"):
        with pytest.raises(ProfkitError):
            parse_time(bad)


def test_timeline_lanes_of_a_real_trace():
    prof = load_all(TRACES / "micro_graph.sqlite.xz")
    fig = timeline(prof)
    d = fig.profkit_data
    kinds = [lane.kind for lane in d.lanes]
    assert kinds[0] == "nvtx" and "api" in kinds
    gpu = [lane.key for lane in d.lanes if lane.kind == "gpu"]
    assert gpu == ["gpu:0:7", "gpu:0:13", "gpu:0:17"]
    acts = prof.trace.activities
    assert sum(len(lane.start) for lane in d.lanes if lane.kind == "gpu") == len(acts)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "GPU 0 stream 7" in labels and any(lbl.startswith("NVTX tid") for lbl in labels)
    assert any(lbl.startswith("CUDA API tid") for lbl in labels)
    # Every lane with intervals is drawn; the x axis is time with a unit.
    for lane in d.lanes:
        if len(lane.start):
            assert by_gid(fig, f"lane-{lane.key}"), lane.key
    assert "(ms)" in fig.axes[0].get_xlabel()
    # The eager chain's kernels take the class of the eager_chain op.
    want = {"compute": COMPUTE, "memory": MEMORY, "launch": LAUNCH}[prof.ops().loc["eager_chain", "class"]]
    eager = prof.trace.ranges[prof.trace.ranges["name"] == "eager_chain"].sort_values("start").iloc[1]
    lane7 = d.lane("gpu:0:7")
    inside = (lane7.start >= eager["start"]) & (lane7.end <= eager["end"])
    assert inside.sum() >= 10 and (lane7.code[inside] == want).all()


def test_timeline_range_window_zooms_to_one_instance():
    prof = load_all(TRACES / "micro_graph.sqlite.xz")
    r = prof.trace.ranges
    third = r[r["name"] == "graph_replay"].sort_values("start").iloc[2]
    d = timeline_data(prof, range_name="graph_replay", instance=3)
    w0, w1 = d.window
    assert w0 <= third["start"] and w1 >= third["end"]
    assert (w1 - w0) < 3 * (third["end"] - third["start"]) + 200_000
    assert d.focus[:2] == (third["start"], third["end"])
    fig = timeline(prof, data=d)
    assert by_gid(fig, "focus")
    with pytest.raises(ProfkitError, match="no NVTX range named 'nope'"):
        timeline_data(prof, range_name="nope")
    with pytest.raises(ProfkitError, match="10 instances"):
        timeline_data(prof, range_name="graph_replay", instance=11)


def test_timeline_start_end_window_and_bad_windows():
    prof = load_all(TRACES / "micro_graph.sqlite.xz")
    d = timeline_data(prof, start="90ms", end="91ms")
    assert d.window == (d.t0 + 90_000_000, d.t0 + 91_000_000)
    for lane in d.lanes:
        assert ((lane.end >= d.window[0]) & (lane.start <= d.window[1])).all()
    with pytest.raises(ProfkitError):
        timeline_data(prof, start="2ms", end="1ms")
    with pytest.raises(ProfkitError):
        timeline_data(prof, start="100s")


def test_nvtx_depth_of_nested_ranges():
    from profkit.show.plots.timeline import _nvtx_depth
    # [0,100] holds [10,50] which holds [20,30]; [60,90] sits in the first; [200,300] stands alone.
    start = np.array([0, 10, 20, 60, 200])
    end = np.array([100, 50, 30, 90, 300])
    assert _nvtx_depth(start, end).tolist() == [0, 1, 2, 1, 0]


def test_idle_gaps_and_coverage_are_exact():
    gaps, busy = _idle_gaps(np.array([10, 15, 40]), np.array([20, 30, 50]), 0, 100)
    assert busy == 20 + 10
    assert sorted(map(tuple, gaps.tolist())) == [(0, 10), (30, 40), (50, 100)]
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 1000, 500)
    e = s + rng.uniform(0, 30, 500)
    edges = np.linspace(0, 1100, 23)
    brute = [np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0, None).sum() for lo, hi in zip(edges, edges[1:])]
    assert _coverage(s, e, edges) == pytest.approx(brute, rel=1e-9, abs=1e-6)


def test_timeline_synthetic_gaps_are_shaded_and_the_largest_labelled(tmp_path):
    prof = load_all(hinted_trace(tmp_path / "h.sqlite"))
    d = timeline_data(prof)
    g = d.gaps[0]
    # GPU work: [1000,101000], [200000,210000], [300000,301000], [500000,501000].
    inner = sorted(map(tuple, g[(g[:, 0] > d.window[0]) & (g[:, 1] < d.window[1])].tolist()))
    assert (101_000, 200_000) in inner and (301_000, 500_000) in inner and (210_000, 300_000) in inner
    fig = timeline(prof, data=d)
    labels = [t.get_text() for t in by_gid(fig, "idle-label")]
    assert "idle 199.0 us" in labels
    assert by_gid(fig, "idle-gpu0")
    # Kernels take the class of their range's op (gemm compute, add memory, plain whatever it
    # is classified as); the kernel launched outside any range is "other".
    lane = d.lane("gpu:0:7")
    plain = {"compute": COMPUTE, "memory": MEMORY, "launch": LAUNCH}[prof.ops().loc["plain", "class"]]
    assert list(lane.code) == [COMPUTE, MEMORY, plain, OTHER]


def test_timeline_million_intervals_are_binned_not_looped():
    n = 1_000_000
    rng = np.random.default_rng(1)
    start = np.sort(rng.integers(0, 10_000_000_000, n))
    end = start + rng.integers(500, 5000, n)
    code = rng.integers(0, 4, n).astype(np.int8)
    lanes = [Lane("api:1", "CUDA API tid 1", "api", start - 300, start - 100, np.full(n, 4, np.int8)),
             Lane("gpu:0:7", "GPU 0 stream 7", "gpu", start, end, code, device=0)]
    gaps, busy = _idle_gaps(start, end, 0, 10_000_010_000)
    d = TimelineData(lanes=lanes, t0=0, window=(0, 10_000_010_000), gaps={0: gaps}, gpu="H200",
                     trace="synthetic", level="kernel", busy_ns={0: busy})
    t = time.perf_counter()
    fig = timeline(data=d)
    fig.savefig(Path("/dev/null"), format="png")
    assert time.perf_counter() - t < 20
    polys = by_gid(fig, "lane-gpu:0:7")[0]
    assert 50 <= len(polys.get_paths()) <= 2000       # one per pixel column, not per kernel
    assert "drawn per pixel column" in by_text(fig, "caption")


# --- CLI -----------------------------------------------------------------------------------------

def run(*args):
    return CliRunner().invoke(main, whole(list(args)), catch_exceptions=False)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_roofline_and_timeline_write_pngs_and_leave_the_trace_alone(tmp_path):
    trace = TRACES / "micro_hinted.sqlite.xz"
    before = sha(trace)
    res = run("roofline", trace, "-o", tmp_path / "r.png", "--by", "range")
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "1 op placed; not placed (no work counts): 0 ops" in res.stderr
    res = run("timeline", trace, "-o", tmp_path / "t.png", "--range", "my_matmul", "--instance", "2")
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "t.png").stat().st_size > 10_000
    res = run("timeline", trace, "-o", tmp_path / "t.svg", "--start", "1ms", "--end", "100ms")
    assert res.exit_code == 0, res.stderr
    assert sha(trace) == before


@pytest.mark.parametrize("args, message", [
    (["roofline", "missing.sqlite", "-o", "{tmp}/r.png"], "trace not found"),
    (["timeline", "{trace}", "-o", "{tmp}/t.png", "--start", "soon"], "--start"),
    (["timeline", "{trace}", "-o", "{tmp}/t.png", "--start", "5ms", "--end", "1ms"], "window"),
    (["timeline", "{trace}", "-o", "{tmp}/t.png", "--range", "no_such_range"], "no NVTX range named"),
    (["timeline", "{trace}", "-o", "{tmp}/t.png", "--range", "my_matmul", "--instance", "99"], "instances"),
    (["roofline", "{trace}", "-o", "{tmp}/nodir/r.png"], "does not exist"),
    (["roofline", "{trace}", "-o", "{tmp}/r.txt"], ".png"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, message):
    trace = TRACES / "micro_hinted.sqlite.xz"
    res = run(*[a.format(tmp=tmp_path, trace=trace) for a in args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profkit: error:") and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr

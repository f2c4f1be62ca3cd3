"""The run summary on real H200 captures of real programs (traces/real, scripts/workloads).

Numbers are checked against independent computations straight from the SQLite export (plain
SQL and a Python loop, no profkit code) and against Nsight Systems' own projection.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import profkit
from profkit.cli import main
from profkit.run.ops import group_ops
import shared
from synth import plain

REAL = Path(__file__).resolve().parents[1] / "traces" / "real"
REF = Path(__file__).resolve().parent / "data" / "nsys_ref" / "real"
NAME = "coalesce((SELECT value FROM StringIds WHERE id = n.textId), n.text)"
PROGRAMS = ["train_llama", "train_llama_fused", "generate_llama", "generate_llama_static",
            "loader_cnn", "loader_cnn_workers", "sync_loop", "sync_loop_nosync", "cnn_infer"]


def _sql(name: str, query: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(f"file:{plain(REAL / (name + '.sqlite.xz'))}?mode=ro", uri=True)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


def _gpu_intervals(name: str, device: int) -> list[tuple[int, int]]:
    out = []
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        out += _sql(name, f'SELECT start, "end" FROM {t} WHERE deviceId = ?', (device,))
    return sorted(out)


def _busy_in(intervals: list[tuple[int, int]], w0: int, w1: int) -> int:
    """Union length of the intervals inside [w0, w1], with a plain loop."""
    busy, cur_s, cur_e = 0, None, None
    for s, e in intervals:
        s, e = max(s, w0), min(e, w1)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + (cur_e - cur_s if cur_e is not None else 0)


@pytest.fixture(scope="module")
def profiles():
    return {n: shared.profile(REAL / f"{n}.sqlite.xz") for n in PROGRAMS}


def test_window_of_the_training_step_is_the_steps_after_the_first(profiles):
    p = profiles["train_llama"]
    w = p.window
    starts = [s for (s,) in _sql("train_llama", f"SELECT n.start FROM NVTX_EVENTS n WHERE {NAME} = "
                                 "'train_step' ORDER BY n.start")]
    assert len(starts) == 12
    assert w.source == "nvtx train_step[1:12] of 12" and w.iterations == 11
    assert w.start_ns == starts[1]
    assert w.iteration_ns == np.diff(starts[1:]).tolist() + [w.end_ns - starts[-1]]  # CPU side
    # The wall time of an iteration is its GPU-side period: first GPU activity to the next's.
    assert len(w.gpu_period_ns) == 11 and w.iteration_median_ns == int(np.median(w.gpu_period_ns))
    assert abs(w.iteration_median_ns - np.median(w.iteration_ns)) < 0.01 * w.iteration_median_ns
    # Set-up is listed, never hidden: the model upload and the first step's first-call set-up.
    what = " ".join(x["what"] for x in w.excluded)
    assert "(model upload) 365 MB" in what and "first 1 iteration(s)" in what


@pytest.mark.parametrize("name", PROGRAMS)
def test_breakdown_adds_up_and_busy_matches_a_plain_union(profiles, name):
    r = profiles[name].run()
    assert sum(r.breakdown.values()) == r.wall_time_ns
    assert all(v >= 0 for v in r.breakdown.values())
    busy = sum(r.breakdown[k] for k in ("compute", "memory", "launch", "communication"))
    assert busy == r.gpu_busy_ns == _busy_in(_gpu_intervals(name, r.device), r.window.start_ns,
                                              r.window.end_ns)


def test_backward_gets_the_work_the_autograd_thread_launches(profiles):
    """>= 95% of the GPU work launched (by any thread) while `backward` is open is backward's."""
    rows = _sql("train_llama", f"SELECT n.start, n.\"end\" FROM NVTX_EVENTS n WHERE {NAME} = 'backward'")
    launched = 0
    for b0, b1 in rows:
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            launched += _sql("train_llama", f'SELECT coalesce(sum(a."end" - a.start), 0) FROM {t} a '
                             "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId "
                             "WHERE r.start >= ? AND r.\"end\" <= ?", (b0, b1))[0][0]
    for attribution, low, high in (("process", 0.95, 1.0), ("thread", 0.0, 0.01)):
        tr = profkit.load(REAL / "train_llama.sqlite.xz", window="all", attribution=attribution).trace
        g = group_ops(tr, by="range")
        acts = g.members[g.members["op"] == "backward"]["act_idx"].unique()
        got = int((tr.activities["end"] - tr.activities["start"]).to_numpy()[acts].sum())
        assert low * launched <= got <= high * launched, (attribution, got, launched)


@pytest.mark.parametrize("name", ["train_llama", "loader_cnn", "sync_loop", "cnn_infer", "train_llama_ncu_auto"])
def test_thread_attribution_still_equals_nsys(name):
    ref = pd.read_csv(REF / f"{name}_nvtx_gpu_proj_sum.csv")
    ref["Range"] = ref["Range"].str.lstrip(":")
    ops = profkit.load(REAL / f"{name}.sqlite.xz", window="all", attribution="thread").ops(by="range")
    for r in ref.itertuples():
        row = ops.loc[r.Range]
        assert int(row["gpu_time_ns"]) == r._3 and int(row["count"]) == r._5, r.Range


def test_verdicts_of_the_real_programs(profiles):
    v = {n: profiles[n].run().verdict.value for n in PROGRAMS}
    assert v["train_llama"] == "host-bound"
    assert v["generate_llama"] == "host-bound"
    assert v["loader_cnn"] == "data-bound"
    assert v["cnn_infer"] == "gpu-bound"
    # The sync drains the queue every step; the step model replays the step without its waits,
    # at the CPU speed estimated without the profiler, and finds the sync worth removing (timed
    # without a profiler on the H200: 1.40x, analyses/whatif.md).
    r = profiles["sync_loop"].run()
    assert v["sync_loop"] == "sync-bound"
    sync = next(a for a in r.actions if a.rule == "per-step-sync")
    assert 1.05 < sync.expected_end_to_end_speedup < 1.5
    top = profiles["loader_cnn"].run().actions[0]
    assert top.rule == "data-loading" and "num_workers" in top.action


def test_unannotated_generate_needs_no_options():
    res = CliRunner().invoke(main, ["classify", str(REAL / "generate_llama.sqlite.xz"), "--top", "3"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "kernel sequence: iterations" in out and "verdict  host-bound" in out
    assert "showing --by kernel" in res.stderr


@pytest.mark.parametrize("name", PROGRAMS)
def test_no_gain_above_its_basis(profiles, name):
    p = profiles[name]
    ops = p.ops(by=p.level_for("range"))
    assert (ops["expected_end_to_end_speedup"] <= ops["expected_op_speedup"] + 1e-9).all()
    assert (ops["expected_gpu_time_speedup"] <= ops["expected_op_speedup"] + 1e-9).all()
    assert ((ops["critical_fraction"] >= 0) & (ops["critical_fraction"] <= 1)).all()
    run = p.run_json(ops)
    assert 0.0 <= run["gpu_idle_fraction"] <= 1.0
    assert all(a["expected_end_to_end_speedup"] >= 1.0 for a in run["actions"])


def test_window_all_keeps_the_whole_capture():
    p = profkit.load(REAL / "train_llama.sqlite.xz", window="all")
    total = sum(d for (d,) in _sql("train_llama", 'SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')) \
        + sum(d for (d,) in _sql("train_llama", 'SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY')) \
        + sum(d or 0 for (d,) in _sql("train_llama", 'SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMSET'))
    assert p.trace.total_gpu_time_ns == total and p.window.is_all


def test_window_options(profiles):
    p = profkit.load(REAL / "train_llama.sqlite.xz", window="train_step[2:5]")
    assert p.window.iterations == 3 and p.window.source == "nvtx train_step[2:5] of 12"
    t = profkit.load(REAL / "train_llama.sqlite.xz", window="16:16.1")
    assert (t.window.start_ns, t.window.end_ns) == (16_000_000_000, 16_100_000_000)
    for bad, says in (("nope", "no NVTX range of that name"), ("train_step[20:30]", "selects no instance"),
                      ("5:4", "end must be after the start")):
        with pytest.raises(profkit.ProfkitError, match=says):
            profkit.load(REAL / "train_llama.sqlite.xz", window=bad)


def test_diff_measures_wall_time_per_iteration():
    from profkit.compare.diff import diff
    b = shared.profile(REAL / "loader_cnn.sqlite.xz")
    a = shared.profile(REAL / "loader_cnn_workers.sqlite.xz")
    run = diff(b, a).run
    assert run["per"] == "iteration"
    assert run["measured_speedup"] == round(b.window.iteration_median_ns / a.window.iteration_median_ns, 3)
    assert run["predicted"][0]["rule"] == "data-loading"


def test_emit_nvtx_decorations_are_cut_before_grouping():
    ops = shared.ops(REAL / "train_llama_aten.sqlite.xz", by="range")
    assert len(ops) < 60  # about 900 rows when every op_id/seq made its own name
    assert "MmBackward0" in ops.index and not any("op_id =" in n for n in ops.index)


def test_ncu_pass_without_a_range_covers_one_whole_iteration():
    """Captured on the H200 with `profkit capture --ncu` and no --ncu-range: ncu profiled the
    second-to-last `step`, every kernel of it (the autograd thread's backward included)."""
    path = REAL / "sync_loop_ncu_auto.sqlite.xz"
    con = sqlite3.connect(f"file:{plain(path)}?mode=ro", uri=True)
    meta = dict(con.execute("SELECT key, value FROM PROFKIT_META"))
    n_ncu = con.execute("SELECT count(*) FROM PROFKIT_NCU_METRICS").fetchone()[0]
    t0, t1 = (int(x) for x in meta["ncu_window"].split(","))
    launched = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId WHERE r.start BETWEEN ? AND ?", (t0, t1)).fetchone()[0]
    con.close()
    assert meta["ncu_iteration"] == "step#2" and n_ncu == launched == 62
    # a range that mixes bf16 tensor-core GEMMs with fp32 helpers is judged on the bf16 roof
    op = shared.ops(path, by="range").loc["step"]
    assert op["source"] == "ncu" and op["class"] == "compute" and 0.3 < op["pct_of_roof"] < 0.5


@pytest.mark.parametrize("name", ["cnn_infer", "cnn_infer_compiled", "train_llama_compiled"])
def test_iteration_time_holds_when_the_cpu_runs_ahead(name):
    """GPU-bound loops without a per-step sync (and CUDA-graph replays) let the CPU queue work
    ahead: the CPU-side periods were 15-30% short of the real ones (eager ResNet-50: 7.59 ms by
    the CPU, 8.97 ms by wall / iterations). The GPU-side period agrees with the wall time."""
    w = shared.profile(REAL / f"{name}.sqlite.xz").window
    assert len(w.gpu_period_ns) == w.iterations
    assert np.median(w.iteration_ns) < 0.9 * w.iteration_median_ns
    if name.startswith("cnn"):  # steady from the first window iteration on
        assert abs(w.wall_ns / w.iterations - w.iteration_median_ns) < 0.02 * w.iteration_median_ns


def test_compile_setup_before_the_loop_does_not_hide_the_loop():
    # torch.compile's autotuning launches most of the capture's kernels before the first `infer`
    w = shared.profile(REAL / "cnn_infer_compiled.sqlite.xz").window
    assert w.source == "nvtx infer[1:20] of 20" and not w.is_all


def test_library_ranges_never_mark_iterations():
    # generate() with a static cache runs CUB scans under CCCL NVTX ranges, three times in all
    # (twice in the committed trace, cut in the second of its three generate() calls)
    w = shared.profile(REAL / "generate_llama_graphs.sqlite.xz").window
    assert w.source.startswith("kernel sequence") and "CCCL" not in w.source


def test_a_script_of_phases_is_judged_whole():
    """The bundled example benchmarks four ops one after another: no loop, so no iterations."""
    from profkit.cli.classify import EXAMPLE
    w = profkit.load(EXAMPLE).window
    assert w.is_all and "holds only 1% of the kernel time" in w.source


def test_set_up_is_skipped_but_a_periodic_slow_step_stays():
    from profkit.run.window import leading_setup
    ms = 1_000_000
    # compile in the first iteration, CUDA-graph recording in the second, then steady 4 ms steps
    setup = np.cumsum([0, 26_000 * ms, 53 * ms] + [4 * ms] * 14)
    assert leading_setup(setup) == 2
    # an evaluation every 10 steps (200 ms) in a 60-step run: part of the run, not set-up
    periods = [4 * ms] * 60
    for i in range(9, 60, 10):
        periods[i] = 200 * ms
    assert leading_setup(np.cumsum([0] + periods)) == 1
    # a warm-up call before the measured one (a gap in the first half), as generate() scripts do
    warm = [5 * ms] * 10 + [300 * ms] + [4 * ms] * 40
    assert leading_setup(np.cumsum([0] + warm)) == 11
    # a warm-up generate() call whose every token is 8x slower, no gap between the calls
    regime = [70 * ms] * 60 + [8 * ms] * 64
    assert leading_setup(np.cumsum([0] + regime)) == 60
    # slow steps scattered through a run (2.5x, never three in a row) are part of it
    scattered = [4 * ms if i % 3 else 10 * ms for i in range(60)]
    assert leading_setup(np.cumsum([0] + scattered)) == 1


def test_the_generate_window_is_the_measured_call():
    # traces/real/generate_llama*: a warm-up generate() of 64 tokens (55-82 ms each), then the
    # measured one (~8 ms a token): the window is the second call. The committed trace keeps the
    # last 2 s of the set-up (scripts/tools/trim_setup.py): 27 of the warm-up's slow tokens; and
    # the first 75 repeats of the delimiting kernel (scripts/tools/trim_tail.py --kernel-repeats
    # 74): 47 of the measured call's 66 iterations.
    w = shared.profile(REAL / "generate_llama_samerun.sqlite.xz").window
    assert w.source.startswith("kernel sequence: iterations 27..74")
    # and the set-up the report leaves out says the file was cut (it is not what the run spent)
    assert w.excluded[0]["what"].endswith("the file keeps only its last 2.00 s (earlier rows were cut from it)")
    assert max(w.iteration_ns) < 20_000_000

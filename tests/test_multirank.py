"""Multi-rank classify: exact per-rank numbers on the real 2-GPU DDP capture, stragglers on
synthetic ranks, a bad rank reported while the good ones finish, Dask and the CLI."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from profkit.compare import multirank as mr
from profkit.cli import main
from synth import TID, make_trace, whole

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "traces" / "ddp2"
REF = ROOT / "tests" / "data" / "nsys_ref"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"


# Per-rank numbers here are checked against nsys: whole capture, per-thread projection.
def classify_ranks(*args, **kw):
    return mr.classify_ranks(*args, window="all", attribution="thread", **kw)


def run(*args):
    return CliRunner().invoke(main, whole(list(args)), catch_exceptions=False)


# -- real traces: every number per rank equals nsys's ------------------------------------------------
@pytest.fixture(scope="module")
def ddp_kernel():
    return classify_ranks([DDP], by="kernel", workers=2)


@pytest.fixture(scope="module")
def ddp_range():
    return classify_ranks([DDP / "rank0.sqlite.xz", DDP / "rank1.sqlite.xz"], by="range", workers=1)


@pytest.mark.parametrize("rank", [0, 1])
def test_kernel_times_per_rank_match_cuda_gpu_kern_sum(ddp_kernel, rank):
    r = ddp_kernel.ranks[rank]
    assert r.ok and r.rank == rank and Path(r.path).name == f"rank{rank}.sqlite.xz"
    ref = pd.read_csv(REF / f"ddp2_rank{rank}_cuda_gpu_kern_sum.csv").set_index("Name")
    ops = r.ops[~r.ops.index.str.startswith("[CUDA ")]
    assert sorted(ops.index) == sorted(ref.index)
    for k in ref.index:
        assert ops.loc[k, "gpu_time_ns"] == ref.loc[k, "Total Time (ns)"], k
        assert ops.loc[k, "count"] == ref.loc[k, "Instances"], k
        assert ops.loc[k, "gpu_time_median_ns"] == ref.loc[k, "Med (ns)"], k
    mem = pd.read_csv(REF / f"ddp2_rank{rank}_cuda_gpu_mem_time_sum.csv").set_index("Operation")
    assert r.total_gpu_time_ns == ref["Total Time (ns)"].sum() + mem["Total Time (ns)"].sum()


@pytest.mark.parametrize("rank", [0, 1])
def test_range_times_per_rank_match_nvtx_gpu_proj_sum(ddp_range, rank):
    r = ddp_range.ranks[rank]
    ref = pd.read_csv(REF / f"ddp2_rank{rank}_nvtx_gpu_proj_sum.csv")
    ref["Range"] = ref["Range"].str.removeprefix(":")
    # the DDP hook ranges carry their bucket's bytes ({bytes=N}); profkit groups them as one op
    ref["op"] = ref["Range"].str.replace(r" \{bytes=[^}]*\}$", "", regex=True)
    want = ref.groupby("op").agg(total=("Total Proj Time (ns)", "sum"), n=("Range Instances", "sum"))
    assert sorted(r.ops.index) == sorted(want.index)
    for op in want.index:
        assert r.ops.loc[op, "gpu_time_ns"] == want.loc[op, "total"], op
        assert r.ops.loc[op, "count"] == want.loc[op, "n"], op
    steps = ref.set_index("Range").loc["step"]
    assert r.steps == steps["Range Instances"] == 6
    assert r.step_time_median_ns == steps["Proj Med (ns)"]


def test_merged_view_of_the_real_ranks(ddp_kernel, ddp_range):
    ops = ddp_kernel.ops
    row = ops.loc[NCCL]
    ref = {k: pd.read_csv(REF / f"ddp2_rank{k}_cuda_gpu_kern_sum.csv").set_index("Name").loc[NCCL,
                                                                                           "Total Time (ns)"]
           for k in (0, 1)}
    assert row["class"] == "communication" and row["ranks"] == 2
    assert row["gpu_time_min_ns"] == min(ref.values()) and row["gpu_time_max_ns"] == max(ref.values())
    assert row["min_rank"] == min(ref, key=ref.get) and row["max_rank"] == max(ref, key=ref.get)
    assert row["gpu_time_median_ns"] == np.median(list(ref.values()))
    assert ddp_kernel.stragglers == []  # 2 ranks: the rule needs 3
    rep = ddp_range.report()
    assert rep["world_size"] == 2 and rep["ranks_failed"] == 0 and rep["errors"] == []
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert all(r["session_start_utc_ns"] > 1.7e18 for r in rep["ranks"])
    assert min(r["aligned_first_gpu_offset_ns"] for r in rep["ranks"]) == 0
    names = [o["name"] for o in rep["ops"]]
    assert {"step", "forward", "backward", "optimizer", "ddp.allreduce"} <= set(names)
    by = {o["name"]: o for o in rep["ops"]}
    assert by["ddp.allreduce"]["class"] == "communication"
    assert by["step"]["gpu_time_ns"]["min"] <= by["step"]["gpu_time_ns"]["median"] <= by["step"]["gpu_time_ns"]["max"]
    c = rep["communication"]
    assert c["link_peak_bytes_per_s"] == 450e9 and c["world_size"] == 2
    ar = next(x for x in c["collectives"] if x["collective"] == "AllReduce")
    assert ar["calls_with_bytes"] == 26 and 0 < ar["pct_of_link_peak"] < 1
    assert 0 < ar["exposed_median_ns"] < ar["gpu_time_median_ns"]
    bc = next(x for x in c["collectives"] if x["collective"] == "Broadcast")
    assert bc["busbw_median_bytes_per_s"] is None  # bytes unknown: said so, not guessed
    assert any("bytes unknown" in n for n in c["notes"])
    assert len(rep["step_skew"]["start_skew_ns"]) == 6
    json.dumps(rep)  # plain JSON types only


# -- synthetic ranks: stragglers ---------------------------------------------------------------------
STEP_NS, N_STEPS = 1_000_000, 4


def make_rank(path: Path, rank: int, compute_ns: int, slowest_ns: int, session_start: int = 10**18) -> Path:
    """N_STEPS steps: a compute kernel of ``compute_ns`` on stream 7, and an AllReduce on stream 13
    that starts halfway through it and ends when the slowest rank is done (+100 us), as DDP does."""
    strings = {1: "gemm_kernel", 2: NCCL, 9: "cudaLaunchKernel"}
    kernels, runtime, nvtx = [], [], []
    for i in range(N_STEPS):
        t = 10_000 + i * STEP_NS
        kernels += [(t, t + compute_ns, 2 * i + 1, 1, 0, 7),
                    (t + compute_ns // 2, t + slowest_ns + 100_000, 2 * i + 2, 2, 0, 13)]
        runtime += [(t - 900, t - 800, 2 * i + 1), (t - 700, t - 600, 2 * i + 2)]
        nvtx.append((t - 1000, t - 500, "step", TID))
    make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings, nvtx_text_id=False)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)")
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (session_start + rank * 1000,))
    con.commit()
    con.close()
    return path


@pytest.fixture
def eight_ranks(tmp_path):
    compute = {r: 400_000 + 2_000 * r for r in range(8)}
    compute[5] = 600_000  # the straggler: 50% more compute
    slowest = max(compute.values())
    return [make_rank(tmp_path / f"trace_rank_{r}.sqlite", r, compute[r], slowest) for r in range(8)], compute


def test_straggler_found_on_compute_and_its_op(eight_ranks):
    paths, compute = eight_ranks
    res = classify_ranks(paths, by="kernel", workers=1)
    assert [r.rank for r in res.ranks] == list(range(8))
    strag = {(s["rank"], s["metric"]) for s in res.stragglers}
    assert (5, "compute_busy") in strag and (5, "op:gemm_kernel") in strag
    assert {s["rank"] for s in res.stragglers} == {5}
    s = next(s for s in res.stragglers if s["metric"] == "compute_busy")
    vals = np.array([compute[r] * N_STEPS for r in range(8)], dtype=float)
    med = np.median(vals)
    mad = np.median(np.abs(vals - med))
    assert s["median_ns"] == med and s["threshold_ns"] == med + max(0.05 * med, 3 * mad)
    assert s["value_ns"] == 600_000 * N_STEPS
    # the straggler's collectives are the *shortest*: it never waits; the others wait for it
    row = res.ops.loc[NCCL]
    assert row["class"] == "communication" and row["min_rank"] == 5
    # exposed time per rank: collective [c/2, slowest+100us) minus compute [c/2, c)
    c = res.communication
    for pr in c["per_rank"]:
        want = (max(compute.values()) + 100_000 - compute[pr["rank"]]) * N_STEPS
        assert pr["exposed_ns"] == want, pr
    # steps end together (the collective syncs them): no step-time straggler
    assert not any(s["metric"] == "step_time" for s in res.stragglers)
    # ranks aligned by session start; step skew = the 7 us spread of session starts
    assert res.step_skew["start_skew_ns"] == [7000] * N_STEPS


def test_no_straggler_when_ranks_agree(tmp_path):
    paths = [make_rank(tmp_path / f"r{r}.sqlite", r, 400_000 + 1000 * r, 410_000) for r in range(6)]
    res = classify_ranks(paths, by="kernel", workers=1)
    assert res.stragglers == []


def test_rank_ids_from_names_else_sorted_order(tmp_path):
    names = ["job.rank10.sqlite", "job.rank2.sqlite", "rank_0.sqlite", "r3.sqlite"]
    assert [(r, p.name) for r, p in mr.rank_ids([Path(n) for n in names])] == [
        (0, "rank_0.sqlite"), (2, "job.rank2.sqlite"), (3, "r3.sqlite"), (10, "job.rank10.sqlite")]
    # a name with no rank in it (or a duplicate): every file by sorted (natural) order instead
    odd = [Path("b.sqlite"), Path("a10.sqlite"), Path("a9.sqlite")]
    assert [(r, p.name) for r, p in mr.rank_ids(odd)] == [(0, "a9.sqlite"), (1, "a10.sqlite"), (2, "b.sqlite")]
    assert mr.rank_ids([Path("worker3.sqlite"), Path("run1.sqlite")])[0][0] == 0  # no 'rank'/'r' token


# -- a bad rank file ------------------------------------------------------------------------------------
@pytest.fixture
def with_bad_rank(tmp_path):
    paths = [make_rank(tmp_path / f"rank{r}.sqlite", r, 400_000, 400_000) for r in range(3)]
    bad = tmp_path / "rank3.sqlite"
    bad.write_text("this is not a trace")
    empty = tmp_path / "rank4.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.close()
    return tmp_path, paths, bad, empty


def test_bad_rank_reported_while_the_others_finish(with_bad_rank):
    d, paths, bad, empty = with_bad_rank
    res = classify_ranks([d], by="kernel", workers=2)
    assert [r.rank for r in res.good] == [0, 1, 2]
    assert [(r.rank, Path(r.path).name) for r in res.errors] == [(3, "rank3.sqlite"), (4, "rank4.sqlite")]
    assert "not an SQLite file" in res.errors[0].error and "rank3.sqlite" in res.errors[0].error
    assert "not an Nsight Systems export" in res.errors[1].error
    assert res.ops.loc["gemm_kernel", "ranks"] == 3 and res.world_size == 5


def test_cli_bad_rank_exit_2_after_the_merged_result(with_bad_rank):
    d, *_ = with_bad_rank
    res = run("classify", str(d), "--by", "kernel", "--format", "json", "--workers", "2")
    assert res.exit_code == 2
    rep = json.loads(res.stdout)
    assert rep["ranks_ok"] == 3 and rep["ranks_failed"] == 2
    assert [e["rank"] for e in rep["errors"]] == [3, 4]
    err = [line for line in res.stderr.splitlines() if line.startswith("profkit: error:")]
    assert len(err) == 2 and "rank 3" in err[0] and "rank3.sqlite" in err[0]
    assert "Traceback" not in res.stderr
    assert "[5/5]" in res.stderr  # progress lines (not a terminal: plain lines)


def test_cli_all_ranks_bad(tmp_path):
    for r in range(2):
        (tmp_path / f"rank{r}.sqlite").write_text("x")
    res = run("classify", str(tmp_path / "rank0.sqlite"), str(tmp_path / "rank1.sqlite"), "--workers", "1")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("profkit: error: rank") == 2


def test_cli_empty_directory(tmp_path):
    res = run("classify", str(tmp_path))
    assert res.exit_code == 2 and "holds no .sqlite exports" in res.stderr


# -- Dask, formats ----------------------------------------------------------------------------------------
def test_dask_local_cluster_gives_the_same_answer(eight_ranks):
    paths, _ = eight_ranks
    local = classify_ranks(paths, by="kernel", workers=1)
    dask = classify_ranks(paths, by="kernel", workers=2, dask="local", dask_processes=False)
    pd.testing.assert_frame_equal(local.ops, dask.ops)
    assert local.stragglers == dask.stragglers
    assert [r.rank for r in dask.ranks] == list(range(8))


def test_dask_bad_rank_is_reported(with_bad_rank):
    d, *_ = with_bad_rank
    res = classify_ranks([d], by="kernel", workers=1, dask="local", dask_processes=False)
    assert [r.rank for r in res.errors] == [3, 4] and len(res.good) == 3


def test_dask_unreachable_scheduler(eight_ranks, monkeypatch):
    paths, _ = eight_ranks
    monkeypatch.setattr(mr, "DASK_CONNECT_TIMEOUT", "0.5s")
    res = run("classify", *map(str, paths[:2]), "--dask", "tcp://127.0.0.1:9")
    assert res.exit_code == 2 and "cannot reach the Dask scheduler" in res.stderr


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_cli_formats_on_the_real_ranks(fmt, tmp_path):
    out = tmp_path / f"o.{fmt}"
    res = run("classify", str(DDP), "--format", fmt, "-o", str(out), "--top", "4", "--workers", "1")
    assert res.exit_code == 0, res.stderr
    text = out.read_text()
    if fmt == "json":
        rep = json.loads(text)
        assert rep["kind"] == "multirank" and len(rep["ops"]) == 4
        assert {"ranks", "ops", "stragglers", "communication", "errors"} <= rep.keys()
    elif fmt == "csv":
        df = pd.read_csv(out)
        assert len(df) == 4 and {"gpu_time_min_ns", "gpu_time_median_ns", "gpu_time_max_ns", "min_rank",
                                 "max_rank", "class", "action"} <= set(df.columns)
    else:
        assert "step" in text and "AllReduce" in text and "stragglers" in text.lower()


def test_one_file_keeps_the_single_trace_output():
    single = run("classify", str(DDP / "rank0.sqlite.xz"), "--format", "json")
    assert single.exit_code == 0 and "kind" not in json.loads(single.stdout)


def test_refuses_to_overwrite_a_rank_trace(tmp_path):
    import shutil
    for r in range(2):
        shutil.copy(DDP / f"rank{r}.sqlite.xz", tmp_path / f"rank{r}.sqlite.xz")
    before = (tmp_path / "rank1.sqlite.xz").read_bytes()
    res = run("classify", str(tmp_path), "-o", str(tmp_path / "rank1.sqlite.xz"))
    assert res.exit_code == 2 and "refusing to write over the input trace" in res.stderr
    assert (tmp_path / "rank1.sqlite.xz").read_bytes() == before


GOLDEN = ROOT / "tests" / "data" / "golden"


def _steady(text: str) -> str:
    """The ranks table's last column is how long each rank's analysis took: the one number that
    differs between runs. It is written as 'N.N s' right-aligned; keep the width, drop the value."""
    import re
    return re.sub(r"(?m)(?<= )( *\d+\.\d s)(?= +$)", lambda m: f"{'_._ s':>{len(m.group(1))}}", text)


@pytest.mark.parametrize("wide", [False, True])
def test_cli_table_is_exact_at_80_columns_and_wide(wide):
    """Every table fits 80 columns, the columns left out are named once under them, and --wide
    keeps them all (the tables are then wider than the terminal)."""
    res = CliRunner().invoke(main, whole(["classify", str(DDP), "--workers", "1",
                                          *(["--wide"] if wide else [])]), env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    if wide:
        assert max(map(len, lines)) > 80 and "not shown" not in res.stdout
    else:
        assert max(map(len, lines)) <= 80
    name = "multirank_ddp2_wide.txt" if wide else "multirank_ddp2_80.txt"
    assert _steady(res.stdout) == (GOLDEN / name).read_text()

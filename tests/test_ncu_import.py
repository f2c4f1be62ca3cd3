"""ncu raw-page CSV parsing and the merge into an nsys trace (always into a copy)."""
from __future__ import annotations

import hashlib
import math
import shutil
import sqlite3
import sys
import types
from pathlib import Path

import click
import pandas as pd
import pytest
from click.testing import CliRunner

import profkit
from synth import plain
from profkit.errors import ProfkitError, TraceError
from profkit.read.ncu import NCU_COLUMNS, NCU_TABLE, read_ncu_metrics
from profkit.capture.ncu_merge import (kernel_base_name, merge_ncu, parse_nvtx_stack, range_matcher,
                                read_meta, read_raw_csv, to_number, unit_scale, write_meta)

DATA = Path(__file__).resolve().parent / "data" / "ncu"
ROOT = Path(__file__).resolve().parent.parent
FIXTURE = DATA / "fixture_raw.csv"
REAL_CSV = DATA / "addnorm_gemm_raw.csv.xz"
REAL_TRACE = ROOT / "traces" / "micro_addnorm_gemm.sqlite.xz"

NSYS_ADD = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add"
            "<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)")
NSYS_FILL = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor"
             "<float>, std::array<char *, (unsigned long)1>>(int, T2, T3)")
NVJET = "nvjet_sm90_tst_128x128_64x4_1x2_h_bz_NNT"
SM80 = ("sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_"
        "tensor16x8x16_kernel")
PID = 999 << 24
TID = PID + 999


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_trace(path: Path) -> Path:
    """A tiny nsys-shaped SQLite: 6 kernels, NVTX step > {add, gemm} on one thread."""
    con = sqlite3.connect(path)
    con.executescript("""
    CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
    CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,
        globalPid INTEGER, correlationId INTEGER, demangledName INTEGER, shortName INTEGER);
    CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER,
        correlationId INTEGER);
    CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT,
        globalTid INTEGER, textId INTEGER);
    """)
    strings = {NSYS_FILL: 1, "vectorized_elementwise_kernel": 2, NSYS_ADD: 3, NVJET: 4, SM80: 5,
               "gemm": 6}
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    kernels = [(NSYS_FILL, "vectorized_elementwise_kernel"), (NSYS_ADD, "vectorized_elementwise_kernel"),
               (NVJET, NVJET), (SM80, SM80), (NSYS_ADD, "vectorized_elementwise_kernel"),
               (NVJET, NVJET)]
    for i, (dem, short) in enumerate(kernels):
        launch = 1000 + 100 * i
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?)",
                    (launch, launch + 5, TID, i + 1))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?)",
                    (launch + 50, launch + 90, 0, PID, i + 1, strings[dem], strings[short]))
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?)", [
        (1090, 1400, 59, "step", TID, None),
        (1095, 1110, 59, "add {flops=4.194e+06, bytes=2.5e+07}", TID, None),
        (1195, 1210, 59, None, TID, 6),           # "gemm" through StringIds
        (1000, 9000, 34, "a mark, not a range", TID, None),
    ])
    con.commit()
    con.close()
    return path


@pytest.fixture
def trace(tmp_path):
    original = make_trace(tmp_path / "orig.sqlite")
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(original, copy)
    before = _sha(original)
    yield copy
    assert _sha(original) == before  # the original is never touched


# --- small pieces --------------------------------------------------------------------------------
def test_numbers_and_units():
    assert to_number("1,048,576") == 1048576.0
    assert to_number(" 12.5 ") == 12.5
    assert math.isnan(to_number("n/a")) and math.isnan(to_number("")) and math.isnan(to_number(None))
    assert unit_scale("Gbyte") == 1e9 and unit_scale("Kbyte") == 1e3 and unit_scale("byte") == 1
    assert unit_scale("us") == 1e3 and unit_scale("usecond") == 1e3 and unit_scale("ms") == 1e6
    assert unit_scale("nsecond") == 1 and unit_scale("%") == 1 and unit_scale("") == 1
    assert unit_scale("byte/second") == 1


def test_nvtx_stack():
    cell = ('4242  "<default domain>:step:none:none:none:none:none:none"  '
            '"<default domain>:add {flops=1, bytes=2}:none:none:RGB:0xff:REGISTERED:add" ')
    assert parse_nvtx_stack(cell) == ["step", "add {flops=1, bytes=2}"]
    assert parse_nvtx_stack('7  "mydomain:a:b:none:none:none:none:none:none"') == ["a:b"]
    assert parse_nvtx_stack("") == [] and parse_nvtx_stack(float("nan")) == []


def test_kernel_base_name():
    assert kernel_base_name(NSYS_ADD) == "vectorized_elementwise_kernel"
    assert kernel_base_name("void at::vectorized_elementwise_kernel<8, at::CUDAFunctor_add"
                            "<c10::BFloat16>, std::array<char *, 3>>(int, T2, T3)") \
        == "vectorized_elementwise_kernel"
    assert kernel_base_name("void at::native::<unnamed>::vectorized_layer_norm_kernel<float, "
                            "float, (bool)1>(int, T2, const T1 *)") == "vectorized_layer_norm_kernel"
    assert kernel_base_name(NVJET) == NVJET
    assert kernel_base_name("triton_poi_fused_add_0") == "triton_poi_fused_add_0"


def test_range_matcher():
    m = range_matcher("step")
    assert m("step") and not m("stepper") and not m(None)
    assert range_matcher("add/")("add {flops=4e6}")
    assert range_matcher("outer/inner/")("inner")
    assert range_matcher("dom@gemm/")("gemm")
    assert range_matcher("regex:^gemm_")("gemm_bf16_8192")
    assert range_matcher(None) is None


# --- parsing the hand fixture ---------------------------------------------------------------------
def test_read_fixture():
    df = read_raw_csv(FIXTURE)
    assert list(df["id"]) == [0, 1, 2, 3, 4]
    assert list(df["launch_index"]) == [0, 1, 2, 3, 4]
    assert set(NCU_COLUMNS) - {"globalPid", "deviceId", "kernel_start"} <= set(df.columns)
    r0, r1, r2, r3, r4 = (df.iloc[i] for i in range(5))
    assert r0["dram_bytes_read"] == pytest.approx(512)          # 0.000512 Mbyte
    assert r0["dram_bytes_write"] == pytest.approx(4_096_000)   # 4,096 Kbyte
    assert r0["gpu_time_ns"] == pytest.approx(1216)             # 1.216 us
    assert r0["flops_tensor"] == 0 and pd.isna(r0["tensor_precision"])
    assert pd.isna(r0["nvtx_range"])
    assert r1["nvtx_range"] == "add {flops=4.194e+06, bytes=2.5e+07}"
    assert r1["flops_fp32"] == 1_048_576
    assert r1["dram_bytes_write"] == pytest.approx(8_388_608)
    assert r1["dram_throughput_pct"] == 88.25
    assert r2["nvtx_range"] == "gemm"
    assert r2["flops_tensor"] == 1_099_511_627_776 and r2["tensor_precision"] == "bf16"
    assert r2["gpu_time_ns"] == pytest.approx(140_250)
    assert r2["sm_throughput_pct"] == 93.1 and r2["achieved_occupancy_pct"] == 14.8
    # fp16 umbrella counter present: its dst_fp32 split is not added again
    assert r3["flops_tensor"] == 2_147_483_648 and r3["tensor_precision"] == "fp16"
    assert r3["flops_fp64"] == 2 + 8 + 2 * 4         # dadd + dmul + 2*dfma
    assert r3["flops_fp32"] == 16 + 64 + 2 * 32      # fadd + fmul + 2*ffma
    assert r3["flops_fp16"] == 2 * 1 + 2 * 4 + 4 * 2  # packed: 2*hadd + 2*hmul + 4*hfma
    assert r3["nvtx_range"] == "step"
    # empty cells are missing counters, not zeros
    assert math.isnan(r4["flops_tensor"]) and math.isnan(r4["flops_fp64"])
    assert r4["flops_fp32"] == 1_048_576


def test_read_rejects_other_files(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ProfkitError, match="not an ncu raw-page CSV"):
        read_raw_csv(bad)
    details = tmp_path / "d.csv"
    details.write_text('"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
                       '"0","k","s","dram__bytes_read.sum","byte","1"\n')
    with pytest.raises(ProfkitError, match="details-page CSV"):
        read_raw_csv(details)
    with pytest.raises(ProfkitError, match="ncu CSV not found"):
        read_raw_csv(tmp_path / "missing.csv")


# --- merging --------------------------------------------------------------------------------------
def _rows(path: Path):
    con = sqlite3.connect(path)
    try:
        return read_ncu_metrics(con).sort_values("launch_index").reset_index(drop=True)
    finally:
        con.close()


def test_merge_matches_by_name_and_launch_order(trace):
    kernel_rows_before = sqlite3.connect(trace).execute(
        "SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    result = merge_ncu(trace, FIXTURE)
    assert (result.profiled, result.matched, result.unmatched) == (5, 5, [])
    rows = _rows(trace)
    # nsys kernel starts: 1050 fill, 1150 add, 1250 nvjet, 1350 sm80, 1450 add, 1550 nvjet
    assert list(rows["kernel_start"]) == [1050, 1150, 1250, 1350, 1450]
    assert set(rows["globalPid"]) == {PID} and set(rows["deviceId"]) == {0}
    assert rows.loc[2, "tensor_precision"] == "bf16"
    con = sqlite3.connect(trace)
    cols = [r[1] for r in con.execute(f"PRAGMA table_info({NCU_TABLE})")]
    assert cols == list(NCU_COLUMNS)
    assert con.execute("SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall() == kernel_rows_before
    # merging again replaces, never duplicates
    merge_ncu(trace, FIXTURE)
    assert con.execute(f"SELECT count(*) FROM {NCU_TABLE}").fetchone()[0] == 5


def test_merge_within_nvtx_range(trace):
    df = read_raw_csv(FIXTURE)
    in_step = df[df["id"].isin([1, 2, 3])]      # what `ncu --nvtx-include step/` profiles
    result = merge_ncu(trace, in_step, range_expr="step")
    assert result.matched == 3
    # without the range the first add would pair with the fill kernel (same function name)
    assert list(_rows(trace)["kernel_start"]) == [1150, 1250, 1350]
    merge_ncu(trace, df[df["id"] == 1], range_expr="add", force=True)   # hinted range matched by bare name
    assert list(_rows(trace)["kernel_start"]) == [1150]
    merge_ncu(trace, df[df["id"] == 2], range_expr="gemm/", force=True)  # range text through StringIds
    assert list(_rows(trace)["kernel_start"]) == [1250]


def test_merge_reports_unmatched(trace):
    df = read_raw_csv(FIXTURE)
    extra = df.iloc[[2]].copy()
    extra["id"] = 9
    extra["kernel_name"] = "some_other_kernel"
    result = merge_ncu(trace, pd.concat([df, extra]))
    assert result.matched == 5 and result.unmatched == ["some_other_kernel"]
    assert result.summary() == ("5 of 6 ncu kernels matched to nsys kernels; "
                                "unmatched: some_other_kernel")


def test_merge_errors(tmp_path):
    with pytest.raises(ProfkitError, match="trace not found"):
        merge_ncu(tmp_path / "none.sqlite", FIXTURE)
    notdb = tmp_path / "x.sqlite"
    notdb.write_text("this is not sqlite at all, just text " * 20)
    with pytest.raises(TraceError):
        merge_ncu(notdb, FIXTURE)
    empty = tmp_path / "e.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(TraceError, match="no CUPTI_ACTIVITY_KIND_KERNEL"):
        merge_ncu(empty, FIXTURE)


def test_meta_table(trace):
    write_meta(trace, {"a": 1, "b": None})
    write_meta(trace, [("a", "2")])
    assert read_meta(trace) == {"a": "2", "b": None}


# --- the command line ---------------------------------------------------------------------------
def _capture_command():
    if not (Path(profkit.__file__).parent / "cli" / "classify.py").exists() \
            and "profkit.cli.classify" not in sys.modules:
        stub = types.ModuleType("profkit.cli.classify")
        stub.classify = click.command("classify")(lambda: None)
        sys.modules["profkit.cli.classify"] = stub
    from profkit.cli.capture import capture
    return capture


def _invoke(args):
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    return runner.invoke(_capture_command(), args, catch_exceptions=False)


def test_cli_merge_into_copy(tmp_path):
    original = make_trace(tmp_path / "orig.sqlite")
    before = _sha(original)
    out = tmp_path / "merged.sqlite"
    r = _invoke(["--merge-ncu", str(FIXTURE), "-o", str(out), str(original)])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == f"profkit: 5 of 5 ncu kernels matched to nsys kernels; wrote {out}\n"
    assert _sha(original) == before
    assert len(_rows(out)) == 5
    assert read_meta(out)["ncu_merged_from"] == str(FIXTURE)
    r = _invoke(["--merge-ncu", str(FIXTURE), "-o", str(out), str(original)])
    assert r.exit_code == 2
    assert r.stderr == f"profkit: error: output {out} exists; pass --force to replace it\n"


def test_cli_merge_in_place_and_errors(tmp_path):
    t = make_trace(tmp_path / "t.sqlite")
    r = _invoke(["--merge-ncu", str(FIXTURE), "--ncu-range", "step", str(t)])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == f"profkit: 3 of 3 ncu kernels matched to nsys kernels; wrote {t}\n"
    assert list(_rows(t)["kernel_start"]) == [1150, 1250, 1350]
    r = _invoke(["--merge-ncu", str(tmp_path / "nope.csv"), str(t)])
    assert r.exit_code == 2
    assert r.stderr == f"profkit: error: ncu CSV not found: {tmp_path / 'nope.csv'}\n"
    r = _invoke(["--merge-ncu", str(FIXTURE), str(tmp_path / "nope.sqlite")])
    assert r.exit_code == 2
    assert r.stderr == f"profkit: error: trace not found: {tmp_path / 'nope.sqlite'}\n"


# --- real data (H200, ncu 2025.3.1) -------------------------------------------------------------
@pytest.mark.skipif(not (REAL_CSV.exists() and REAL_TRACE.exists()),
                    reason="real ncu/nsys fixtures not present")
def test_real_ncu_csv_merges_into_copy_of_real_trace(tmp_path):
    before = _sha(REAL_TRACE)
    copy = tmp_path / "real.sqlite"
    shutil.copyfile(plain(REAL_TRACE), copy)
    df = read_raw_csv(REAL_CSV)
    assert len(df) == 59
    gemm = df[df["nvtx_range"] == "gemm_bf16_8192"]
    assert len(gemm) == 10
    # 2*8192^3 plus the 320-wide tile's padding (8320/8192): ncu counts what the MMAs did
    assert (gemm["flops_tensor"] == 1_116_691_496_960).all()
    assert (gemm["tensor_precision"] == "bf16").all()
    assert gemm["dram_bytes_read"].iloc[0] == pytest.approx(1.250254e9)   # "Gbyte" column
    assert gemm["gpu_time_ns"].iloc[0] == pytest.approx(1_377_344)        # "ms" column
    fp32 = df[df["nvtx_range"] == "gemm_fp32_4096"]
    assert (fp32["flops_fp32"] == 2 * 68_736_253_952).all()               # 2 * ffma ≈ 2*4096^3
    assert fp32["tensor_precision"].isna().all()
    result = merge_ncu(copy, df)
    assert (result.matched, result.profiled) == (59, 59)
    con = sqlite3.connect(copy)
    pairs = con.execute(
        f"SELECT m.kernel_name, s.value FROM {NCU_TABLE} m JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
        "ON k.start = m.kernel_start AND k.deviceId = m.deviceId AND k.globalPid = m.globalPid "
        "JOIN StringIds s ON s.id = k.shortName").fetchall()
    assert len(pairs) == 59
    assert all(kernel_base_name(n) == short for n, short in pairs)
    # with the range, only the kernels inside gemm_bf16_8192 are candidates
    result = merge_ncu(copy, gemm, range_expr="gemm_bf16_8192", force=True)
    assert result.matched == 10
    assert _sha(REAL_TRACE) == before


def test_base_name_of_ncu_anonymous_namespace():
    """ncu prints `<unnamed>::` as `unnamed>::`; the unbalanced `>` must not eat the name."""
    from profkit.capture.ncu_merge import kernel_base_name
    ncu = ("void unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, void "
           "normal_and_transform<BFloat16, float>(TensorIteratorBase &, T3, T4)::[lambda(int) "
           "(instance 2)]>(long, PhiloxCudaState, T3, T4)")
    nsys = ("void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, (int)4, "
            "void at::native::normal_and_transform<c10::BFloat16, float>(at::TensorIteratorBase &, T3, "
            "T4)::[lambda(int) (instance 2)]>(long, at::PhiloxCudaState, T3, T4)")
    assert kernel_base_name(ncu) == kernel_base_name(nsys) == "distribution_elementwise_grid_stride_kernel"


# --- the matcher refuses pairs that do not line up ---------------------------------------------
@pytest.mark.skipif(not (REAL_CSV.exists() and REAL_TRACE.exists()),
                    reason="real ncu/nsys fixtures not present")
@pytest.mark.parametrize("skip", [1, 5, 10])
def test_launch_skip_is_caught_by_grid_and_block(tmp_path, skip):
    """ncu --launch-skip N: the k-th ncu launch is no longer the k-th nsys launch of a name."""
    copy = tmp_path / "real.sqlite"
    shutil.copyfile(plain(REAL_TRACE), copy)
    df = read_raw_csv(REAL_CSV)
    with pytest.raises(ProfkitError, match="do not line up"):
        merge_ncu(copy, df.iloc[skip:])
    assert read_ncu_metrics(sqlite3.connect(copy)).empty  # nothing merged
    result = merge_ncu(copy, df.iloc[skip:], allow_mismatch=True)
    assert result.mismatched
    full = merge_ncu(copy, df)
    assert not full.mismatched and full.matched == 59
    rows = read_ncu_metrics(sqlite3.connect(copy))
    assert rows["grid"].notna().all() and rows["block"].notna().all()


def test_merge_ncu_never_replaces_counters_with_fewer(trace, tmp_path):
    from profkit.capture.runner import merge_existing
    csv_all = FIXTURE
    merge_existing(csv_all, trace)
    df = read_raw_csv(FIXTURE)
    fewer = tmp_path / "fewer.csv"
    # the same CSV with its last two kernels cut off
    lines = FIXTURE.read_text().splitlines()
    fewer.write_text("\n".join(lines[:-2]) + "\n")
    assert len(read_raw_csv(fewer)) == len(df) - 2
    with pytest.raises(ProfkitError, match="fewer than the"):
        merge_existing(fewer, trace)
    assert len(_rows(trace)) == len(df)
    merge_existing(fewer, trace, force=True)
    assert len(_rows(trace)) == len(df) - 2


def test_hadd_without_hfma_or_hmul_is_a_conversion_not_flops():
    head = ('"ID","Process ID","Kernel Name","Block Size","Grid Size","Device",'
            '"sm__sass_thread_inst_executed_op_hadd_pred_on.sum",'
            '"sm__sass_thread_inst_executed_op_hfma_pred_on.sum",'
            '"sm__sass_thread_inst_executed_op_hmul_pred_on.sum","lts__t_bytes.sum"\n'
            '"","","","","","","inst","inst","inst","Mbyte"\n')
    rows = ('"0","1","k_convert","(128, 1, 1)","(64, 1, 1)","0","1000","0","0","16.8"\n'
            '"1","1","k_half_math","(128, 1, 1)","(64, 1, 1)","0","1000","10","0","1"\n')
    import io
    df = read_raw_csv(io.StringIO(head + rows))
    assert df.loc[0, "flops_fp16"] == 0            # HADD2.F32 moves: no half-precision math
    assert df.loc[1, "flops_fp16"] == 2000 + 40    # real half math: HADD2 x2, HFMA2 x4
    assert df.loc[0, "l2_bytes"] == pytest.approx(16.8e6)
    assert (df.loc[0, "grid"], df.loc[0, "block"]) == ("64,1,1", "128,1,1")


@pytest.mark.skipif(not (REAL_CSV.exists() and REAL_TRACE.exists()),
                    reason="real ncu/nsys fixtures not present")
def test_other_geometry_stays_unmatched_and_mismatches_are_left_out(tmp_path):
    """A second run that launched a kernel with another grid (cuDNN picked another config):
    that launch stays unmatched; pairs out of launch order are dropped with allow_mismatch."""
    copy = tmp_path / "real.sqlite"
    shutil.copyfile(plain(REAL_TRACE), copy)
    df = read_raw_csv(REAL_CSV).copy()
    df.loc[2, "grid"] = "999,1,1"
    result = merge_ncu(copy, df)
    assert result.matched == 58 and not result.mismatched
    assert len(result.unmatched) == 1
    moved = read_raw_csv(REAL_CSV).copy()
    moved = pd.concat([moved.iloc[[20]], moved.drop(index=20)]).reset_index(drop=True)
    moved["id"] = range(len(moved))  # ncu saw kernel 20 first: out of launch order
    with pytest.raises(ProfkitError, match="do not line up"):
        merge_ncu(copy, moved)
    res = merge_ncu(copy, moved, allow_mismatch=True, force=True)  # fewer than the 58 before
    assert res.dropped > 0 and len(_rows(copy)) == res.matched - res.dropped


def test_cli_merge_that_would_lose_counters_changes_nothing(tmp_path):
    t = make_trace(tmp_path / "t.sqlite")
    assert _invoke(["--merge-ncu", str(FIXTURE), str(t)]).exit_code == 0
    assert len(_rows(t)) == 5
    before = _sha(t)
    # a typo in the range: nothing matches; the five counters merged earlier must stay
    r = _invoke(["--merge-ncu", str(FIXTURE), "--ncu-range", "stpe", str(t)])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1
    assert "'stpe'" in r.stderr and "unchanged" in r.stderr
    assert _sha(t) == before
    # fewer than already there: refused too, unless --force
    r = _invoke(["--merge-ncu", str(FIXTURE), "--ncu-range", "step", str(t)])
    assert r.exit_code == 2 and "fewer than the 5 counters already in" in r.stderr
    assert _sha(t) == before
    r = _invoke(["--merge-ncu", str(FIXTURE), "--ncu-range", "step", "--force", str(t)])
    assert r.exit_code == 0 and len(_rows(t)) == 3
    # into a copy: refused merges leave no copy behind
    out = tmp_path / "copy.sqlite"
    r = _invoke(["--merge-ncu", str(FIXTURE), "--ncu-range", "nope", "-o", str(out), str(t)])
    assert r.exit_code == 2 and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.sqlite"]


def test_cli_merge_into_a_read_only_trace_points_to_a_copy(tmp_path, monkeypatch):
    import os
    t = make_trace(tmp_path / "t.sqlite")
    before = _sha(t)
    # root may write to a 0444 file, so the permission check is what is simulated here
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if (mode & os.W_OK and str(p) == str(t))
                        else real_access(p, mode, **kw))
    r = _invoke(["--merge-ncu", str(FIXTURE), str(t)])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"profkit: error: {t} is read-only") and "-o COPY.sqlite" in r.stderr
    assert _sha(t) == before
    out = tmp_path / "copy.sqlite"
    r = _invoke(["--merge-ncu", str(FIXTURE), "-o", str(out), str(t)])
    assert r.exit_code == 0, r.stderr
    assert len(_rows(out)) == 5 and _sha(t) == before

"""`profkit classify` on the command line: exact output, the JSON contract and bad input."""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from profkit.cli import main
from synth import TID, make_trace, plain, whole

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "micro_addnorm_gemm.sqlite.xz"
GOLDEN = ROOT / "tests" / "data" / "golden"


def run(*args):
    return CliRunner().invoke(main, whole(list(args)), catch_exceptions=False)


def test_csv_output_is_exact():
    res = run("classify", str(TRACE), "--format", "csv")
    assert res.exit_code == 0, res.stderr
    assert res.stdout == (GOLDEN / "classify_micro_addnorm_gemm.csv").read_text()


def test_markdown_output_is_exact():
    res = run("classify", str(TRACE), "--format", "markdown", "--by", "kernel", "--top", "3")
    assert res.exit_code == 0
    assert res.stdout == (GOLDEN / "classify_micro_addnorm_gemm_kernel_top3.md").read_text()


def test_json_contract():
    res = run("classify", str(TRACE), "--format", "json")
    assert res.exit_code == 0
    rep = json.loads(res.stdout)
    assert {"trace", "gpu", "total_gpu_time_ns", "ops"} <= rep.keys()
    assert rep["gpu"]["name"] == "NVIDIA H200"
    assert rep["gpu"]["peaks"]["memory_bandwidth_bytes_per_s"] == 4.8e12
    # = cuda_gpu_kern_sum total 43908881 + cuda_gpu_mem_time_sum total 9247 (nsys stats)
    assert rep["total_gpu_time_ns"] == 43908881 + 9247
    names = [op["name"] for op in rep["ops"]]
    assert names == ["gemm_fp32_4096", "gemm_bf16_8192", "add_rmsnorm", "gemm_skinny_decode"]
    for op in rep["ops"]:
        assert {"name", "level", "count", "gpu_time_ns", "gpu_time_median_ns", "share", "class",
                "confidence", "evidence", "suggestion"} <= op.keys()
        assert op["class"] in {"compute", "memory", "launch"}
        assert "source" in op["evidence"]
        assert {"rung", "action", "expected_op_speedup", "expected_end_to_end_speedup"} <= op["suggestion"].keys()
    add = rep["ops"][2]
    assert add["count"] == 10 and add["gpu_time_ns"] == 10683564 and add["gpu_time_median_ns"] == 175056


def test_table_output_names_gpu_and_ops():
    res = run("classify", str(TRACE))
    assert res.exit_code == 0
    assert "NVIDIA H200" in res.stdout and "add_rmsnorm" in res.stdout
    assert "peaks: spec table (H200 datasheet)" in res.stdout


def test_example_runs_without_arguments():
    res = run("classify")
    assert res.exit_code == 0 and "example.sqlite.xz" in res.stdout and "gemm_bf16_8192" in res.stdout


def test_output_file_and_refusal_to_overwrite_the_trace(tmp_path):
    t = tmp_path / "t.sqlite.xz"
    shutil.copy(TRACE, t)
    before = t.read_bytes()
    res = run("classify", str(t), "-o", str(t), "--format", "json")
    assert res.exit_code == 2 and "refusing to write over the input trace" in res.stderr
    assert t.read_bytes() == before
    out = tmp_path / "r.json"
    res = run("classify", str(t), "-o", str(out), "--format", "json")
    assert res.exit_code == 0 and json.loads(out.read_text())["ops"]


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    (tmp / "text.sqlite").write_text("hello\n")
    (tmp / "zeros.sqlite").write_bytes(b"\0" * 4096)
    (tmp / "empty.sqlite").write_bytes(b"")
    (tmp / "trunc.sqlite").write_bytes(plain(TRACE).read_bytes()[:200_000])
    (tmp / "trunc.sqlite.xz").write_bytes(TRACE.read_bytes()[:20_000])
    (tmp / "gz-named-xz.sqlite.xz").write_bytes(gzip.compress(plain(TRACE).read_bytes()[:1000]))
    (tmp / "text.sqlite.gz").write_bytes(gzip.compress(b"hello\n"))
    (tmp / "adir").mkdir()
    import sqlite3
    con = sqlite3.connect(tmp / "other.sqlite")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    make_trace(tmp / "nogpu.sqlite", runtime=[(1, 2, 1)], nvtx=[(0, 10, "r", TID)])
    make_trace(tmp / "nogpuinfo.sqlite", kernels=[(5, 9, 1, 1)], runtime=[(1, 2, 1)], gpu_name=None)
    return {
        "missing": (tmp / "missing.sqlite", "no such file"),
        "directory": (tmp / "adir", "not a file"),
        "text": (tmp / "text.sqlite", "not an SQLite file"),
        "zeros": (tmp / "zeros.sqlite", "not an SQLite file"),
        "empty": (tmp / "empty.sqlite", "empty file (0 bytes)"),
        "truncated": (tmp / "trunc.sqlite", "damaged or truncated"),
        "truncated-xz": (tmp / "trunc.sqlite.xz", "damaged xz file"),
        "wrong-compression": (tmp / "gz-named-xz.sqlite.xz", "rename it to end in .gz"),
        "compressed-text": (tmp / "text.sqlite.gz", "does not hold an SQLite file once decompressed"),
        "not-nsys": (tmp / "other.sqlite", "not an Nsight Systems export"),
        "no-gpu-activity": (tmp / "nogpu.sqlite", "no GPU activity"),
        "unknown-gpu-no-numbers": (tmp / "nogpuinfo.sqlite", "pass --peaks FILE"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "text", "zeros", "empty", "truncated",
                                  "truncated-xz", "wrong-compression", "compressed-text",
                                  "not-nsys", "no-gpu-activity", "unknown-gpu-no-numbers"])
def test_bad_input_one_line_exit_2_input_untouched(tmp_path, case):
    path, message = _bad_inputs(tmp_path)[case]
    snapshot = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
                for p in tmp_path.iterdir() if p.is_file()}
    res = run("classify", str(path))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profkit: error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.output
    after = {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
             for p in tmp_path.iterdir() if p.is_file()}
    assert after == snapshot  # nothing written, no journal left beside the trace


def test_unknown_gpu_warns_and_uses_the_trace_numbers(tmp_path):
    p = make_trace(tmp_path / "t.sqlite", kernels=[(100, 200, 1, 1)], runtime=[(10, 20, 1)],
                   nvtx=[(0, 50, "r", TID)], gpu_name="Mystery GPU 9000")
    res = run("classify", str(p), "--format", "json")
    assert res.exit_code == 0
    assert "Mystery GPU 9000 is not in the spec table" in res.stderr
    peaks = json.loads(res.stdout)["gpu"]["peaks"]
    assert peaks["memory_bandwidth_bytes_per_s"] == 2e12
    assert peaks["flops_per_s"] == {"fp32": 2 * 128 * 100 * 1.5e9}


def test_peaks_file_overrides_the_spec_table(tmp_path):
    f = tmp_path / "peaks.json"
    f.write_text(json.dumps({"gpu": "NVIDIA H200", "source": "measured", "memory_bandwidth": 4.25e12,
                             "flops": {"bf16": 7.9e14}, "launch_floor_ns": 1300}))
    rep = json.loads(run("classify", str(TRACE), "--format", "json", "--peaks", str(f)).stdout)
    assert rep["gpu"]["peaks"]["memory_bandwidth_bytes_per_s"] == 4.25e12
    assert rep["gpu"]["peaks"]["flops_per_s"]["bf16"] == 7.9e14
    assert rep["gpu"]["peaks"]["flops_per_s"]["fp32"] == 67e12  # kept from the spec table


def test_bad_peaks_file(tmp_path):
    f = tmp_path / "peaks.json"
    f.write_text("{not json")
    res = run("classify", str(TRACE), "--peaks", str(f))
    assert res.exit_code == 2 and "is not valid JSON" in res.stderr


def test_level_without_ranges_is_explained():
    res = run("classify", str(ROOT / "traces" / "micro_chain.sqlite.xz"), "--by", "aten")
    assert res.exit_code == 2 and "profkit capture --aten" in res.stderr


def test_shapes_from_a_trace_without_aten_ranges_is_one_line():
    res = run("classify", str(TRACE), "--shapes-from", str(ROOT / "traces" / "micro_chain.sqlite.xz"))
    assert res.exit_code == 2
    assert res.stderr == (f"profkit: error: {ROOT / 'traces' / 'micro_chain.sqlite.xz'}: no aten ranges to "
                          "take shapes from: capture the program with `profkit capture --aten`\n")


def test_shapes_from_takes_one_trace():
    res = run("classify", str(TRACE), str(TRACE), "--shapes-from", str(TRACE))
    assert res.exit_code == 2 and res.stderr == "profkit: error: --shapes-from takes one TRACE, not several ranks\n"


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_table_fits_a_narrow_terminal(columns):
    res = CliRunner().invoke(main, ["classify", str(TRACE)], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(x) for x in lines) <= columns
    assert "next step" in res.stdout and "--wide" in res.stdout
    assert "warning" not in res.stdout  # warnings go to stderr


def test_wide_keeps_every_column():
    res = CliRunner().invoke(main, ["classify", "--wide", str(TRACE)], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    for col in ("median", "conf", "evidence", "op x", "e2e x"):
        assert col in res.stdout
    assert "not shown" not in res.stdout


def test_names_wrap_at_word_boundaries():
    from profkit.show.render import wrap_name
    assert wrap_name("triton_poi_fused_add_native_layer_norm_0", 12).split("\n") == [
        "triton_poi_", "fused_add_", "native_", "layer_norm_0"]
    assert wrap_name("short", 12) == "short"


def test_unknown_gpu_warning_goes_to_stderr(tmp_path):
    path = make_trace(tmp_path / "t.sqlite", kernels=[(200, 300, 1, 1)], runtime=[(110, 120, 1)],
                      nvtx=[(100, 400, "op", TID)], gpu_name="Mystery GPU 9000")
    res = CliRunner().invoke(main, ["classify", str(path)])
    assert res.exit_code == 0, res.output
    assert "not in the spec table" in res.stderr and res.stderr.startswith("profkit: warning: ")
    assert "warning" not in res.stdout


@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("command", [
    ["diff", str(ROOT / "traces" / "real" / "train_llama.sqlite.xz"),
     str(ROOT / "traces" / "real" / "train_llama_fused.sqlite.xz")],
    ["classify", str(ROOT / "traces" / "ddp2")],
])
def test_diff_and_multirank_tables_fit_a_narrow_terminal(command, columns):
    res = CliRunner().invoke(main, command, env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    assert max(len(x) for x in res.stdout.splitlines()) <= columns
    assert "not shown" in res.stdout and "--wide" in res.stdout
    wide = CliRunner().invoke(main, [*command, "--wide"], env={"COLUMNS": str(columns)})
    assert wide.exit_code == 0 and "not shown" not in wide.stdout
    assert max(len(x) for x in wide.stdout.splitlines()) > columns  # every column kept


def _waits_and_works(tmp_path):
    """'waits': two 1 us kernels 900 us apart (the host works in between); 'works': one 50 us
    kernel. By span 'waits' is the larger op, by GPU work 'works' is."""
    return make_trace(tmp_path / "t.sqlite",
                      kernels=[(10_000, 11_000, 1, 1), (910_000, 911_000, 2, 1), (1_000_000, 1_050_000, 3, 2)],
                      runtime=[(5_000, 6_000, 1), (905_000, 906_000, 2), (990_000, 991_000, 3)],
                      nvtx=[(0, 950_000, "waits", TID), (980_000, 1_100_000, "works", TID)])


def test_gpu_time_is_busy_time_and_orders_the_ops(tmp_path):
    path = _waits_and_works(tmp_path)
    rep = json.loads(run("classify", str(path), "--format", "json").stdout)
    ops = {op["name"]: op for op in rep["ops"]}
    assert [op["name"] for op in rep["ops"]] == ["works", "waits"]
    # gpu_time_ns keeps its meaning (the projected span, as nsys gives it); busy time beside it
    assert ops["waits"]["gpu_time_ns"] == 901_000 and ops["waits"]["gpu_time_median_ns"] == 901_000
    assert ops["waits"]["gpu_busy_ns"] == 2_000 and ops["waits"]["gpu_busy_median_ns"] == 2_000
    assert ops["works"]["gpu_time_ns"] == ops["works"]["gpu_busy_ns"] == 50_000
    res = CliRunner().invoke(main, whole(["classify", str(path), "--wide"]), env={"COLUMNS": "80"})
    head = next(x for x in res.stdout.splitlines() if x.lstrip().startswith("op "))
    assert head.split()[:7] == ["op", "calls", "GPU", "time", "median", "GPU", "span"]
    rows = [x.split() for x in res.stdout.splitlines() if x.lstrip().startswith(("waits ", "works "))]
    # op, calls, GPU time (busy), median call (busy), GPU span, share
    assert [r[:9] for r in rows] == [["works", "1", "50.0", "us", "50.0", "us", "50.0", "us", "96.2%"],
                                     ["waits", "1", "2.0", "us", "2.0", "us", "901.0", "us", "3.8%"]]
    csv = run("classify", str(path), "--format", "csv").stdout.splitlines()
    assert csv[0].endswith(",gpu_busy_ns,gpu_busy_median_ns")
    assert csv[2].startswith("waits,range,1,901000,901000.0,") and csv[2].endswith(",2000,2000.0")


@pytest.mark.parametrize("wide", [False, True])
def test_table_is_exact_at_80_columns_and_wide(wide):
    """The whole table at 80 columns (least useful columns left out and named) and with --wide
    (every column, GPU span included): add_rmsnorm's GPU time is its busy 1.74 ms, its span
    10.68 ms (a first call that waited on set-up)."""
    res = CliRunner().invoke(main, whole(["classify", str(TRACE), *(["--wide"] if wide else [])]),
                             env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    name = "classify_micro_addnorm_gemm_wide.txt" if wide else "classify_micro_addnorm_gemm_80.txt"
    assert res.stdout == (GOLDEN / name).read_text()


def test_usage_errors_are_one_line_with_where_to_look():
    res = run("classify", str(TRACE), "--by", "nonsense")
    assert res.exit_code == 2
    assert res.stderr == ("profkit: error: Invalid value for '--by': 'nonsense' is not one of 'range', "
                          "'kernel', 'aten'. (see `profkit classify --help`)\n")
    res = run("nosuch")
    assert res.exit_code == 2 and res.stderr == "profkit: error: No such command 'nosuch'. (see `profkit --help`)\n"

"""`profkit export-perfetto`: Chrome trace-event JSON with CPU-thread and GPU-stream tracks."""
from __future__ import annotations

from functools import partial

import hashlib
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import profkit
from profkit.show import perfetto
from profkit.cli import main
from synth import PID, TID, make_trace

# Golden numbers here are over the whole capture with Nsight Systems' per-thread projection.
load_all = partial(profkit.load, window="all", attribution="thread")

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"


def export(trace: Path, by: str = "range") -> dict:
    buf = io.StringIO()
    perfetto.write(load_all(trace), buf, by=by)
    return json.loads(buf.getvalue())


def test_synthetic_trace_events_are_exact(tmp_path):
    strings = {1: "void k<float>(float*)", 2: "other_kernel", 9: "cudaLaunchKernel"}
    trace = make_trace(tmp_path / "t.sqlite", strings=strings,
                       kernels=[(2_000, 5_000, 1, 1), (9_000, 9_500, 2, 2)],
                       runtime=[(1_000, 1_500, 1), (8_000, 8_200, 2)],
                       nvtx=[(500, 6_000, "step <b>", TID)])
    doc = export(trace)
    ev = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ns"
    meta = [e for e in ev if e["ph"] == "M"]
    names = {(e["pid"], e["tid"], e["name"]): e["args"] for e in meta}
    cpu_pid, cpu_tid = PID >> 24, TID & 0xFFFFFF
    gpu_pid = perfetto.GPU_PID_BASE + 0
    assert names[(cpu_pid, cpu_tid, "thread_name")]["name"] == f"NVTX thread {cpu_tid}"
    assert names[(cpu_pid, cpu_tid + perfetto.API_TID_OFFSET, "thread_name")]["name"] == f"CUDA API thread {cpu_tid}"
    assert names[(gpu_pid, 0, "process_name")]["name"].startswith("GPU 0")
    assert names[(gpu_pid, 7, "thread_name")]["name"] == "stream 7"
    x = [e for e in ev if e["ph"] == "X"]
    nvtx = [e for e in x if e["cat"] == "nvtx"]
    assert nvtx == [{"ph": "X", "cat": "nvtx", "name": "step <b>", "pid": cpu_pid, "tid": cpu_tid,
                     "ts": 0.0, "dur": 5.5, "args": {}}]
    kern = [e for e in x if e["cat"] == "kernel"]
    assert [(e["ts"], e["dur"], e["pid"], e["tid"]) for e in kern] == [(1.5, 3.0, gpu_pid, 7), (8.5, 0.5, gpu_pid, 7)]
    k0, k1 = kern
    assert k0["args"]["kernel"] == "void k<float>(float*)" and k0["args"]["op"] == "step <b>"
    assert k0["args"]["class"] in {"compute", "memory", "launch"}
    assert ":" in k0["args"]["next_step"] and "expected_end_to_end_speedup" in k0["args"]
    assert k1["args"]["op"] is None and k1["args"]["class"] == "outside any op"
    api = [e for e in x if e["cat"] == "cuda_api"]
    assert [(e["ts"], e["dur"], e["tid"]) for e in api] == [(0.5, 0.5, cpu_tid + perfetto.API_TID_OFFSET),
                                                             (7.5, 0.2, cpu_tid + perfetto.API_TID_OFFSET)]
    flows = [e for e in ev if e["ph"] in "sf"]
    assert len(flows) == 4 and {e["id"] for e in flows} == {0, 1}


def test_real_trace_every_gpu_activity_exported_with_its_verdict(tmp_path):
    trace = TRACES / "micro_graph.sqlite.xz"
    before = hashlib.sha256(trace.read_bytes()).hexdigest()
    res = CliRunner().invoke(main, ["export-perfetto", "--window", "all", "--attribution", "thread", str(trace), "-o", str(tmp_path / "g.json")],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    doc = json.loads((tmp_path / "g.json").read_text())
    prof = load_all(trace)
    acts = prof.trace.activities
    gpu = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= perfetto.GPU_PID_BASE]
    assert len(gpu) == len(acts)
    assert {e["tid"] for e in gpu} == set(acts["streamId"].astype(int))
    assert sum(e["dur"] for e in gpu) == pytest.approx(prof.trace.total_gpu_time_ns / 1000, rel=1e-6)
    for e in gpu:
        assert e["ts"] >= 0 and e["dur"] >= 0
    row = prof.ops(by="range").loc["eager_chain"]
    eager = [e for e in gpu if e["args"].get("op") == "eager_chain"]
    assert len(eager) == 10 * 20     # 10 calls of 20 kernels
    assert all(e["args"]["class"] == row["class"] for e in eager)
    assert all(e["args"]["next_step"] == f"{row['rung']}: {row['action']}" for e in eager)
    nvtx = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "nvtx"]
    assert len(nvtx) == len(prof.trace.ranges)
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == before


def test_cli_errors_are_one_line(tmp_path):
    res = CliRunner().invoke(main, ["export-perfetto", "--window", "all", "--attribution", "thread", str(tmp_path / "x.sqlite"), "-o", str(tmp_path / "o.json")])
    assert res.exit_code == 2 and res.stderr.startswith("profkit: error: trace not found")
    res = CliRunner().invoke(main, ["export-perfetto", "--window", "all", "--attribution", "thread", str(TRACES / "micro_graph.sqlite.xz"),
                                    "-o", str(tmp_path / "no" / "o.json")])
    assert res.exit_code == 2 and "does not exist" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_window_keeps_only_the_events_inside(tmp_path):
    trace = TRACES / "micro_graph.sqlite.xz"
    res = CliRunner().invoke(main, ["export-perfetto", "--window", "all", "--attribution", "thread", str(trace), "-o", str(tmp_path / "w.json"),
                                    "--range", "graph_replay", "--instance", "3"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    doc = json.loads((tmp_path / "w.json").read_text())
    gpu = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= perfetto.GPU_PID_BASE]
    assert 20 <= len(gpu) < 100     # the replay's 20 kernels and their neighbours, not all 423
    nvtx = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "nvtx"]
    assert "graph_replay" in nvtx and len(nvtx) < 10
    res = CliRunner().invoke(main, ["export-perfetto", "--window", "all", "--attribution", "thread", str(trace), "-o", str(tmp_path / "x.json"),
                                    "--start", "later"])
    assert res.exit_code == 2 and res.stderr.startswith("profkit: error: --start")

"""PK207 invariant-recompute: the op record's loop-invariant ops (weights dequantized at every
call) priced through the step model on int8_dequant_infer's capture (an H100, 2026-12-06), whose
record found them itself (profkit.capture.invariant; tests/test_invariant_record.py runs the
record); edited records (entries the program makes, scaled, or none) test what the rule refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

import profkit
import shared

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "corpus" / "int8_dequant_infer.sqlite.xz"
D, FF, LAYERS = 2048, 5632, 8
SHAPES = {3 * D * D: 1, D * D: 1, FF * D: 3}       # qkv, o; gate, up and down


def _with_invariant(tmp_path: Path, entries: list[dict] | None) -> Path:
    return shared.with_record_items(TRACE, tmp_path, "invariant", entries)


def _dequant(scale: float = 1.0) -> list[dict]:
    rows = []
    for numel, per_block in SHAPES.items():
        n = int(per_block * LAYERS * scale)
        rows += [{"op": "to", "from": "int8", "dtype": "bfloat16", "numel": numel, "count": n,
                  "bytes": 2 * numel * n, "gpu_ns": 0, "timed": 0},
                 {"op": "mul", "from": "bfloat16", "dtype": "bfloat16", "numel": numel, "count": n,
                  "bytes": 2 * numel * n, "gpu_ns": 0, "timed": 0}]
    return rows


def test_weights_dequantized_every_call_are_priced_by_removing_their_kernels():
    prof = profkit.load(TRACE)
    (f,) = [f for f in prof.findings() if f.code == "PK207"]
    assert f.evidence["invariant_ops_per_iteration"] == 80 and f.evidence["kernels_found_per_iteration"] == 80
    # the 40 casts and the 40 scalings, 2.26 ms of kernels an iteration (29 iterations); the
    # record's CUDA events timed 4.51 ms around them, their launches included
    assert f.evidence["kernel_ns_per_iteration"] == 2_264_803
    assert f.evidence["timed_gpu_ns_per_iteration"] == 4_510_525
    # 4.09 -> 1.83 ms; measured 2.31x dequantizing once (the H100, run folder ab-55)
    assert f.expected_end_to_end_speedup == pytest.approx(2.2387, abs=1e-3)
    assert "dequantized at every call" in f.action and "torch._weight_int8pack_mm" in f.action
    assert prof.run().top_actions()[0].rule == "invariant-recompute"
    # the entries the program makes, as a test writes them, price the same kernels
    assert {(o["op"], o["numel"]) for o in f.evidence["ops"]} <= {(r["op"], r["numel"]) for r in _dequant()}


def test_no_record_or_too_little_work_is_no_finding(tmp_path):
    assert "PK207" not in {f.code for f in profkit.load(_with_invariant(tmp_path, None)).findings()}
    tiny = [{"op": "to", "from": "int8", "dtype": "bfloat16", "numel": 64, "count": 1, "bytes": 128}]
    assert "PK207" not in {f.code for f in profkit.load(_with_invariant(tmp_path, tiny)).findings()}


def test_kernels_the_trace_does_not_hold_are_not_priced(tmp_path):
    # the record counts ten times the casts the trace shows: the kernels are not these
    assert "PK207" not in {f.code for f in profkit.load(_with_invariant(tmp_path, _dequant(10))).findings()}


def test_the_committed_vocoder_capture_prices_its_weight_norm():
    """vocoder_weightnorm_infer (an H100): 42 weight-normalised convolutions, each weight
    recomputed at every inference call, as its capture's record found them; the fused weight-norm
    kernels are 0.10 ms of an iteration, their launches and dispatch most of the rest: 1.28x,
    folding the weight norm measured 1.41x (the parametrizations' Python is not priced)."""
    (f,) = [f for f in profkit.load(ROOT / "traces/corpus/vocoder_weightnorm_infer.sqlite.xz").findings()
            if f.code == "PK207"]
    assert f.expected_end_to_end_speedup == pytest.approx(1.2760, abs=1e-3)
    assert f.evidence["invariant_ops_per_iteration"] == 42 and f.evidence["kernels_found_per_iteration"] == 42
    assert f.evidence["kernel_ns_per_iteration"] == 104_656
    assert f.action.startswith("every iteration recomputes tensors from weights that never change (42 ops: "
                               "_weight_norm float32->float32 x42; 0.10 ms of kernels an iteration): a weight "
                               "normalisation is recomputed at every call: remove it at inference")

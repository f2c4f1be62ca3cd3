"""The aten recorder's capture of the real Llama training step (H200): element types come from
the record, casts count both types, and backward ops are seen on autograd's thread."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from synth import plain

import profkit

TRACE = Path(__file__).resolve().parents[1] / "traces" / "real" / "train_llama_rec.sqlite.xz"
pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="traces/real/train_llama_rec.sqlite.xz not present")


@pytest.fixture(scope="module")
def ops():
    return profkit.load(TRACE).ops(by="aten")


def test_gemms_are_judged_on_the_recorded_bf16(ops):
    mm = ops[ops.index.str.startswith("aten::mm ")]
    assert len(mm) >= 5 and (mm["precision"] == "bf16").all()
    assert (mm["pct_of_roof"] <= 1.0).all()
    assert all("recorded" in e["element_type_basis"] for e in mm["evidence"])


def test_a_cast_counts_its_source_and_destination_types(ops):
    # the logits cast bf16 -> fp32 before the loss: 8x512x32000 read as 2 bytes, written as 4
    row = ops[ops.index.str.startswith("aten::_to_copy [[8, 512, 32000]")
              & ops.index.str.contains("in=bf16") & ops.index.str.contains("dtype=fp32")]
    assert len(row) == 1, list(row.index)
    assert row.iloc[0]["evidence"]["bytes_per_call"] == 8 * 512 * 32000 * (2 + 4)


def test_backward_ops_are_recorded_on_autograds_thread():
    con = sqlite3.connect(f"file:{plain(TRACE)}?mode=ro", uri=True)
    rows = con.execute("SELECT n.globalTid, count(*) FROM NVTX_EVENTS n "
                       "WHERE n.text LIKE 'aten::mm,%' GROUP BY n.globalTid").fetchall()
    con.close()
    assert len(rows) == 2 and min(c for _, c in rows) >= 100  # forward thread and autograd's


def test_host_verdicts_of_an_aten_capture_come_with_a_warning():
    rec = profkit.load(TRACE)
    rec.run()
    assert any("recorded every aten op" in w for w in rec.warnings)
    plain = profkit.load(TRACE.with_name("train_llama.sqlite.xz"))
    plain.run()
    assert not any("recorded every aten op" in w for w in plain.warnings)

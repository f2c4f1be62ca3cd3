"""The accuracy harness holds its floor on the committed traces with counters (see
analyses/accuracy.md; the floors sit a little under the measured numbers), and the committed page
is what scripts/pages/accuracy.py makes of them now. Every trace is measured once, for both."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("accuracy", ROOT / "scripts" / "pages" / "accuracy.py")
acc = importlib.util.module_from_spec(spec)
sys.modules["accuracy"] = acc
spec.loader.exec_module(acc)

FLOORS = {  # trace: (agreement by GPU time, aten bytes within +-25% by GPU time or None)
    "traces/micro_addnorm_gemm_ncu.sqlite.xz": (0.95, None),
    "traces/fused_bias_gelu_torch_ncu.sqlite.xz": (0.95, None),
    "traces/model_tiny_llama.sqlite.xz": (0.90, 0.55),  # DRAM-only counters, emit_nvtx shapes
    # real H200 captures (a Llama training step, ResNet-50 inference, a sync loop)
    "traces/real/train_llama_ncu.sqlite.xz": (0.90, None),
    "traces/real/cnn_infer_ncu.sqlite.xz": (0.85, None),
    "traces/real/sync_loop_ncu.sqlite.xz": (0.95, None),
    # counters on every kernel of one whole steady-state iteration (all threads)
    "traces/real/train_llama_ncu_auto.sqlite.xz": (0.95, None),
    "traces/real/sync_loop_ncu_auto.sqlite.xz": (0.95, None),
    # the aten recorder with counters on one whole step, L2 store sectors included
    "traces/real/train_llama_rec_ncu.sqlite.xz": (0.95, 0.90),
}


@pytest.fixture(scope="module")
def corpus() -> tuple[str, dict]:
    """The page and each trace's result, as ``accuracy.py --remerge`` makes them (counters paired
    by the current matcher)."""
    text, results = acc.build(remerge=True)
    return text, {r.trace: r for r in results}


@pytest.mark.long
def test_committed_page_matches_a_fresh_run(corpus):
    page = ROOT / "analyses" / "accuracy.md"
    assert corpus[0] == page.read_text(), \
        "analyses/accuracy.md is stale: run `python scripts/pages/accuracy.py --remerge`"


@pytest.mark.parametrize("trace", sorted(FLOORS))
def test_accuracy_floor(trace, corpus):
    if not (ROOT / trace).exists():
        pytest.skip(f"{trace} not present")
    r = corpus[1][trace]
    agree, bytes_floor = FLOORS[trace]
    assert r.kernels > 0 and r.agree_ns / r.gpu_ns >= agree
    assert r.above_roof == 0
    # every GEMM/attention op with counters gets ncu's element type without them
    assert all(truth == pred for _, truth, pred in r.dtype_ops), r.dtype_ops
    if bytes_floor is not None:
        assert r.bytes_ns > 0 and r.bytes_ok_ns / r.bytes_ns >= bytes_floor


def test_check_mode_reports_drift(tmp_path, capsys, monkeypatch):
    stale = tmp_path / "accuracy.md"
    stale.write_text("stale\n")
    monkeypatch.setattr(acc, "build", lambda traces, remerge: ("fresh\n", []))
    assert acc.main(["--check", "-o", str(stale)]) == 1
    err = capsys.readouterr().err
    assert "differs from a fresh run" in err and "-stale" in err and "+fresh" in err
    assert stale.read_text() == "stale\n"

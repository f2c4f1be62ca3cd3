"""PK401 on RMSNorms composed of elementwise kernels (HF LlamaRMSNorm), on real H200 captures."""
from __future__ import annotations

from pathlib import Path

import profkit

ROOT = Path(__file__).resolve().parents[1]


def _pk401(trace: str):
    return {f.code: f for f in profkit.load(ROOT / trace).findings()}.get("PK401")


def test_hf_decode_chains_found_exactly():
    # generate(): 4 layers x 2 norms + the final norm per token (46 tokens: the first 46 of the
    # measured call's 64, which the committed trace keeps); layer 0's input norm has no add
    f = _pk401("traces/real/generate_llama_samerun.sqlite.xz")
    ev = f.evidence
    assert (ev["composed"], ev["kernel"], ev["chains"], ev["with_add"], ev["launches"]) == \
        (True, "add_rmsnorm", 414, 368, 3680)
    # Priced by the step model (each chain one kernel, its other launches gone): a few percent
    # to a few tens of percent on this host-bound decode (measured 1.10-1.60x without the
    # profiler in two sessions).
    assert 1.02 < f.expected_end_to_end_speedup < 1.3
    assert f.expected_end_to_end_speedup <= f.expected_op_speedup


def test_training_step_chains_found_and_bounded_by_its_cpu_share():
    # a training step: the forward's norms only, and most of the step is GPU work
    f = _pk401("traces/real/train_llama.sqlite.xz")
    assert (f.evidence["chains"], f.evidence["with_add"]) == (55, 44)
    # the chains' launches and the dispatch before each go; the GEMMs and the backward stay
    assert round(f.expected_end_to_end_speedup, 3) == 1.054


def test_quiet_once_the_norms_are_fused():
    f = _pk401("traces/real/generate_llama_fused.sqlite.xz")
    assert f is None or not f.evidence.get("composed")


def test_a_composed_norm_with_no_add_is_the_library_norm(monkeypatch):
    # with no residual add before any chain the advice is F.rms_norm, a library call
    from profkit.model import Rung
    from profkit.judge.rules import pk401_eager_norm_fusion as pk

    monkeypatch.setattr(pk, "ADD_RE", __import__("re").compile(r"^$"))
    f = _pk401("traces/real/generate_llama_samerun.sqlite.xz")
    assert f.evidence["with_add"] == 0 and f.evidence["kernel"] == "rms_norm"
    assert f.rung is Rung.LIBRARY and "torch.nn.functional.rms_norm" in f.action

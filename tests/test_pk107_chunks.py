"""PK107 on a loop over the chunks of one batch, each through the whole model: the op record's
outermost module calls (profkit.capture.roots) say the model ran 64 times an iteration on slices
of one tensor, which the trace alone reads as a layer stack (GEMM-heavy units, left to PK103).
nerf_chunks_infer's capture was taken before the record kept those calls: here it is given the
entry its program makes (``Field`` over 64 chunks of 2,048 points), as the record now writes it
(tests/test_invariant_record.py runs the record itself)."""
from __future__ import annotations

from pathlib import Path

import pytest

import profkit
import shared

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "traces" / "corpus" / "nerf_chunks_infer.sqlite.xz"


def _pk107(tmp_path: Path, calls: int, sliced: bool):
    p = shared.with_record_items(TRACE, tmp_path, "root_calls",
                                 [{"module": "Field", "calls": calls, "params": 595844, "sliced_input": sliced}])
    prof = profkit.load(p)
    return prof, next((f for f in prof.findings() if f.code == "PK107"), None)


def test_a_model_run_over_slices_of_one_tensor_is_a_loop_to_run_once(tmp_path):
    prof, f = _pk107(tmp_path, 64, True)
    assert f is not None and f.evidence["sliced_model"] == "Field"
    assert (f.evidence["copies"], f.evidence["unit_kernels"]) == (64, 45)
    # chunks 32x larger measured 5.76x (the H100, run folder ab-56); the wave model keeps the
    # wide elementwise kernels at their copies' time: priced low
    assert f.expected_end_to_end_speedup == pytest.approx(3.078, abs=1e-3)
    assert f.action.startswith("a Python loop runs the whole model (Field) 64 times an iteration, each time "
                               "on a slice of one tensor (in render: chunks of one batch, a unit of 45 kernels "
                               "a chunk): run it over larger chunks, or the whole batch at once")
    assert prof.run().top_actions()[0].rule == "repeated-unit-loop"


@pytest.mark.parametrize("calls,sliced", [(64, False), (4, True)])
def test_a_decode_loop_or_a_few_calls_stay_layers(tmp_path, calls, sliced):
    # each call fed the last one's output (a decode loop), or too few calls for a loop: the trace
    # alone speaks, and it reads the GEMM-heavy unit as layers
    assert _pk107(tmp_path, calls, sliced)[1] is None
    assert "PK107" not in {f.code for f in profkit.load(TRACE).findings()}


CFG = ROOT / "traces" / "corpus" / "cfg_two_pass_sample.sqlite.xz"


def test_a_model_called_twice_on_one_input_is_one_call_on_both(tmp_path):
    # a diffusion transformer sampled with classifier-free guidance: the denoiser called with the
    # labels, then with the null label, on the same latents (cfg_two_pass_sample's capture, given
    # the entry its program makes); one call on both halves measured 1.95x (the H100, ab-57)
    p = shared.with_record_items(CFG, tmp_path, "root_calls",
                                 [{"module": "DiT", "calls": 2, "params": 32957200, "sliced_input": False,
                                   "same_input": True}])
    (f,) = [f for f in profkit.load(p).findings() if f.code == "PK107"]
    assert f.evidence["same_input"] is True and (f.evidence["copies"], f.evidence["unit_kernels"]) == (2, 291)
    assert f.expected_end_to_end_speedup == pytest.approx(1.699, abs=1e-3)
    assert f.action.startswith("the whole model (DiT) runs 2 times an iteration on the same input, other "
                               "arguments changed (in denoise: a unit of 291 kernels a call")
    # as captured (a record that did not yet tell the same input apart), the trace alone: no loop
    assert "PK107" not in {f.code for f in profkit.load(CFG).findings()}



def _cfg_roots(tmp_path: Path, roots):
    p = shared.with_record_items(CFG, tmp_path, "root_calls", roots)
    return next((f for f in profkit.load(p).findings() if f.code == "PK107"), None)


# the guided sampler's two denoiser calls, as the record writes them where the two inputs are
# tensors of their own of one shape (a sampler that copies its latents for the unconditional call);
# tests/test_invariant_record.py's multi_crop runs the record itself
TWO_INPUTS = {"module": "DiT", "calls": 2, "params": 32957200, "sliced_input": False, "same_input": False,
              "shape_calls": 2}


def test_calls_on_inputs_of_one_shape_are_one_call_on_them_concatenated(tmp_path):
    # the calls-of-one-shape search (units of a quarter of a call or more, twice or more) finds
    # the same two copies of the 291-kernel call as the same-input path, and prices them alike
    # (DINO's multi-crop step, its first-sight capture given its entry: see PK107's --explain)
    f = _cfg_roots(tmp_path, [TWO_INPUTS])
    assert f is not None and f.evidence["grouped_calls"] is True and f.evidence["sliced_model"] == "DiT"
    assert (f.evidence["copies"], f.evidence["unit_kernels"]) == (2, 291)
    assert f.expected_end_to_end_speedup == pytest.approx(1.699, abs=1e-3)
    assert f.action.startswith(
        "the whole model (DiT) runs once on each of several inputs of one shape, calls that do not depend on "
        "each other (in denoise: 1 run of copies of one call an iteration, the longest 2 copies of a "
        "291-kernel unit, as a multi-crop step's crops each run on their own): one call on the inputs of "
        "one shape concatenated along the batch")


@pytest.mark.parametrize("roots", [None, [dict(TWO_INPUTS, shape_calls=0)]])
def test_without_independent_calls_of_one_shape_the_calls_stay_layers(tmp_path, roots):
    # no record of the calls (a plain nsys trace), or calls that depend on each other (a decode
    # loop's): the trace alone reads the GEMM-heavy unit as layers
    assert _cfg_roots(tmp_path, roots) is None

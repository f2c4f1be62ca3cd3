"""What torch.compile's price may fuse (profkit.run.step.fusion), on every committed trace: runs of
one stream, one iteration, one range and no graph break, none of a library's kernels, each fused
kernel no faster than its longest member; and the programs PK103 must tell apart (compiled already,
a micro-benchmark loop whose kernels are all candidates)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from profkit.read.compressed import find_traces
from profkit.run.step.fusion import LIBRARY_RE, candidates, inductor_fusion
from profkit.run.step.graph import CallKind, Wait
from profkit.run.step.transform import replace_ops, scale_ops
import shared

ROOT = Path(__file__).resolve().parents[1]
TRACES = find_traces(ROOT / "traces", recursive=True)


def _model(trace: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return shared.profile(trace).step_model()


@pytest.mark.parametrize("trace", TRACES, ids=lambda t: str(t.relative_to(ROOT / "traces")))
def test_fused_runs_stay_inside_what_one_compiled_graph_holds(trace):
    m = _model(trace)
    if m is None:
        pytest.skip(f"no step model for {trace.name}")
    g = m.graph
    runs, new = inductor_fusion(g)
    blocking = np.cumsum((g.c_kind == int(CallKind.SYNC))
                         | ((g.c_kind == int(CallKind.COPY)) & (g.c_wait != int(Wait.NONE))))
    for run, ns in zip(runs, new):
        calls = g.g_call[run]
        assert len(run) >= 2 and (calls >= 0).all()
        assert len(set(g.g_stream[run])) == 1, "a run spans two streams"
        assert len(set(np.searchsorted(g.iter_call, calls, side="right"))) == 1, "a run spans two iterations"
        assert len(set(g.c_range[calls])) == 1, "a run spans two ranges"
        assert len(set(blocking[calls])) == 1, "a run spans a blocking call"
        assert not any(LIBRARY_RE.search(str(g.op_names[k])) for k in g.g_name[run])
        # never faster than its bytes: at least its longest kernel, at most all of them
        assert g.g_dur[run].max() - 1e-6 <= ns <= g.g_dur[run].sum() + 1e-6
    # The fusion's price can never beat every candidate kernel taking no time and no launch (two
    # replays a trace: checked on the what-if corpus, where the prices are scored).
    if runs and trace.parent.name == "corpus":
        fused = m.speedup(replace_ops(g, runs, new))
        free = m.speedup(scale_ops(g, np.flatnonzero(candidates(g)), 1e6, drop_launches=True))
        assert fused <= free + 1e-9


def test_a_loop_with_no_library_kernel_is_fused_one_iteration_at_a_time():
    """Eager add + RMSNorm, 19 iterations of two kernels and nothing else: each iteration's pair
    becomes one kernel as long as the longer of the two (once 575x: the window's 38 kernels were
    one run)."""
    trace = ROOT / "traces" / "fused_add_rmsnorm_torch.sqlite.xz"
    m = _model(trace)
    runs, new = inductor_fusion(m.graph)
    its = len(m.graph.iter_call) - 1
    assert len(runs) == its and all(len(r) == 2 for r in runs)
    prof = shared.profile(trace)
    pk103 = next(f for f in prof.findings() if f.code == "PK103")
    pk401 = next(f for f in prof.findings() if f.code == "PK401")
    # The op itself: 176.7 us an iteration, its longer kernel 93 us: at most 1.9x.
    assert 1.1 < pk103.expected_end_to_end_speedup < 1.95
    assert pk401.expected_end_to_end_speedup == pytest.approx(1.25, abs=0.01)


@pytest.mark.parametrize("trace", ["real/train_llama_compiled.sqlite.xz", "corpus/compiled_gpt_train.sqlite.xz"])
def test_a_compiled_step_is_offered_no_fusion_whatever_inductors_share(trace):
    prof = shared.profile(ROOT / "traces" / trace)
    for f in prof.findings():
        if f.code == "PK103":
            assert f.evidence["inductor_kernels_per_iteration"] >= 1
            assert "compile_speedup" not in f.evidence and "fusion_speedup" not in f.evidence
            assert "compiled already" in f.action


def test_the_optimizer_and_library_kernels_are_no_candidates():
    m = _model(ROOT / "traces" / "corpus" / "train_llama.sqlite.xz")
    g = m.graph
    cand = candidates(g)
    names = np.array([str(n) for n in g.op_names])[g.g_name]
    rng = np.array(g.range_names, dtype=object)[g.c_range[np.maximum(g.g_call, 0)]]
    assert not cand[np.char.find(names.astype(str), "multi_tensor_apply") >= 0].any()
    assert not cand[rng == "optimizer"].any()
    assert not cand[np.char.find(names.astype(str), "nvjet") >= 0].any()
    assert cand.sum() > 0.5 * ((g.g_kind == 0) & (g.g_call >= 0) & (rng != "optimizer")).sum()


"""PK208 per-step-decomposition: the eight eigendecompositions a step of a hand-written Shampoo
(shampoo_precond_train's capture, an H100, 2026-12-07; recomputing them every 10th step measured
8.37x) priced through the step model; decompositions of the data (a Gaussian process's Cholesky
in its forward and backward) are left alone."""
from __future__ import annotations

from pathlib import Path

import numpy as np

import profkit
from profkit.judge.rules import pk208_per_step_decomposition as pk208

ROOT = Path(__file__).resolve().parents[1]
SHAMPOO = ROOT / "traces" / "corpus" / "shampoo_precond_train.sqlite.xz"


def test_the_optimizers_decompositions_are_priced_one_step_in_ten():
    prof = profkit.load(SHAMPOO)
    (f,) = [f for f in prof.findings() if f.code == "PK208"]
    ev = f.evidence
    # 1,224 solver-kernel launches an iteration (eight syevd), 88.5 ms of the 108 ms iteration
    assert ev["decomposition_launches_per_iteration"] == 1224.0
    assert ev["decomposition_kernel_ns_per_iteration"] == 88_546_692
    assert ev["every"] == 10 and ev["kernels"][0] == "sytrd4_gpu"
    assert round(f.expected_end_to_end_speedup, 2) == 8.44
    # gone every step is the bound; one step in ten less than that
    assert ev["without_speedup"] == 12.221 and round(f.bound, 3) == ev["without_speedup"]
    assert f.expected_end_to_end_speedup < f.bound
    assert "every 10 steps" in f.action and "88.5 ms" in f.action
    # it leads: the syncs and graphs are a tenth of it
    assert prof.findings()[0].code == "PK208"


def test_each_decomposition_is_a_run_of_solver_launches_with_no_python_between():
    g = profkit.load(SHAMPOO).step_model().graph
    solver = np.array([bool(pk208.SOLVER_RE.search(str(n))) for n in g.op_names] + [False], dtype=bool)
    ops = np.flatnonzero(solver[g.g_name] & (g.g_call >= 0))
    mine, calls = pk208.decompositions(g)
    assert len(calls) == len(np.unique(g.g_call[ops])) and len(mine) == len(ops)   # every one after the backward
    runs = pk208.spans(g, calls)
    for (a, b), (c, _) in zip(runs, runs[1:]):
        assert a <= b < c
        # between two runs the CPU ran Python (a gap of 50 us or more), or another thread called
        between = np.arange(b + 1, c + 1)
        assert (g.c_gap[between] >= pk208.DISPATCH_GAP_NS).any() or (g.c_tid[between] != g.c_tid[b]).any()
    # the info checks after a run are syncs or copies that wait
    checks = np.concatenate([pk208._checks(g, b) for _, b in runs])
    assert len(checks) and set(np.unique(g.call_names[g.c_name[checks]])) <= {
        "cudaStreamSynchronize_v3020", "cudaMemcpyAsync_v3020"}


def test_decompositions_of_the_data_are_not_amortised():
    # the GP's Cholesky runs in its forward and backward: of the batch's kernel matrix
    for name in ("gp_cholesky_train", "fp64_surrogate_train"):
        codes = {f.code for f in profkit.load(ROOT / "traces" / "corpus" / f"{name}.sqlite.xz").findings()}
        assert "PK208" not in codes, name

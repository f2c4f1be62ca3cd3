"""PK204 recomputed-forward: activation checkpointing runs stretches of the forward again in the
backward. No committed capture checkpoints, so a hand-built step stands in for one: a forward of
layers on the main thread, a backward on autograd's thread that (with checkpointing) first runs
each layer's forward again; the committed traces check that the backward's own kernels are never
taken for a recomputation."""
from __future__ import annotations

from pathlib import Path

import pytest

import profkit
from profkit.judge.rules import pk204_recomputed_forward as pk204
from profkit.read.compressed import find_traces
import shared

ROOT = Path(__file__).resolve().parents[1]
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel"
FWD = [GEMM, "rms_norm_kernel", GEMM, "rotary_kernel", "softmax_warp_forward", GEMM, "silu_mul_kernel", GEMM,
       "add_kernel", "copy_kernel"]
BWD = [GEMM, GEMM, "silu_mul_backward_kernel", GEMM, GEMM, "softmax_warp_backward", "rotary_backward_kernel",
       GEMM, GEMM, "rms_norm_backward_kernel", "add_backward_kernel", "sum_kernel"]


def step_trace(path: Path, *, checkpointed: bool, layers: int = 4, steps: int = 6, kernel_ns: int = 40_000,
               one_thread: bool = False, every_ns: int = 5_000, reentry_ns: int = 0) -> Path:
    """``steps`` NVTX ranges ``step``: the forward of ``layers`` layers launched on the main thread,
    then the backward on autograd's thread (on the main thread with ``one_thread``), each layer's
    backward preceded by its forward again when ``checkpointed``. GPU-bound by default: every
    kernel ``kernel_ns``, launched ``every_ns`` apart (the Python between launches), run back to
    back. ``reentry_ns``: with checkpointing, after each layer's first backward kernel, that much
    Python and a CUDA call that launches nothing (the nested backward the checkpoint starts)."""
    from synth import TID, Launches, make_trace
    autograd_tid = TID + 1   # another thread of the same process
    run = Launches(FWD + BWD, kernel_ns, every_ns)
    nvtx = []
    for _ in range(steps):
        t0 = run.t
        for _layer in range(layers):
            for n in FWD:
                run.launch(n, TID)
        back = TID if one_thread else autograd_tid
        for _layer in range(layers):
            if checkpointed:
                for n in FWD:
                    run.launch(n, back)
            for j, n in enumerate(BWD):
                run.launch(n, back)
                if checkpointed and reentry_ns and j == 0:
                    run.t += reentry_ns
                    run.corr += 1
                    run.runtime.append((run.t, run.t + 4_000, run.corr, back))
                    run.t += 5_000
        run.t = max(run.t, run.gpu) + 200_000
        nvtx.append((t0, run.t - 1, 3, TID))
    return make_trace(path, kernels=run.kernels, runtime=run.runtime, nvtx=nvtx, strings=run.strings)


def pk204_of(path: Path):
    prof = profkit.load(path)
    return prof, next((f for f in prof.findings() if f.code == "PK204"), None)


def test_a_checkpointed_step_is_priced_as_its_recomputation_gone(tmp_path):
    prof, f = pk204_of(step_trace(tmp_path / "ckpt.sqlite", checkpointed=True))
    assert f is not None
    # each iteration: 4 layers x 10 recomputed kernels of 4 x (10 + 10 + 12) = 128, and the GEMM
    # that opens each layer's backward, whose name follows the recomputed layer's last kernels in
    # the forward too (the next layer's first GEMM): one kernel a layer too many
    assert f.evidence["recomputed_kernels_per_iteration"] == 44
    assert f.evidence["recomputed_ns_per_iteration"] == 44 * 40_000
    assert f.evidence["kernel_ns_per_iteration"] == 128 * 40_000
    # GPU-bound: at most the kernel time gone, 128 / 84, less the step's 200 us of host time after
    # its kernels, which stays; the price is the step model's replay of the edit
    m = prof.step_model()
    again = m.simulate().mean_iteration_ns / m.simulate(f.edit(m.graph)).mean_iteration_ns
    assert f.expected_end_to_end_speedup == pytest.approx(again, rel=1e-9)
    assert 1.2 < f.expected_end_to_end_speedup <= 128 / 84 + 1e-6
    assert f.bound >= f.expected_end_to_end_speedup
    assert "activation checkpointing" in f.action and "assumes the activations fit" in f.basis
    assert "a ceiling" not in f.basis   # measured above it on an HF Llama (1.62x against 1.38x)


def test_a_host_bound_step_gets_back_the_python_of_the_recomputation(tmp_path):
    """50 us of Python before each 2 us kernel: the CPU sets the pace, and what checkpointing costs
    is the forward's Python run again in the backward, not the kernels. The recomputed stretches'
    calls and the CPU time before each go: 44 of 128 launches an iteration (the 4 x 10 recomputed
    and the GEMM after each, which the detection counts with them)."""
    prof, f = pk204_of(step_trace(tmp_path / "host.sqlite", checkpointed=True, kernel_ns=2_000,
                                  every_ns=50_000))
    assert f is not None
    m = prof.step_model()
    again = m.simulate().mean_iteration_ns / m.simulate(f.edit(m.graph)).mean_iteration_ns
    assert f.expected_end_to_end_speedup == pytest.approx(again, rel=1e-9)
    # each iteration: 128 launches of 50 us and 200 us after them; the recomputed stretches hold
    # 4 x 11 of them (their launch calls and the Python before each)
    assert f.expected_end_to_end_speedup == pytest.approx((128 * 50 + 200) / (84 * 50 + 200), rel=0.02)
    assert f.evidence["recompute_cpu_ns_per_iteration_profiled"] == pytest.approx(44 * 50_000, rel=0.02)


def test_the_nested_backward_a_checkpoint_starts_goes_too(tmp_path):
    """400 us of Python and a call that launches nothing after each layer's first backward kernel
    (the nested backward that a reentrant checkpoint runs on the recomputed graph): the CPU time up
    to the next launch goes with the recomputation. By hand, per iteration: 40 launch cycles of
    50 us in the forward, 4 x (10 recomputed + 1 + 11) in the backward, 4 x 405 us of re-entry and
    200 us after: 8,220 us before; after, the forward's 2,000 us, 4 x (10 cycles and the 5 us of the
    launch that follows the re-entry: its call, 1 us after the removed one) and the 200 us: 4,220 us."""
    prof, f = pk204_of(step_trace(tmp_path / "reentry.sqlite", checkpointed=True, kernel_ns=2_000,
                                  every_ns=50_000, reentry_ns=400_000))
    assert f is not None
    assert f.expected_end_to_end_speedup == pytest.approx(8_220 / 4_220, rel=0.03)


@pytest.mark.parametrize("case", ["plain", "one_thread"])
def test_quiet_without_a_recomputation_or_without_a_backward_thread(tmp_path, case):
    # The backward's own kernels (another kernel per op, the GEMMs alike) are not a recomputation;
    # a backward on the launching thread gives no split to read.
    path = step_trace(tmp_path / f"{case}.sqlite", checkpointed=case == "one_thread", one_thread=case == "one_thread")
    assert pk204_of(path)[1] is None


def test_runs_of_gemms_alone_are_not_a_recomputation(tmp_path):
    g_mask_names = [GEMM] * 12
    import numpy as np
    from types import SimpleNamespace
    # forward and backward of eight GEMMs in a row on two threads: the same names, no other kernel
    n = 16
    g = SimpleNamespace(n_ops=n, op_names=np.array(g_mask_names[:1], dtype=object),
                        g_kind=np.zeros(n, dtype=int), g_call=np.arange(n), g_name=np.zeros(n, dtype=int),
                        c_tid=np.r_[np.full(8, 1), np.full(8, 2)], iter_call=np.array([0, n]))
    assert not pk204.recomputed(g, 8, 3).any()


@pytest.mark.parametrize("trace", find_traces(ROOT / "traces" / "corpus", recursive=False)
                         + find_traces(ROOT / "traces" / "real", recursive=False),
                         ids=lambda p: p.name.split(".")[0])
def test_quiet_on_every_committed_capture(trace):
    # None of them checkpoints but grad_checkpoint_train: their backwards (autograd's thread, GEMMs
    # sharing kernel names with the forward's) must not read as a recomputation.
    prof = shared.profile(trace)
    model = prof.step_model()
    if model is None:
        pytest.skip("no step model")
    checkpointed = trace.name.startswith("grad_checkpoint_train.")
    assert pk204.recomputed(model.graph, 8, 3).any() == checkpointed

"""A removed launch takes its dispatch with it, and every torch.compile price is one edit.

In PyTorch 2.13's captures each kernel launch is preceded by a driver query on its thread
(cuKernelGetName before cudaLaunchKernel, cuKernelGetFunction before cuLaunchKernel); the CPU
time that dispatched the op lies before that query, not before the launch.
"""
from __future__ import annotations

import numpy as np
import pytest

import shared
from profkit.run.step.graph import CallKind
from profkit.run.step.transform import remove_calls, scale_ops, with_lead_calls


def _graph(name: str):
    return shared.corpus(name).step_model().graph


def test_the_dispatch_before_a_launch_sits_on_the_driver_query_before_it():
    g = _graph("item_loss_small_train")
    launch = g.c_kind == int(CallKind.LAUNCH)
    names = g.call_names[g.c_name]
    pred = np.maximum(g.c_pred, 0)
    queried = np.flatnonzero(launch & (g.c_pred >= 0) & (names[pred] == "cuKernelGetName")
                             & (g.c_tid[pred] == g.c_tid))
    assert len(queried) > 0.5 * launch.sum()
    # the launch's own gap is nothing; the query's is the op's dispatch
    assert np.median(g.c_gap[queried]) < 1_000 < 20_000 < np.median(g.c_gap[pred[queried]])
    short = queried[g.c_gap[pred[queried]] < 50_000]  # a dispatch, not the program's Python
    i = int(short[len(short) // 2])
    lead = with_lead_calls(g, np.array([i])).tolist()
    # the query right before it, and any driver queries before that one (cuKernelGetFunction)
    assert lead[-2:] == [int(g.c_pred[i]), i] and all(str(names[c]).startswith("cu") for c in lead[:-1])
    # not from a call that is not a launch
    other = int(pred[i])
    assert with_lead_calls(g, np.array([other])).tolist() == [other]
    out = remove_calls(g, with_lead_calls(g, np.array([i])))
    assert out.c_gap[g.c_pred[i]] == 0.0 and out.c_own[i] == 0.0


def test_kernels_a_library_launches_inside_a_call_keep_its_dispatch():
    g = _graph("item_loss_small_train")
    ops = np.flatnonzero((g.g_kind == 0) & (g.g_call >= 0))
    lead = g.c_pred[g.g_call[ops]]
    ok = (lead >= 0) & (g.c_kind[np.maximum(lead, 0)] == int(CallKind.OTHER)) \
        & (g.c_gap[np.maximum(lead, 0)] > 5_000) & (g.c_gap[np.maximum(lead, 0)] < 50_000)
    op, lead = int(ops[ok][0]), int(lead[ok][0])
    call = int(g.g_call[op])
    gone = scale_ops(g, np.array([op]), np.inf, drop_launches=True)
    kept = scale_ops(g, np.array([op]), np.inf, drop_launches=True, own_dispatch=False)
    assert gone.c_own[call] == kept.c_own[call] == 0.0
    assert kept.c_gap[lead] == g.c_gap[lead] > 0.0 == gone.c_gap[lead]


def test_compiling_the_chains_is_the_compile_edit_on_the_runs_that_hold_them():
    # GPT-2 fp16, 8 micro-batches a step: the default mode measured 1.81x (--try compile), priced
    # with its 10 graph calls a step; its
    # fp32 loss fused at the passes a fused loss makes over the logits (1.72x and 1.50x before)
    p = shared.corpus("grad_accum_fp16_train")
    f103 = next(f for f in p.findings() if f.code == "PK103")
    f402 = next(f for f in p.findings() if f.code == "PK402")
    assert f103.evidence["fusion_speedup"] == 1.75
    assert round(f402.expected_end_to_end_speedup, 3) == 1.525
    assert "runs of fusible kernels that hold the chains" in f402.basis


def test_compiling_some_chains_never_beats_compiling_the_model():
    # (not on a step the model's compile breaks into many graphs, such as the MoE's 65 a step:
    # functions compiled around the chains alone are fewer graphs, each call cheaper than a break)
    for name in ("grad_accum_fp16_train", "per_sample_loss_train", "t5_finetune"):
        p = shared.corpus(name)
        f103 = next(f for f in p.findings() if f.code == "PK103")
        f402 = next(f for f in p.findings() if f.code == "PK402")
        assert f402.expected_end_to_end_speedup <= f103.evidence["fusion_speedup"] + 1e-3, name


def test_a_batch_norms_statistics_end_a_fused_run():
    # ResNet-50 training with PyTorch's own batch norm: the statistics and what uses them are
    # two passes over the tensor, never one kernel
    from profkit.run.step.fusion import BN_STATS_RE, fusible_runs
    g = _graph("resnet50_train")
    names = np.array([str(n) for n in g.op_names] + [""], dtype=object)
    runs = fusible_runs(g)
    stats_inside = [r for r in runs if any(BN_STATS_RE.search(names[g.g_name[o]]) for o in r[:-1])]
    assert runs and not stats_inside
    assert any(BN_STATS_RE.search(names[g.g_name[r[-1]]]) for r in runs)
    p = shared.corpus("resnet50_train")
    f103 = next(f for f in p.findings() if f.code == "PK103")
    assert (f103.evidence["fusion_speedup"], f103.evidence["compile_speedup"]) == (1.273, 1.351)


def test_the_fused_runs_leave_as_many_kernels_as_inductor_launched():
    """The fusion edit's groups against what Inductor made of the same program: a ResNet-50's
    inference (torchvision, bf16 channels_last, batch 128; compiled with freezing, BatchNorm
    folded) and a Llama training step, each captured eager and compiled. The kernels an iteration keeps after the edit (each fused run one kernel) are within
    10% of the compiled capture's own count (triton_* and library kernels together)."""
    from profkit.run.step.fusion import inductor_fusion

    def per_iteration(name: str) -> tuple[float, float]:
        g = shared.profile(shared.CORPUS.parent / "real" / f"{name}.sqlite.xz").step_model().graph
        its = len(g.iter_call)
        kernels = int(((g.g_kind == 0) & (g.g_call >= 0)).sum())
        runs, _ = inductor_fusion(g)
        return kernels / its, (kernels - sum(len(r) - 1 for r in runs)) / its

    for eager, compiled, before, after, inductor in (("cnn_infer", "cnn_infer_compiled", 260.3, 100.6, 97.8),
                                                      ("train_llama", "train_llama_compiled", 364.8, 135.7, 125.5)):
        n, fused = per_iteration(eager)
        assert (round(n, 1), round(fused, 1)) == (before, after)
        assert per_iteration(compiled)[0] == pytest.approx(inductor, abs=0.05)
        assert abs(fused / inductor - 1) < 0.10, (eager, fused, inductor)

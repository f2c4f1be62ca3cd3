"""torch.compile advice against real before/after captures (H200, traces/real and traces/ddp2*):
the prediction is held to the issue's +-25% of the measured wall time per iteration."""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit.compare.diff import run_change
import shared

ROOT = Path(__file__).resolve().parents[1]


def _finding(trace: str, code: str):
    prof = shared.profile(ROOT / trace)
    return prof, {f.code: f for f in prof.findings()}.get(code)


def _predicted(trace: str, code: str, key: str | None) -> float:
    prof = shared.profile(ROOT / trace)
    if "+" in code:  # one change doing what several rules propose: their edits at once, at the
        # profiled CPU scale (host 1.0), since the capture after the change ran under nsys too
        gain = prof.price_together(code.split("+"), host=1.0)
        assert gain is not None
        return gain
    f = {f.code: f for f in prof.findings()}[code]
    return f.evidence[key] if key else f.expected_end_to_end_speedup


@pytest.mark.parametrize("before, after, code, key", [
    # eager Llama training step -> torch.compile(mode="reduce-overhead") + compiled optimizer step:
    # the model's compile (PK103) and the optimizer's fusion (PK201) replayed together
    ("traces/real/train_llama_eager_rerun.sqlite.xz", "traces/real/train_llama_compiled.sqlite.xz",
     "PK103+PK201", None),
    # eager ResNet-50 inference -> freezing + torch.compile (BatchNorm folded)
    ("traces/real/cnn_infer.sqlite.xz", "traces/real/cnn_infer_compiled.sqlite.xz", "PK403", None),
    # HF generate() -> static cache + CUDA graphs (per token: one iteration is one token in both)
    ("traces/real/generate_llama.sqlite.xz", "traces/real/generate_llama_graphs.sqlite.xz", "PK103",
     "cuda_graph_speedup"),
    # DDP rank 0 -> no per-step sync (30 steps a capture, both captured in one run)
    ("traces/ddp2_samerun/rank0.sqlite.xz", "traces/ddp2_nosync/rank0.sqlite.xz", "PK101", None),
    # GPT-2 with a 50257 vocabulary -> padded to 50304: the step is CPU-paced, so ~1x
    ("traces/real/train_gpt2_rec.sqlite.xz", "traces/real/train_gpt2_padded_rec.sqlite.xz", "PK304", None),
    # HF eager attention -> SDPA (host-bound step: the GPU saving lands in idle time)
    ("traces/real/train_llama_eager_attn.sqlite.xz", "traces/real/train_llama_sdpa_samerun.sqlite.xz",
     "PK301", None),
])
def test_prediction_within_25_percent_of_measured(before, after, code, key):
    predicted = _predicted(before, code, key)
    measured = run_change(shared.profile(ROOT / before), shared.profile(ROOT / after))["measured_speedup"]
    assert abs(measured / predicted - 1) <= 0.25, (predicted, measured)


def test_compiled_code_is_not_promised_compile_gains():
    _, f = _finding("traces/real/train_llama_compiled.sqlite.xz", "PK103")
    if f is not None:
        assert f.evidence["inductor_kernel_share"] >= 0.3
        assert f.expected_end_to_end_speedup == f.evidence["cuda_graph_speedup"]


def test_the_compile_estimate_is_bounded_by_what_it_models():
    _, f = _finding("traces/real/train_llama_eager_rerun.sqlite.xz", "PK103")
    ev = f.evidence
    assert ev["compile_speedup"] > ev["cuda_graph_speedup"]  # fusion lowers the GPU floor
    assert f.expected_end_to_end_speedup <= f.bound
    # both edits priced on the same replay: compiling never takes the step below zero
    assert ev["compile_speedup"] < ev["iteration_ns"] / 1e3


def test_data_loading_is_not_compiled_away():
    # the `data` range inside the step is not model code: compile removes none of it
    prof, f = _finding("traces/real/loader_cnn.sqlite.xz", "PK103")
    assert prof.run().actions[0].code == "PK102"
    assert f is None or f.expected_end_to_end_speedup < 1.2


def test_a_cheap_change_worth_it_ranks_before_a_compile():
    # DDP rank 0: removing the per-step sync ranks before capturing the pieces between the syncs
    actions = shared.profile(ROOT / "traces/ddp2/rank0.sqlite.xz").run().actions
    assert actions[0].code == "PK101"
    assert any(a.code == "PK103" for a in actions)


def test_inductor_fused_kernels_are_not_gemms():
    ops = shared.ops(ROOT / "traces/real/cnn_infer_compiled.sqlite.xz", by="kernel")
    fused = ops[ops.index.str.startswith("triton_poi_fused_add_convolution_relu")]
    assert len(fused) and (fused["class"] == "memory").all()


def test_a_step_that_already_replays_graphs_is_told_what_is_left_outside_them():
    _, f = _finding("traces/real/generate_llama_graphs.sqlite.xz", "PK103")
    assert f.evidence["graph_launches_per_iteration"] >= 0.5
    assert "left outside the CUDA graphs" in f.action
    _, eager = _finding("traces/real/generate_llama.sqlite.xz", "PK103")
    assert "graph_launches_per_iteration" not in eager.evidence


def test_the_run_change_says_whether_the_medians_lie_apart():
    before = shared.profile(ROOT / "traces/real/train_llama.sqlite.xz")
    after = shared.profile(ROOT / "traces/real/train_llama_fused.sqlite.xz")
    rc = run_change(before, after)
    assert rc["verdict"] == "no change"  # 2.3% slower, inside both medians' 95% intervals
    lo, hi = rc["before_median_ci_ns"]
    assert lo <= rc["before_ns"] <= hi
    big = run_change(shared.profile(ROOT / "traces/real/train_llama_eager_rerun.sqlite.xz"),
                     shared.profile(ROOT / "traces/real/train_llama_compiled.sqlite.xz"))
    assert big["verdict"] == "improvement"
    # a second mode (generate()'s prefill between calls) widens BEFORE's interval, yet 3x is seen
    gen = run_change(shared.profile(ROOT / "traces/real/generate_llama.sqlite.xz"),
                     shared.profile(ROOT / "traces/real/generate_llama_graphs.sqlite.xz"))
    assert gen["verdict"] == "improvement"


def test_several_captures_of_a_side_enter_the_verdict():
    # six steps a capture could not resolve the DDP sync removal (~8%) ...
    old = run_change(shared.profile(ROOT / "traces/ddp2/rank0.sqlite.xz"),
                     shared.profile(ROOT / "traces/ddp2_nosync/rank0.sqlite.xz"))
    assert old["verdict"] in ("no change", "improvement")
    # ... thirty steps a capture and two captures a side do (7.95 -> 7.60 ms)
    base = [shared.profile(ROOT / f"traces/{d}/rank0.sqlite.xz") for d in ("ddp2_samerun", "ddp2_rerun")]
    after = [shared.profile(ROOT / f"traces/{d}/rank0.sqlite.xz") for d in ("ddp2_nosync", "ddp2_nosync_rerun")]
    rc = run_change(base[0], after[0], before_also=base[1:], after_also=after[1:])
    assert rc["captures"] == {"before": 2, "after": 2}
    assert 1.0 < rc["between_captures_pct"] < 3.0
    assert rc["verdict"] == "improvement" and 1.03 < rc["measured_speedup"] < 1.07


def test_padding_the_vocabulary_op_gain_is_measured():
    """PK304's per-op prediction against the GEMMs' measured GPU time after padding."""
    b, f = _finding("traces/real/train_gpt2_rec.sqlite.xz", "PK304")
    a = shared.profile(ROOT / "traces/real/train_gpt2_padded_rec.sqlite.xz")

    def lm_head_ns(p, vocab):
        ops = p.ops(by="aten")
        keep = [n for n in ops.index if n.startswith("aten::mm ") and str(vocab) in n]
        return float((ops.loc[keep, "gpu_time_median_ns"] * ops.loc[keep, "count"]).sum()), len(keep)
    tb, nb = lm_head_ns(b, 50257)
    ta, na = lm_head_ns(a, 50304)
    assert nb == na == 3 and len(f.evidence["unaligned"]) == 3
    assert abs((tb / ta) / f.expected_op_speedup - 1) <= 0.25, (f.expected_op_speedup, tb / ta)
    assert f.expected_end_to_end_speedup < 1.01  # CPU-paced step: the GPU saving lands in idle


def test_sdpa_op_gain_is_measured():
    """PK301's per-op prediction against the fused attention kernels' measured GPU time: eager
    attention (the GEMM pairs and the kernels between them) per step, against SDPA's kernels."""
    import numpy as np

    from profkit.judge.patterns import FLASH_RE
    from profkit.judge.rules import pk301_attention_path as pk301
    from profkit.judge.rules.base import RuleContext, matches
    b, f = _finding("traces/real/train_llama_eager_attn.sqlite.xz", "PK301")
    ctx = RuleContext(b, b.run())
    glue, after, a = pk301._glue(ctx, {n for n in ctx.kernels.index if "softmax_warp" in n})
    first = np.flatnonzero(glue & ~np.concatenate([[False], glue[:-1]]))  # each glue run's start
    before = np.zeros(len(a), dtype=bool)
    before[first - 1] = True                                             # the GEMM before it
    dur = a["dur"].to_numpy(np.float64)
    eager_ns = float(dur[glue | after | before].sum()) / ctx.iterations
    sdpa = shared.profile(ROOT / "traces/real/train_llama_sdpa_samerun.sqlite.xz")
    sctx = RuleContext(sdpa, sdpa.run())
    k = sctx.kernels
    fused_ns = float(k[matches(k.index.to_series(), FLASH_RE)]["total_ns"].sum()) / sctx.iterations
    measured = eager_ns / fused_ns                        # 1.64 ms -> 0.16 ms a step on the H200
    assert abs(f.expected_op_speedup / measured - 1) <= 0.25, (f.expected_op_speedup, measured)
    # End to end the step model prices little: HF's eager attention code (the Python around the
    # GEMMs) is not in the trace, only the glue kernels' launches are (measured 1.11x between
    # captures; analyses/whatif.md keeps such misses).
    assert f.evidence["removed_launches"] > 0 and 1.0 < f.expected_end_to_end_speedup < 1.10


def test_unaligned_gemm_rows_say_which_dimension_to_pad():
    ops = shared.ops(ROOT / "traces/real/train_gpt2_rec.sqlite.xz", by="aten")
    row = ops.loc[[n for n in ops.index if n.startswith("aten::mm [[4096, 768], [768, 50257]]")][0]]
    assert "N = 50257 not a multiple of 8" in row["action"] and "pad_to_multiple_of=64" in row["action"]
    aligned = ops.loc[[n for n in ops.index if n.startswith("aten::mm [[4096, 768], [768, 3072]]")][0]]
    assert "not a multiple" not in aligned["action"]


def test_composed_rmsnorm_swap_prediction_within_25_percent_of_pooled_captures():
    # HF generate() decode, LlamaRMSNorm -> kernels.add_rmsnorm. The host's speed drifted between
    # the four interleaved captures (the single pairs measure 0.97x and 1.16x), so both captures of
    # each side are pooled, as `profkit diff --before-also/--after-also` does.
    b, f = _finding("traces/real/generate_llama_samerun.sqlite.xz", "PK401")
    load = lambda t: shared.profile(ROOT / t)  # noqa: E731
    r = run_change(b, load("traces/real/generate_llama_fused.sqlite.xz"),
                   before_also=[load("traces/real/generate_llama_samerun_rerun.sqlite.xz")],
                   after_also=[load("traces/real/generate_llama_fused_rerun.sqlite.xz")])
    assert abs(r["measured_speedup"] / f.expected_end_to_end_speedup - 1) <= 0.25


def test_compiling_the_model_leaves_the_optimizer_step_eager():
    # llrd_param_groups_finetune (H100): AdamW over 151 parameter groups spends ~26 ms of Python an
    # iteration (at its calibrated CPU speed) in optimizer.step(), which torch.compile(model,
    # mode="reduce-overhead") does not capture. Its own trial measured 1.91x; with the optimizer
    # graphed too the price was 3.71x.
    prof, f = _finding("traces/corpus/llrd_param_groups_finetune.sqlite.xz", "PK103")
    ev = f.evidence
    assert ev["optimizer_host_ms_per_iteration"] == pytest.approx(25.9, abs=0.2)
    assert ev["compile_speedup"] == pytest.approx(2.28, abs=0.01)
    # the whole step graphed by hand (capturable optimizer) keeps the optimizer in the graph
    assert ev["cuda_graph_speedup"] > ev["compile_speedup"] + 0.4
    assert "torch.compile(model) leaves the optimizer step eager, its 25.9 ms of host time" in f.action


@pytest.mark.parametrize("name, share", [("fasterrcnn_train", 0.333), ("moe_routing_train", 0.856),
                                         ("generate_llama", 0.978), ("t5_finetune", None)])
def test_pieces_whose_shapes_follow_the_data_are_said_to_need_padding(name, share):
    # Faster R-CNN's proposals, the experts' routed tokens and a growing KV cache change the
    # pieces' launch shapes from one iteration to the next: a CUDA graph replays one shape. T5's
    # batches (a quarter of its pieces' kernels in shapes the window's 4 iterations do not repeat)
    # stay under the line; its reduce-overhead compile measured 1.29x, priced 1.34x.
    _, f = _finding(f"traces/corpus/{name}.sqlite.xz", "PK103")
    assert f.evidence.get("varying_piece_kernel_share") == share
    assert ("no other iteration of the window repeated" in f.action) == (share is not None)
    if share is not None:
        assert "pad them to a few fixed sizes first" in f.action

"""PK107 repeated-unit-loop: a Python loop that launches the same short unit of small kernels again
and again. No committed capture shows the pattern (a per-sample loss, an EMA over the parameters),
so hand-built traces stand in for it; the committed ones check that it stays quiet on the layer
stacks and recurrent loops that repeat too."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import profkit
from profkit.judge.rules import pk107_repeated_unit_loop as pk107
from profkit.judge.rules.base import RuleContext
from profkit.judge.rules.pk107_repeated_unit_loop import find_repeats
from profkit.read.compressed import find_traces
import shared

ROOT = Path(__file__).resolve().parents[1]
SMS = 100          # synth.make_trace's GPU
GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_execute_kernel"


def loop_trace(path: Path, *, copies: int = 64, unit: int = 5, grid=4, kernel_ns=2_000,
               launch_ns: int = 4_000, gap_ns: int = 6_000, steps: int = 8, tail_ns: int = 1_000_000,
               names=None, back_to_back: bool = False, with_grids: bool = True,
               gemm_variants: int = 1) -> Path:
    """``steps`` NVTX ranges ``step``, each a Python loop launching ``copies`` copies of a unit of
    ``unit`` kernels (``launch_ns`` a launch call, ``gap_ns`` of Python before the next), then
    ``tail_ns`` of Python. Kernels start 3 us after their launch (``back_to_back``: right after the
    previous one when it is still running, so the GPU sets the pace); ``grid`` and ``kernel_ns`` a
    number, or one per position of the unit; ``grid`` may be a function of (copy, position);
    ``names`` a list of units (one loop after the other: a forward and a backward);
    ``gemm_variants``: a kernel named ``nvjet...`` gets one of that many tile suffixes by copy, as
    cuBLAS picks another kernel for a GEMM of another size; a name ``ew:FUNCTOR`` is that
    elementwise functor's vectorised kernel, and its unrolled one in every third copy (an operand
    not aligned to the vector width)."""
    from synth import TID, make_trace
    names = names or [f"per_sample_op_{j}" for j in range(unit)]
    units = names if isinstance(names[0], list) else [names]
    def named(n: str, c: int) -> str:
        if n.startswith("ew:"):  # an elementwise functor: its unrolled kernel in every third copy
            if c % 3 == 1:
                return (f"void at::native::unrolled_elementwise_kernel<{n[3:]}, std::array<char *, "
                        "(unsigned long)2>, TrivialOffsetCalculator<1, unsigned int>>(int, T1, T2)")
            return (f"void at::native::vectorized_elementwise_kernel<(int)4, {n[3:]}, std::array<char *, "
                    "(unsigned long)2>>(int, T2, T3)")
        return f"{n}_{c % gemm_variants}" if n.startswith("nvjet") and gemm_variants > 1 else n
    flat = sorted({named(n, c) for u in units for n in u for c in range(max(gemm_variants, 3))})
    ids = {n: 10 + i for i, n in enumerate(flat)}
    strings = {i: n for n, i in ids.items()}
    strings.update({9: "cudaLaunchKernel", 3: "step"})
    kernels, runtime, nvtx, grids = [], [], [], {}
    corr, t = 0, 0
    for _ in range(steps):
        t0, gpu_free = t, t
        for u in units:
            for c in range(copies):
                for j, name in enumerate(u):
                    corr += 1
                    runtime.append((t, t + launch_ns, corr))
                    dur = kernel_ns[j] if isinstance(kernel_ns, (list, tuple)) else kernel_ns
                    start = max(t + 3_000, gpu_free + 1_000) if back_to_back else t + 3_000
                    kernels.append((start, start + dur, corr, ids[named(name, c)]))
                    gpu_free = start + dur
                    g = grid(c, j) if callable(grid) else grid[j] if isinstance(grid, (list, tuple)) else grid
                    grids[corr] = (g, 1, 1, 128, 1, 1)
                    t += launch_ns + gap_ns
        t = max(t, gpu_free) + tail_ns
        nvtx.append((t0, t - 1, 3, TID))
    return make_trace(path, kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings,
                      grids=grids if with_grids else None)


def pk107_of(path: Path):
    prof = profkit.load(path)
    return prof, next((f for f in prof.findings() if f.code == "PK107"), None)


# -- the search --------------------------------------------------------------------------------
def test_the_search_finds_each_loop_with_its_shortest_unit():
    rng = np.random.default_rng(0)
    noise = lambda n: rng.integers(1_000, 2_000, n)  # noqa: E731 (names that do not come back)
    seq = np.r_[noise(50), np.tile([1, 2, 3, 4, 5], 64), noise(30), np.tile([7, 8, 7, 9], 10), noise(20)]
    r = find_repeats(seq, np.zeros(len(seq), dtype=np.int64))
    assert list(zip(r.start, r.period, r.count)) == [(50, 5, 64), (400, 4, 10)]
    # Seven copies are not a loop; nor is one kernel repeated (a unit of one name, "a a"), nor a
    # loop cut in two by an iteration's end (each half is judged on its own).
    for seq, seg in ((np.r_[noise(10), np.tile([1, 2, 3], 7), noise(10)], None),
                     (np.r_[noise(10), np.full(40, 5), noise(10)], None),
                     (np.tile([1, 2, 3], 12), np.repeat([0, 1], 18))):
        seg = np.zeros(len(seq), dtype=np.int64) if seg is None else seg
        assert not len(find_repeats(seq, seg).start)
    # Both halves of a loop of 16 split by an iteration's end are loops of 8.
    r = find_repeats(np.tile([1, 2, 3], 16), np.repeat([0, 1], 24))
    assert list(zip(r.start, r.period, r.count)) == [(0, 3, 8), (24, 3, 8)]


def test_the_search_bails_out_on_a_million_kernels_that_do_not_repeat():
    # The shape of the search, not a timing: on a sequence whose names do not come back within
    # max_period positions no position is a candidate, and no period is compared at all; on a
    # million kernels that are all loops, each period's scan stops once its loops are claimed.
    rng = np.random.default_rng(1)
    n = 1_000_000
    seg = np.arange(n) // 100_000
    r = find_repeats(rng.integers(0, 1_000, n), seg)
    assert r.candidates == 0 and r.periods_scanned == 0 and not len(r.start)
    body = np.r_[np.arange(100, 400), np.tile(np.arange(13), 64)]   # a model, then a 13-kernel loop
    seq = np.tile(body, n // len(body))                              # 883 steps, 999,556 kernels
    r = find_repeats(seq, np.arange(len(seq)) // len(body))
    assert len(r.start) == 883 and set(r.period.tolist()) == {13} and set(r.count.tolist()) == {64}
    assert r.periods_scanned <= 12          # periods 2..13, then nothing left to compare


# -- the finding on a hand-built loop ----------------------------------------------------------
def test_a_launch_bound_loop_of_small_kernels_is_told_to_vectorise_at_the_waves_price(tmp_path):
    prof, f = pk107_of(loop_trace(tmp_path / "loop.sqlite"))
    assert f is not None
    ev = f.evidence
    # 64 copies of 5 kernels of 4 blocks: one kernel per position as wide as 64 copies, 256
    # blocks on 100 SMs at one block per SM = 3 waves of the copy's 2 us = 6 us (between the
    # longest copy, 2 us, and the copies summed, 128 us); 315 launches of the other 63 copies gone.
    assert (ev["copies"], ev["unit_kernels"], ev["same_grid"], ev["max_grid"]) == (64, 5, True, 4)
    assert ev["kernel_ns_per_iteration"] == 64 * 5 * 2_000
    assert ev["vectorised_kernel_ns_per_iteration"] == 5 * math.ceil(64 * 4 / SMS) * 2_000
    assert ev["launches_removed_per_iteration"] == 315
    # By hand: the step is the CPU's, every CPU duration at the calibrated scale h: 320 launch
    # cycles of 10 us and 1 ms of Python before; 5 cycles and the same Python after (the wider
    # kernels, 6 us each, run under the Python).
    h = prof.pricing_host
    by_hand = (64 * 5 * 10_000 + 1_000_000) * h / ((5 * 10_000 + 1_000_000) * h)
    assert f.expected_end_to_end_speedup == pytest.approx(by_hand, rel=0.03)
    # Never above what removing the loop outright gives (its kernels and launches gone).
    assert 1.0 < f.expected_end_to_end_speedup <= f.bound < by_hand * 1.1
    # Both fixes named, each number said to be whose; the graph's is PK103's own.
    pk103 = next(x for x in prof.findings() if x.code == "PK103")
    assert "if the 64 repeats are independent (a loop over samples or parameters), vectorise" in f.action
    assert "if each depends on the last (layers, timesteps), a CUDA graph of the step" in f.action
    assert f"{f.expected_end_to_end_speedup:.2f}x, the number below" in f.action
    assert ev["cuda_graph_speedup"] == pk103.evidence["cuda_graph_speedup"]
    assert f"PK103's price, {pk103.evidence['cuda_graph_speedup']:.2f}x" in f.action
    assert "identical grids" in f.action and f.rung.value == "library"


def test_wider_kernels_never_price_higher_and_the_sum_is_the_ceiling(tmp_path):
    # The same loop with 60-block kernels: 64 x 60 blocks need 39 waves of 2 us = 78 us a
    # position, slower than the 4-block loop's 6 us; with 99 blocks, 64 waves: the copies' sum.
    gains = []
    for grid in (4, 60, 99):
        _, f = pk107_of(loop_trace(tmp_path / f"g{grid}.sqlite", grid=grid))
        per_position = min(math.ceil(64 * grid / SMS), 64) * 2_000
        assert f.evidence["vectorised_kernel_ns_per_iteration"] == 5 * per_position
        gains.append(f.expected_end_to_end_speedup)
        assert 1.0 < f.expected_end_to_end_speedup <= f.bound
    assert gains[0] >= gains[1] >= gains[2]


def test_a_forward_and_a_backward_loop_are_both_priced(tmp_path):
    # The per-sample loss's forward loop, then its backward loop: two blocks of other units, both
    # widened by one edit; the price is above either alone.
    fwd = [f"fwd_op_{j}" for j in range(5)]
    bwd = [f"bwd_op_{j}" for j in range(4)]
    _, both = pk107_of(loop_trace(tmp_path / "fb.sqlite", names=[fwd, bwd]))
    assert both.evidence["loops_per_iteration"] == 2 and "2 such loops per iteration" in both.action
    assert both.evidence["launches_removed_per_iteration"] == 63 * 5 + 63 * 4
    assert both.evidence["vectorised_kernel_ns_per_iteration"] == 9 * 3 * 2_000
    _, one = pk107_of(loop_trace(tmp_path / "f.sqlite", names=[fwd]))
    assert both.expected_end_to_end_speedup > one.expected_end_to_end_speedup


def test_copies_of_different_sizes_lean_to_parameters(tmp_path):
    # A loop over tensors of different sizes (an EMA over the parameters): the copies' grids
    # differ, the waves add up their blocks.
    grid = lambda c, j: 1 + c % 8  # noqa: E731
    _, f = pk107_of(loop_trace(tmp_path / "params.sqlite", grid=grid))
    assert f is not None and not f.evidence["same_grid"] and "different grids" in f.action
    blocks = sum(1 + c % 8 for c in range(64))
    assert f.evidence["vectorised_kernel_ns_per_iteration"] == 5 * math.ceil(blocks / SMS) * 2_000
    # A few large tensors among them (one copy in 16 fills the GPU 10 times over): still a loop of
    # small kernels; the large copies' blocks are waves of their own, priced at no gain.
    grid = lambda c, j: 1_000 if c % 16 == 0 else 1 + c % 8  # noqa: E731
    _, f = pk107_of(loop_trace(tmp_path / "large.sqlite", grid=grid))
    assert f is not None and f.evidence["max_grid"] == 1_000
    blocks = sum(grid(c, 0) for c in range(64))
    assert f.evidence["vectorised_kernel_ns_per_iteration"] == 5 * math.ceil(blocks / SMS) * 2_000
    # Where the median copy is large and the unit multiplies by weights (a GEMM among its
    # kernels), the loop is not one of small kernels: a layer's.
    layer = [GEMM, *(f"per_sample_op_{j}" for j in range(1, 5))]
    _, f = pk107_of(loop_trace(tmp_path / "half.sqlite", names=layer, grid=lambda c, j: 1_000 if c % 2 else 4))
    assert f is None


def test_partitions_of_different_sizes_are_a_loop_whatever_their_kernels_size(tmp_path):
    """A mixture of experts' routing loop: each copy a GEMM of the expert's own token count
    (cuBLAS picks one of three kernels), elementwise kernels of 1,000 blocks (over the SM count),
    and 200 us of Python in each copy. The search reads the GEMMs as one name; the copies' GEMMs
    differ, so they are partitions of a batch, not layers; vectorised, the body's Python runs
    once: every copy's CPU time but the first's goes."""
    unit = ["gather_kernel", "nvjet_sm90_tst_128x128_bias_TNT", "gelu_kernel", "index_add_kernel"]
    path = loop_trace(tmp_path / "moe.sqlite", copies=16, names=unit, grid=1_000, gap_ns=50_000,
                      gemm_variants=3, kernel_ns=[3_000, 6_000, 3_000, 3_000])
    prof, f = pk107_of(path)
    assert f is not None and f.evidence["gemm_sizes_differ"] and "partitions of one batch" in f.action
    assert "a loop over samples, parameters or a batch's partitions" in f.action
    assert "layers, not samples" not in f.action     # their own weights do not make them layers
    assert (f.evidence["copies"], f.evidence["unit_kernels"]) == (16, 4)
    # By hand, the CPU sets the pace: 64 launch cycles of 54 us and 1 ms of Python after them;
    # vectorised, 4 cycles and the 1 ms (the wider kernels run under the Python).
    h = prof.pricing_host
    by_hand = (64 * 54_000 + 1_000_000) * h / ((4 * 54_000 + 1_000_000) * h)
    assert f.expected_end_to_end_speedup == pytest.approx(by_hand, rel=0.03)
    # the same loop with one GEMM kernel throughout: layers of a stack (large kernels): quiet
    same = loop_trace(tmp_path / "stack.sqlite", copies=16, names=unit, grid=1_000, gap_ns=50_000,
                      kernel_ns=[3_000, 6_000, 3_000, 3_000])
    assert pk107_of(same)[1] is None


def test_an_elementwise_ops_vectorised_and_unrolled_kernels_read_as_one(tmp_path):
    """A loop over a batch's partitions whose slices are not all aligned to the vector width: PyTorch
    runs one elementwise op as its vectorised kernel in some copies and its unrolled one in others.
    The copies are one unit all the same (read as two names, no two neighbouring copies would
    match and the search would find nothing)."""
    unit = ["gather_kernel", "ew:at::native::BUnaryFunctor<long, long, long, at::native::MulFunctor<long>>",
            "index_add_kernel"]
    path = loop_trace(tmp_path / "ew.sqlite", copies=16, names=unit, gap_ns=50_000)
    prof, f = pk107_of(path)
    assert f is not None and (f.evidence["copies"], f.evidence["unit_kernels"]) == (16, 3)
    assert not f.evidence["gemm_sizes_differ"]  # the two kernels of one op say nothing of sizes
    ids = pk107._search_ids(prof.step_model().graph)
    names = [str(n) for n in prof.step_model().graph.op_names]
    variants = [i for i, n in enumerate(names) if "elementwise_kernel" in n]
    assert len(variants) == 2 and ids[variants[0]] == ids[variants[1]]


def test_quiet_on_a_layer_stack_of_large_kernels(tmp_path):
    # Twelve copies of a unit with a GEMM whose kernels launch more blocks than the GPU has SMs: a
    # stack of layers, each already filling the GPU; launch-bound or not, there is nothing to widen.
    layer = [GEMM, *(f"per_sample_op_{j}" for j in range(1, 5))]
    _, f = pk107_of(loop_trace(tmp_path / "layers.sqlite", copies=12, grid=1_000, names=layer))
    assert f is None


def test_a_launch_bound_loop_of_wide_data_kernels_is_priced_for_its_launches_alone(tmp_path):
    # The same loop with no library kernel in its unit (an augmentation per image: slices, resizes,
    # normalisations of 1,000 blocks each) is work over data, not a layer: spoken for, its kernels
    # priced at their own time (their waves add up to it), its launches and Python gone.
    prof, f = pk107_of(loop_trace(tmp_path / "wide.sqlite", copies=12, grid=1_000))
    assert f is not None and f.evidence["max_grid"] == 1_000
    assert f.evidence["vectorised_kernel_ns_per_iteration"] == f.evidence["kernel_ns_per_iteration"] == 12 * 5 * 2_000
    # 60 launch cycles of 10 us and 1 ms of Python, by hand; vectorised 5 cycles (the kernels,
    # 12 x 2 us each, run under the Python after them)
    h = prof.pricing_host
    assert f.expected_end_to_end_speedup == pytest.approx((60 * 10_000 + 1_000_000) * h / ((5 * 10_000 + 1_000_000) * h),
                                                          rel=0.05)


def test_a_loop_whose_copies_launch_an_optional_kernel_is_found_with_it(tmp_path):
    """A loop over images that flips some of them: half the copies, in no regular pattern, launch
    one more kernel. The plain search finds no 8 copies in a row alike; set aside, the flip is an
    optional kernel of the unit, priced as one kernel over the copies that launch it."""
    from synth import TID, make_trace
    base = [f"aug_op_{j}" for j in range(5)]
    strings = {9: "cudaLaunchKernel", 3: "step", **{10 + j: n for j, n in enumerate([*base, "flip_kernel"])}}
    kernels, runtime, nvtx, grids = [], [], [], {}
    corr, t = 0, 0
    flips = [c in (1, 2, 4, 7, 8, 9, 13, 14, 16, 19, 22, 23, 24, 25, 28, 30) for c in range(32)]  # no period
    for _ in range(6):
        t0 = t
        for c in range(32):
            for name in base[:2] + (["flip_kernel"] if flips[c] else []) + base[2:]:
                corr += 1
                runtime.append((t, t + 4_000, corr))
                kernels.append((t + 3_000, t + 5_000, corr, 10 + [*base, "flip_kernel"].index(name)))
                grids[corr] = (4, 1, 1, 128, 1, 1)
                t += 10_000
        t += 1_000_000
        nvtx.append((t0, t - 1, 3, TID))
    path = make_trace(tmp_path / "flip.sqlite", kernels=kernels, runtime=runtime, nvtx=nvtx, strings=strings,
                      grids=grids)
    prof, f = pk107_of(path)
    assert f is not None and (f.evidence["copies"], f.evidence["unit_kernels"]) == (32, 5)
    # each iteration: 176 launches, 5 + 1 left
    assert f.evidence["launches_removed_per_iteration"] == pytest.approx(32 * 5 + 16 - 6, abs=0.5)
    found = pk107.loops(RuleContext(prof, prof.run()))
    # one loop an iteration, each with its 16 flips; the plain search alone found no 8 copies in a row
    assert found and all(len(lp.extras) == 1 and len(lp.extras[0]) == 16 for lp in found)


def test_models_trained_one_after_another_are_a_loop_whatever_their_gemms(tmp_path):
    """An ensemble trained member by member: each copy of the unit is a forward and backward of
    GEMMs of 512 blocks (most of its kernel time) and its own optimizer's foreach update. GEMMs
    that most of the time and that wide would be a layer; an optimizer's update in every copy
    says the copies are models of their own: spoken for, named as such."""
    step = ("void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<4>, "
            "at::native::<unnamed>::PointwiseOpScalarFunctor<float, (int)4, (int)3, (int)3>, "
            "std::multiplies<float>, float>(T1, T2, T3, T4)")
    unit = [GEMM, "relu_kernel", GEMM, "relu_backward_kernel", GEMM, step]
    path = loop_trace(tmp_path / "ensemble.sqlite", copies=8, names=unit, grid=512, gap_ns=30_000,
                      kernel_ns=[8_000, 1_000, 8_000, 1_000, 8_000, 2_000])
    _, f = pk107_of(path)
    assert f is not None and f.evidence["steps_optimizer"]
    assert "trains 8 models one after another" in f.action and "torch.func.stack_module_state" in f.action
    # without the optimizer's update the same unit is a stack of weighted layers: quiet
    layers = loop_trace(tmp_path / "stack.sqlite", copies=8, names=unit[:5], grid=512, gap_ns=30_000,
                        kernel_ns=[8_000, 1_000, 8_000, 1_000, 8_000])
    assert pk107_of(layers)[1] is None


def test_quiet_when_the_gpu_sets_the_pace(tmp_path):
    # The same small kernels, 20 us each, queued back to back: the GPU is busy, not waiting.
    _, f = pk107_of(loop_trace(tmp_path / "busy.sqlite", kernel_ns=20_000, back_to_back=True))
    assert f is None


def test_quiet_on_a_launch_bound_stack_of_weighted_layers(tmp_path):
    # Small kernels and launch-bound, but GEMMs carry most of the unit's time: layers or
    # timesteps with weights of their own, which depend on each other (PK103's graphs).
    names = [GEMM, "layer_norm_kernel", GEMM, "gelu_kernel", GEMM]
    _, f = pk107_of(loop_trace(tmp_path / "weighted.sqlite", copies=12, names=names,
                               kernel_ns=[4_000, 1_500, 4_000, 1_500, 4_000]))
    assert f is None
    # The same loop with one small GEMM among elementwise kernels is spoken for, and says so.
    names = ["sub_kernel", "pow_kernel", GEMM, "clamp_kernel", "sqrt_kernel"]
    _, f = pk107_of(loop_trace(tmp_path / "one_gemm.sqlite", names=names))
    assert f is not None and f.evidence["matrix_kernels"] == 1 and "layers, not samples" in f.action


def test_quiet_without_launch_dimensions(tmp_path):
    # An export without gridX..blockZ cannot tell a small kernel from a large one.
    _, f = pk107_of(loop_trace(tmp_path / "nogrid.sqlite", with_grids=False))
    assert f is None


# -- the committed traces --------------------------------------------------------------------
COMMITTED = [t for t in find_traces(ROOT / "traces", recursive=True)
             if t.parent.name in ("corpus", "real")]


@pytest.mark.parametrize("trace", COMMITTED, ids=lambda t: f"{t.parent.name}/{t.name}")
def test_quiet_on_the_committed_layer_stacks_and_loops(trace):
    # Layer stacks (GPT-2, BERT, ViT, ConvNeXt, DenseNet) and the LSTM/GRU loops repeat units 8
    # times and more; each unit launches kernels wider than the GPU or keeps it busy, and the
    # launch-bound ones are mostly GEMMs (weights: dependent) or LSTM/GRU cells (PK106's). The
    # detection post-processing loops over its images (boxes, scores, NMS per image): a loop over
    # samples, which it names; the mixture of experts loops over its experts (each given its own
    # tokens: GEMMs of different sizes, which cuBLAS runs with different kernels), a batch's partitions;
    # the per-sample loss runs its loss graph once per sample of the batch, forward and backward.
    # PPO's advantage estimate (GAE) is a Python loop over the rollout's 64 timesteps, each a unit
    # of 8 one-block kernels: it fires, and says that timesteps that depend on the last call for a
    # graph, not for vectorising (1.03x). An ensemble trains its eight MLPs one after another, each
    # copy ending in its own optimizer's update; an augmentation loop over images launches a flip
    # and a resize in some copies only (a unit with optional kernels), all of them data work.
    # A hand-written LAMB steps its 153 parameters in a Python loop (a loop over parameters: its
    # foreach rewrite measured 2.01x, priced 1.97x). Where it is wrong: the PINN's MLP of eight
    # 64-wide layers, forward and the double backward through it, is a stack of dependent layers
    # whose small GEMMs (of two sizes: cuBLAS picks two kernels, as for a batch's partitions)
    # leave the unit under max_matrix_share: it fires at 1.11x, third, and its action says that
    # layers call for a graph of the step instead (PK103's price; the graph measured 5.12x).
    # Forty tiny task heads called one after another on the same features (a loop over modules of
    # one shape): it fires at 2.87x, the heads stacked into one batched head measured 4.46x.
    # A normalizing flow's exact divergence, 32 backward passes an Euler step each its own
    # autograd.grad call (every copy launched from the program's thread and autograd's engine):
    # GEMM-heavy as layers are, yet each copy is a backward call of its own; it fires at 1.82x,
    # one is_grads_batched call measured 2.93x. A BiLSTM-CRF's forward algorithm, a Python loop
    # over 127 timesteps of 25 small kernels, each depending on the last: it fires at 4.78x and
    # names the graph for dependent steps (a graph of the step measured 5.09x). Faster R-CNN's
    # per-image loops (its transforms, anchors and proposal filtering, 8 images): it fires at 1.20x.
    # RAFT's 12 refinement iterations (a ConvGRU update and a correlation lookup each, each
    # depending on the last): it fires at 1.02x, under PK103's graph of the step (2.35x). DINO's
    # loss, a list comprehension over the crops (a softmax each, then 14 cross-entropy terms of 4
    # kernels): it fires at 1.04x on those (the committed capture's record predates shape_calls,
    # so the crops' calls of the network are not searched there).
    fired = "PK107" in {f.code for f in shared.profile(trace).findings()}
    assert fired == trace.name.startswith(LOOPS_OVER_SAMPLES)


LOOPS_OVER_SAMPLES = ("detection_postproc_infer.", "moe_routing_train.", "per_sample_loss_train.",
                      "rl_rollout_train.", "ensemble_loop_train.", "gpu_augment_loop_train.",
                      "lamb_python_optim_train.", "pinn_burgers_train.", "multitask_heads_train.",
                      "cnf_exact_divergence_train.", "bilstm_crf_train.", "fasterrcnn_train.",
                      "raft_flow_train.", "detr_matching_train.", "multicrop_dino_train.")


def test_the_loops_it_leaves_are_found_and_judged_by_the_stated_criteria():
    # BERT at batch 1: twelve layers of 13 kernels, launch-bound, GEMMs most of their time and a
    # kernel of 384 blocks; the LSTM loop: 512 cell steps of 5 kernels, cells and 192 blocks.
    from profkit.judge.rules.base import RuleContext
    for name, copies, period in (("bert_b1_infer", 12, 13), ("lstm_cell_loop", 512, 5)):
        prof = shared.corpus(name)
        ctx = RuleContext(prof, prof.run())
        found = pk107.loops(ctx)
        assert found and {(lp.copies, lp.period) for lp in found} == {(copies, period)}
        dur = ctx.model.graph.g_dur
        for lp in found:
            assert lp.busy_share < pk107.RULE.param("max_busy_share")        # launch-bound
            assert lp.grid.max() >= prof.full_trace.primary_gpu().sm_count  # but not small
            assert pk107.matrix_share(lp, dur) >= pk107.RULE.param("max_matrix_share")
            assert not pk107.qualifies(lp, prof.full_trace.primary_gpu().sm_count, dur)


def test_backward_passes_called_one_at_a_time_are_spoken_for():
    # cnf_exact_divergence_train (H100): each Euler step's divergence is 32 autograd.grad calls,
    # one basis vector each; the unit is GEMM-heavy (it would lean to layers) but every copy is
    # launched from the program's thread and autograd's engine: its own backward call
    prof = shared.corpus("cnf_exact_divergence_train")
    f = {x.code: x for x in prof.findings()}["PK107"]
    assert f.evidence["own_backward_calls"] is True and f.evidence["copies"] == 31
    assert "is_grads_batched=True" in f.action and "Hessian-vector iterations" in f.action
    assert f.expected_end_to_end_speedup == pytest.approx(1.82, abs=0.01)   # measured 2.93x
    # a layer stack's copies come from one thread each: BERT at batch 1 stays PK103's
    from profkit.judge.rules.base import RuleContext
    bert = shared.corpus("bert_b1_infer")
    assert not any(lp.own_calls for lp in pk107.loops(RuleContext(bert, bert.run())))


def test_heads_of_their_own_stacked_also_shrink_the_optimizer():
    # multitask_heads_train (H100): 40 heads, nn.Linear(512, 1) each, summed in a Python loop. The
    # op record holds 40 addmm of 64 x 1 x 512 and, in the AdamW, 41 tensors of 512 elements and 40
    # of 1: the copies are modules of their own, and one output from 512 inputs cannot feed the next
    # copy (heads side by side, not layers). Stacked, AdamW steps 28 tensors instead of 106: its
    # host time (1.06 ms an iteration as profiled) shrinks with them. 2.87x -> 3.07x; measured 4.46x
    prof = shared.corpus("multitask_heads_train")
    f = {x.code: x for x in prof.findings()}["PK107"]
    assert f.evidence["own_parameters"] == {"modules": 40, "tensors_each": 2, "optimizer_tensors": 106}
    assert "stack them into one module" in f.action and "28 tensors instead of 106" in f.action
    assert f.expected_end_to_end_speedup == pytest.approx(3.07, abs=0.01)
    assert f.expected_end_to_end_speedup <= f.bound


def _ctx(gemm: list, optimizer: list):
    """What own_parameters reads of a RuleContext: the capture's op record."""
    from types import SimpleNamespace
    from profkit.run.replacements import Replacements
    return SimpleNamespace(replacements=Replacements(record={"gemm": gemm, "optimizer": optimizer}))


@pytest.mark.parametrize("gemm,sizes,want", [
    # heads: one output from 512 inputs, weight and bias each once a copy
    ({"op": "addmm", "n": 1, "k": 512, "count": 40}, [[512, 41], [1, 40], [9216, 1]], (2, 40, 82, True)),
    # a stack of square layers of their own: they may feed each other (layers), still their own
    ({"op": "mm", "n": 256, "k": 256, "count": 12}, [[65536, 12], [100, 1]], (1, 12, 13, False)),
    # one module called once a copy (samples through one Linear): the optimizer holds it once
    ({"op": "addmm", "n": 1, "k": 512, "count": 40}, [[512, 1], [1, 1]], (0, 0, 0, False)),
    # a GEMM recorded once, not once a copy
    ({"op": "addmm", "n": 1, "k": 512, "count": 1}, [[512, 41], [1, 40]], (0, 0, 0, False)),
])
def test_own_parameters_reads_the_op_record(gemm, sizes, want):
    params = sum(c for _, c in sizes)
    ctx = _ctx([gemm], [{"class": "AdamW", "params": params, "sizes": sizes}])
    assert pk107.own_parameters(ctx, 40 if gemm["count"] != 12 else 12) == want
    assert pk107.own_parameters(_ctx([gemm], []), 40) == (0, 0, 0, False)

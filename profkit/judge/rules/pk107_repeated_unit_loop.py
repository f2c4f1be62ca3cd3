"""PK107 repeated-unit-loop: a Python loop launches the same short kernel sequence again and again.

What
    Inside one step, on one stream, a block of kernels whose names repeat one unit of 2 to
    ``max_period`` kernels at least ``min_repeats`` times in a row, its kernels small (fewer
    thread blocks than the GPU has SMs) and the block launch-bound (the GPU idles between
    its kernels): a Python loop over the samples of a batch (a per-sample loss, forward and
    backward), over a model's parameters one tensor at a time (an EMA, a clip, a norm), or over
    anything else whose body launches a few tiny kernels.
Why
    Each copy of the unit costs the CPU its launches and the Python between them, while its
    kernels fill a few SMs for a few microseconds. The same work written over all copies at once
    (one batched call, ``torch._foreach_*``, ``torch.vmap``) launches the unit once, with kernels
    as wide as all the copies together, which fill the GPU in a few waves.
Evidence
    The step graph's kernels (its modelled iterations: at most 12 from the middle of the window,
    what every fix is priced on), each stream's in order, as kernel-name ids: the blocks come from
    a periodicity search (``find_repeats``): a position can lie in a block only if its name comes
    back within ``max_period`` positions, which one sort finds for every position; only stretches
    of such positions long enough for ``min_repeats`` copies are compared with themselves shifted
    by each period in turn, shortest first, and the search stops at the first period no stretch is
    long enough for (at once on a sequence that does not repeat itself). Each block keeps its
    shortest unit; blocks never span two iterations or streams. A loop body with a branch launches
    a kernel in some copies only (a flip for half the images, a resize skipped where the size is
    already right), and no 8 copies in a row are alike: among what the search left, the names
    seen most often are set aside one by one, each kept aside where the search on the rest then
    covers more (``find_gapped``); a block so found holds each name set aside at most once a
    copy, priced as one more kernel of the vectorised unit. Every GEMM kernel reads as one
    name: cuBLAS picks a kernel by the problem's size, and the copies of a loop over partitions of
    different sizes launch different ones at the same position. So do an elementwise op's
    vectorised and unrolled kernels: PyTorch takes the unrolled one where an operand is not aligned
    to the vector width (a slice that starts at an expert's token count), so the copies of one loop
    launch either at the same position. A loop's body may be long: a DETR matcher's, once per
    (decoder layer, image), builds that image's cost matrix in 50 kernels (a softmax, a gather,
    ``cdist``, the GIoU's box arithmetic) and copies it to the host for the solver, 96 times an
    iteration. Searched up to 40 kernels a unit, that loop went unseen at the program's first
    sight (PK101 priced the waits 1.03x; one batched cost matrix measured 2.26x); units of up
    to ``max_period`` = 256 kernels are searched now (2.36x on its committed 3-iteration capture,
    2.23x on the 14 it was scored on; measured 2.28x), at no cost worth the name:
    the scan of the longer periods stops where no stretch holds ``min_repeats`` of them.
    A block is spoken for when all of these hold:

    * each copy ends in an optimizer's update (a foreach or fused Adam/AdamW/SGD kernel) after
      work of its own: models of their own trained one after another, an ensemble's members,
      whatever their kernels' size or GEMM share (a layer never steps an optimizer). A unit that
      is an optimizer's update kernels and nothing else is one optimizer stepping its parameter
      groups one after another (torch.optim's foreach step runs once a group: a layer-wise
      learning-rate decay with a group per layer, 12 copies of 88 kernels), PK201's to price
      (one fused step, fewer groups), never spoken for here; the action says so and names the
      stacked model (``torch.func.stack_module_state`` and ``torch.vmap``). Or each copy is
      launched from two threads, the program's and autograd's engine: a backward pass called
      once a copy from a Python loop (``torch.autograd.grad`` per basis vector: a Jacobian's
      rows, an exact divergence), whatever its GEMM share (a layer stack's copies, forward or
      backward, each come from one thread); the action names ``is_grads_batched=True`` and
      ``torch.func.vmap``, and the graph for passes that depend on the last (Hessian-vector
      iterations). The other copies' calls on both threads go with the vectorised body. A
      normalizing flow's exact divergence (32 passes an Euler step, an H100): 1.82x, one
      batched call measured 2.93x. Otherwise:
    * its kernels are small, or its copies run GEMMs of different sizes (another cuBLAS kernel
      at one position in another copy: a layer stack, a batch's samples, a decode's steps multiply
      at one shape each; the partitions of one batch, the experts of a mixture each given its own
      tokens, do not, and are independent of each other whatever their kernels' size). Small: at
      each position of the unit, the median copy's grid (gridX x gridY
      x gridZ of the trace's kernel table) is under the SM count of the trace's GPU
      (``TARGET_INFO_GPU``). The median, not every copy: a loop over a model's parameters runs
      a few large tensors among many small ones, and those few, already filling the GPU, are
      priced at no gain (their waves add up to their own time). Copies of one shape (samples,
      layers) have one grid, so for them every kernel must be small. A unit with no library
      matrix or multi-tensor kernel at all (work over data: slices, resizes, normalisations of
      one image) is not a layer whatever its kernels' width: the waves price its wide kernels at
      their own time, and only its launches and Python go. An export without launch
      dimensions or SM count gets no finding: a small kernel cannot be told from a large one;
    * in the replay of the step at the calibrated CPU scale, the block's kernels run less than
      ``max_busy_share`` of its span (first kernel's start to last kernel's end), or the host
      takes longer to issue the copies (first launch to last) than their kernels run: launch-bound
      (a loop whose kernels queue behind the last step's GPU work runs them back to back, late,
      yet its pace is the host's);
    * library GEMM, GEMV, convolution and attention kernels carry less than ``max_matrix_share``
      of the unit's kernel time, and no LSTM/GRU cell kernel is in it (a loop over timesteps:
      PK106's, or PK103's where PK106 finds the recurrence is not plain).

    The trace cannot tell independent repeats (the samples of a batch, the parameters of a model:
    vectorise them) from dependent ones (layers, timesteps, decode steps: each needs the last
    one's output, and only a CUDA graph or a compiler removes their launches). What it shows is
    used to lean. A layer or a recurrent cell multiplies by weights, and its library kernels are
    most of its kernel time: in the units that repeat on the committed traces, 76% of a BERT
    layer's at batch 1, 68-70% of a bf16 BERT layer's on variable-length batches, 62-96% in the
    layer stacks of GPT-2, ViT, ConvNeXt and DenseNet (47-54% in a ViT training step's), 88% of
    the LSTM cell loop's unit, 90% of the GRU refiner's of ``early_exit_sync``: a unit at
    ``max_matrix_share`` or above leans dependent, and PK107 leaves it to PK103 (and PK106). A
    per-sample loss or a loop over parameters launches elementwise and reduction kernels. Of the
    units it speaks for, one whose copies launch identical grids leans to the samples of one
    batch, one whose copies launch different grids to tensors of different sizes (parameters:
    ``torch._foreach_*``). The action names both fixes in any case, and its number is the
    vectorised one.

    On the committed traces (111 captures) the units that repeat 8 times or more are layer stacks
    (BERT, GPT-2, ViT, ConvNeXt, DenseNet) and the LSTM and GRU loops; in each, some position of
    the unit launches more blocks than the H200's 132 SMs in its median copy, most keep the GPU
    busy, and the launch-bound ones (BERT at batch 1, the bf16 BERT on variable-length batches, the
    LSTM and GRU loops) are also held back by their library share: PK107 fires on none of them.
    It fires on ``detection_postproc_infer`` (a detector's post-processing that loops over the
    images of a batch: four loops of a 24-kernel unit, 14 copies each, an iteration; its
    per-image syncs PK101 prices first), and on ``moe_routing_train`` (each MoE layer's loop over
    16 experts: ``nonzero``, a gather, two GEMMs of the expert's own token count, an
    ``index_add_``; and the same loop's backward); since set h, on ``ensemble_loop_train`` (eight
    MLPs trained one after another, each copy ending in its own AdamW's update: 3.83x at the
    capture, the members stacked under ``torch.vmap`` measured 4.79x) and on
    ``gpu_augment_loop_train`` (a per-image augmentation loop whose flips and resizes make copies
    differ: 1.20x at the capture, measured 1.79x at a slower timed baseline; both written after
    those programs' first sight had found no loop); hand-built traces (``tests/test_pk107.py``)
    test the price.
Fix
    Independent repeats: for the experts of a mixture, a fixed capacity per expert and one
    batched GEMM over the stacked experts' weights (or a grouped GEMM); one call over the batch
    dimension (broadcasting, ``torch.cdist``, a
    masked reduction over a matrix instead of a loop over its rows), ``torch.vmap`` of the
    per-sample function, ``torch._foreach_*`` over a list of tensors (``torch._foreach_lerp_``
    for an EMA); or ``torch.compile`` of the function that holds the loop (Dynamo unrolls it,
    Inductor fuses the repeats' kernels: on a per-sample triplet loss, 64 anchors, it measured
    2.02x where vectorising measured 2.23x and this rule priced 2.36x; the compiled loop itself
    is not priced here). Dependent repeats: a CUDA graph of the step (``torch.cuda.graphs``,
    ``torch.compile(mode="reduce-overhead")``; PK103).
Expected gain
    Graph edit (``replace_ops``, ``drop_cpu``): at each position of the unit,
    the block's copies become one kernel, the first copy's, and the other copies' calls go with the
    CPU time before each, on the launching thread from the second copy's first launch to the last
    copy's last: the loop body's Python, its syncs and its launches, which a vectorised body makes
    once (a mixture of experts' routing loop, at the capture's calibration: 1.05x with the launches
    and their dispatch alone, 1.45x with the body's Python and syncs, both for the forward's loops
    alone; 2.94x once the backward's loops were found too (their copies launch the vectorised or
    the unrolled kernel of an elementwise op by alignment), 3.13x with PK101's syncs, where
    fixed-capacity routing measured 2.03x: that fix pads every expert to 1.25x its share of the
    tokens and adds its own scatter and gather, which the vectorised price does not count, so the
    price is an upper bound for it). The one kernel takes the
    time a kernel as wide as all the copies takes: as many waves as their blocks together need at
    one resident block per SM, each wave as long as the copies' median time; never less than the
    longest copy (a kernel is not faster than its own work), never more than the copies' time summed
    (not slower than before). The export profkit reads has the grids but not the registers and
    shared memory that set how many blocks an SM holds: one block per SM is the conservative choice
    (more waves, a slower kernel). Wide copies merged at their time summed less the fixed cost
    each copy but one paid (the launch floor, 1.3 us) was tried (2026-12-07) and not adopted: on
    the what-if page three pairs moved nearer (R-GCN's batched relations +90% -> +59%, the request
    loop's batch, the augmentation loop's) and three away (the experts' fixed capacity, the
    ensemble under vmap, LAMB's foreach step), the counts unchanged. The step model replays the
    edited graph at the calibrated CPU scale, capped at the loops removed outright (kernels and
    launches gone: the most a change of them can give). The loops' span over the wider kernels'
    time is no cap: once a loop's launches are gone its kernels run under the Python that follows
    it, which before waited for the loop. The action names beside it PK103's price for a CUDA
    graph of the step (its graph alone), the fix if the repeats depend on each other, and says
    which number is whose. On the what-if corpus it is priced on ``detection_postproc_infer``
    (batched NMS, with PK101) and ``moe_routing_train`` (fixed capacity, with PK101); hand-built
    traces test the edit itself (``tests/test_pk107.py``).
Modules of their own
    Where the capture's op record shows the copies holding parameters of their own (a GEMM
    recorded once a copy whose weight, N x K elements, the optimizer holds as often, with its bias),
    the copies are modules side by side when N is not K (a GEMM's outputs of another width than its
    inputs cannot feed the next copy: a head per task on one feature vector), and the action names
    stacking them into one module (one ``nn.Linear`` with every head's outputs, one loss over them)
    or ``torch.func.stack_module_state`` with ``torch.vmap``. Stacked, the optimizer steps fewer
    tensors: its host time (the optimizer step's calls, PK103's ``optimizer_calls``) is scaled by
    the tensors left over the tensors it had, one pass of Python over the parameter list. On
    multitask_heads_train (40 heads of ``nn.Linear(512, 1)``, an H100): 106 tensors become 28, the
    price 2.87x -> 3.11x, where stacking measured 4.46x (what is left of the gap is not explained
    by the trace: the backbone's backward and the optimizer's kernels stay as profiled).
Loops over chunks
    A loop that runs the whole model over the chunks of one batch (a NeRF renderer's 64 chunks of
    points) repeats a unit of GEMMs, which the trace reads as layers. The op record's outermost
    module calls (profkit.capture.roots) tell it apart: where the model with the most parameters
    ran ``min_repeats`` times or more in the watched iteration, every call on a slice of one tensor
    (``sliced_input``), the copies of a unit repeated as often as the calls are searched first
    (a unit as long as one call; the layer stack inside it repeats less often), spoken for
    whatever their GEMM share or width while launch-bound, and priced as above ("run it over
    larger chunks"). A decode loop, each call fed the last one's output, is not sliced and stays
    with the layers. On nerf_chunks_infer (an H100), given its program's entry, 3.08x where chunks
    32x larger measured 5.76x: the wave model keeps its wide elementwise kernels at their copies'
    time, where merged they lose each copy's fixed cost (``tests/test_pk107_chunks.py``).
    A model called twice or more an iteration on the very same input, other arguments changed
    (``same_input``: a guided diffusion sampler's conditional and unconditional calls of its
    denoiser), is the same case with as few as two calls: one call on the inputs concatenated
    does their work. On cfg_two_pass_sample (a DiT-S/2 sampled with guidance, an H100), given its
    program's entry, 1.72x; one call on both measured 1.95x. Calls that do not depend on each
    other, twice or more on inputs of one shape (``shape_calls``: a multi-crop step runs its
    network once per crop, two global crops and six local ones; a contrastive step once per
    view), are searched for units of a quarter of a call's kernels or more (a call's forward; a
    layer inside it is shorter) repeated twice or more, spoken for while launch-bound unless each
    copy crosses into autograd's thread (a forward and its own backward: gradient accumulation's
    micro-batches, PK205's), and priced as above ("one call on the inputs of one shape"). The
    search claims the shortest period first, and a unit that also matches the end of the call
    before it starts there: on multicrop_dino_train's first-sight capture (an H100, 14
    iterations; the committed one is cut shorter, its record older than ``shape_calls``: no such
    finding there, 1.04x on the what-if page), given the entry its program makes, it
    found the six local crops' forwards and backwards, the teacher's two forwards and the global
    crops' backwards, not their forwards: 2.27x, where grouping the crops by resolution measured
    2.58x (the price a lower bound; PK103's CUDA graph, 3.13x, stays first: student and teacher
    under ``torch.compile(mode="reduce-overhead")`` measured 2.78x and 2.51x in two processes,
    grouping 2.65x and 2.64x beside it, an H100). A record written before it kept
    ``shape_calls`` gives no such finding.
References
    PyTorch ``torch.vmap`` and ``torch.func`` docs (per-sample computations); the
    ``torch._foreach_*`` multi-tensor ops (``torch.optim``'s foreach implementations); PyTorch
    performance tuning guide; PyTorch CUDA Graphs docs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table, bare_kernel_name
from profkit.judge.rules.pk106_rnn_cell_loop import CELL_RE
from profkit.judge.rules.pk201_unfused_optimizer import optimizer_step_kernel
from profkit.run.step.transform import drop_cpu, replace_ops, scale_cpu, scale_ops
from profkit.run.summary import GEMM_RE

# Library kernels that multiply by a layer's weights or attend (GEMM, GEMV, convolution, cuDNN,
# attention): the work of a layer or a timestep.
MATRIX_RE = re.compile(GEMM_RE.pattern[2:] + r"|gemv|dot_kernel", re.I)
# A foreach kernel: one launch over a list of tensors, a loop already vectorised.
MULTI_TENSOR_RE = re.compile(r"multi_tensor_apply", re.I)

RULE = RuleMeta(
    code="PK107", name="repeated-unit-loop",
    summary="a Python loop repeats the same short, small-gridded kernel sequence: vectorise over it "
            "(or, for dependent steps, a CUDA graph)",
    tables=(Table.KERNEL, Table.RUNTIME),
    example="traces/corpus/detection_postproc_infer.sqlite.xz",
    quiet_on="traces/corpus/bert_b1_infer.sqlite.xz",
    params=(Param("min_repeats", 8, "copies of the unit in a row that make a loop"),
            Param("max_period", 256, "most kernels in the repeated unit (the search stops sooner "
                                     "where no stretch holds min_repeats copies of a longer one)"),
            Param("max_busy_share", 0.5, "the loop's kernel time as a share of its span in the "
                                         "replay, below which it is launch-bound"),
            Param("max_matrix_share", 0.5, "library GEMM/convolution/attention kernels' share of the "
                                           "unit's kernel time at and above which the unit is a "
                                           "weighted layer or timestep (dependent)")))


@dataclass(frozen=True)
class Repeats:
    """Blocks of a sequence that repeat one unit: each block's first position, its unit's length
    (the period) and how many copies of the unit in a row it holds; and what the search did."""
    start: np.ndarray
    period: np.ndarray
    count: np.ndarray
    candidates: int        # positions whose name comes back within max_period of them
    periods_scanned: int   # periods compared position by position


def find_repeats(codes, seg, max_period: int = 40, min_repeats: int = 8, min_period: int = 2) -> Repeats:
    """The blocks of ``codes`` (kernel-name ids, in stream order) in which one unit of
    ``min_period`` to ``max_period`` names repeats at least ``min_repeats`` times in a row, inside
    one ``seg`` (stream and iteration): each with its shortest unit, no two overlapping.

    One sort, then one pass per period it has to scan: a position can lie in a block only if its
    name comes back within ``max_period`` positions, which the sort finds for every position at
    once; only stretches of such positions long enough to hold ``min_repeats``
    copies are compared, period by period, and the search stops at the first period no stretch
    is long enough for (at once on a sequence that does not repeat itself)."""
    codes = np.asarray(codes, dtype=np.int64)
    seg = np.asarray(seg, dtype=np.int64)
    n = len(codes)
    none = np.empty(0, dtype=np.int64)
    if n < 2 * min_repeats or max_period < 2 or not min_repeats >= 2:
        return Repeats(none, none, none, 0, 0)
    # The distance to the next position with the same name in the same segment.
    key = seg * (int(codes.max()) + 1) + codes
    order = np.argsort(key, kind="stable")
    same = key[order[1:]] == key[order[:-1]]
    nxt = np.full(n, n, dtype=np.int64)
    nxt[order[:-1][same]] = (order[1:] - order[:-1])[same]
    cand = nxt <= max_period
    zs, ze = _zones(cand, (min_repeats - 1) * 2)
    cands = int((ze - zs).sum())
    claimed = np.zeros(n, dtype=bool)
    found: list[tuple[int, int, int]] = []
    scanned = n_found = 0
    for p in range(2, max_period + 1):
        z = ze - zs >= (min_repeats - 1) * p
        if not z.any():
            break
        if p < min_period:
            continue
        scanned += 1
        zs, ze = zs[z], ze[z]
        lens = ze - zs
        pos = np.repeat(zs - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(int(lens.sum()))
        pos = pos[pos + p < n]
        eq = (codes[pos + p] == codes[pos]) & (seg[pos + p] == seg[pos])
        cont = np.r_[False, pos[1:] == pos[:-1] + 1]
        first = eq & ~(cont & np.r_[False, eq[:-1]])
        last = eq & ~(np.r_[cont[1:], False] & np.r_[eq[1:], False])
        rs, run = pos[first], pos[last] + 1 - pos[first]
        long_ = run >= (min_repeats - 1) * p
        for lo, r in zip(rs[long_].tolist(), run[long_].tolist()):
            k = (r + p) // p
            # Copies a shorter unit claimed are left out at either end.
            while k >= min_repeats and claimed[lo:lo + p].any():
                lo, k = lo + p, k - 1
            while k >= min_repeats and claimed[lo + (k - 1) * p:lo + k * p].any():
                k -= 1
            if k < min_repeats or claimed[lo:lo + k * p].any():
                continue
            unit = codes[lo:lo + p]
            if any(p % q == 0 and (unit[q:] == unit[:-q]).all() for q in range(1, p)):
                continue  # a shorter unit repeated
            claimed[lo:lo + k * p] = True
            found.append((lo, p, k))
        if len(found) > n_found:
            # What a shorter unit claimed holds no other block: the search goes on without it.
            n_found = len(found)
            zs, ze = _zones(cand & ~claimed, (min_repeats - 1) * (p + 1))
    arr = np.array(found, dtype=np.int64).reshape(-1, 3)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    return Repeats(arr[:, 0], arr[:, 1], arr[:, 2], cands, scanned)


def _zones(mask: np.ndarray, shortest: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each run of True in ``mask`` at least ``shortest`` long."""
    d = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    s, e = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    keep = e - s >= shortest
    return s[keep], e[keep]


def find_gapped(codes, seg, claimed, max_period: int = 40, min_repeats: int = 8,
                tries: int = 8) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Blocks that repeat one unit except for optional names: a loop whose body launches a kernel
    in some copies only (a flip for half the images, a resize skipped where the size is already
    right). Among the positions ``claimed`` leaves (find_repeats' blocks), the ``tries`` names seen
    most often (``min_repeats`` / 2 times or more) are set aside one by one, each kept aside where
    find_repeats on the rest of each stretch then covers more positions; a block holds each name
    set aside at most once a copy. Returns, per block, its positions (copies x period) and each
    optional name's positions inside it."""
    codes = np.asarray(codes, dtype=np.int64)
    seg = np.asarray(seg, dtype=np.int64)
    free = np.flatnonzero(~np.asarray(claimed, dtype=bool))
    if len(free) < 2 * min_repeats:
        return []
    # stretches of free positions in one segment: a claimed position or a new segment cuts one;
    # the names set aside are left out without cutting them
    run = np.cumsum(np.r_[True, (np.diff(free) != 1) | (seg[free][1:] != seg[free][:-1])])
    names, counts = np.unique(codes[free], return_counts=True)
    order = np.argsort(-counts, kind="stable")
    aside: list[int] = []
    best: list[tuple[np.ndarray, list[np.ndarray]]] = []
    for name in names[order][counts[order] >= max(min_repeats // 2, 2)][:tries].tolist():
        got = _blocks_without(codes, free, run, [*aside, name], max_period, min_repeats)
        if sum(pos.size for pos, _ in got) > sum(pos.size for pos, _ in best):
            aside, best = [*aside, name], got
    return best


def _blocks_without(codes, free, run, aside: list[int], max_period: int, min_repeats: int):
    """find_repeats on the ``free`` positions without the names ``aside``; each block with the
    positions of each name set aside inside it, kept where no name is there more than once a copy
    (and at least one is there: else find_repeats had found it)."""
    rest = ~np.isin(codes[free], aside)
    sub = free[rest]
    rep = find_repeats(codes[sub], run[rest], max_period, min_repeats)
    out = []
    for lo, p, c in zip(rep.start.tolist(), rep.period.tolist(), rep.count.tolist()):
        pos = sub[lo:lo + p * c]
        within = free[(free > pos[0]) & (free < pos[-1])]
        inside = [within[codes[within] == n] for n in aside]
        inside = [x for x in inside if len(x)]
        if inside and all(len(x) <= c for x in inside):
            out.append((pos.reshape(c, p), inside))
    return out


@dataclass
class Loop:
    """One block of repeated units in the step graph: ``ops`` holds the graph's operations, one
    row a copy of the unit."""
    ops: np.ndarray            # (copies, period) operation indices
    names: list[str]           # the unit's kernel names
    busy_share: float          # the kernels' time over the block's span in the baseline replay
    span_ns: float
    grid: np.ndarray           # blocks launched per operation (same shape as ops); -1 where the
                               # export has none, or the loop is not launch-bound (not read)
    matrix: bool               # a library GEMM, convolution or attention kernel in the unit
    cell: bool                 # an LSTM/GRU cell kernel in the unit (PK106's)
    where: str                 # the range its launches ran in
    gemm_kernels_differ: bool = False  # another GEMM kernel at one position in another copy
    steps_optimizer: bool = False      # an optimizer's update in the unit: each copy a model of its own
    multi_tensor: bool = False         # a multi-tensor (foreach) kernel in the unit: already vectorised
    extras: list = field(default_factory=list)       # per optional kernel some copies launch
    # (find_gapped): its operations; and their grids, -1 where unread
    extra_grids: list = field(default_factory=list)
    host_paced: bool = False  # the host takes longer to issue the copies than their kernels run
    sliced: str = ""          # the model the op record saw called once a copy (_chunk_loop), and
    how: str = ""             # on what: "sliced" (slices of one tensor), "same" (the very same input,
    # other arguments changed) or "groups" (inputs of one shape: one call on them concatenated)
    own_calls: bool = False   # every copy launched from two threads or more: the program's and
    # autograd's engine (each copy its own backward call, made from a Python loop)
    optimizer_only: bool = False  # the unit is an optimizer's update kernels and nothing else: one
    # optimizer stepping its parameter groups one after another (PK201's), not models of their own

    @property
    def extra(self) -> np.ndarray:
        return np.concatenate(self.extras) if self.extras else np.empty(0, dtype=np.int64)

    @property
    def copies(self) -> int:
        return int(self.ops.shape[0])

    @property
    def period(self) -> int:
        return int(self.ops.shape[1])


def loops(ctx: RuleContext) -> list[Loop]:
    """The step graph's blocks of a unit repeated ``min_repeats`` times or more in a row on one
    stream inside one iteration, with what the rule judges them by."""
    m = ctx.model
    if m is None or ctx.iterations == 0 or ctx.baseline is None:
        return []
    g = m.graph
    k = np.flatnonzero((g.g_kind == 0) & (g.g_call >= 0))
    if len(k) < 2 * RULE.param("min_repeats"):
        return []
    k = k[np.lexsort((g.g_start[k], g.g_stream[k]))]
    it = np.searchsorted(g.iter_call, g.g_call[k], side="right") - 1
    seg = g.g_stream[k].astype(np.int64) * (len(g.iter_call) + 1) + it
    ids = _search_ids(g)[g.g_name[k]]
    period, least = int(RULE.param("max_period")), int(RULE.param("min_repeats"))
    claimed = np.zeros(len(k), dtype=bool)
    blocks = []
    chunked = _chunk_loop(ctx, least)
    if chunked is not None:
        # The model run over slices of one tensor (or on one input), once a copy: the copies of a
        # unit as long as one call, repeated as often as the calls (a layer stack inside it
        # repeats less often; with as few as two calls, a unit under half a call is a layer's)
        calls, model, how = chunked
        its = max(len(g.iter_call) - 1, 1)
        per_call = len(k) // its // calls
        if how == "groups":
            # calls on inputs of one shape, as few as two: units of a quarter of a call's kernels or
            # more (its forward; its backward launches about twice as many), which a layer inside
            # it does not reach, repeated twice or more
            rep = find_repeats(ids, seg, max(period, per_call + 1), 2, max(per_call // 4, 2))
        else:
            rep = find_repeats(ids, seg, max(period, per_call + 1), calls, per_call // 2 if how == "same" else 2)
        for lo, p, c in zip(rep.start.tolist(), rep.period.tolist(), rep.count.tolist()):
            claimed[lo:lo + p * c] = True
            blocks.append((np.arange(lo, lo + p * c).reshape(c, p), [], model, how))
    rep = find_repeats(ids, seg, period, least)
    for lo, p, c in zip(rep.start.tolist(), rep.period.tolist(), rep.count.tolist()):
        if claimed[lo:lo + p * c].any():
            continue
        claimed[lo:lo + p * c] = True
        blocks.append((np.arange(lo, lo + p * c).reshape(c, p), [], "", ""))
    blocks += [(pos, extra, "", "") for pos, extra in find_gapped(ids, seg, claimed, period, least)]
    if not blocks:
        return []
    b = ctx.baseline
    names = np.asarray(g.op_names, dtype=object)
    gemm = _gemm_names(g)
    out = []
    for pos, extra_pos, sliced, how in blocks:
        ops, extras = k[pos], [k[x] for x in extra_pos]
        extra = np.concatenate(extras) if extras else np.empty(0, dtype=np.int64)
        s, e = b.g_start[ops], b.g_end[ops]
        span = float(e.max() - s.min())
        busy = float((e - s).sum() + (b.g_end[extra] - b.g_start[extra]).sum())
        # the host's own time to issue the copies, first launch to last on the launching thread
        # (the Python before each call and the call itself, at the priced CPU scale; not its
        # waits for the GPU, which a sync inside the loop would count as the host's)
        launched = g.g_call[np.r_[ops.ravel(), extra]]
        launched = launched[launched >= 0]
        issue = 0.0
        if len(launched):
            own = _thread_calls(g, int(launched.min()), int(launched.max()))
            issue = float(g.c_gap[own[1:]].sum() + g.c_own[own].sum()) * ctx.host
        unit = [str(x) for x in names[g.g_name[ops[0]]]]
        extra_names = [str(names[g.g_name[x[0]]]) for x in extras]
        calls = g.g_call[ops.ravel()]
        where = pd.Series(np.asarray(g.range_names, dtype=object)[g.c_range[calls]]).mode()
        # Another GEMM kernel at one position in another copy (the search read them as one name,
        # and an elementwise op's two kernels too, which tell nothing of the sizes).
        by_pos = g.g_name[ops]
        differ = bool(((by_pos != by_pos[0]) & gemm[by_pos]).any())
        # a copy whose launches come from two threads crossed from the program's into autograd's
        # engine and back: a backward pass called once a copy (a layer stack's copies, forward or
        # backward, are launched from one thread each)
        tid = g.c_tid[np.maximum(g.g_call[ops], 0)]
        crosses = bool(((tid != tid[:, :1]).any(axis=1) & (g.g_call[ops] >= 0).all(axis=1)).all())
        out.append(Loop(ops, unit, busy / span if span > 0 else 1.0, span,
                        np.full(ops.shape, -1, dtype=np.int64),
                        any(MATRIX_RE.search(n) for n in unit + extra_names),
                        any(CELL_RE.search(n) for n in unit + extra_names),
                        str(where.iloc[0]) if len(where) else "", differ,
                        any(optimizer_step_kernel(n) for n in unit),
                        any(MULTI_TENSOR_RE.search(n) for n in unit + extra_names),
                        extras, [np.full(len(x), -1, dtype=np.int64) for x in extras], issue > busy,
                        sliced, how, crosses,
                        all(optimizer_step_kernel(n) or MULTI_TENSOR_RE.search(n) for n in unit + extra_names)))
    # Launch dimensions are read only for the loops that wait for the CPU: the others are not
    # spoken for whatever their size.
    _read_grids(ctx, [lp for lp in out if launch_bound(lp)])
    return out


# cuBLAS picks a GEMM kernel (its tile shape) by the problem's size: copies of one unit whose GEMMs
# differ in size (the experts of a mixture, each given its own number of tokens) launch different
# GEMM kernels at the same position. The repeat search reads every GEMM kernel as one name
# (convolutions keep theirs: cuDNN's differ by layer, and a layer stack is not a loop to vectorise).
GEMM_ANY_RE = re.compile(r"gemm|nvjet|cutlass|cublas", re.I)
CONV_RE = re.compile(r"fprop|dgrad|wgrad|conv|implicit", re.I)


# PyTorch runs an elementwise op as its vectorised kernel where every operand is aligned to the
# vector width and as its unrolled one otherwise: a slice that starts at a token count that is not a
# multiple of 4 (an expert's share of a batch) takes the other kernel of the same functor. The
# repeat search reads both as the functor's one name.
ELEMENTWISE_VARIANT_RE = re.compile(
    r"^void at::native::(?:vectorized_elementwise_kernel<\(int\)\d+, |unrolled_elementwise_kernel<)(.+?), "
    r"std::array<char \*")


def _chunk_loop(ctx: RuleContext, least: int) -> Optional[tuple[int, str, str]]:
    """(calls an iteration, the model, how: "sliced", "same" or "groups") where the op record saw
    the model with the most parameters called ``least`` times or more in its watched iteration,
    every call on a slice of one tensor (profkit.capture.roots: a loop over the chunks of a batch,
    each through the whole model), or twice or more on the very same input (a guided sampler's
    conditional and unconditional calls: independent, so one call on both does their work), or
    calls that do not depend on each other twice or more on inputs of one shape (``shape_calls``:
    a multi-crop step's crops, a contrastive step's views); else None."""
    rows = [r for r in ctx.replacements.recorded("root_calls")
            if isinstance(r.get("calls"), int) and isinstance(r.get("params"), int)]
    if not rows:
        return None
    top = max(rows, key=lambda r: r["params"])
    model = str(top.get("module") or "the model")
    if top["calls"] >= least and top.get("sliced_input") is True:
        return int(top["calls"]), model, "sliced"
    if top["calls"] >= 2 and top.get("same_input") is True:
        return int(top["calls"]), model, "same"
    if top["calls"] >= 2 and isinstance(top.get("shape_calls"), int) and top["shape_calls"] >= 2:
        return int(top["calls"]), model, "groups"
    return None


def _gemm_names(g) -> np.ndarray:
    """Per kernel-name id of the graph: whether it is a GEMM kernel (not a convolution)."""
    return np.array([bool(GEMM_ANY_RE.search(str(n))) and not CONV_RE.search(str(n))
                     for n in g.op_names], dtype=bool)


def _search_ids(g) -> np.ndarray:
    """Per kernel-name id of the graph, the id the repeat search reads: one id for every GEMM, and
    one for the vectorised and unrolled kernels of one elementwise functor."""
    ids = np.arange(len(g.op_names), dtype=np.int64)
    gemm = _gemm_names(g)
    if gemm.any():
        ids[gemm] = int(np.flatnonzero(gemm)[0])
    first: dict[str, int] = {}
    for i, n in enumerate(g.op_names):
        m = ELEMENTWISE_VARIANT_RE.match(str(n))
        if m:
            ids[i] = first.setdefault(m.group(1), i)
    return ids


def _read_grids(ctx: RuleContext, found: list[Loop]) -> None:
    """Each loop's launch grids (blocks per kernel), read from the trace's kernel table for the
    stretch the loops run in (one read for all of them); -1 where the export has no launch
    dimensions."""
    if not found:
        return
    grids = ctx.launch_grids(np.concatenate([np.r_[lp.ops.ravel(), lp.extra] for lp in found]))
    for lp, part in zip(found, np.split(grids, np.cumsum([lp.ops.size + len(lp.extra) for lp in found])[:-1])):
        lp.grid[...] = part[:lp.ops.size].reshape(lp.ops.shape)
        lp.extra_grids = np.split(part[lp.ops.size:], np.cumsum([len(x) for x in lp.extras])[:-1])


def qualifies(lp: Loop, sm_count: int, dur: np.ndarray) -> bool:
    """Whether PK107 speaks for a loop (see the module docstring): every grid read, the loop
    launch-bound in the replay, not an LSTM/GRU cell loop (PK106's); then a unit whose copies each
    step an optimizer (models of their own) is spoken for; any other, its kernels small (at each
    position of the unit, the median copy launches fewer blocks than the GPU has SMs) unless the
    unit holds no library matrix or multi-tensor kernel (work over data, not a layer), and
    library GEMM/convolution/attention kernels under ``max_matrix_share`` of its kernel time."""
    if lp.cell or (lp.grid < 0).any() or any((x < 0).any() for x in lp.extra_grids):
        return False
    if not launch_bound(lp) or lp.optimizer_only:
        return False
    if lp.how == "groups" and lp.own_calls:
        # each copy a forward and its own backward: micro-batches (PK205's), not calls to group
        return False
    if lp.steps_optimizer or lp.sliced or lp.own_calls:
        return True
    data_only = not lp.matrix and not lp.multi_tensor
    wide = (np.median(lp.grid, axis=0) >= sm_count).any() or any(len(x) and np.median(x) >= sm_count
                                                                for x in lp.extra_grids)
    if wide and not (lp.gemm_kernels_differ or data_only):
        return False
    return matrix_share(lp, dur) < RULE.param("max_matrix_share")


def launch_bound(lp: Loop) -> bool:
    """The loop waits for the CPU: its kernels run under ``max_busy_share`` of its span in the
    replay, or the host takes longer to issue the copies than their kernels run."""
    return lp.busy_share < RULE.param("max_busy_share") or lp.host_paced


def matrix_share(lp: Loop, dur: np.ndarray) -> float:
    """Library GEMM, convolution and attention kernels' share of the loop's kernel time (``dur``:
    the graph's durations)."""
    d = dur[lp.ops]
    mat = np.array([bool(MATRIX_RE.search(n)) for n in lp.names], dtype=bool)
    total = float(d.sum())
    return float(d[:, mat].sum()) / total if total > 0 else 0.0


def merged_ns(d: np.ndarray, blocks: np.ndarray, sm_count: int, blocks_per_sm: int = 1) -> np.ndarray:
    """Per column of ``d`` (kernel times, one row a copy) and ``blocks`` (their grids), the time of
    the one kernel that does the work of all its copies: as many waves as the copies' blocks
    together need (``blocks_per_sm`` resident on each SM), each as long as the copy's median time;
    never less than the longest copy (a kernel is not faster than its own work) and never more
    than the copies' time summed (not slower than before)."""
    d = np.asarray(d, dtype=np.float64)
    waves = np.ceil(np.asarray(blocks).sum(axis=0) / float(sm_count * blocks_per_sm))
    return np.clip(waves * np.median(d, axis=0), d.max(axis=0), d.sum(axis=0))


def vectorised_ns(lp: Loop, dur: np.ndarray, sm_count: int, blocks_per_sm: int = 1) -> np.ndarray:
    """Per position of the unit, its copies as one kernel (merged_ns)."""
    return merged_ns(dur[lp.ops], lp.grid, sm_count, blocks_per_sm)


def extra_ns(lp: Loop, dur: np.ndarray, sm_count: int, blocks_per_sm: int = 1) -> float:
    """Each optional kernel's copies (find_gapped) as one kernel (merged_ns: the vectorised unit
    launches it once, over the copies that need it), their times summed."""
    return float(sum(merged_ns(dur[ops][:, None], grid[:, None], sm_count, blocks_per_sm)[0]
                     for ops, grid in zip(lp.extras, lp.extra_grids)))


def detect(ctx: RuleContext) -> list[Finding]:
    found = loops(ctx)
    if not found:
        return []
    sm = ctx.prof.full_trace.primary_gpu().sm_count
    if not sm:
        return []
    g = ctx.model.graph
    dur = g.g_dur
    keep = [lp for lp in found if qualifies(lp, int(sm), dur)]
    if not keep:
        return []
    its = max(len(g.iter_call) - 1, 1)
    groups, new = [], []
    before = after = span = 0.0
    for lp in keep:
        ns = vectorised_ns(lp, dur, int(sm))
        # the optional kernels' copies go with the unit's first position: one kernel each after it
        ns[0] += extra_ns(lp, dur, int(sm))
        groups.append(np.r_[lp.ops[:, 0], lp.extra])
        groups.extend(lp.ops[:, j] for j in range(1, lp.period))
        new.extend(ns.tolist())
        before += float(dur[lp.ops].sum() + dur[lp.extra].sum())
        after += float(ns.sum())
        span += lp.span_ns
    new_arr = np.asarray(new, dtype=np.float64)
    gone = np.concatenate([np.r_[lp.ops.ravel(), lp.extra] for lp in keep])
    body = other_copies_cpu(g, keep)
    # The most a change of the loops can give: their kernels and launches gone outright, with the
    # other copies' CPU time. (Their span over the wider kernels' time is no bound: once the loop's
    # launches are gone, its kernels run under the Python that follows it.)
    big = max(keep, key=lambda lp: lp.ops.size)
    # Copies that are modules of their own (a head per task) hold parameters of their own: stacked,
    # the optimizer steps fewer tensors, and its Python, one pass over them, shrinks with them
    own, modules, params, side = (own_parameters(ctx, big.copies) if not big.steps_optimizer
                                  else (0, 0, 0, False))
    opt = np.empty(0, dtype=np.int64)
    if own:
        from profkit.judge.rules.pk103_host_overhead import optimizer_calls
        opt = np.setdiff1d(optimizer_calls(g), body)
    left = params - own * (modules - 1)
    shrink = left / params if own and len(opt) else 1.0

    def stacked(gr):  # the optimizer's share of the stacked parameters gone with the copies
        return scale_cpu(gr, opt, shrink) if shrink < 1.0 else gr
    bound, _ = ctx.price(lambda gr: stacked(drop_cpu(scale_ops(gr, gone, float("inf"), True), body)),
                         "the loops' kernels and launches removed")
    removed = sum(lp.ops.size - lp.period + len(lp.extra) - len(lp.extras) for lp in keep)
    n_loops = len(keep) / its
    many = "one such loop" if round(n_loops) == 1 else f"{n_loops:.0f} such loops"
    sizes = any(lp.gemm_kernels_differ for lp in keep)
    unit = f"a unit of {big.period}{'' if sizes else ' small'} kernels {big.copies} times"
    loops_txt = (f"the loop that repeats {unit}" if round(n_loops) == 1 else
                 f"{n_loops:.0f} loops per iteration (the largest repeats {unit})")
    what = (f"{loops_txt}, each made one unit of kernels as wide as its copies together "
            f"({removed / its:.0f} launches per iteration gone, the kernels' time "
            f"{before / its / 1e3:.0f} -> {after / its / 1e3:.0f} us per iteration, in waves of "
            f"{int(sm)} blocks at one block per SM)")
    if len(body):
        what += (f"; the other copies' calls and the CPU time between them "
                 f"{float(g.c_gap[body].sum() + g.c_own[body].sum()) / its / 1e6:.2f} ms per iteration as "
                 "profiled (the loop body's Python and its syncs, run once for all copies)")
    if shrink < 1.0:
        what += (f"; the {modules} copies' own parameters ({own} tensors each) stacked into {own}: the "
                 f"optimizer steps {left} tensors instead of {params}, its host time "
                 f"{float(g.c_gap[opt].sum() + g.c_own[opt].sum()) / its / 1e6:.2f} ms per iteration as profiled "
                 f"scaled by as much")
    gain, basis = ctx.price(lambda gr: stacked(drop_cpu(replace_ops(gr, groups, new_arr), body)), what,
                            cap=bound)
    if gain < 1.02:
        return []
    graph = _graph_price(ctx)
    same_grid = all(bool((lp.grid == lp.grid[0]).all()) for lp in keep)
    matrix = sorted({n for lp in keep for n in lp.names if MATRIX_RE.search(n)})
    ev = {"loops_per_iteration": round(len(keep) / its, 1), "copies": big.copies,
          "unit_kernels": big.period, "unit": [bare_kernel_name(n) for n in big.names],
          "where": big.where, "launches_removed_per_iteration": round(removed / its, 1),
          "loop_span_ns_per_iteration": int(span / its), "kernel_ns_per_iteration": int(before / its),
          "vectorised_kernel_ns_per_iteration": int(after / its),
          "busy_share": round(max(lp.busy_share for lp in keep), 3), "same_grid": same_grid,
          "max_grid": int(max(lp.grid.max() for lp in keep)), "sm_count": int(sm),
          "matrix_kernels": len(matrix), "gemm_sizes_differ": sizes, "vectorised_speedup": round(gain, 3)}
    if graph is not None:
        ev["cuda_graph_speedup"] = round(graph, 3)
    lean = ("the copies run GEMMs of different sizes (cuBLAS picks another kernel for each), as the "
            "partitions of one batch do (the experts of a mixture, each given its own tokens: one "
            "grouped or padded batched GEMM over all of them)" if sizes else
            "the copies launch identical grids, as the samples of one batch do" if same_grid else
            "the copies launch different grids, as tensors of different sizes do (parameters)")
    graph_txt = (f"a CUDA graph of the step (PK103's price, {graph:.2f}x) removes their launches instead"
                 if graph is not None else "a CUDA graph of the step (PK103) removes their launches instead")
    # (partitions multiply by weights of their own too: the GEMMs' sizes already told them apart)
    note = (f"; the unit holds {len(matrix)} library GEMM/convolution kernel(s): if they multiply by "
            "weights of each copy's own, the copies are layers, not samples" if matrix and not sizes else "")
    independent = "samples, parameters or a batch's partitions" if sizes else "samples or parameters"
    where = "outside any NVTX range" if big.where in ("", "(no range)") else f"in {big.where}"
    sliced = next((lp for lp in keep if lp.sliced), None)
    if sliced is not None and sliced.how == "same":
        ev["sliced_model"] = sliced.sliced
        ev["same_input"] = True
        action = (f"the whole model ({sliced.sliced}) runs {sliced.copies} times an iteration on the same "
                  f"input, other arguments changed ({where}: a unit of {sliced.period} kernels a call, as a "
                  "guided sampler's conditional and unconditional calls): one call on the inputs "
                  f"concatenated along the batch ({sliced.copies}x the batch), its output split "
                  f"({gain:.2f}x, the number below); {graph_txt}")
    elif sliced is not None and sliced.how == "groups":
        ev["sliced_model"] = sliced.sliced
        ev["grouped_calls"] = True
        grouped = [lp for lp in keep if lp.how == "groups"]
        first = max(grouped, key=lambda lp: lp.copies)
        runs = len(grouped) / its
        ranges = list(dict.fromkeys(lp.where for lp in grouped if lp.where not in ("", "(no range)")))
        inside = f"in {' and '.join(ranges)}" if ranges else "outside any NVTX range"
        action = (f"the whole model ({sliced.sliced}) runs once on each of several inputs of one shape, calls "
                  f"that do not depend on each other ({inside}: {runs:.0f} run{'' if round(runs) == 1 else 's'} of "
                  f"copies of one call an "
                  f"iteration, the longest {first.copies} copies of a {first.period}-kernel unit, as a multi-crop "
                  "step's crops each run on their own): one call on the inputs of one shape concatenated "
                  "along the batch (as DINO groups its crops by resolution), the outputs "
                  f"split ({gain:.2f}x, the number below); BatchNorm then takes its statistics over the "
                  f"group, not each input; {graph_txt}")
    elif sliced is not None:
        ev["sliced_model"] = sliced.sliced
        action = (f"a Python loop runs the whole model ({sliced.sliced}) {sliced.copies} times an iteration, "
                  f"each time on a slice of one tensor ({where}: chunks of one batch, a unit of "
                  f"{sliced.period} kernels a chunk): run it over larger chunks, or the whole batch at once, "
                  f"as memory allows ({gain:.2f}x, the number below, all chunks in one); {graph_txt}")
    elif any(lp.own_calls and not lp.steps_optimizer for lp in keep):
        ev["own_backward_calls"] = True
        action = (f"a Python loop makes {big.copies} backward passes in a row, each its own call into "
                  f"autograd ({many} per iteration, {where}: the same {big.period}-kernel unit a pass, "
                  "launched from the program's thread and autograd's): where the passes are independent "
                  "(the rows of a Jacobian, per-sample gradients, an exact trace or divergence one basis "
                  "vector at a time), make them one call, torch.autograd.grad(..., is_grads_batched=True) "
                  "over the stacked vectors or torch.func.vmap over torch.func.vjp/jacrev "
                  f"({gain:.2f}x, the number below); where each uses the last one's result "
                  f"(Hessian-vector iterations), {graph_txt}")
    elif own and side:
        ev["own_parameters"] = {"modules": modules, "tensors_each": own, "optimizer_tensors": params}
        action = (f"a Python loop runs {modules} modules of their own side by side, each the same "
                  f"{big.period}-kernel unit ({many} per iteration, {where}; the optimizer holds each one's "
                  "weights, and a GEMM whose outputs are not its inputs' width cannot feed the next: heads "
                  "on one input, as a head per task is): stack them into one module (one nn.Linear with "
                  "every head's outputs, one loss over the stacked outputs) or run them with "
                  "torch.func.stack_module_state and torch.vmap; the optimizer then steps "
                  f"{left} tensors instead of {params} ({gain:.2f}x, the number below)")
    elif any(lp.steps_optimizer for lp in keep):
        ev["steps_optimizer"] = True
        action = (f"a Python loop trains {big.copies} models one after another, each copy the same "
                  f"{big.period}-kernel unit ending in its own optimizer's update ({many} per iteration, "
                  f"{where}; models of their own, as an ensemble's members are): stack them and train them as "
                  "one (torch.func.stack_module_state, torch.vmap over torch.func.functional_call, one "
                  f"optimizer over the stacked parameters; {gain:.2f}x, the number below); {graph_txt}")
    else:
        action = (f"a Python loop launches the same {big.period}-kernel unit {big.copies} times in a row "
                  f"({many} per iteration, {where}; {lean}{note}): if the "
                  f"{big.copies} repeats are independent (a loop over {independent}), vectorise over "
                  "them (one batched call over the batch dimension / torch._foreach_* / torch.vmap; "
                  f"{gain:.2f}x, the number below); if each depends on the last (layers, timesteps), "
                  f"{graph_txt}")
    members = frozenset(n for lp in keep for n in lp.names)
    return [Finding(RULE.code, RULE.name, action, Rung.LIBRARY, ev, gain,
                    f"{removed / its:.0f} launches per iteration removed, kernels as wide as their copies; "
                    f"{basis}", max(bound, gain), kernels=members)]


def own_parameters(ctx: RuleContext, copies: int) -> tuple[int, int, int, bool]:
    """(parameter tensors each copy holds of its own, the modules holding them, the optimizer's
    tensors, whether the modules cannot be a chain) from the capture's op record: a GEMM recorded
    once a copy (give or take one: the trace's loop search may leave the first copy out) whose
    weight, its N x K elements, the optimizer holds
    as often (and its bias, N elements, where the GEMM adds one): the copies are modules of their
    own, a head per task, not samples through one module. Zeros without a record, an optimizer or
    such a GEMM."""
    rec = ctx.replacements
    optimizers = rec.recorded("optimizer")
    if not optimizers or copies < 2:
        return 0, 0, 0, False
    sizes: dict[int, int] = {}
    params = 0
    for o in optimizers:
        params += int(o.get("params") or 0)
        for item in o.get("sizes") or ():
            if isinstance(item, (list, tuple)) and len(item) == 2:
                sizes[int(item[0])] = sizes.get(int(item[0]), 0) + int(item[1])
    own = modules = 0
    side = False
    for gm in rec.recorded("gemm"):
        n, k, count = int(gm.get("n") or 0), int(gm.get("k") or 0), int(gm.get("count") or 0)
        if abs(count - copies) > 1 or n * k <= 0 or sizes.get(n * k, 0) < count:
            continue
        bias = gm.get("op") == "addmm" and n != n * k and sizes.get(n, 0) >= count
        if 1 + int(bias) > own:
            own, modules, side = 1 + int(bias), count, n != k
    return (own, modules, params, side) if own and params > own * (modules - 1) else (0, 0, 0, False)


def other_copies_cpu(g, keep: list[Loop]) -> np.ndarray:
    """The calls of each loop's copies after the first, on the thread that launched them: from the
    second copy's first launch to the last copy's last, every call (the syncs and copies the body
    makes too) with the CPU time before it. Vectorised, the body runs once: its Python, its syncs
    and its launches for the other copies are not made."""
    out = []
    for lp in keep:
        if lp.copies < 2:
            continue
        first, last = g.g_call[lp.ops[1]], g.g_call[lp.ops[-1]]
        if (first < 0).any() or (last < 0).any():
            continue
        lo, hi = int(first.min()), int(last.max())
        if lp.own_calls:
            # each copy its own backward call: autograd's engine thread runs the other copies'
            # passes too, and one batched call makes them once
            calls = np.arange(lo, hi + 1)
            out.append(calls[np.isin(g.c_tid[calls], g.c_tid[g.g_call[lp.ops[1:]].ravel()])])
        else:
            out.append(_thread_calls(g, lo, hi))
    return np.unique(np.concatenate(out)) if out else np.empty(0, dtype=np.int64)


def _thread_calls(g, lo: int, hi: int) -> np.ndarray:
    """The calls from ``lo`` to ``hi`` made on the thread that made call ``lo``."""
    calls = np.arange(lo, hi + 1)
    return calls[g.c_tid[calls] == g.c_tid[lo]]


def _graph_price(ctx: RuleContext):
    """PK103's price for a CUDA graph of the step (its graph alone, not its compile), the fix
    for repeats that depend on each other; None where it finds none or refuses the graph."""
    found = ctx.found.get("PK103")
    if found is None:  # PK103 not judged in this evaluation (a subset of the rules)
        from profkit.judge.rules import pk103_host_overhead
        priced = list(ctx.priced)
        try:
            found = pk103_host_overhead.detect(ctx)
        finally:
            ctx.priced = priced
    for f in found:
        if "refused" not in f.evidence and "cuda_graph_speedup" in f.evidence:
            return float(f.evidence["cuda_graph_speedup"])
    return None

"""PK402 elementwise-chain: runs of small eager elementwise kernels that one compiled kernel does.

What
    Three or more consecutive elementwise kernels on a stream, each short, outside any compiled
    region: an eager expression (``x * a + b``, a composed RMSNorm, RoPE) evaluated one op at a
    time, each reading and writing the whole tensor.
Why
    ``torch.compile`` fuses such a chain into one kernel that reads the inputs once and writes
    the result once.
Evidence
    Kernel order per stream: runs of ``elementwise_kernel`` / ``vectorized_elementwise_kernel`` /
    ``unrolled_elementwise_kernel`` shorter than ``max_kernel_us``. Inductor's own ``triton_*``
    kernels never count (already compiled). Casts belong to PK202.
Fix
    ``torch.compile`` the function or module that holds the chain.
Expected gain
    The graph edit of every compile price (``profkit.run.step.fusion``, PK103's
    ``fusion_speedup``), on the runs of fusible kernels that hold the chains: compiling the code
    around a chain fuses the run Inductor sees there (reductions and norms beside the
    elementwise kernels, in any range: the chain may be in code outside the model), each run one
    kernel as long as its longest, never less, the other launches gone with the driver query
    and the dispatch before each. On every committed trace that both price, it is at most PK103's
    default-mode price, which fuses every run of the model's ranges; it can be more only where
    the chains lie outside the model (an optimizer's or an EMA's code), which compiling the model
    does not reach. Before the two shared the edit, this rule fused only the
    elementwise kernels of each chain and kept their dispatch: GPT-2 fp16 with gradient
    accumulation (grad_accum_fp16_train) was priced 1.16x here and 1.51x by PK103 for one
    ``torch.compile``, whose default mode measured 1.81x on the program (``--try compile``); now
    1.50x here and 1.72x for the whole model (no test of it: the pair is not in the corpus); 1.52x
    and 1.75x with a module graph's call cost (450 us in training: analyses/compile_breaks.md).
Trial
    ``compile`` (``torch.compile`` of the outermost module, default mode) measures the price
    where the chains are in the model's code; chains outside it (an optimizer's, an EMA's) stay
    eager under that trial, which then measures less than the fix. On GPT-2 fp16 with gradient
    accumulation the trial measured 1.81x against this rule's 1.50x: the compiled model also
    fuses what is not a chain of three (the casts, the norms' pairs). Pricing the compiled model
    instead where a chain runs in its code (every run of fusible kernels in the model's ranges
    fused with the chains') was tried (2026-12-07) and not adopted: on the what-if page the compile
    pairs this rule prices moved nearer (ViT's +50% -> +1%, masked SDPA's +22% -> -4%, int8
    weights' +51% -> +16%, LoRA's +48% -> +32%; NeRF's -9% -> -15%), 263 of 355 within 15%
    against 262, but the new number put this rule first on two programs whose compile was never
    timed (ViT with per-tensor gradient norms, T5 fine-tuning), and the top action was right on
    100 programs against 102.

    Noticed, not mended: on a host-paced step the price keeps each kernel the compiled graph
    still launches at its eager host cost. An HF Llama fine-tune with gradient checkpointing
    (grad_checkpoint_train: 96 of 105 ms an iteration on the host's path, 3,134 launches) was
    priced 1.53x here (1.62x for PK103's default mode); ``torch.compile(model)`` measured 2.49x
    and 2.63x in two processes (an H100, 2026-12-07), the best of its fixes (turning the
    checkpointing off 1.61-1.68x): compiled, the HF modules' Python around each kept kernel goes,
    which the price keeps (where Dynamo traces the checkpoint, the recomputed forward's Python
    too; not established which it did here).
References
    PyTorch ``torch.compile`` docs; Inductor pointwise fusion.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import (Finding, Param, RuleContext, RuleMeta, Scope, Table,
                                TrialOf, iteration_bounds, matches)
from profkit.judge.rules.pk103_host_overhead import backward_kernels, shape_following_share
from profkit.judge.rules.pk202_autocast_recast import CAST_RE
from profkit.run.step.fusion import compile_host, inductor_fusion
from profkit.run.step.transform import replace_ops

RULE = RuleMeta(
    code="PK402", name="elementwise-chain",
    summary="chains of small eager elementwise kernels: torch.compile fuses them into one",
    tables=(Table.KERNEL,), example="traces/micro_chain.sqlite.xz",
    quiet_on="traces/real/cnn_infer.sqlite.xz", trials=(TrialOf("compile"),),
    params=(Param("min_chain", 3, "kernels in a row"),
            Param("max_kernel_us", 50.0, "each kernel shorter than this"),
            Param("min_gpu_share", 0.02, "chains' share of the window's GPU time")))

ELEMENTWISE_RE = re.compile(r"(vectorized_|unrolled_)?elementwise_kernel", re.I)


def detect(ctx: RuleContext) -> list[Finding]:
    a = ctx.kernels_in_stream_order
    if a.empty:
        return []
    names = a["name"]
    ok = (matches(names, ELEMENTWISE_RE) & ~matches(names, CAST_RE)
          & (a["dur"] < RULE.param("max_kernel_us") * 1e3)).to_numpy()
    stream = a["streamId"].to_numpy()
    dur = a["dur"].to_numpy(np.float64)
    crit = a["critical"].to_numpy(np.float64)
    # Runs of consecutive qualifying kernels on one stream, inside one iteration: back-to-back
    # calls of one expression are separate chains, not one long one.
    launched = a["api_start"].fillna(a["start"]).to_numpy(np.int64)
    it = np.searchsorted(iteration_bounds(ctx.run), launched, side="right")
    brk = np.ones(len(a), dtype=bool)
    brk[1:] = ~(ok[1:] & ok[:-1] & (stream[1:] == stream[:-1]) & (it[1:] == it[:-1]))
    run_id = np.cumsum(brk)
    n_min = int(RULE.param("min_chain"))
    # Per run of qualifying kernels: its length, time, longest kernel and critical time.
    rid = run_id[ok]
    n_runs = int(run_id.max()) + 1
    count = np.bincount(rid, minlength=n_runs)
    t_run = np.bincount(rid, weights=dur[ok], minlength=n_runs)
    c_run = np.bincount(rid, weights=(dur * crit)[ok], minlength=n_runs)
    longest = np.zeros(n_runs)
    np.maximum.at(longest, rid, dur[ok])
    chain = count >= n_min
    chains = int(chain.sum())
    total = float(t_run[chain].sum())
    saved = float((t_run - longest)[chain].sum())
    crit_ns = float(c_run[chain].sum())
    in_chain = np.zeros(len(a), dtype=bool)
    in_chain[np.flatnonzero(ok)] = chain[rid]
    members = {str(n) for n in names[in_chain].unique()}
    if not chains or total < RULE.param("min_gpu_share") * float(dur.sum()):
        return []
    op_gain = total / (total - saved)
    share = float(crit_ns / total)
    ev = {"chains": chains, "chain_kernel_ns": int(total), "critical_share": round(share, 3)}
    g, basis = 1.0, "no step model for this window: not priced"
    if ctx.model is not None:
        # The same edit as every compile price (profkit.run.step.fusion): the compiled code
        # around each chain fuses the run of fusible kernels that holds it, wherever it runs
        graph = ctx.model.graph
        chain_ops = ctx.graph_ops(a.iloc[np.flatnonzero(in_chain)])
        runs, new = inductor_fusion(graph, anywhere=True)
        hit = [i for i, r in enumerate(runs) if np.isin(r, chain_ops).any()]
        groups, ns = [runs[i] for i in hit], new[hit]
        before = float(sum(graph.g_dur[r].sum() for r in groups))
        its = max(len(graph.iter_call) - 1, 1)
        if groups and ns.sum() > 0:
            op_gain = before / float(ns.sum())
            ev["fused_runs"] = len(groups)
            # and, as every compile price, the compiled graphs' calls (one an iteration and one
            # after each blocking call, where a chain runs) at their host cost
            calls = np.unique(graph.g_call[np.concatenate(groups)])
            calls = calls[calls >= 0]
            dyn = shape_following_share(ctx, graph, calls)
            training = bool(backward_kernels(ctx) > 0)
            g, basis = ctx.price(lambda gr: compile_host(replace_ops(gr, groups, ns), calls, training, dyn,
                                                         ctx.host, ctx.replacements.module_calls()),
                                 f"the {len(groups)} runs of fusible kernels that hold the chains "
                                 f"({before / its / 1e6:.2f} ms per iteration) fused into one kernel "
                                 f"each at its bytes ({float(ns.sum()) / its / 1e6:.2f} ms), one launch each; "
                                 "each compiled graph's call at its host cost",
                                 cap=op_gain)
    return [Finding(RULE.code, RULE.name,
                    f"torch.compile the code around the {chains} chains of small elementwise kernels "
                    f"({chains / max(ctx.iterations, 1):.0f} per iteration): each becomes one kernel",
                    Rung.TORCH_COMPILE, ev, g, basis, g, op_gain, Scope.OPS, frozenset(members))]

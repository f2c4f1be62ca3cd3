"""PK401 eager-norm-fusion: add + RMSNorm / add + LayerNorm / bias + GELU / scale + softmax in eager.

What
    A residual add (or bias add, or a scale) immediately followed on the same stream by the norm
    (or GELU, or softmax) that reads its output: two kernels and an extra round trip of the
    activation through HBM. Also an RMSNorm composed of elementwise ops, as HF's
    ``LlamaRMSNorm`` writes it (to fp32, pow, mean, + eps, rsqrt, mul, to the input dtype,
    * weight): eight kernels, nine with the residual add before it.
Why
    The bundled kernels fuse each pair into one pass: ``kernels.add_rmsnorm`` (RMSNorm),
    ``kernels.add_layernorm`` (LayerNorm), ``kernels.bias_gelu``, ``kernels.softmax``. Which norm
    runs is read from the kernels, not the module name: PyTorch runs nn.RMSNorm through its layer
    norm kernel with the flag rms_norm=true (``vectorized_layer_norm_kernel<..., (bool)1>``), and
    HF names its RMSNorm modules ``input_layernorm``.
Evidence
    Kernel order per stream: the producer kernel (add / mul / div) directly before the consumer
    (layer-norm kernel, GELU, softmax), forward kernels only. A composed RMSNorm: a ``pow`` kernel,
    then a ``MeanOps`` reduction, then ``rsqrt`` within two kernels, with the cast before and the
    elementwise kernels after it (up to three) counted in; with an add directly before, the chain
    is ``kernels.add_rmsnorm``'s, without one ``F.rms_norm``'s (one kernel since PyTorch 2.9).
Fix
    The named bundled kernel (``from kernels import add_rmsnorm``); or ``torch.compile`` the block.
Expected gain
    Graph edit (``replace_ops``, a fusion): each producer -> consumer pair becomes one kernel of
    the pair's time x fused / eager passes over the activation (add+norm 5 -> 4, bias+GELU and
    softmax 4 -> 2), the second launch gone with its short dispatch. A composed RMSNorm: each
    chain becomes one kernel as long as its longest, its other launches gone. The step model
    replays the edited graph at the calibrated CPU scale; never above the op's own gain: the
    pair's kernels and the GPU's idle between them (up to one launch's latency, which the second
    kernel's absence removes too) over the fused kernel's time. On HF
    ``generate()`` decode (a host-bound Llama, 9 chains a token) the swap measured 1.60x without
    the profiler.
References
    profkit ``kernels/`` and analyses/fused_add_rmsnorm.md, fused_add_layernorm.md.
"""
from __future__ import annotations

import re

import numpy as np

from profkit.judge.advisor import FUSED_PASSES
from profkit.model import Rung
from profkit.judge.patterns import NormKind, norm_kind
from profkit.read.nsys import per_name
from profkit.judge.rules.base import (Finding, Param, RuleContext, RuleMeta, Scope, Table, matches,
                                removed_launch_cost)
from profkit.judge.rules.pk402_elementwise_chain import ELEMENTWISE_RE

RULE = RuleMeta(
    code="PK401", name="eager-norm-fusion",
    summary="add+RMSNorm / add+LayerNorm / bias+GELU / softmax in eager: the bundled fused kernels",
    tables=(Table.KERNEL,), example="traces/model_tiny_llama.sqlite.xz",
    quiet_on="traces/fused_add_rmsnorm_cuda.sqlite.xz",
    params=(Param("min_pairs_per_iteration", 1, "pairs per iteration"),
            Param("dispatch_gap_us", 50.0, "host gaps before a removed launch shorter than this "
                  "are dispatch, removed with it"),
            Param("fused_call_us", 20.0, "host cost of one fused call (kernels.add_rmsnorm, "
                  "backend auto, plain launches: 15-21 us at decode shapes on H200)")))

NORM_RE = re.compile(r"layer_norm_kernel|LayerNormForward|rms_?norm\w*kernel", re.I)
GELU_RE = re.compile(r"GeluCUDAKernel|gelu_kernel", re.I)
SOFTMAX_RE = re.compile(r"SoftMaxForward(?!.*LogSoftMax)|softmax_warp_forward", re.I)
ADD_RE = re.compile(r"CUDAFunctor_add|AddFunctor|add_kernel|CUDAFunctorOnSelf_add", re.I)
SCALE_RE = re.compile(r"MulFunctor|DivFunctor|div_true", re.I)
BACKWARD_RE = re.compile(r"backward|grad", re.I)
# The kernels of an RMSNorm composed of elementwise ops (HF LlamaRMSNorm, T5LayerNorm).
POW_RE = re.compile(r"pow_tensor_scalar|PowFunctor|pow_kernel", re.I)
MEAN_RE = re.compile(r"MeanOps", re.I)
RSQRT_RE = re.compile(r"rsqrt", re.I)
COPY_RE = re.compile(r"copy_kernel", re.I)
MAX_TAIL = 3  # kernels after rsqrt: * rsqrt, cast back, * weight


def _consumer(name: str) -> str | None:
    if BACKWARD_RE.search(name):
        return None
    if NORM_RE.search(name):
        return "add_layernorm" if norm_kind([name]) is NormKind.LAYER else "add_rmsnorm"
    if GELU_RE.search(name):
        return "bias_gelu"
    if SOFTMAX_RE.search(name):
        return "softmax"
    return None


def detect(ctx: RuleContext) -> list[Finding]:
    a = ctx.kernels_in_stream_order
    names = a["name"]
    dur = a["dur"].to_numpy(np.float64)
    start, end = a["start"].to_numpy(np.float64), a["end"].to_numpy(np.float64)
    crit = a["critical"].to_numpy(np.float64)
    stream = a["streamId"].to_numpy()
    found: dict[str, list] = {}
    if len(a) > 1:
        # Names are classified once each; pairs are then found with array comparisons.
        consumer = per_name(names, _consumer)
        is_add, is_scale = matches(names, ADD_RE), matches(names, SCALE_RE)
        same = np.zeros(len(a), dtype=bool)
        same[1:] = stream[1:] == stream[:-1]
        prev_add = np.zeros(len(a), dtype=bool)
        prev_add[1:] = is_add[:-1]
        prev_scale = np.zeros(len(a), dtype=bool)
        prev_scale[1:] = is_scale[:-1]
        for kern in ("add_layernorm", "add_rmsnorm", "bias_gelu", "softmax"):
            prod = prev_scale if kern == "softmax" else prev_add
            idx = np.flatnonzero((consumer == kern) & same & prod)
            if len(idx):
                found[kern] = idx.tolist()
    out = [f for f in (_composed_rmsnorm(ctx),) if f is not None]
    for kern, idx in found.items():
        per_it = len(idx) / max(ctx.iterations, 1)
        if per_it < RULE.param("min_pairs_per_iteration"):
            continue
        both = np.concatenate([np.array(idx), np.array(idx) - 1])
        total = float(dur[both].sum())
        eager, fused = FUSED_PASSES[kern]
        # The pair's own gain on the GPU: its two kernels and the gap between them, up to one
        # kernel launch's latency (what the GPU idles between back-to-back kernels, gone with the
        # second kernel), against one kernel of fused/eager of their bytes. The bytes alone
        # (5/4) were below what the step model rightly priced on a GPU-bound micro-benchmark
        # (1.26x); a longer gap is the CPU's, which the step model prices, not the op.
        ix = np.asarray(idx, dtype=np.int64)
        gap = start[ix] - end[ix - 1]
        own = total + float(np.clip(gap, 0.0, ctx.prof.peaks.launch_floor_ns).sum())
        op_gain = own / (total * fused / eager) if total else eager / fused
        share = float((dur[both] * crit[both]).sum() / total) if total else 0.0
        pos = np.stack([ix - 1, ix], axis=1).ravel()
        g, basis = ctx.price_fusion(a[["start", "correlationId"]].iloc[pos], np.repeat(np.arange(len(idx)), 2),
                                    ((dur[ix - 1] + dur[ix]) * fused / eager).tolist(),
                                    f"pairs {ctx.per_iteration(total)} x {fused}/{eager}, one launch each",
                                    cap=op_gain)
        out.append(Finding(RULE.code, RULE.name,
                           f"fuse the {len(idx)} producer -> consumer pairs into the bundled kernel "
                           f"kernels.{kern} ({eager} passes over HBM become {fused})", Rung.TRITON,
                           {"kernel": kern, "pairs": len(idx), "pair_kernel_ns": int(total),
                            "critical_share": round(share, 3)}, g,
                           basis, g,
                           op_gain, Scope.OPS, frozenset(names.iloc[both].astype(str).tolist())))
    return out


def _composed_chains(a) -> tuple[list[tuple[int, int]], np.ndarray]:
    """(first, last) kernel index of each composed RMSNorm in ``a`` (stream order), and a mask of
    the chains whose kernel before is a residual add on the same stream."""
    names = a["name"]
    stream = a["streamId"].to_numpy()
    pow_, mean, rsq = matches(names, POW_RE), matches(names, MEAN_RE), matches(names, RSQRT_RE)
    copy, elem = matches(names, COPY_RE), matches(names, ELEMENTWISE_RE)
    is_add = matches(names, ADD_RE)
    n = len(a)
    chains, with_add = [], []
    for m in np.flatnonzero(mean):
        if m < 1 or not pow_[m - 1] or stream[m - 1] != stream[m]:
            continue
        r = next((j for j in (m + 1, m + 2) if j < n and rsq[j] and stream[j] == stream[m]), None)
        if r is None:
            continue
        first = m - 1
        if first >= 1 and copy[first - 1] and stream[first - 1] == stream[m]:
            first -= 1  # the cast to fp32
        last = r
        while last + 1 < n and last - r < MAX_TAIL and elem[last + 1] and stream[last + 1] == stream[m] \
                and not pow_[last + 1]:
            last += 1
        add = first >= 1 and is_add[first - 1] and stream[first - 1] == stream[m]
        chains.append((first - 1 if add else first, last))
        with_add.append(add)
    return chains, np.array(with_add, dtype=bool)


def _composed_rmsnorm(ctx: RuleContext) -> Finding | None:
    a = ctx.kernels_in_stream_order
    if len(a) < 4:
        return None
    chains, with_add = _composed_chains(a)
    per_it = len(chains) / max(ctx.iterations, 1)
    if not chains or per_it < RULE.param("min_pairs_per_iteration"):
        return None
    dur = a["dur"].to_numpy(np.float64)
    crit = a["critical"].to_numpy(np.float64)
    member = np.zeros(len(a), dtype=bool)
    saved = longest_total = 0.0
    for first, last in chains:
        member[first:last + 1] = True
        span = dur[first:last + 1]
        saved += float(span.sum()) - float(span.max())
        longest_total += float(span.max())
    total = float(dur[member].sum())
    share = float((dur * crit)[member].sum() / total) if total else 0.0
    # CPU: every launch of a chain with its short dispatch gap goes; one fused call per chain
    # comes back (its host cost is a measured parameter, not a launch of the trace).
    cpu_chains = removed_launch_cost(a, member, RULE.param("dispatch_gap_us") * 1e3)
    cpu_removed = max(cpu_chains - len(chains) * RULE.param("fused_call_us") * 1e3, 0.0)
    op_gain = total / longest_total if longest_total else 1.0
    pos = np.concatenate([np.arange(first, last + 1) for first, last in chains])
    gid = np.concatenate([np.full(last - first + 1, k) for k, (first, last) in enumerate(chains)])
    g, basis = ctx.price_fusion(a.iloc[pos], gid, [float(dur[first:last + 1].max()) for first, last in chains],
                                f"each chain one kernel as long as its longest, "
                                f"{ctx.per_iteration(total)} -> {ctx.per_iteration(longest_total)}",
                                cap=op_gain)
    n_add = int(with_add.sum())
    per = max(ctx.iterations, 1)
    kern = "kernels.add_rmsnorm" if n_add else "torch.nn.functional.rms_norm"
    what = (f"{n_add} residual add + composed RMSNorm chains into the bundled kernel kernels.add_rmsnorm"
            + (f" and {len(chains) - n_add} composed RMSNorms into torch.nn.functional.rms_norm"
               if n_add < len(chains) else "")) if n_add else \
        f"{len(chains)} composed RMSNorms into torch.nn.functional.rms_norm (one kernel each)"
    return Finding(RULE.code, RULE.name,
                   f"fuse the {what} (HF LlamaRMSNorm-style: to fp32, pow, mean, rsqrt, mul, cast, "
                   f"* weight, {int(member.sum()) / len(chains):.0f} kernels each)",
                   Rung.TRITON if n_add else Rung.LIBRARY,
                   {"kernel": "add_rmsnorm" if n_add else "rms_norm", "composed": True,
                    "chains": len(chains), "with_add": n_add, "chain_kernel_ns": int(total),
                    "launches": int(member.sum()), "cpu_removed_ns": int(cpu_removed),
                    "critical_share": round(share, 3)}, g,
                   f"chains {ctx.per_iteration(total)} -> their longest kernels "
                   f"{ctx.per_iteration(longest_total)}; {int(member.sum()) / per:.0f} launches per "
                   f"iteration with their dispatch {ctx.per_iteration(cpu_chains)} -> one {kern} call "
                   f"per chain ({RULE.param('fused_call_us'):.0f} us each); {basis}", g, op_gain, Scope.OPS,
                   frozenset(a["name"].iloc[np.flatnonzero(member)].astype(str).tolist()))

"""profkit's rule catalogue: one module per rule, each with a stable code and an explanation.

    >>> from profkit.judge.rules import RULES, evaluate
    >>> [r.RULE.code for r in RULES]

Rules are judging code: they read the trace and the run summary (profkit.read.trace, profkit.run.window,
profkit.run.summary) and return Findings; nothing in the reading layers imports them. ``evaluate`` runs
every rule on one Profile and ranks the findings by expected gain on wall time.
"""
from __future__ import annotations

import inspect
from types import ModuleType
from typing import TYPE_CHECKING, Collection, Optional

from profkit.errors import ProfkitError
from profkit.judge.rules import (pk101_per_step_sync, pk102_data_loading, pk103_host_overhead,
                           pk104_pageable_copy, pk105_allocator_churn, pk106_rnn_cell_loop,
                           pk107_repeated_unit_loop, pk108_code_load_per_step,
                           pk109_host_tensor_compute, pk110_request_at_a_time,
                           pk201_unfused_optimizer, pk202_autocast_recast,
                           pk203_fp32_logits_loss, pk204_recomputed_forward, pk205_accumulation_micro_batches,
                           pk206_unstepped_backward, pk207_invariant_recompute,
                           pk208_per_step_decomposition,
                           pk301_attention_path, pk302_fp32_gemm,
                           pk303_gemm_shape, pk304_gemm_alignment, pk305_fp32_conv, pk306_fp64_compute,
                           pk307_underfilled_grid,
                           pk401_eager_norm_fusion,
                           pk402_elementwise_chain, pk403_inference_bn_fold, pk501_nccl_exposed,
                           pk502_accumulation_allreduce)
from profkit.judge.rules.base import Finding, ProfileView, RuleContext, RuleMeta, Scope, TrialOf

if TYPE_CHECKING:
    from profkit.run.summary import RunSummary

RULES: tuple[ModuleType, ...] = (
    pk101_per_step_sync, pk102_data_loading, pk103_host_overhead, pk104_pageable_copy,
    pk105_allocator_churn, pk106_rnn_cell_loop, pk107_repeated_unit_loop, pk108_code_load_per_step,
    pk109_host_tensor_compute, pk110_request_at_a_time,
    pk201_unfused_optimizer, pk202_autocast_recast, pk203_fp32_logits_loss, pk204_recomputed_forward,
    pk205_accumulation_micro_batches, pk206_unstepped_backward, pk207_invariant_recompute, pk208_per_step_decomposition,
    pk301_attention_path, pk302_fp32_gemm, pk303_gemm_shape, pk304_gemm_alignment, pk305_fp32_conv,
    pk306_fp64_compute, pk307_underfilled_grid, pk401_eager_norm_fusion, pk402_elementwise_chain, pk403_inference_bn_fold, pk501_nccl_exposed,
    pk502_accumulation_allreduce)

__all__ = ["RULES", "Finding", "ProfileView", "RuleContext", "RuleMeta", "Scope", "TrialOf", "evaluate", "get",
           "explain"]


def get(code_or_name: str) -> ModuleType:
    """A rule module by code (PK101) or name (per-step-sync), case-insensitive."""
    key = code_or_name.strip().lower()
    for mod in RULES:
        if key in (mod.RULE.code.lower(), mod.RULE.name):
            return mod
    raise ProfkitError(f"no rule {code_or_name!r}: `profkit rules` lists them")


def explain(code_or_name: str) -> str:
    """The rule's reasoning: its module docstring, with its metadata."""
    mod = get(code_or_name)
    m = mod.RULE
    params = "".join(f"\n    {p.name} = {p.default:g}: {p.help}" for p in m.params) or " none"
    return (inspect.getdoc(mod).rstrip() + "\n\nTables\n    " + ", ".join(t.value for t in m.tables)
            + "\nParameters" + params + f"\nFires on\n    {m.example}"
            + (f"\nQuiet on\n    {m.quiet_on}" if m.quiet_on else "") + "\n")


def evaluate(prof: ProfileView, run: RunSummary, codes: Optional[Collection[str]] = None) -> list[Finding]:
    """Every rule's findings on one profile (the facade's Profile, seen as a ProfileView), best
    expected gain on wall time first; ``codes``: those rules' alone (rules are independent of
    each other, so their findings are the same as in the full evaluation)."""
    ctx = RuleContext(prof, run)
    out: list[Finding] = []
    for mod in RULES:
        if codes is not None and mod.RULE.code not in codes:
            continue
        ctx.priced = []
        found = mod.detect(ctx)
        for f in found:
            # The edit whose replay gave the finding its gain (a rule prices several variants
            # and keeps one), for pricing findings together (profkit.judge.combine).
            if f.edit is None:
                f.edit = next((e for g, e in reversed(ctx.priced)
                               if abs(g - f.expected_end_to_end_speedup) < 1e-12), None)
            # the rule's first trial measures the finding's own price, unless the finding says
            # that switch cannot run the program (then no switch measures it)
            if (f.switch is None and mod.RULE.trials
                    and mod.RULE.trials[0].switch not in f.evidence.get("trials_refused", ())):
                f.switch = mod.RULE.trials[0].switch
        ctx.found[mod.RULE.code] = found
        out.extend(found)
    return sorted(out, key=lambda f: -f.expected_end_to_end_speedup)

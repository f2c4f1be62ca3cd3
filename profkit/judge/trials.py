"""Trials and the rules: which switches ``profkit capture --try auto`` runs on a trace, and which
measured trial speaks for which finding.

Each rule that a switch can try lists its trials in its metadata (``RULE.trials``,
profkit.judge.rules.base.TrialOf): the switch that measures the finding's own price comes first
unless the finding names another (``Finding.switch``: PK103's torch.compile of a GPU-paced step,
PK305's channels_last alone), and the others measure variants the rule priced in its evidence
(PK302's ``bf16_speedup``). ``--try auto`` runs, for every rule that fired, best price first, the
trials its metadata lists but those its finding refuses (evidence ``trials_refused``); and
``cudnn_benchmark`` where convolutions take CONV_SHARE of the window's kernel time or more, and
``freeze_unstepped`` where the capture's op record found parameters holding gradients that no
optimizer steps (profkit.capture.unstepped; PK206 prices it where the record also holds the
optimizers' parameters), ``no_anomaly`` where it ran under autograd's anomaly detection, and
``inference_mode`` where its record saw inputs requiring gradients in an iteration with no
backward (inference with autograd left on), which no rule prices.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from profkit.judge import rules
from profkit.judge.rules.base import Finding, RuleContext, kernel_share
from profkit.judge.rules.pk302_fp32_gemm import CONV_RE
from profkit.model import Switch
from profkit.run.replacements import backward_launched

if TYPE_CHECKING:
    from profkit.judge.rules.base import ProfileView
    from profkit.run.summary import RunSummary
    from profkit.run.trials import TrialResult

CONV_SHARE = 0.2


def auto_trials(findings: list[Finding], prof: "ProfileView", run: "RunSummary") -> list[str]:
    """The trials ``--try auto`` runs for a profile's ``findings`` (see the module docstring), in
    order; ``prof`` and ``run`` give the convolutions' share of the window."""
    out: list[str] = []
    for f in sorted(findings, key=lambda f: -f.expected_end_to_end_speedup):
        meta = rules.get(f.code).RULE
        out += [f.switch] if f.switch else []
        # a switch the finding says cannot run the program (PK103's reduce-overhead on a step
        # that accumulates gradients) would spend a run on a known failure
        refused = set(f.evidence.get("trials_refused", ()))
        out += [t.switch for t in meta.trials if t.switch not in refused]
    ctx = RuleContext(prof, run)
    if conv_share(ctx) >= CONV_SHARE:
        out.append(Switch.CUDNN_BENCHMARK.value)
    if ctx.replacements.recorded("unstepped"):
        out.append(Switch.FREEZE_UNSTEPPED.value)
    if ctx.replacements.recorded("anomaly"):
        out.append(Switch.NO_ANOMALY.value)
    if ctx.replacements.autograd_at_inference(lambda: backward_launched(prof.full_trace)):
        out.append(Switch.INFERENCE_MODE.value)
    return list(dict.fromkeys(out))


def conv_share(ctx: RuleContext) -> float:
    """The convolution kernels' share of the window's kernel time."""
    return kernel_share(ctx, CONV_RE)


def model_price(finding: Finding, trial: str) -> Optional[float]:
    """The model's price of what ``trial`` measures, from ``finding``: its own gain where the
    trial is its switch (or, where its number is a fix no switch tries, the price of what its
    switch does: evidence ``switch_speedup``), else the variant of its evidence the rule names
    for the trial."""
    if finding.switch == trial:
        return float(finding.evidence.get("switch_speedup", finding.expected_end_to_end_speedup))
    for t in rules.get(finding.code).RULE.trials:
        if t.switch == trial and t.evidence and isinstance(finding.evidence.get(t.evidence), (int, float)):
            return float(finding.evidence[t.evidence])
    return None


def tried_of(findings: list[Finding], results: list["TrialResult"]) -> dict[str, "TrialResult"]:
    """Per finding code, the trial that measured its price (its ``switch``'s); where two findings
    name one switch (PK103's default-mode compile of a GPU-paced step, PK402's compile of the
    chains), the trial speaks for the better-priced one alone: one measurement, one action."""
    by_switch = {t.switch: t for t in results}
    out: dict[str, "TrialResult"] = {}
    taken: set[str] = set()
    for f in sorted(findings, key=lambda f: -f.expected_end_to_end_speedup):
        if f.switch in by_switch and f.switch not in taken:
            out[f.code] = by_switch[f.switch]
            taken.add(f.switch)
    return out


def variants_measured(findings: list[Finding], results: list["TrialResult"]) -> dict[str, list["TrialResult"]]:
    """Per finding code, the measured trials of the other fixes its action offers, each with a
    switch of its own (PK302's bf16 beside its TF32), best first. A trial that measures another
    finding's own price (PK402's compile, beside PK103's default-mode variant) speaks for that one."""
    owned = {f.switch for f in findings if f.switch}
    by_switch = {t.switch: t for t in results if t.measured and t.switch not in owned}
    out: dict[str, list] = {}
    for f in findings:
        # only the variants this finding priced (its evidence holds their key): a variant the
        # rule prices on other programs is not a fix this action offers
        got = [by_switch[t.switch] for t in rules.get(f.code).RULE.trials
               if t.switch != f.switch and t.evidence and t.switch in by_switch
               and isinstance(f.evidence.get(t.evidence), (int, float))]
        if got:
            out[f.code] = sorted(got, key=lambda t: -float(t.speedup))
    return out


def trials_json(findings: list[Finding], results: list["TrialResult"],
                actions: list[dict]) -> list[dict]:
    """``run.trials``: every trial, with the model's price of what it measured where a finding
    has one (``model``, from the finding ``code``) and the rank of the action it is shown beside
    (``action``, 1-based among ``actions``; None: shown in the run summary's ``tried`` lines)."""
    shown = {a["tried"]["switch"]: i for i, a in enumerate(actions, 1) if a.get("tried")}
    out = []
    for t in results:
        # The finding whose own price the trial measures first, then the variants, best first
        ranked = sorted(findings, key=lambda f: (f.switch != t.switch, -f.expected_end_to_end_speedup))
        src = next(((f, p) for f in ranked if (p := model_price(f, t.switch)) is not None), None)
        out.append({**t.as_dict(), "code": src[0].code if src else None,
                    "model": round(src[1], 3) if src else None, "action": shown.get(t.switch)})
    return out

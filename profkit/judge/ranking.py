"""The actions a report lists: the rules' findings and the op table's suggestions that pay, each
counted once, ranked as the run summary ranks them."""
from __future__ import annotations

from typing import Optional

import pandas as pd

from profkit.run.summary import MIN_ACTION_GAIN, rank_actions


def ranked_actions(findings: list, ops: Optional[pd.DataFrame] = None,
                   tried: Optional[dict] = None, variants: Optional[dict] = None) -> list[dict]:
    """Rule findings and op-level suggestions that pay, ranked as the run summary ranks them: by
    expected gain on wall time, the cheaper of two within 5% first.

    One action is counted once: an op row whose GPU work is mostly kernels a finding already
    claims (the rule speaks for them, e.g. the foreach optimizer kernels under an `optimizer`
    range), or whose action text repeats one already listed, is left out.

    ``tried``: per finding code, the trial that measured its price (``profkit capture --try``,
    profkit.run.trials.TrialResult): the action carries it as ``tried``, and is ranked by the
    measured gain where the trial applied and timed one, by the model's price otherwise (a
    finding priced under MIN_ACTION_GAIN is listed all the same where its trial measured a gain:
    _measured_gain). An
    action that offers a second fix no trial switches on (``untried_alternative_speedup`` in its
    evidence: PK103's CUDA graphs by hand beside its compiled number) is ranked by the better of
    the measured gain and that fix's price: the trial measured one of its two fixes. An action
    whose trial failed (the program raised under its switch: TrialResult.failed) is ranked after
    every action that can pay, by the price of the second fix it offers where it has one: an
    FNO's torch.compile, priced 1.31x, failed on its complex tensors. A trial that
    left part of the program as it was (``left_out``: a compile of one of the several modules the
    program calls) measured part of the fix: the action is ranked by the better of it and its
    price.
    ``variants``: per finding code, the measured trials of the other fixes its action offers
    (PK302's bf16 beside its TF32), best first: the action is ranked by the better of the best of
    them and its own trial (or, untried, its price), and carries them as ``tried_variants``, so
    that the line says why it ranks where it does: a Conformer's fp32 GEMMs, TF32 tried 1.35x and
    bf16 1.62x, had ranked under channels_last+bf16 tried 1.49x.
    """
    tried = tried or {}
    variants = variants or {}
    actions = []
    for f in findings:
        t = tried.get(f.code)
        if f.expected_end_to_end_speedup < MIN_ACTION_GAIN and not _measured_gain(t, variants.get(f.code)):
            continue
        a = f.as_action()
        if t is not None:
            # (as_dict keeps why a trial never ran: else it would read as "not applied")
            a["tried"] = t.as_dict()
            if "switch_speedup" in f.evidence:
                # the trial ran another fix than the number's: its own price said beside it
                a["tried"]["model"] = float(f.evidence["switch_speedup"])
            if t.failed:
                # the program failed under the fix's switch: the price is of a fix that does not
                # run it as it is, ranked after those that do (a second fix it offers keeps its own)
                a["_rank_gain"] = max(1.0, float(f.evidence.get("untried_alternative_speedup", 1.0)))
            elif t.measured:
                a["_rank_gain"] = max(float(t.speedup), float(f.evidence.get("untried_alternative_speedup", 0.0)),
                                      # a trial that reached part of the program measured part of the fix
                                      float(f.expected_end_to_end_speedup) if t.left_out else 0.0)
        if variants.get(f.code):
            best = float(variants[f.code][0].speedup)
            a["_rank_gain"] = max(a.get("_rank_gain", float(f.expected_end_to_end_speedup)), best)
            a["tried_variants"] = [v.as_dict() for v in variants[f.code]]
        actions.append(a)
    claimed = set().union(*(f.kernels for f in findings)) if findings else set()
    seen = {a["action"] for a in actions}
    if ops is not None and len(ops):
        worth = ops[ops["worth_it"].astype(bool)]
        for name, row in worth.iterrows():
            kernels = ops.attrs.get("kernels_of", {}).get(name, {name})
            # (a latency-bound op's time is mostly its small-grid kernels: a finding that claims
            # one of its kernels, PK307's, speaks for it)
            latency = row.get("class") == "latency" and bool(kernels & claimed)
            if name in claimed or (kernels and len(kernels & claimed) * 2 >= len(kernels)) \
                    or row["action"] in seen or latency:
                continue
            seen.add(row["action"])
            actions.append({"rule": f"op:{row['rung']}", "action": f"{name}: {row['action']}",
                            "expected_end_to_end_speedup":
                                round(float(row["expected_end_to_end_speedup"]), 3),
                            "basis": row["basis"]})
    # The run summary's order: op suggestions carry their rung in "rule".
    out = rank_actions(actions, lambda a: a.get("_rank_gain", a["expected_end_to_end_speedup"]),
                       lambda a: a.get("rung") or a["rule"].removeprefix("op:"))
    for a in out:
        a.pop("_rank_gain", None)
    return out


def _measured_gain(trial, variants) -> bool:
    """Whether a finding priced under MIN_ACTION_GAIN is an action all the same: its trial (or a
    trial of another fix it offers) measured a gain of at least MIN_ACTION_GAIN, every run of it
    (its range's low end) a gain. The model missed a gain the program showed (a float64 GP's
    CUDA graph, priced 1.00x, its compile_graphs trial 1.17x): the action is listed, ranked by it."""
    for t in ([trial] if trial is not None else []) + list(variants or []):
        if t.measured and float(t.speedup) >= MIN_ACTION_GAIN and (t.lo is None or float(t.lo) > 1.0):
            return True
    return False

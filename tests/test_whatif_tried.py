"""The what-if page's trials section: profkit's own trial of a fix beside the same fix applied by
hand (scripts/whatif/tried.py)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from whatif import registry, tried  # noqa: E402

from profkit.model import parse_trial  # noqa: E402


def test_every_compared_pair_is_registered_and_every_switch_exists():
    pairs = {(p["name"], f) for p in registry.PROGRAMS for f in p.get("fixes", {})}
    assert set(tried.SWITCH_OF) <= pairs
    for switch in set(tried.SWITCH_OF.values()):
        parse_trial(switch)  # raises on a name --try does not know


def _trial(switch, speedup, applied=True, runs=2, error=None):
    return {"switch": switch, "speedup": speedup, "runs": runs, "lo": speedup and speedup * 0.98,
            "hi": speedup and speedup * 1.02, "applied": applied, "error": error, "note": "",
            "warm_up_s": None}


def test_a_trial_is_compared_only_with_the_fix_it_does_and_counted_within_five_percent():
    pairs = [{"program": "recsys_embbag_train", "fix": "fused_adam", "measured": 1.80, "predicted": 1.7},
             {"program": "recsys_embbag_train", "fix": "sparse", "measured": 4.0, "predicted": 3.0},
             {"program": "recsys_embbag_train", "fix": "bf16", "measured": 1.00, "predicted": 1.0},
             {"program": "moe_routing_train", "fix": "fused_adamw", "measured": 1.10, "predicted": 1.1}]
    tried.attach(pairs[:3], [_trial("fused_optim", 1.85), _trial("bf16", 1.2)])
    tried.attach(pairs[3:], [_trial("fused_optim", None, applied=False)])
    assert [r["tried"] and r["tried"]["switch"] for r in pairs] == ["fused_optim", None, "bf16", "fused_optim"]
    text = "\n".join(tried.lines(pairs))
    # 1.85 against 1.80 is within 5%; 1.2 against 1.00 is not; the unapplied trial has no gain
    assert "Within ±5%: **1 of 2** trials that timed a gain" in text
    assert "| recsys_embbag_train | fused_adam | fused_optim | 1.85x (2 runs, 1.81-1.89x) | 1.80x | +3% | 1.70x |" in text
    assert "| moe_routing_train | fused_adamw | fused_optim | not applied | 1.10x | - | 1.10x |" in text
    assert "sparse" not in text


def test_no_section_without_a_trial():
    pairs = [{"program": "train_llama", "fix": "fused", "measured": 1.06, "predicted": 1.04}]
    tried.attach(pairs, [])
    assert tried.lines(pairs) == []

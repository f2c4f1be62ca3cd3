"""Judging: work counts, evidence, bound classes, advice, and the rule catalogue (profkit.judge.rules)."""

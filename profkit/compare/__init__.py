"""Comparing: before/after (diff) and one trace per rank (multirank)."""

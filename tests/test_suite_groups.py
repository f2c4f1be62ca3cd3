"""The parallel run keeps tests that share a module fixture in one worker (conftest.py): a check
that the grouping took effect, since pytest-xdist applies it by renaming each grouped test."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def shared_value() -> int:
    return 1


def test_grouped_tests_carry_their_group(request, shared_value):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist workers with --dist loadgroup")
    assert request.node.nodeid.endswith("@module:tests/test_suite_groups.py"), request.node.nodeid

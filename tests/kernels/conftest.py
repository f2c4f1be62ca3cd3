"""Kernel tests: a fresh random seed per test (printed on failure), torch optional."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

torch = pytest.importorskip("torch", reason='the kernel tests need torch: pip install -e ".[kernels,test]"')


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Seed from os.urandom so every run sees new inputs; the seed is reported if the test fails."""
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            rep.sections.append(("kernel test seed", f"torch.manual_seed({seeds[0]})"))

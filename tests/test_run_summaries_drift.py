"""analyses/run_summaries.md is what scripts/pages/make_run_summaries.py makes from traces/real now."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_run_summaries_page_is_current():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "pages" / "make_run_summaries.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr

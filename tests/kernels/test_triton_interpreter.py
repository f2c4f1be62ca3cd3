"""The Triton kernels through Triton's CPU interpreter (TRITON_INTERPRET=1), in a subprocess so the
variable is set before triton is imported and does not leak into other tests."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason='the Triton backend tests need triton: pip install -e ".[kernels,test]"')

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.long
@pytest.mark.parametrize("parts", ["float32 special", "bfloat16 float16"])
def test_triton_kernels_in_interpreter(parts):
    # two subprocesses, so parallel test workers share the interpreter's time
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(HERE, "_triton_interp_cases.py"), *parts.split()],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    m = re.search(r"triton interpreter: (\d+) cases, 0 failures", r.stdout)
    assert m and int(m.group(1)) >= 6, r.stdout

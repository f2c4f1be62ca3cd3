#!/usr/bin/env python3
"""The what-if corpus's commands: its registry, the harness that times every (program, fix) pair
without a profiler, and ``analyses/whatif.md``. The work is in the package ``scripts/whatif/``,
one module per phase (its ``__init__`` lists them).

    python3 scripts/whatif_accuracy.py list [--variants | --capture [--fixed] | --multirank]
    python3 scripts/whatif_accuracy.py capture-ranks OUTDIR [--programs a,b] [--budget SECONDS] [--dry-run]
    python3 scripts/whatif_accuracy.py measure OUTDIR [--programs a,b] [--fixes f,g] [--reps 3] [--budget SECONDS]
    python3 scripts/whatif_accuracy.py interleave OUTDIR [--programs a,b] [--reps 3] [--rounds 15] [--budget SECONDS]
    python3 scripts/whatif_accuracy.py table OUTDIR/measured.json
    python3 scripts/whatif_accuracy.py merge OUTDIR/measured.json --folder LABEL
    python3 scripts/whatif_accuracy.py page [--check]
"""
from __future__ import annotations

import signal

from whatif.cli import main

if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    main()

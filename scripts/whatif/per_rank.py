"""Start a command with every ``{RANK}`` in its arguments replaced by this process's rank (the
``RANK`` that torchrun sets; 0 without it): each rank's own output names when a launcher starts
one command per rank (``torchrun --no-python python3 scripts/whatif/per_rank.py nsys profile -o
OUT/rank{RANK} ...``). Imports nothing beyond the standard library.

    python3 scripts/whatif/per_rank.py COMMAND [ARG...]
"""
from __future__ import annotations

import os
import sys


def command(argv: list[str], rank: str) -> list[str]:
    return [a.replace("{RANK}", rank) for a in argv]


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    cmd = command(argv, os.environ.get("RANK", "0"))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The benchmark run behind analyses/kernels_h200.md: reading its CSV (scripts/bench/bench_kernels.py's
output), what the page compares in it (our backends, the peers, the decode shapes, the targets),
what backend="auto" runs for each shape, and the number formats the page's cells use.

What ``auto`` runs is asked of the bundled kernels' own rules (``kernels/ops.py``), imported when
first needed, from the repository root that make_kernels_page.py puts on the path.
"""
from __future__ import annotations

import csv
import gzip
import lzma
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "analyses" / "data" / "bench_kernels_h200.csv.xz"

OURS = ("auto", "cuda", "triton")            # what the package ships (cuda_v0 = the previous launch config)
PEERS = ("liger", "compile")
DECODE_ROWS = 64                             # shapes with <= 64 rows are the decode shapes
LARGE = ("4096x4096", "16384x4096", "65536x8192")
DECODE_FACTOR = 1.3
BW_TARGET = 90.0


def _f(x: str) -> float:
    return float(x) if x not in ("", None) else float("nan")


def load(path: Path) -> tuple[list[dict], str, str]:
    """(rows of the CSV, the run's environment line, the run's table) for a CSV or a run folder."""
    path = Path(path)
    csv_path = path / "bench_kernels.csv" if path.is_dir() else path
    # the committed runs' CSVs are kept compressed (their .md beside them is not)
    md_path = csv_path.with_name(csv_path.name.removesuffix(".xz").removesuffix(".gz")).with_suffix(".md")
    opener = {".xz": lzma.open, ".gz": gzip.open}.get(csv_path.suffix, open)
    with opener(csv_path, "rt", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for k in ("median_us", "gbps", "pct_copy", "host_us", "best_peer_us", "speedup_vs_best_peer"):
            r[k] = _f(r.get(k, ""))
        r["tokens"], r["hidden"] = int(r["tokens"]), int(r["hidden"])
    table = md_path.read_text() if md_path.exists() else ""
    env = table.splitlines()[0].lstrip("# ").strip() if table else "(no environment line: the .md beside the CSV is missing)"
    return rows, env, table


def empty_us(env: str) -> float:
    """The empty kernel's GPU µs per call, from the run's environment line."""
    m = re.search(r"empty kernel ([0-9.]+) µs", env)
    if not m:
        raise SystemExit("make_kernels_page: the run's table has no empty-kernel time "
                         "(re-run scripts/bench/bench_kernels.py)")
    return float(m.group(1))


def launch_defaults() -> str:
    from kernels import _build

    return ", ".join(f"{op} {v}" for op, v in _build.LAUNCH_DEFAULTS.items())


def auto_backend(op: str, rows: int, n: int) -> str:
    """What backend="auto" runs for a CUDA tensor of rows x n in this benchmark's GPU timings, which
    replay CUDA graphs: kernels/ops.py graph_backend."""
    from kernels import ops

    return ops.graph_backend(op, rows, n)


def eager_backend(op: str, rows: int, n: int) -> str:
    """What backend="auto" runs for the same tensor in eager code (the host-cost column):
    kernels/ops.py choose_backend's shape rule."""
    from kernels import ops

    return "triton" if ops.triton_by_shape(op, rows, n) else "cuda"


def min_elems() -> str:
    from kernels import ops

    m = ops._TRITON_MIN_ELEMS
    return f"{m // 2**20} Mi" if m % 2**20 == 0 else str(m)


def own_best(by: dict, op: str, shape: str) -> tuple[str, float]:
    """(impl, GPU µs) of the fastest of our backends for op at shape; `by` maps (op, shape, impl) to rows."""
    r = min((by[(op, shape, i)] for i in OURS if (op, shape, i) in by), key=lambda r: r["median_us"])
    return r["impl"], r["median_us"]


def fmt_x(v: float) -> str:
    return f"{v:.2f}x"


def fmt_us(v: float) -> str:
    return f"{v:.2f}"


def ahead(ratio: float) -> bool:
    """At or ahead, unrounded: a cell printed 1.00x may still be behind (its line says by how much)."""
    return ratio >= 1.0


#!/usr/bin/env python3
"""Write analyses/kernels_h200.md from a benchmark run's data (scripts/bench/bench_kernels.py output).

    python scripts/pages/make_kernels_page.py                  # the committed run: analyses/data/bench_kernels_h200.csv.xz
    python scripts/pages/make_kernels_page.py PATH             # a CSV, or a run's folder holding bench_kernels.csv
    python scripts/pages/make_kernels_page.py --check [PATH]   # exit 1 when the committed page is stale

The page = method + the tables and the scorecard computed from the CSV (ratios, % of copy
bandwidth, decode time vs an empty kernel, host cost per backend, what backend="auto" runs) + the
analysis text + the run's table verbatim (the .md beside the CSV) + the previous run's page
(analyses/data/kernels_h200_previous.md).  The environment line is the first line of that .md.

The page's parts: kernels_page_run.py (the run's data), kernels_page_scorecard.py (the tables and the
scorecard), kernels_page_probes.py (the other runs and the probes), kernels_page_text.py (the prose).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "analyses" / "kernels_h200.md"
PREVIOUS = ROOT / "analyses" / "data" / "kernels_h200_previous.md"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))  # ncu_decode_compare: the ncu run's summary
from _page import write_or_check  # noqa: E402
from kernels_page_probes import (consumer_table, decode_margin, earlier_table, evict_table,  # noqa: E402
                                 final_host, host_range, host_table, ncu_compare_text, one_row, reload_table,
                                 separated_tables, spread_text, warps_table)
from kernels_page_run import DATA, ahead, empty_us, load, min_elems  # noqa: E402
from kernels_page_scorecard import render  # noqa: E402
from kernels_page_text import CHECKS, PREV_ROUND, SWAP, THIS_ROUND, WHY_DECODE  # noqa: E402  (the page's prose)


def render_all(path: Path = DATA) -> str:
    rows, env, table = load(path)
    by = {(r["op"], r["shape"], r["impl"]): r["median_us"] for r in rows}
    full = {(r["op"], r["shape"], r["impl"]): r for r in rows}
    g = lambda op, s, i: f"{by[(op, s, i)]:.2f}"  # noqa: E731
    earlier = "\n\n".join(f"  {op}:\n\n{earlier_table(op)}" for op in ("softmax", "add_layernorm"))
    separated, separated_note = separated_tables()
    why = WHY_DECODE.format(
        empty=f"{empty_us(env):.2f}", evict=evict_table(), min_elems=min_elems(),
        separated=separated, separated_note=separated_note, earlier=earlier,
        bg_large=g("bias_gelu", "65536x8192", "auto"),
        bg_pct=f"{full[('bias_gelu', '65536x8192', 'auto')]['pct_copy']:.0f}%",
        bg_cuda=g("bias_gelu", "1x4096", "cuda"), bg_v0=g("bias_gelu", "1x4096", "cuda_v0"),
        liger_rms=g("add_rmsnorm", "1x4096", "liger"), rms_v1=g("add_rmsnorm", "1x4096", "cuda"),
        rms_tr=g("add_rmsnorm", "1x4096", "triton"), liger_sm=g("softmax", "1x4096", "liger"),
        sm_cuda=g("softmax", "1x4096", "cuda"), sm_tr=g("softmax", "1x4096", "triton"),
        comp_bg=g("bias_gelu", "1x4096", "compile"), sm16_tr=g("softmax", "16x4096", "triton"),
        cuda_dec_host=host_range(rows, "cuda"), triton_dec_host=host_range(rows, "triton"),
        row_margin=decode_margin(rows, ("add_rmsnorm", "add_rmsnorm_", "add_layernorm", "softmax")),
        ncu_compare=ncu_compare_text())
    consumer, consumer_spread = consumer_table()
    host = {impl: statistics.median(r["host_us"] for r in rows if r["impl"] == impl) for impl in ("triton", "cuda")}
    this_round = THIS_ROUND.format(
        min_elems=min_elems(), auto_ok=sum(ahead(full[(op, s, "auto")]["best_peer_us"] / full[(op, s, "auto")]["median_us"])
                                            for (op, s, i) in full if i == "auto"),
        host_table=host_table(), triton_host=f"{host['triton']:.1f}", cuda_host=f"{host['cuda']:.1f}",
        consumer_table=consumer, consumer_spread=consumer_spread, one_row=one_row(),
        warps_table=warps_table(), spread=spread_text(rows),
        bg16=g("bias_gelu", "16x4096", "triton"), bg16c=g("bias_gelu", "16x4096", "compile"),
        bg16_final=final_host("bias_gelu", "16x4096"))
    prev_round = PREV_ROUND.format(reload_table=reload_table())
    parts = [render(path, rows, env), this_round, prev_round, SWAP, why, CHECKS, "## The run's table\n\n" + table]
    if PREVIOUS.exists():
        parts.append(PREVIOUS.read_text())
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", type=Path, default=DATA,
                    help="a benchmark CSV, or a run's folder holding bench_kernels.csv (default: the committed run)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed page is stale")
    args = ap.parse_args(argv)
    path = args.path.resolve()
    if not (path / "bench_kernels.csv" if path.is_dir() else path).exists():
        print(f"make_kernels_page: no benchmark data at {path}", file=sys.stderr)
        return 2
    return write_or_check({PAGE: render_all(path)}, args.check, command="python scripts/pages/make_kernels_page.py")


if __name__ == "__main__":
    sys.exit(main())

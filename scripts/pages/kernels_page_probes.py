"""The sections of analyses/kernels_h200.md that come from beside the run's table: the repeat of the
benchmark (RUN2) and the run on the final code (FINAL), the probes of scripts/gpu/probe_variants.py
(PROBE), the launch-variant and evict_first runs, the earlier side-by-side run (EARLIER) and the ncu
comparison at the decode shapes. Each returns the text or table a template of kernels_page_text.py
(or the scorecard) is filled with; a missing file gives "not measured" or nothing.
"""
from __future__ import annotations

import csv
import functools
import gzip
import math
import statistics
from pathlib import Path

from kernels_page_run import BW_TARGET, DATA, DECODE_ROWS, PEERS, ahead, auto_backend, load, own_best

# The side-by-side run earlier on 2026-11-30, with launch variant 1 (the one-barrier reductions)
# for softmax and add_layernorm: GPU µs per call, graph
# replays; (variant 1, cuda_v0 = variant 0, triton).
EARLIER = {
    "softmax": {"1x4096": (2.40, 2.16, 2.09), "16x4096": (2.55, 2.30, 2.36), "64x8192": (3.73, 3.47, 3.21),
                "4096x4096": (21.12, 19.60, 19.07), "16384x4096": (72.21, 66.72, 69.64),
                "65536x8192": (585.77, 546.97, 539.81)},
    "add_layernorm": {"1x4096": (2.84, 2.54, 2.15), "16x4096": (3.56, 3.05, 2.81), "64x8192": (4.85, 4.57, 3.89),
                      "4096x4096": (40.05, 38.54, 36.80), "16384x4096": (144.2, 143.15, 138.77),
                      "65536x8192": (1118.1, 1128.4, 1073.4)},
}


RUN2 = DATA.with_name("bench_kernels_h200_run2.csv.xz")
FINAL = DATA.with_name("bench_kernels_h200_final.csv.xz")
PROBE = DATA.with_name("probe_variants_h200.json.gz")


@functools.cache
def _probe() -> dict:
    """The probe results (read once: most helpers below take a mode's part of them)."""
    import json
    return json.loads(gzip.decompress(PROBE.read_bytes())) if PROBE.exists() else {}


@functools.cache
def _other_run(path: Path) -> list[dict]:
    """The rows of another run's table (RUN2, FINAL), read once however many sections use them."""
    return load(path)[0]


def _med(d: dict, prefix: str) -> float:
    """Median over rounds of the per-round minima of the probe keys `prefix r0`, `prefix r1`, ..."""
    vals = [min(v) for k, v in d.items() if isinstance(v, list) and k.rsplit(" r", 1)[0] == prefix]
    return statistics.median(vals) if vals else float("nan")


def consumer_table() -> tuple[str, str]:
    d = _probe().get("consumer", {})
    shapes = list(dict.fromkeys(k.split()[0] for k in d if k != "wall s"))
    names = (("ours", "ours (kernels.softmax, Triton: `.cs` from 2 rows)"), ("plain", "same kernel, plain store"),
             ("cs", "same kernel, .cs store"), ("liger", "Liger-Kernel (.cs store)"))
    lines = ["  | kernel | " + " | ".join(f"{s} alone | {s} + p@v" for s in shapes) + " |",
             "  | --- |" + " ---: | ---: |" * len(shapes)]
    spread = []
    for key, label in names:
        lines.append(f"  | {label} | " + " | ".join(f"{_med(d, f'{s} {key} alone'):.2f} | {_med(d, f'{s} {key} +pv'):.2f}"
                                                   for s in shapes) + " |")
    lines.append("  | p@v alone | " + " | ".join(f" | {_med(d, f'{s} pv only'):.2f}" for s in shapes) + " |")
    for s in shapes:
        pair = [_med(d, f"{s} {k} +pv") for k, _ in names]
        spread.append(max(pair) - min(pair))
    return "\n".join(lines), f"{max(max(spread), 0.01):.2f} µs" if spread else "?"


NCU_COMPARE = DATA.with_name("ncu_decode_compare_h200.csv.xz")


def ncu_compare_text() -> str:
    """scripts/gpu/ncu_decode_compare.py's summary of the committed ncu run (and SASS excerpts)."""
    if not NCU_COMPARE.exists():
        return "  (no ncu comparison data)"
    from ncu_decode_compare import summarize
    text = summarize(NCU_COMPARE, NCU_COMPARE.parent / "ncu_decode_compare_h200_sass")
    return "\n".join(("  " + line) if line else "" for line in text.splitlines())


def own_copy_note(limit: float) -> str:
    """The `cuda_index` probe's copy-only kernels (one vector load and store a thread) at the decode
    shapes: does a copy of our own get under the decode limit where torch's does not?"""
    d = _probe().get("cuda_index", {})
    best: dict[str, float] = {}
    n = set()
    for k, v in d.items():
        if isinstance(v, list) and k.endswith(", False)"):  # the last flag: GELU off
            shape, cfg = k.split(" ", 1)
            n.add(cfg)
            best[shape] = min(best.get(shape, float("inf")), statistics.median(v))
    if not best:
        return ""
    return (f"  Nor do copies of our own: in a probe (`scripts/gpu/probe_variants.py cuda_index`, {len(n)} copy-only "
            "kernels: each thread loads one vector of x and stores it, by vector width and block size) the "
            "fastest took " + ", ".join(f"{v:.2f} µs at {s}" for s, v in best.items())
            + (f", against the {limit:.2f} µs limit." if min(best.values()) > limit else "."))


def gelu_mid_note(shape: str) -> str:
    """The `gelu_mid` probe at `shape`: could any copy of the op's bytes, ours or torch's, reach the target?"""
    d = _probe().get("gelu_mid", {})
    bw = d.get("copy bandwidth GB/s (1 GiB copy_)")
    timed = {k[len(shape) + 1:]: statistics.median(v) for k, v in d.items()
             if k.startswith(shape + " ") and isinstance(v, list)}
    if not bw or not timed:
        return ""
    rows, hidden = map(int, shape.split("x"))
    need = 4 * rows * hidden / (BW_TARGET / 100 * bw * 1e9) * 1e6  # bf16 x in, out back: µs at the target
    copies = {k: v for k, v in timed.items() if k == "torch -x" or k.startswith("(0,")}
    gelus = {k: v for k, v in timed.items() if k.startswith("(2,")}
    cheap = {k: v for k, v in timed.items() if k.startswith("(3,")}
    best = min(copies, key=copies.get)
    pct = 4 * rows * hidden / (copies[best] * 1e-6) / (bw * 1e9) * 100
    return (f"  Whether any kernel could: in a probe run on the same GPU model (`scripts/gpu/probe_variants.py gelu_mid`, "
            f"its 1 GiB copy at {bw:.0f} GB/s), the fastest of {len(copies)} copies of these bytes at {shape} "
            f"(torch's `-x` and {len(copies) - 1} variants of our row kernel doing `-x`: cache hints, rows a "
            f"thread, threads, a persistent grid) took {copies[best]:.2f} µs ({best}), {pct:.0f}% of that "
            f"bandwidth, where {BW_TARGET:.0f}% needs {need:.2f} µs; the fastest of {len(gelus)} bias+GELU "
            f"variants took {min(gelus.values()):.2f} µs, and with GELU's tanh form through one `tanh.approx` "
            f"instruction (less arithmetic; not the erf form the op computes) {min(cheap.values()):.2f} µs.  "
            "At this size the target is above what a copy reaches.")


def decode_margin(rows: list[dict], ops: tuple = ()) -> str:
    """Range of cuda minus triton GPU µs over the decode cells (of `ops`, or every op)."""
    t = {(r["op"], r["shape"], r["impl"]): r["median_us"] for r in rows}
    d = [t[(op, sh, "cuda")] - t[(op, sh, "triton")] for (op, sh, i) in t
         if i == "cuda" and (op, sh, "triton") in t and int(sh.split("x")[0]) <= DECODE_ROWS
         and (not ops or op in ops)]
    return f"{min(d):.2f}-{max(d):.2f}" if d else "?"


def _run_score(path: Path) -> tuple[int, int, int, list[str], float]:
    """Target 1 in another run's table: cells, own best at or ahead, `auto` at or ahead, the cells
    where either is behind (with how far), and the extension's median host µs (how fast that host was)."""
    rows = _other_run(path)
    by = {(r["op"], r["shape"], r["impl"]): r for r in rows}
    cells = [(op, sh) for (op, sh, i) in by if i == "auto"]
    own_ok = auto_ok = 0
    behind = []
    for op, sh in cells:
        peer = by[(op, sh, "auto")]["best_peer_us"]
        own, auto = own_best(by, op, sh)[1], by[(op, sh, "auto")]["median_us"]
        own_ok += ahead(peer / own)
        auto_ok += ahead(peer / auto)
        if not ahead(peer / auto):
            behind.append(f"{op} {sh} (`auto` {100 * (auto / peer - 1):.2f}% slower"
                          + (f", own best {100 * (own / peer - 1):.2f}%)" if not ahead(peer / own) else ")"))
    host = statistics.median(r["host_us"] for r in rows if r["impl"] == "cuda" and not math.isnan(r["host_us"]))
    return len(cells), own_ok, auto_ok, behind, host


def final_host(op: str, shape: str) -> str:
    """Triton's and the extension's host µs per call for op/shape in the final-code run (FINAL)."""
    if not FINAL.exists():
        return "not run"
    h = {r["impl"]: r["host_us"] for r in _other_run(FINAL) if r["op"] == op and r["shape"] == shape}
    return f"{h['triton']:.1f} and {h['cuda']:.1f}, {h['triton'] / h['cuda']:.1f}x the extension's"


def repeat_score() -> str:
    """Target 1 in the repeat of the benchmark (RUN2) and in the run on the final code (FINAL)."""
    out = []
    for path, label in ((RUN2, "In the repeat of the benchmark minutes later (`{name}`)"),
                        (FINAL, "On the final code, a third run later the same day (`{name}`, on a slower host: "
                                "the extension's median host cost {host:.1f} µs a call)")):
        if path.exists():
            n, own_ok, auto_ok, behind, host = _run_score(path)
            out.append(label.format(name=path.name, host=host) + f": own best at or ahead at {own_ok} of {n}, "
                       f"`auto` at {auto_ok} of {n}" + (" (behind: " + ", ".join(behind) + ")" if behind else "") + ".")
    return "  ".join(out)


def host_table() -> str:
    """CPU µs per call, layer by layer, before and after the compiled-kernel launch (probe `host`)."""
    p = _probe()
    before, now = p.get("host_before_cached_launch", {}), p.get("host", {})
    rows = (("torch.softmax (eager)", "torch.softmax"), ('`kernels.softmax(backend="cuda")`', "kernels.softmax cuda"),
            ('`kernels.softmax(backend="triton")`', "kernels.softmax triton"),
            ("the Triton custom op (`torch.ops.profkit_kernels.softmax_triton`)", "torch.ops softmax_triton"),
            ("its launcher (`triton_kernels.softmax`: allocates the output)", "tk.softmax (launcher)"),
            ("the autotuned kernel `[grid]`, output given", "autotuner[grid] (out given)"),
            ("the JIT function `[grid]`, output given", "jit[grid] (out given)"),
            ("the compiled kernel's own launcher, output given", "compiled.run (out given)"))
    lines = ["  | layer | before this round | this run |", "  | --- | ---: | ---: |"]
    for label, key in rows:
        cell = lambda d: f"{statistics.median(d[key]):.1f}" if key in d else ""  # noqa: E731
        lines.append(f"  | {label} | {cell(before)} | {cell(now)} |")
    return "\n".join(lines)


def warps_table() -> str:
    d = _probe().get("decode_warps", {})
    lines = ["  | op | CUDA | Triton as shipped | 8 warps | 16 warps | 32 warps |",
             "  | --- | ---: | ---: | ---: | ---: | ---: |"]
    for op in ("add_rmsnorm", "add_layernorm", "softmax"):
        keys = ("cuda", "triton", "triton w8", "triton w16", "triton w32")
        if all(f"{op} {k}" in d for k in keys):
            lines.append(f"  | {op} | " + " | ".join(f"{statistics.median(d[f'{op} {k}']):.2f}" for k in keys) + " |")
    return "\n".join(lines)


def host_range(rows: list[dict], impl: str) -> str:
    h = [r["host_us"] for r in rows if r["impl"] == impl and r["tokens"] <= DECODE_ROWS]
    return f"{min(h):.0f}-{max(h):.0f}" if h else "?"


def one_row() -> str:
    p = _probe()
    out = []
    for key, when in (("consumer_earlier_run", "the previous round's probe"), ("consumer", "this run's")):
        d = p.get(key, {})
        pl, cs = _med(d, "1x4096 plain alone"), _med(d, "1x4096 cs alone")
        if pl == pl and cs == cs:
            out.append(f"{pl:.2f} µs plain vs {cs:.2f} `.cs` in {when}")
    return "; ".join(out) if out else "not measured"


def reload_table() -> str:
    d = _probe().get("reload", {})
    shapes = list(dict.fromkeys(k.split()[0] for k in d if k != "wall s"))
    lines = ["  | shape | op | compile | autotuned | 8 warps | 16 warps | 32 warps |",
             "  | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in shapes:
        for op in ("add_rmsnorm_", "add_rmsnorm"):
            v = [_med(d, f"{s} {op} {k}") for k in ("compile", "triton", "reload w8", "reload w16", "reload w32")]
            lines.append(f"  | {s} | {op} | " + " | ".join(f"{x:.2f}" for x in v) + " |")
    return "\n".join(lines)


def spread_text(rows: list[dict]) -> str:
    """The same code timed in two runs: this page's and RUN2 (the benchmark again, minutes later)."""
    if not RUN2.exists():
        return ""
    other = {(r["op"], r["shape"], r["impl"]): r["median_us"] for r in _other_run(RUN2)}
    diffs = []
    for r in rows:
        k = (r["op"], r["shape"], r["impl"])
        if k not in other or r["impl"] == "copy":
            continue
        diffs.append((abs(r["median_us"] / other[k] - 1), k, r["median_us"], other[k]))
    if not diffs:
        return ""
    diffs.sort(reverse=True)
    med = statistics.median(x[0] for x in diffs)
    comp = [x for x in diffs if x[1][2] == "compile" and int(x[1][1].split("x")[0]) <= DECODE_ROWS]
    big = [x for x in diffs if x[1][1] == "65536x8192"]
    by = {(r["op"], r["shape"], r["impl"]): r["median_us"] for r in rows}
    same = [(op, s, by[(op, s, "auto")], by[(op, s, "triton")]) for (op, s, i) in by
            if i == "auto" and s == "65536x8192" and auto_backend(op, *map(int, s.split("x"))) == "triton"]
    # the rows where auto and triton run the same kernel, at the largest shape
    same = [(op, s, a, t) for op, s, a, t in same if abs(a / t - 1) > 0.02] or same
    big_peer = [x for x in big if x[1][2] in PEERS]
    return ("**Run-to-run spread.**  The same code timed twice: this page's run and the benchmark "
            "again on the same machine a few minutes later, with every kernel compiled and tuned "
            f"already (`analyses/data/bench_kernels_h200_run2.csv.xz`): {len(diffs)} timings, median "
            f"difference {100 * med:.1f}%, largest "
            + ", ".join(f"{k[0]} {k[1]} {k[2]} {a:.2f} vs {b:.2f} µs" for _, k, a, b in diffs[:3])
            + ".  torch.compile's decode-shape timings move most (largest "
            + (f"{100 * max(x[0] for x in comp):.0f}%" if comp else "n/a")
            + ", the compiled kernel differs between processes); at 65536x8192 every implementation "
              "moves, by up to " + (f"{100 * max(x[0] for x in big):.0f}%" if big else "n/a")
            + (" (the peers' too: " + ", ".join(f"{k[2]} {k[0]} {100 * d:.0f}%" for d, k, _, _ in big_peer[:3]) + ")"
               if big_peer else "")
            + ", and within one run the same Triton kernel, timed as `auto` and as `triton`, differs: "
            + ", ".join(f"{op} {a:.0f} vs {t:.0f} µs" for op, s, a, t in same)
            + ".  Cells within about 2% of the peer are ties at this precision, in either direction.")


def earlier_table(op: str) -> str:
    lines = ["  | shape | variant 1 | variant 0 | change | Triton |", "  | --- | ---: | ---: | ---: | ---: |"]
    for s, (v1, v0, tr) in EARLIER[op].items():
        lines.append(f"  | {s} | {v1:.2f} | {v0:.2f} | {100 * (v1 / v0 - 1):+.1f}% | {tr:.2f} |")
    return "\n".join(lines)


VARIANTS = DATA.with_name("bench_variants_h200.csv")


def separated_tables() -> tuple[str, str]:
    """Softmax and add_layernorm on launch variants 0, 2 and 3 in one run (bench_variants_h200.csv)."""
    if not VARIANTS.exists():
        return "  (not measured)", ""
    with VARIANTS.open() as f:
        rows = list(csv.DictReader(f))
    t = {(r["op"], r["shape"], r["impl"], r["launch_variant"]): float(r["median_us"]) for r in rows}
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    lines = ["  | op | shape | 16 warps, two-pass (0) | 8 warps, two-pass (2) | 8 warps, two barriers (3) | "
             "Triton | Liger |", "  | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    gain = {}
    for op in ("softmax", "add_layernorm"):
        for sh in shapes:
            v = [t.get((op, sh, "cuda", str(k))) for k in (0, 2, 3)]
            if None in v:
                continue
            tr, lg = t.get((op, sh, "triton", "3")), t.get((op, sh, "liger", "3"))
            lines.append(f"  | {op} | {sh} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} | "
                         f"{'' if tr is None else f'{tr:.2f}'} | {'' if lg is None else f'{lg:.2f}'} |")
            gain.setdefault(op, []).append(v[2] / v[0] - 1)
    note = ("Variant 3 against variant 0 (same shapes, in order): softmax "
            + ", ".join(f"{100 * g:+.0f}%" for g in gain.get("softmax", []))
            + "; add_layernorm " + ", ".join(f"{100 * g:+.0f}%" for g in gain.get("add_layernorm", []))
            + ".  Softmax runs variant 3 by default; at the decode shapes it is still behind the Triton "
              "kernels (next paragraph).")
    return "\n".join(lines), note


def evict_table() -> str:
    """Triton µs with and without evict_first, one run each way (bench_evict_{on,off}_h200.csv)."""
    paths = [DATA.with_name(f"bench_evict_{k}_h200.csv") for k in ("on", "off")]
    if not all(q.exists() for q in paths):
        return "  (not measured)"
    t = []
    for q in paths:
        with q.open() as f:
            t.append({(r["op"], r["shape"]): float(r["median_us"]) for r in csv.DictReader(f) if r["impl"] == "triton"})
    lines = ["  | op | shape | evict_first | no hint | change |", "  | --- | --- | ---: | ---: | ---: |"]
    for key, on in t[0].items():
        off = t[1].get(key)
        if off is not None:
            lines.append(f"  | {key[0]} | {key[1]} | {on:.2f} | {off:.2f} | {100 * (off / on - 1):+.1f}% |")
    return "\n".join(lines)

"""``page``: ``analyses/whatif.md``, each fix's predicted gain against the measured one (CPU).

The page's rows come from ``pricing.page_rows``; this module turns them into the targets (the
issue's ±15% band, the median error, the top action against the measured best), the pairs'
table, the pairs timed side by side in one process, and the programs' calibration. ``--check``
compares a fresh page with the committed one and prints a unified diff when they differ.
"""
from __future__ import annotations

import argparse
import json
import lzma
import statistics
import sys
from pathlib import Path

from . import tried
from .pricing import page_rows
from .store import INTERLEAVED, MEASURED, ROOT, read_measured

# The band: a predicted step time within 15% of the measured one is right.
BAND = 0.15
PAGE = ROOT / "analyses" / "whatif.md"


def resolved(r: dict) -> bool:
    """Whether the timings resolve a pair to the target's ±15%: every run folder's gain within
    15% of their median (a single folder cannot show its own spread and counts as resolved)."""
    lo, hi = r["spread"]
    return lo >= r["measured"] / (1 + BAND) and hi <= r["measured"] * (1 + BAND)


def resolution_text(pairs: list[dict]) -> str:
    """What the timings can resolve: the ±15% target split by whether the pair's own runs agree
    to 15%. Said beside the target, not instead of it."""
    res = [r for r in pairs if resolved(r)]
    rest = [r for r in pairs if not resolved(r)]
    hit = sum(abs(r["error"]) <= BAND for r in res)
    misses = [f"{r['program']} {r['fix']} {r['error']:+.0%}" for r in res if abs(r["error"]) > BAND]
    # The widest of the fixes priced to change nothing: what the runs alone do to a gain of 1.
    flat = [r for r in rest if 0.97 <= r["predicted"] <= 1.03]
    w = max(flat, key=lambda r: r["spread"][1] / r["spread"][0]) if flat else None
    example = (f": {w['program']} {w['fix']}, priced {w['predicted']:.2f}x, measured "
               f"{w['spread'][0]:.2f}-{w['spread'][1]:.2f}x across its runs" if w else "")
    return ("How much of that the timings can tell: in **" + f"{len(res)}" + "** pairs every run folder's "
            "gain lies within 15% of their median, and **" + f"{hit} of {len(res)}" + "** of those are within "
            "±15% (misses: " + (", ".join(misses) or "none") + "). In the other "
            f"{len(rest)} the runs of the same fix disagree with each other by more than the target band (host-bound "
            f"programs on machines whose CPU speed changes from one run to the next{example}); "
            f"{sum(abs(r['error']) <= BAND for r in rest)} of them are "
            "within ±15%. The target above counts every pair.")


# The rows the page is made of (pricing.page_rows), committed beside it: the tests check each
# program's rows against a fresh pricing of its trace (in the worker that loads that trace for its
# other tests) and the page against a rendering of these rows, instead of pricing every program
# in one test.
ROWS = ROOT / "analyses" / "data" / "whatif" / "page_rows.json.xz"   # xz: a tenth of the JSON's size
ROWS_FORMAT = "profkit-whatif-rows/1"


def rows_json(pairs: list[dict], progs: list[dict]) -> str:
    """The page's rows as the committed JSON (tuples become lists; floats round-trip exactly)."""
    return json.dumps({"format": ROWS_FORMAT, "pairs": pairs, "programs": progs}, indent=1) + "\n"


def _read(path: Path) -> str:
    """A page file's text (the rows file is xz-compressed)."""
    return lzma.decompress(path.read_bytes()).decode() if path.suffix == ".xz" else path.read_text()


def read_rows(text: str | None = None) -> tuple[list[dict], list[dict]]:
    """(pairs, programs) of the committed rows file (or of ``text``)."""
    d = json.loads(_read(ROWS) if text is None else text)
    if d.get("format") != ROWS_FORMAT:
        raise SystemExit(f"{ROWS}: not a {ROWS_FORMAT} file")
    return d["pairs"], d["programs"]


def fresh_rows(measured: dict, load=None, only: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """page_rows, as the rows file holds them (through JSON)."""
    return read_rows(rows_json(*page_rows(measured, load, only)))


def page_text(measured: dict, load=None, rows: tuple[list[dict], list[dict]] | None = None) -> str:
    """The page, from ``rows`` (``read_rows``) or from a fresh pricing of every program."""
    pairs, progs = rows if rows is not None else fresh_rows(measured, load)
    n = len(pairs)
    within = sum(abs(r["error"]) <= BAND for r in pairs)
    med = statistics.median(abs(r["error"]) for r in pairs) if pairs else 0.0
    within_cap = sum(abs(r["error_capture"]) <= BAND for r in pairs)
    med_cap = statistics.median(abs(r["error_capture"]) for r in pairs) if pairs else 0.0
    low = [r for r in pairs if r["measured"] < 1.05]
    false_promise = [r for r in low if r["predicted"] >= 1.10]
    idle_promise = [p for p in progs if p["best"] and p["best"]["measured"] < 1.05 and p["top"]
                    and p["top"]["expected_end_to_end_speedup"] >= 1.10]
    lines = [
        "# What-if accuracy: each fix priced by the step model, against the fix timed without a profiler",
        "",
        "*Generated by `python3 scripts/whatif_accuracy.py page` from the committed traces and "
        f"`{MEASURED.relative_to(ROOT)}`; `--check` fails when this page is stale.*",
        "",
        "Each program of the corpus (`scripts/whatif_accuracy.py`, `scripts/workloads/`) was captured on an "
        "NVIDIA H200 with `profkit capture` (a calibration run without the profiler, then nsys), and each fix was "
        f"applied by hand (a flag of the program) and timed without any profiler ({measured['gpu']}, "
        f"{measured['date']}){other_gpus(measured)}. **Predicted** is the gain "
        "profkit's rule for that fix prices through the step model (the rule's edit of the step graph, replayed "
        "at the calibrated CPU scale; a fix that does what two rules propose, such as `PK103+PK201`, by both "
        "edits replayed together) for the program as it ran where the fix was timed: in each run folder the "
        "model is calibrated to the baseline timed there, as `profkit capture` calibrates it to its own run "
        "without the profiler (`Profile.findings_at`), and where the GPU set that baseline's pace (its period "
        "then shows nothing of the CPU's speed), to the host's time to issue one iteration, "
        "timed in the same process (`issue_ns`, in the folders of allocation 31 on: one iteration from an "
        "idle GPU there, from 32 on two after an untimed one; not where the launch queue would have filled "
        "while it was timed, the GPU's time then as much as the CPU's); gpt2_fp32_train is priced with "
        "the GEMM shapes of a `--aten` capture of it (`classify --shapes-from`, "
        "`traces/real/train_gpt2_fp32_rec.sqlite.xz`). The price shown is the "
        "median over the folders, `baseline timed` the median of their baselines. The "
        "timings ran on other allocations of the machine kind than most captures, on other days, and the "
        "host-bound programs' baselines moved with them (gpt2_empty_cache: 32.3 ms in its capture's "
        "calibration run, 37.4-38.2 ms beside its fixes); **at capture** is the same rule's price at the "
        "capture's calibration. **Measured** is the baseline's median iteration over the fix's, both from "
        "the same run folder (median over folders); where the pair was timed with the baseline side by side "
        "in one process (`runs` N ab), from those processes alone (see *Pairs timed side by side in one process*). "
        "The step time after the fix is the timed baseline "
        "divided by each gain; the error is predicted step time over measured step time, minus one, in each "
        "folder (its fix against the price at its own baseline), the median over the folders. `runs` 0: the "
        "fix and the baseline were never timed in the same run folder, and their medians from different "
        "runs (other machines of the same kind) are compared.",
        "",
        "## Targets (issue: ±15% for 90% of pairs, median error ≤ 7%, top action the measured best on 90% of "
        "programs, no 1.10x promise where every fix measured under 1.05x)",
        "",
        f"- pairs: {n}, of which {len(low)} measured below 1.05x",
        f"- step time after the fix within ±15%: **{within} of {n}** ({within / max(n, 1):.0%})",
        f"- median absolute error: **{med:.1%}**",
        f"- priced at the capture's calibration instead: {within_cap} of {n} within ±15%, median error "
        f"{med_cap:.1%}",
        f"- pairs measured below 1.05x that profkit priced at 1.10x or more: **{len(false_promise)}**"
        + (" (" + ", ".join(f"{r['program']} {r['fix']} {r['predicted']:.2f}x" for r in false_promise) + ")"
           if false_promise else ""),
        *[f"- {label}: {sum(abs(r['error']) <= BAND for r in rs)} of {len(rs)} within ±15%, median error "
          f"{statistics.median(abs(r['error']) for r in rs):.1%}"
          for label, rs in (("tests (later pairs from which no change of their model or rule came)",
                             [r for r in pairs if r["role"] == "test"]),
                            ("built on (the corpus's first programs, timed while the model was written)",
                             [r for r in pairs if r["role"] == "built on"]),
                            ("no test (later pairs whose miss led to a change: see the rules' --explain)",
                             [r for r in pairs if r["role"] == "no test"]),
                            ("first sight (programs of kinds the corpus lacked, priced the first time profkit "
                             "saw them: see *First sight*)", [r for r in pairs if r["role"] == "first sight"]))
          if rs],
        f"- programs where every measured fix gave under 1.05x and the top action promised 1.10x or more: "
        f"**{len(idle_promise)}**" + (" (" + ", ".join(
            f"{p['program']}: {p['top']['rule']} {p['top']['expected_end_to_end_speedup']:.2f}x, a fix not timed"
            for p in idle_promise) + ")" if idle_promise else ""),
        *far_baselines(pairs, progs),
        "",
        resolution_text(pairs),
        *first_sight_lines(pairs, progs),
        "",
        "## Pairs",
        "",
        "| program | fix | rule | predicted | at capture | measured | runs | spread | baseline timed | step after (pred) "
        "| step after (meas) | error | error at capture | role |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in pairs:
        lo, hi = r["spread"]
        lines.append(f"| {r['program']} | {r['fix']} | {r['rule']} | {r['predicted']:.2f}x | "
                     f"{r['predicted_capture']:.2f}x | {r['measured']:.2f}x | "
                     f"{r['runs']}{' ab' if r['interleaved'] else ''} | {lo:.2f}-{hi:.2f}x | {r['base_ns'] / 1e6:.2f} ms | {r['pred_ns'] / 1e6:.2f} ms | "
                     f"{r['meas_ns'] / 1e6:.2f} ms | {r['error']:+.0%} | {r['error_capture']:+.0%} | "
                     f"{r['role']} |")
    lines += both_ways_text(pairs)
    lines += tried.lines(pairs)
    lines += ["", "## Programs: calibration, and the top action against the measured best", "",
              "| program | calibration | under nsys | without (measured) | model without | top action | its fix measured "
              "| measured best | right |",
              "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |"]
    ok_top = 0
    for p in progs:
        top, best = p["top"], p["best"]
        top_txt = f"{top['rule']} {top['expected_end_to_end_speedup']:.2f}x" if top else "none"
        best_txt = f"{best['fix']} {best['measured']:.2f}x" if best else "-"
        ok, got = p["top_ok"]
        ok_top += ok
        meas = f"{p['unprofiled_ns'] / 1e6:.2f} ms" if p["calibration"] == "measured" else "(estimated)"
        lines.append(f"| {p['program']} | {p['calibration']} | {p['profiled_ns'] / 1e6:.2f} ms | {meas} | "
                     f"{p['predicted_ns'] / 1e6:.2f} ms | {top_txt} | {got} | {best_txt} | {'yes' if ok else 'no'} |")
    lines += ["", f"The top action is the measured best fix, or within 5% of it, on **{ok_top} of {len(progs)}** "
              "programs (where no fix measured 1.05x: the top action promised under 1.10x; a timed fix that does what "
              "the top action's rule and another propose, such as `PK104+PK305`, counts as the top action's: profkit "
              "prices its top actions together on the `together` line). The measured fixes are those timed by hand "
              "and profkit's own trials in the capture (`--try`, marked `(tried)`: the program run unprofiled with "
              "one switch, beside its baseline), and the top action's own fix counts as measured by either. "
              "`runs`: the run folders "
              "in which the baseline and the fix were timed one after the other; `spread`: the lowest and highest "
              "ratio among them (the host-bound programs vary most between runs of one machine).", ""]
    return "\n".join(lines) + "\n"


# A baseline timed beside the fixes this many times faster or slower than the capture's own run
# without the profiler is not clearly the program that was captured.
FAR = 1.5


def far_baselines(pairs: list[dict], progs: list[dict]) -> list[str]:
    """The programs whose baseline, timed beside their fixes, ran over FAR times faster or slower
    than the capture's calibration run: their pairs are counted above, and said to be suspect (a
    cache that interleaved variants share, such as cuDNN's compiled engines, makes the baseline
    another program)."""
    cal = {p["program"]: p["unprofiled_ns"] for p in progs if p.get("unprofiled_ns")}
    far = {}
    for r in pairs:
        c = cal.get(r["program"])
        if c and not (1 / FAR <= r["base_ns"] / c <= FAR):
            far.setdefault(r["program"], (r["base_ns"], c))
    if not far:
        return []
    return [f"- programs whose baseline timed beside the fixes lies over {FAR:g}x from the capture's own run "
            "without the profiler (a machine of another speed, a capture whose window lost its GPU work, or "
            "not the captured program: a cache that interleaved variants share; their pairs are counted above "
            "all the same): "
            + ", ".join(f"{n} {b / 1e6:.2f} ms against {c / 1e6:.2f} ms" for n, (b, c) in far.items())]


def other_gpus(measured: dict) -> str:
    """The programs captured and timed on another GPU than the data's own, said after it."""
    by_gpu: dict[str, list[str]] = {}
    for prog, gpu in sorted((measured.get("program_gpu") or {}).items()):
        by_gpu.setdefault(gpu, []).append(prog)
    return "".join(f"; {', '.join(progs)} captured and timed on an {gpu} instead (the same machine for "
                   "both: their traces name it, and profkit reads its peaks)" for gpu, progs in by_gpu.items())


def first_sight_lines(pairs: list[dict], progs: list[dict]) -> list[str]:
    """The first-sight section (firstsight.section), today's score from this page's own rows."""
    from .firstsight import judged, registered, section
    names = {p["name"] for p in registered()}
    if not names:
        return []
    today = {p["program"]: judged(p, [r for r in pairs if r["program"] == p["program"]])
             for p in progs if p["program"] in names}
    return section(today)


def both_ways_text(pairs: list[dict]) -> list[str]:
    """The pairs timed side by side in one process (``interleave``) as well as in separate runs:
    both measurements, so that the change of protocol shows."""
    ab = [r for r in pairs if r["interleaved"]]
    if not ab:
        return []
    lines = ["", "## Pairs timed side by side in one process", "",
             f"In {len(ab)} pairs the baseline and the fixes were built in one process and timed in blocks "
             "that take turns (`scripts/whatif_accuracy.py interleave`: blocks of 0.2 s or 10 iterations or more, "
             "the order reversed each round, the first round warm-up, one process per run folder, folders `ab-*`). "
             "Those folders alone give the pair's measured gain above (`runs` N ab), because separate runs seconds "
             "apart drifted with the machine's CPU speed by more than the target band. A process's gain for a "
             "fix is the median over its rounds of the baseline's block over the fix's block of the same round "
             "(`paired_gain`): a change of the CPU's speed that lasts several blocks divides out (every block: "
             f"`{INTERLEAVED.relative_to(ROOT)}`). Both "
             "measurements, each folder against the price at its own baseline:", "",
             "| program | fix | separate runs: predicted | measured | spread | runs | interleaved: predicted "
             "| measured | spread | processes | error, separate | error, interleaved |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    apart = [r for r in ab if r["apart"]]
    lines[-3:-3] = ["", f"Within ±15%: {sum(abs(r['apart'][4]) <= BAND for r in apart)} of "
                    f"{len(apart)} with the separate runs (the others were timed interleaved only), "
                    f"{sum(abs(r['error']) <= BAND for r in ab)} of {len(ab)} interleaved."]
    for r in ab:
        lo, hi = r["spread"]
        if r["apart"]:
            am, an, ar, ap, aerr = r["apart"]
            then = f"{ap:.2f}x | {am:.2f}x | {min(ar):.2f}-{max(ar):.2f}x | {an}"
            err = f"{aerr:+.0%}"
        else:
            then, err = "- | - | - | 0", "-"
        lines.append(f"| {r['program']} | {r['fix']} | {then} | {r['predicted']:.2f}x | {r['measured']:.2f}x | "
                     f"{lo:.2f}-{hi:.2f}x | {r['runs']} | {err} | {r['error']:+.0%} |")
    return lines


def cmd_page(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    measured = read_measured()
    rows = rows_json(*page_rows(measured))
    text = page_text(measured, rows=read_rows(rows))
    if args.check:
        import difflib
        stale = False
        for path, new in ((PAGE, text), (ROWS, rows)):
            if not path.exists() or _read(path) != new:
                old = _read(path).splitlines(keepends=True) if path.exists() else []
                sys.stdout.writelines(difflib.unified_diff(old, new.splitlines(keepends=True), str(path),
                                                           "regenerated"))
                stale = True
        if stale:
            print("whatif_accuracy: analyses/whatif.md is stale: run `python3 scripts/whatif_accuracy.py page`")
            raise SystemExit(1)
        print("whatif_accuracy: analyses/whatif.md is current")
        return
    ROWS.write_bytes(lzma.compress(rows.encode(), preset=9))
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)} and {ROWS.relative_to(ROOT)}")

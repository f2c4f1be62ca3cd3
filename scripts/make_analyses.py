"""Write the case-study pages analyses/<name>.md from real traces, with profkit's own numbers.

    python scripts/make_analyses.py                 # (re)write every page whose traces exist
    python scripts/make_analyses.py --only cuda_graph_tiny_chain
    python scripts/make_analyses.py --check         # CI: regenerate into a temp dir, exit 1 on drift
    python scripts/make_analyses.py --name my_case --before traces/a.sqlite --after traces/b.sqlite \\
        --before-range eager_chain --after-range graph_replay --title "..." --out /tmp/pages

A case is (name, BEFORE trace, AFTER trace or none, level, title, notes). Each page holds BEFORE's
classification and suggestion for the op(s) of interest, the diff table (profkit.diff), profkit's
predicted vs the measured gain per op and end to end, and — where the two disagree by more than
20% — a "Why" section whose text is the case's ``notes``. The notes are written by a person after
looking at the numbers; a case that disagrees by more than 20% and has no notes FAILS the run
(exit 2), so no page ships an unexplained miss. ``before_range``/``after_range`` compare two
differently named ranges (for one trace that holds both variants). Roofline images are added when
``profkit.plots.roofline`` exists (skipped otherwise). Exit codes: 0 ok, 1 drift (--check),
2 a case error.
"""
from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import profkit  # noqa: E402
from profkit import estimate, render  # noqa: E402
from profkit.diff import DiffResult, diff, to_markdown  # noqa: E402

DISAGREEMENT_PCT = 20.0   # predicted vs measured further apart than this needs a "why"
NOTES_PLACEHOLDER = "WHY:"  # notes are inserted under this heading


@dataclass(frozen=True)
class Case:
    name: str                       # page: analyses/<name>.md
    before: str                     # trace, relative to the repository root
    after: Optional[str]            # None: a single-trace page (verdict only)
    by: str                         # range | kernel | aten
    title: str
    notes: str = ""                 # the WHY text, written after looking at the numbers
    ops: tuple[str, ...] = ()       # BEFORE ops of interest (default: every matched op)
    before_range: Optional[str] = None  # compare BEFORE's op of this name ...
    after_range: Optional[str] = None   # ... with AFTER's op of this name
    summary: str = ""               # one paragraph: what was run and what the question is

    @property
    def renames(self) -> dict:
        if (self.before_range is None) != (self.after_range is None):
            raise CaseError(f"case {self.name}: give both before_range and after_range, or neither")
        return {self.before_range: self.after_range} if self.before_range else {}

    def traces(self) -> list[str]:
        return [self.before] + ([self.after] if self.after else [])


class CaseError(Exception):
    """A case that cannot be written as defined (the message says what to fix)."""


CASES: list[Case] = [
    Case(
        name="cuda_graph_tiny_chain",
        before="traces/micro_graph.sqlite", after="traces/micro_graph.sqlite", by="range",
        before_range="eager_chain", after_range="graph_replay",
        title="A chain of tiny kernels: eager vs CUDA graph replay",
        summary=(
            "`scripts/workloads/micro.py graph` runs the same 20 tiny elementwise kernels (4096 floats) "
            "per call twice in one process, 10 calls each: eagerly under the NVTX range `eager_chain`, "
            "and replayed from a captured CUDA graph under `graph_replay`. Both ranges are in one trace, "
            "so the diff compares the two ranges (`--match eager_chain=graph_replay`). The question: "
            "profkit calls the eager chain launch-bound and suggests fusing / CUDA graphs; what does a "
            "graph replay actually buy, and how close is the advisor's estimate?"),
        notes=(
            "*Per op (predicted 18.05x, measured 12.78x).* The advisor's number is a fusion bound: "
            "one call's span (349.8 us) over ONE fused kernel (2.0 us, the launch floor) plus one "
            "launch gap (17.4 us). Graph replay is not fusion: it still runs 20 kernels per call "
            "(kern/call 20 → 20). It removes the CPU launch gaps but keeps twenty ~1.1 us kernels "
            "and the short gaps between them on the GPU (busy 22.4 us, span 27.4 us per call), "
            "so it lands below the bound. Fusing the chain (torch.compile) is what the bound "
            "describes; the graph is the cheaper half of that suggestion (classified on its own, the replay is "
            "still launch-bound, and profkit still suggests fusing its 20 kernels).\n\n"
            "*End to end (predicted 1.788x, measured 0.939x).* The advisor's end-to-end figure is "
            "Amdahl over the trace's GPU time, the sum of kernel durations (443.3 us), which holds "
            "no idle launch gaps; the saving it counts is kernel time that fusion would remove "
            "(capped at the op's busy time, 195.4 us). A graph removes idle gaps, which are not in "
            "that sum, and no kernels: the 20 kernels took 224.1 us replayed vs 195.4 us eager "
            "(+14.7%, median kernel 1.1 us vs 0.9 us), so in kernel-time terms the replay is 0.94x "
            "while each call's wall time on the GPU fell 12.8x. For launch-bound work the honest "
            "end-to-end measure is step (wall) time, which kernel-time accounting cannot show; "
            "this pair does not isolate it."),
    ),
    Case(
        name="dont_write_a_kernel_bf16_gemm",
        before="traces/micro_hinted.sqlite", after=None, by="range", ops=("my_matmul",),
        title="Don't write a kernel: a bf16 GEMM near its roof",
        summary=(
            "`scripts/workloads/micro.py hinted` runs a bf16 matmul 10 times inside an NVTX range that "
            "carries its FLOP and byte counts (`profkit.annotate`), so profkit can place it on the "
            "H200 roofline without counters. The question: is a custom kernel worth writing?"),
    ),
    # The fused-kernel pairs (traces from scripts/capture_case_studies.sh; range names are equal
    # across each pair). Add them here once the traces are in traces/, run the script, read the
    # numbers, and write `notes` for any case it stops on:
    # Case(name="fused_add_rmsnorm_triton", before="traces/fused_add_rmsnorm_torch.sqlite",
    #      after="traces/fused_add_rmsnorm_triton.sqlite", by="range", ops=("add_rmsnorm",),
    #      title="Residual add + RMSNorm: eager PyTorch vs the bundled Triton kernel", notes=""),
]


# ------------------------------------------------------------------------------------ page parts

def _fmt_x(v: Optional[float], nd: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}x"


def _fmt_pct(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def disagreements(res: DiffResult, ops: tuple[str, ...]) -> list[tuple[str, str, float]]:
    """(op, which, percent) for every predicted-vs-measured pair further apart than 20%."""
    out = []
    for op in res.ops:
        if ops and op["name"] not in ops:
            continue
        for which, key in (("op speedup", "op_disagreement_pct"),
                           ("end-to-end speedup", "end_to_end_disagreement_pct")):
            d = op[key]
            if d is not None and abs(d) > DISAGREEMENT_PCT:
                out.append((op["name"], which, d))
    t = res.total
    p, m = t["predicted_end_to_end_speedup"], t["measured_end_to_end_speedup"]
    if p and m is not None and abs((m / p - 1) * 100) > DISAGREEMENT_PCT and len(res.ops) > 1:
        out.append(("total", "end-to-end speedup", (m / p - 1) * 100))
    return out


def _baseline(case: Case, prof) -> list[str]:
    df = prof.ops(by=case.by)
    wanted = list(case.ops) or ([case.before_range] if case.before_range else list(df.index))
    missing = [o for o in wanted if o not in df.index]
    if missing:
        raise CaseError(f"case {case.name}: no op {missing[0]!r} at --by {case.by} in {case.before}")
    sel = df.loc[wanted]
    header = {"trace": Path(case.before).name, "gpu": prof.gpu.name,
              "total_gpu_time_ns": prof.trace.total_gpu_time_ns, "level": case.by}
    lines = ["## Baseline: profkit's verdict", "", render.to_markdown(sel, header).rstrip(), ""]
    for name, row in sel.iterrows():
        lines.append(f"- **{render.short_name(str(name), 60)}**: {row['class']}-bound "
                     f"({row['confidence']} confidence, evidence from {row['source']}): {row['reason']}")
        lines.append(f"  - next step ({row['rung']}): {row['action']}")
        lines.append(f"  - expected: {row['expected_op_speedup']:.2f}x on the op, "
                     f"{row['expected_end_to_end_speedup']:.3f}x end to end "
                     f"({'worth it' if row['worth_it'] else 'not worth it'}); basis: {row['basis']}")
        pct = row["pct_of_roof"]
        if pct is not None and pct == pct and pct > 0:
            perfect = 1.0 / float(pct)
            e2e = estimate.amdahl(min(float(row["share"]), 1.0), perfect)
            lines.append(f"  - ceiling: at {float(pct):.0%} of its roof, the op can get at most "
                         f"{perfect:.2f}x faster (a kernel at 100% of the roof, which no real kernel "
                         f"reaches), and `amdahl({float(row['share']):.3f}, {perfect:.2f})` = "
                         f"{e2e:.3f}x end to end is the most any kernel work could buy")
    lines.append("")
    return lines


def _prediction_table(res: DiffResult, ops: tuple[str, ...]) -> list[str]:
    lines = ["## Predicted vs measured", "",
             "| op | predicted op x | measured op x | off by | predicted e2e | measured e2e | off by |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for op in res.ops:
        if ops and op["name"] not in ops:
            continue
        label = op["name"] if op["after_name"] == op["name"] else f"{op['name']} → {op['after_name']}"
        lines.append(f"| {render.short_name(label, 60)} | {_fmt_x(op['predicted_op_speedup'])} | "
                     f"{_fmt_x(op['measured_op_speedup'])} | {_fmt_pct(op['op_disagreement_pct'])} | "
                     f"{_fmt_x(op['predicted_end_to_end_speedup'], 3)} | "
                     f"{_fmt_x(op['measured_end_to_end_speedup'], 3)} | "
                     f"{_fmt_pct(op['end_to_end_disagreement_pct'])} |")
    t = res.total
    p, m = t["predicted_end_to_end_speedup"], t["measured_end_to_end_speedup"]
    off = None if not p or m is None else (m / p - 1) * 100
    lines.append(f"| total (matched ops) | | | | {_fmt_x(p, 3)} | {_fmt_x(m, 3)} | {_fmt_pct(off)} |")
    lines += ["",
              "Predicted = BEFORE's `expected_op_speedup` / `expected_end_to_end_speedup` (profkit "
              "classify on BEFORE). Measured op = BEFORE median / AFTER median GPU time per call. "
              "Measured end to end = BEFORE's total GPU time (sum of kernel, memcpy and memset "
              "durations) with the op's kernel time replaced by AFTER's (per op: calls x busy median; "
              "total: the matched ops' kernel time, scaled to BEFORE's call count) — the frame the "
              "prediction is made in. \"Off by\" = measured / predicted - 1.", ""]
    return lines


def _roofline(case: Case, sides: list[tuple[str, object, list[str]]], img_dir: Path,
              page_dir: Path) -> list[str]:
    """Roofline images before/after through profkit.plots.roofline, when it exists. ``sides``:
    (label, profile, ops to show). Ops without FLOP and byte counts cannot be placed; a side with
    none placed gets no image (said on the page)."""
    try:
        from profkit.plots import roofline, roofline_data  # another engineer's module; optional
    except ImportError:
        return []
    lines = ["## Roofline", ""]
    for label, prof, names in sides:
        df = prof.ops(by=case.by)
        df = df.loc[[n for n in names if n in df.index]] if names else df
        try:
            data = roofline_data(prof, by=case.by, ops=df)
            if data.points.empty:
                lines += [f"{label}: no roofline point to draw: {', '.join(data.not_placed)} "
                          "has no FLOP and byte counts (for those: FLOP/byte hints in the range name, "
                          "`--aten` shapes or `--ncu` counters).", ""]
                continue
            fig = roofline(data=data)
            img_dir.mkdir(parents=True, exist_ok=True)
            png = img_dir / f"{case.name}_{label.lower()}.png"
            fig.savefig(png, dpi=80, metadata={"Software": None})
        except Exception as exc:  # the plot module is not ours: never let it break the pages
            print(f"{case.name}: roofline skipped ({exc.__class__.__name__}: {exc})", file=sys.stderr)
            return []
        lines += [f"![{label}: roofline of {Path(prof.path).name}]({png.relative_to(page_dir).as_posix()})", ""]
    return lines


def render_case(case: Case, out_dir: Path) -> str:
    """The Markdown page of one case (images, if any, are written beside it)."""
    for t in case.traces():
        if not (ROOT / t).exists():
            raise FileNotFoundError(t)
    before = profkit.load(ROOT / case.before)
    lines = [f"# {case.title}", "",
             f"*Generated by `scripts/make_analyses.py` from `{case.before}`"
             + (f" and `{case.after}`" if case.after and case.after != case.before else "")
             + f" (ops by {case.by}); do not edit by hand: edit the case and regenerate.*", ""]
    if case.summary:
        lines += [case.summary, ""]
    lines += _baseline(case, before)
    profs = [before]
    if case.after is None:
        lines += ["## Measured", "",
                  "No AFTER trace: this page is the verdict alone. Where profkit says to leave the op "
                  "alone, there is nothing to measure.", ""]
    else:
        after = before if case.after == case.before else profkit.load(ROOT / case.after)
        profs.append(after)
        res = diff(before, after, by=case.by, rename=case.renames)
        cmd = (f"profkit diff {case.before} {case.after} --by {case.by}"
               + "".join(f" --match {k}={v}" for k, v in case.renames.items()) + " --format markdown")
        lines += ["## Before → after", "", f"`{cmd}`", "", to_markdown(res).rstrip(), ""]
        lines += _prediction_table(res, case.ops)
        off = disagreements(res, case.ops)
        if off:
            if not case.notes.strip():
                raise CaseError(
                    f"case {case.name}: predicted and measured disagree by more than "
                    f"{DISAGREEMENT_PCT:.0f}% (" + "; ".join(f"{o} {w} {d:+.1f}%" for o, w, d in off)
                    + ") and the case has no notes: read the numbers and write its `notes` (the WHY)")
            lines += ["## Why the prediction and the measurement differ", "",
                      "Disagreements over 20%: " + "; ".join(
                          f"{render.short_name(o, 40)} {w} {d:+.1f}%" for o, w, d in off) + ".", "",
                      case.notes.strip(), ""]
        elif case.notes.strip():
            lines += ["## Notes", "", case.notes.strip(), ""]
    sides = [("BEFORE" if case.after else "Baseline", before,
              list(case.ops) or ([case.before_range] if case.before_range else []))]
    if case.after:
        after_names = [case.renames.get(n, n) for n in sides[0][2]]
        sides.append(("AFTER", profs[1], after_names))
    lines += _roofline(case, sides, out_dir / "img", out_dir)
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------------ driver

def write_pages(cases: list[Case], out_dir: Path) -> tuple[list[Path], list[str]]:
    """Write every case whose traces exist; return (pages written, cases skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for case in cases:
        try:
            text = render_case(case, out_dir)
        except FileNotFoundError as exc:
            skipped.append(f"{case.name} (trace {exc.args[0]} not captured yet)")
            continue
        page = out_dir / f"{case.name}.md"
        page.write_text(text)
        written.append(page)
    return written, skipped


def check(cases: list[Case], committed_dir: Path) -> list[str]:
    """Regenerate into a temp dir; the pages that differ from the committed ones (with a diff)."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        pages, _ = write_pages(cases, Path(tmp))
        for page in pages:
            old = committed_dir / page.name
            new = page.read_text()
            if not old.exists():
                problems.append(f"{old.relative_to(ROOT) if old.is_relative_to(ROOT) else old}: "
                                "not committed (run scripts/make_analyses.py)")
                continue
            if old.read_text() != new:
                d = "".join(difflib.unified_diff(old.read_text().splitlines(True), new.splitlines(True),
                                                 str(old), "regenerated", n=1))
                problems.append(f"{old}: differs from a fresh run\n{d}")
    return problems


def _adhoc(args) -> Case:
    return Case(name=args.name, before=args.before, after=args.after, by=args.by,
                title=args.title or args.name, notes=args.notes or "",
                ops=tuple(args.op or ()), before_range=args.before_range, after_range=args.after_range)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir; exit 1 on drift")
    ap.add_argument("--only", action="append", help="only this case (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "analyses", help="output directory")
    ap.add_argument("--list", action="store_true", help="list the cases and whether their traces exist")
    adhoc = ap.add_argument_group("one ad-hoc case instead of the defined ones")
    adhoc.add_argument("--name")
    adhoc.add_argument("--before")
    adhoc.add_argument("--after")
    adhoc.add_argument("--by", default="range", choices=["range", "kernel", "aten"])
    adhoc.add_argument("--title")
    adhoc.add_argument("--notes")
    adhoc.add_argument("--op", action="append", help="an op of interest (repeatable)")
    adhoc.add_argument("--before-range", help="BEFORE's op to compare with --after-range")
    adhoc.add_argument("--after-range", help="AFTER's op to compare with --before-range")
    args = ap.parse_args(argv)

    if args.name or args.before:
        if not (args.name and args.before):
            ap.error("an ad-hoc case needs --name and --before")
        cases = [_adhoc(args)]
    else:
        cases = [c for c in CASES if not args.only or c.name in args.only]
        unknown = set(args.only or ()) - {c.name for c in CASES}
        if unknown:
            ap.error(f"no case named {sorted(unknown)[0]!r}; cases: {', '.join(c.name for c in CASES)}")
    if args.list:
        for c in cases:
            have = all((ROOT / t).exists() for t in c.traces())
            print(f"{c.name}: {' vs '.join(c.traces())} ({'ready' if have else 'trace missing'})")
        return 0
    try:
        if args.check:
            problems = check(cases, args.out)
            for p in problems:
                print(f"drift: {p}", file=sys.stderr)
            if problems:
                print("make_analyses: pages are stale: run `python scripts/make_analyses.py` and commit",
                      file=sys.stderr)
                return 1
            print(f"make_analyses: {len(cases)} case(s) checked, no drift")
            return 0
        pages, skipped = write_pages(cases, args.out)
    except CaseError as exc:
        print(f"make_analyses: error: {exc}", file=sys.stderr)
        return 2
    except profkit.ProfkitError as exc:
        print(f"make_analyses: error: {exc}", file=sys.stderr)
        return 2
    for p in pages:
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

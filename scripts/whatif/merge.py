"""``merge``: a ``measure`` or ``interleave`` output added to the committed data
(``store.MEASURED``), one run folder per rep.

``merge`` adds each rep of a ``measure`` output to the committed data
(``analyses/data/whatif/measured_h200.json.xz``) as a run folder ``LABEL_rN``, and each process of
an ``interleave`` output as ``ab-LABEL_rN``; the page reads a pair from the ``ab-`` folders alone
where it has any, showing the separate runs beside them. An interleaved folder keeps each fix's
gain paired round by round (``paired_gain``) and the host's issue time of an iteration
(``issue_ns``), and the process's blocks go to ``store.INTERLEAVED``.
"""
from __future__ import annotations

import argparse
import json
import lzma
import statistics
from pathlib import Path

from . import store


def paired_gain(base_ns: list[float], fix_ns: list[float]) -> float:
    """An interleaved process's gain for a fix: the median over its rounds (the first, warm-up,
    left out) of the baseline's block over the fix's block of the same round. The blocks of one
    round ran next to each other, so a change of the CPU's speed that lasts several rounds (seen
    on the timing machines: 1.9x for seconds) divides out of each ratio, where the ratio of the
    two medians would keep it."""
    return float(statistics.median(b / f for b, f in zip(base_ns[1:], fix_ns[1:])))


def cmd_merge(args: argparse.Namespace) -> None:
    """Each rep of a ``measure`` output becomes one run folder of the committed data (the baseline
    and the fixes of one rep ran one after the other, which is what a folder means there). An
    ``interleave`` output's folders are named AB_PREFIX + LABEL_rN; each fix's ``gain`` there is
    ``paired_gain`` of the process's blocks (read from OUTDIR/calib/, copied to INTERLEAVED)."""
    try:
        new = json.loads(Path(args.measured).read_text())
        programs = new["programs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"cannot read {args.measured} as a `measure` output ({e}): pass "
                         "OUTDIR/measured.json") from None
    ab = bool(new.get("interleaved"))
    data = store.read_measured()
    kept = store.interleaved_blocks()
    added = 0
    for prog, entry in programs.items():
        blocks = {}
        for rep in (entry["variants"].get("baseline", {}).get("reps", []) if ab else []):
            raw = Path(args.measured).parent / "calib" / f"{prog}__interleaved__{rep}.json"
            try:
                blocks[rep] = json.loads(raw.read_text())
            except (OSError, ValueError) as e:
                raise SystemExit(f"cannot read {raw} ({e}): an interleaved output needs its calib/ folder") from None
            kept[f"{store.AB_PREFIX}{args.folder}_r{rep}__{prog}"] = blocks[rep]
        for var, v in entry["variants"].items():
            for rep, med, n in zip(v["reps"], v["median_ns"], v["n_used"]):
                folder = f"{store.AB_PREFIX if ab else ''}{args.folder}_r{rep}"
                runs = data["runs"].setdefault(prog, {}).setdefault(var, {})
                if folder in runs:
                    raise SystemExit(f"folder {folder} already holds {prog} {var}: pick another --folder")
                runs[folder] = {"iterations": n, "median_ns": med}
                if getattr(args, "gpu", ""):
                    # the GPU the folder ran on: the page prices a folder timed on another GPU
                    # than its program's capture at the capture's calibration
                    data.setdefault("folder_gpu", {}).setdefault(prog, {})[folder] = args.gpu
                if ab and "issue_median_ns" in blocks[rep]["variants"][var]:
                    # the host's issue time of one iteration (_corpus.interleave): the CPU's speed
                    # in this process, which a GPU-paced baseline's period does not show
                    runs[folder]["issue_ns"] = blocks[rep]["variants"][var]["issue_median_ns"]
                if ab and blocks[rep]["variants"][var].get("gc_median_ns"):
                    # the garbage collector's time an iteration in this process (store.gc_biased)
                    runs[folder]["gc_ns"] = blocks[rep]["variants"][var]["gc_median_ns"]
                if ab and var != "baseline":
                    vb = blocks[rep]["variants"]
                    runs[folder]["gain"] = round(paired_gain(vb["baseline"]["block_ns"], vb[var]["block_ns"]), 4)
                added += 1
    if getattr(args, "gpu", "") and args.gpu != data["gpu"]:
        # programs captured and timed on another kind of GPU: their traces say so too (TARGET_INFO_GPU)
        for prog in programs:
            data.setdefault("program_gpu", {})[prog] = args.gpu
    if args.note:
        data["how"] = data["how"].rstrip(". ") + ". " + args.note
    if ab:
        store.INTERLEAVED.write_bytes(lzma.compress((json.dumps(kept, sort_keys=True) + "\n").encode(), preset=9))
    store.write_data(store.MEASURED, data)
    print(f"added {added} run(s) to {store.MEASURED.relative_to(store.ROOT)}")


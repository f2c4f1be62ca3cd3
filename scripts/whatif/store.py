"""The committed timings (``analyses/data/whatif/``): where they live, how the harness writes its
JSON, and which run folders give a pair's measured gain.

A run folder of ``MEASURED`` holds the variants of one program timed together: the reps of a
``measure`` call (the baseline and the fixes one after the other) or one ``interleave`` process
(the variants side by side, blocks taking turns). The interleaved folders are named AB_PREFIX +
LABEL + _rN, and where a pair has any they alone give its gain (``measured_speedups``).
"""
from __future__ import annotations

import json
import lzma
import os
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every run folder's timings, xz-compressed JSON in write_json's layout (read_data, write_data)
MEASURED = ROOT / "analyses" / "data" / "whatif" / "measured_h200.json.xz"
# The interleaved processes' blocks, as ``interleave`` wrote them (``merge`` copies them here).
# Every interleaved process's blocks, {FOLDER__PROGRAM: the process's output}, xz-compressed JSON
INTERLEAVED = ROOT / "analyses" / "data" / "whatif" / "interleaved_blocks.json.xz"
# merge names an interleaved output's folders AB_PREFIX + LABEL + _rN: the page reads a pair from
# them alone where it has any (``measured_speedups``).
AB_PREFIX = "ab-"


def write_json(path: Path, data: dict) -> None:
    """``data`` as indented JSON whose innermost objects (a run folder's timing) each take one
    line: diffs stay one line a run, and the file a fraction of its fully indented size."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(_layout(data))
    os.replace(tmp, path)


def _layout(data: dict) -> str:
    """write_json's text of ``data``."""
    def dump(x, depth: int) -> str:
        if not isinstance(x, dict) or not any(isinstance(v, (dict, list)) for v in x.values()):
            return json.dumps(x)
        pad = " " * (depth + 1)
        body = ",\n".join(f"{pad}{json.dumps(k)}: {dump(v, depth + 1)}" for k, v in x.items())
        return "{\n" + body + "\n" + " " * depth + "}"
    return dump(data, 0) + "\n"


def read_data(path: Path) -> dict:
    """A committed data file: JSON, xz-compressed where its name ends in .xz."""
    raw = path.read_bytes()
    return json.loads(lzma.decompress(raw) if path.suffix == ".xz" else raw)


def write_data(path: Path, data: dict) -> None:
    """``data`` to ``path`` in write_json's layout, xz-compressed where the name ends in .xz
    (``xz -dc`` gives the text back, one line a run folder or a pair)."""
    text = _layout(data).encode()
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(lzma.compress(text, preset=9 | lzma.PRESET_EXTREME) if path.suffix == ".xz" else text)
    os.replace(tmp, path)


def interleaved_blocks() -> dict:
    """The committed blocks of every interleaved process, by FOLDER__PROGRAM (empty before any)."""
    return json.loads(lzma.decompress(INTERLEAVED.read_bytes())) if INTERLEAVED.exists() else {}


# An interleaved process holds every variant's objects, and each full pass of Python's garbage
# collector walks all of them: a variant that collects for this share of its iteration or more was
# slowed by the others' objects (tabular_mlp_train's row-by-row loader: 41.0 ms an iteration, 19.3
# ms of it collecting, beside its fixes; 16.1-16.8 ms alone in its own process).
GC_BIASED_SHARE = 0.25


def gc_biased(entry: dict) -> bool:
    """Whether a run folder's timing of one variant spent GC_BIASED_SHARE of its iteration or more
    in the garbage collector (``gc_ns``, kept for interleaved processes since allocation 48)."""
    return entry.get("gc_ns", 0) >= GC_BIASED_SHARE * entry["median_ns"]


def shared_folders(base: dict, runs: dict, interleaved: bool | None = None) -> list[str]:
    """The run folders that timed both the baseline and the fix: the interleaved ones alone where
    there are any (the variants shared one process, so the machine's drift between processes,
    up to 1.9x on host-bound programs, is not in them), else the separate runs; an interleaved
    folder where either side was slowed by the other variants' objects (``gc_biased``) is left out
    where separate runs timed the pair. ``interleaved`` True / False picks one kind."""
    both = [f for f in runs if f in base]
    ab = [f for f in both if f.startswith(AB_PREFIX)]
    separate = [f for f in both if not f.startswith(AB_PREFIX)]
    if separate and interleaved is not True:
        ab = [f for f in ab if not (gc_biased(base[f]) or gc_biased(runs[f]))]
    if interleaved is None:
        return ab or separate
    return ab if interleaved else separate


def measured_speedups(measured: dict, interleaved: bool | None = None
                      ) -> dict[tuple[str, str], tuple[float, int, list[float]]]:
    """(program, fix) -> (median over run folders of baseline / fix measured in the same folder,
    folders, the per-folder ratios); the folders as ``shared_folders`` picks them."""
    out = {}
    for prog, variants in measured["runs"].items():
        base = variants.get("baseline", {})
        for var, runs in variants.items():
            if var == "baseline":
                continue
            ratios = [runs[r].get("gain", base[r]["median_ns"] / runs[r]["median_ns"])
                      for r in shared_folders(base, runs, interleaved)]
            if ratios:
                out[(prog, var)] = (float(statistics.median(ratios)), len(ratios), ratios)
            else:  # never in one folder: medians of different runs (separate runs only, with False)
                bs = [b["median_ns"] for f, b in base.items() if interleaved is not False or not f.startswith(AB_PREFIX)]
                vs = [v["median_ns"] for f, v in runs.items() if interleaved is not False or not f.startswith(AB_PREFIX)]
                if bs and vs and interleaved is not True:
                    r = statistics.median(bs) / statistics.median(vs)
                    out[(prog, var)] = (r, 0, [r])
    return out


def timed_baseline(measured: dict, prog: str, fix: str, interleaved: bool | None = None) -> float:
    """The baseline's median iteration in the run folders where ``fix`` was timed beside it
    (``shared_folders``; median over them, over every folder when they never shared one)."""
    runs = measured["runs"][prog]
    base, mine = runs["baseline"], runs[fix]
    shared = shared_folders(base, mine, interleaved) or [
        f for f in base if interleaved is None or f.startswith(AB_PREFIX) == interleaved] or list(base)
    return float(statistics.median(base[f]["median_ns"] for f in shared))


def read_measured() -> dict:
    """The committed timings (``MEASURED``)."""
    return read_data(MEASURED)

#!/usr/bin/env python3
"""The CUDA and Triton kernels of each bundled op at the decode shapes, one profiled launch each,
for Nsight Compute (why are the extension's row kernels slower than Triton's at these shapes?):

    ncu --profile-from-start off --set full --csv --page raw \\
        python scripts/gpu/ncu_decode_compare.py > ncu_decode_compare.csv

Only the launch between profiler start and stop is profiled (after warm-up calls: builds,
autotuning, Triton's compiled-kernel launch path), in the order printed on stderr.  With
--sass DIR it also writes the SASS of the kernels it ran (cuobjdump of the extension, Triton's
the Triton cache's cubins) for an instruction count side by side, and

    python scripts/gpu/ncu_decode_compare.py --summarize ncu_decode_compare.csv [--sass DIR]

prints the comparison: per op and shape, each backend's duration and instructions executed
(ncu, clocks locked, no graph), and with the SASS, the instruction mix of the add+RMSNorm kernels.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SHAPES = [(1, 4096), (16, 4096), (64, 8192)]
OPS = ("add_rmsnorm", "add_layernorm", "softmax", "bias_gelu")


def call(op: str, backend: str, x, r, w, b):
    import kernels

    if op == "add_rmsnorm":
        return kernels.add_rmsnorm(x, r, w, 1e-6, backend=backend)
    if op == "add_layernorm":
        return kernels.add_layernorm(x, r, w, b, 1e-5, backend=backend)
    if op == "softmax":
        return kernels.softmax(x, 1.0, backend=backend)
    return kernels.bias_gelu(x, b, "none", backend=backend)


def write_sass(out: Path) -> None:
    from kernels import _build

    out.mkdir(parents=True, exist_ok=True)
    for so in _build.cache_dir().rglob("*.so"):
        res = subprocess.run(["cuobjdump", "-sass", str(so)], capture_output=True, text=True)
        (out / "cuda_extension.sass").write_text(res.stdout or res.stderr)
        break
    # Triton's own cache holds every compiled variant: dump the cubins' SASS by file name
    for cubin in Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache")).rglob("*.cubin"):
        res = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True)
        (out / f"triton_{cubin.parent.name[:12]}_{cubin.stem}.sass").write_text(res.stdout or res.stderr)


METRICS = {"gpu__time_duration.sum": "ns", "smsp__inst_executed.sum": "instructions",
           "launch__registers_per_thread": "registers", "launch__block_size": "threads",
           "launch__grid_size": "blocks"}


def _opcode_mix(sass: str) -> dict[str, int]:
    """Static instruction count per opcode (without modifiers) of one function's SASS."""
    mix: dict[str, int] = {}
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", line)
        if m:
            mix[m.group(1)] = mix.get(m.group(1), 0) + 1
    return mix


def _function(sass: str, needle: str) -> str:
    """The SASS of the first function whose name contains `needle` (cuobjdump output)."""
    parts = re.split(r"(?m)^\s*Function : ", sass)
    return next((p for p in parts[1:] if needle in p.splitlines()[0]), "")


def summarize(csv_path: Path, sass_dir: Path | None) -> str:
    # ncu's own messages (==PROF==, ==WARNING==) are not CSV; rows[0] holds the units
    rows = list(csv.DictReader(line for line in _read(csv_path).splitlines() if line.startswith('"')))[1:]
    cases = [(op, be, f"{r}x{n}") for r, n in SHAPES for op in OPS for be in ("cuda", "triton")]
    if len(rows) != len(cases):
        sys.exit(f"{csv_path}: {len(rows)} profiled kernels, expected {len(cases)}")
    val = {c: {k: float(row[k].replace(",", "")) for k in METRICS} for c, row in zip(cases, rows)}
    out = ["| op | shape | CUDA ns | Triton ns | CUDA instructions | Triton instructions | ratio |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r, n in SHAPES:
        for op in OPS:
            c, t = val[(op, "cuda", f"{r}x{n}")], val[(op, "triton", f"{r}x{n}")]
            out.append(f"| {op} | {r}x{n} | {c['gpu__time_duration.sum']:.0f} | {t['gpu__time_duration.sum']:.0f} | "
                       f"{c['smsp__inst_executed.sum']:.0f} | {t['smsp__inst_executed.sum']:.0f} | "
                       f"{c['smsp__inst_executed.sum'] / t['smsp__inst_executed.sum']:.2f} |")
    if sass_dir:
        cu = _function(_read(sass_dir / "cuda_extension.sass.xz"), "add_rmsnorm_reg_kernelIN3c108BFloat16ELi8ELi2E")
        tr = [_read(f) for f in sorted(sass_dir.glob("triton_*add_rmsnorm_kernel.sass*"))]
        # the Triton variant with as many loads as the CUDA kernel: the same elements a thread
        # (2 vectors of x, residual and weight: a 4096 row on 256 threads)
        same = [t for t in tr if _opcode_mix(t).get("LDG") == _opcode_mix(cu).get("LDG")]
        tr = same[0] if same else ""
        mixes = {"CUDA add_rmsnorm_reg_kernel<bf16, 8, 2>": _opcode_mix(cu),
                 "Triton _add_rmsnorm_kernel, same loads a thread": _opcode_mix(tr)}
        ops = sorted({o for m in mixes.values() for o in m}, key=lambda o: (-max(m.get(o, 0) for m in mixes.values()), o))
        out += ["", "static SASS instructions by opcode (the whole function, slow paths included):", "",
                "| opcode | " + " | ".join(mixes) + " |", "| --- |" + " ---: |" * len(mixes),
                "| all | " + " | ".join(str(sum(m.values())) for m in mixes.values()) + " |"]
        out += [f"| {o} | " + " | ".join(str(m.get(o, 0)) for m in mixes.values()) + " |" for o in ops[:14]]
    return "\n".join(out)


def _read(path: Path) -> str:
    if not path.exists():
        return ""
    opener = {".xz": lzma.open, ".gz": gzip.open}.get(path.suffix)
    return opener(path, "rt").read() if opener else path.read_text()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sass", type=Path, default=None, help="directory for the kernels' SASS")
    ap.add_argument("--summarize", type=Path, default=None, help="an ncu CSV (--page raw) of this script's run")
    args = ap.parse_args()
    if args.summarize:
        print(summarize(args.summarize, args.sass))
        return 0
    import torch
    if not torch.cuda.is_available():
        sys.exit("ncu_decode_compare.py needs a CUDA device.")
    torch.manual_seed(0)
    for rows, n in SHAPES:
        x, r = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for op in OPS:
            for backend in ("cuda", "triton"):
                for _ in range(5):
                    call(op, backend, x, r, w, b)
                torch.cuda.synchronize()
                print(f"profiled: {op} {backend} {rows}x{n}", file=sys.stderr, flush=True)
                torch.cuda.profiler.start()
                call(op, backend, x, r, w, b)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
    if args.sass:
        write_sass(args.sass)
    return 0


if __name__ == "__main__":
    sys.exit(main())

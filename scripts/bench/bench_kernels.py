#!/usr/bin/env python3
"""Benchmark the bundled fused kernels against their baselines (a benchmark, not a test).

For every op and shape it times, side by side in one run: backend="auto", the Triton kernel, the CUDA
C++ kernel (current and previous launch configuration), Liger-Kernel when installed (ops it has),
the eager PyTorch baseline (kernels/baselines.py) and torch.compile of that same baseline; and for
each, the host cost per call of plain launches.

Method: warm-up, then CUDA-event timing of batches of calls, median over batches.  Inputs rotate
over up to 64 buffer sets, enough that one pass over them is larger than 3x the L2 (60 MiB on
H200) from 64x8192 up, so the data comes from HBM; at the smallest decode shapes (1x4096, 16x4096)
64 sets stay in L2, as a decode op's input does in a model (the kernel before it just wrote it).  Every shape is captured into a CUDA graph of many calls and the graph is
replayed, so the host-side cost of a call (Python dispatch, torch.compile guards, Triton's launcher:
tens of µs) is not what is measured: without graphs the Triton and torch.compile paths were
CPU-bound below ~50 µs of GPU time in our runs.  --no-graph times plain launches instead.  Each measured region is an NVTX
range named <kernel>.<backend>.<shape> (no '/': ncu's --nvtx-include nests on it) (nsys profile -t cuda,nvtx ... python scripts/bench/bench_kernels.py --quick).

Effective GB/s = bytes the fused op must move (kernels/baselines.PASSES["fused"] tensor passes +
the weight/bias vectors) / median time, for every backend alike.

    python scripts/bench/bench_kernels.py --out out/bench            # full run, a few minutes on an H200
    python scripts/bench/bench_kernels.py --quick --out out/quick    # few shapes, few reps (profiling)
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import kernels  # noqa: E402
from kernels import baselines  # noqa: E402

L2_BYTES = 60 * 2**20
DATASHEET_BPS = 4.8e12
DECODE = [(1, 4096), (16, 4096), (64, 8192)]
PREFILL = [(4096, 4096), (16384, 2048), (16384, 4096), (16384, 8192), (65536, 4096), (65536, 8192)]
QUICK = [(16, 4096), (16384, 4096)]
OPS = ["add_rmsnorm", "add_rmsnorm_", "add_layernorm", "bias_gelu", "softmax"]
# ours: auto (the default backend), triton, cuda, cuda_v0 (the CUDA extension with its previous
# launch configurations, kernels/_build.set_launch_variant); peers: liger (Liger-Kernel, optional,
# only ops it has an equivalent for), compile (torch.compile of the eager baseline); eager; and a
# reference, copy: one torch kernel that reads and writes the op's tensors once (the floor at that shape).
IMPLS = ["auto", "triton", "cuda", "cuda_v0", "liger", "eager", "compile", "copy"]
OURS = ("auto", "triton", "cuda", "cuda_v0")
PEERS = ("liger", "compile")
HOST_CALLS = 300


def find_peers():
    """Optional peer libraries found in this environment: {name: version}."""
    found = {}
    try:
        import liger_kernel  # noqa: F401
        from importlib import metadata

        try:
            found["liger"] = metadata.version("liger_kernel")
        except metadata.PackageNotFoundError:
            found["liger"] = "unknown"
    except ImportError:
        pass
    return found


def liger_fn(op):
    """Liger-Kernel's equivalent of op, or None (no equivalent, or Liger not installed).

    add_layernorm: Liger has no residual-add LayerNorm; its peer is `x + r` then LigerLayerNorm
    (two kernels, what a Liger user writes).  bias_gelu: no equivalent.  softmax: no scale
    argument, so `x * scale` is a separate eager multiply (benchmarked with scale 1.0 instead)."""
    try:
        if op == "add_rmsnorm":
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as F

            return lambda d: F.apply(d["x"], d["residual"], d["weight"], 1e-6, 0.0, "llama", False)
        if op == "add_rmsnorm_":
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as F

            return lambda d: F.apply(d["x"], d["residual"], d["weight"], 1e-6, 0.0, "llama", True)
        if op == "add_layernorm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction as F

            def f(d):
                h = d["x"] + d["residual"]
                return F.apply(h, d["weight"], d["bias"], 1e-5), h

            return f
        if op == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction as F

            return lambda d: F.apply(d["x"])
    except ImportError:
        return None
    return None

try:
    import nvtx as _nvtx

    def nvtx_range(name):
        return _nvtx.annotate(name)
except ImportError:  # fall back to torch's NVTX bindings
    def nvtx_range(name):
        return torch.cuda.nvtx.range(name)


def make_set(op, rows, hidden, dtype):
    g = lambda *s: torch.randn(*s, device="cuda", dtype=dtype)  # noqa: E731
    if op in ("add_rmsnorm", "add_rmsnorm_"):
        return dict(x=g(rows, hidden), residual=g(rows, hidden), weight=g(hidden))
    if op == "add_layernorm":
        return dict(x=g(rows, hidden), residual=g(rows, hidden), weight=g(hidden), bias=g(hidden))
    if op == "bias_gelu":
        return dict(x=g(rows, hidden), bias=g(hidden))
    return dict(x=g(rows, hidden))


def rotation_sets(op, rows, hidden, dtype) -> list[dict]:
    """Input sets to rotate over: enough that one pass is over 3x the L2 (at most 64)."""
    in_bytes = sum(t.numel() * t.element_size() for t in make_set(op, 1, hidden, dtype).values()) * rows
    n_sets = max(2, min(64, math.ceil(3 * L2_BYTES / max(in_bytes, 1))))
    return [make_set(op, rows, hidden, dtype) for _ in range(n_sets)]


def fused_bytes(op, rows, hidden, elem):
    vectors = {"add_rmsnorm": 1, "add_rmsnorm_": 1, "add_layernorm": 2, "bias_gelu": 1, "softmax": 0}[op]
    return (baselines.PASSES[op]["fused"] * rows + vectors) * hidden * elem


def make_fn(op, impl):
    """A callable taking one input set (None: no such implementation); `compile` wraps the eager
    baseline in torch.compile.  Softmax runs with scale 1.0 for every implementation (Liger's has none)."""
    if impl == "liger":
        return liger_fn(op)
    if impl == "copy":
        # The op's tensor passes and nothing else, in one kernel: -x (2 passes: an elementwise kernel;
        # a same-dtype copy_ would become a copy-engine memcpy node inside the CUDA graph, 65% of the
        # copy bandwidth at 1 GiB on an H200), or x and residual -> one new tensor (torch.cat: 4
        # passes).  At a decode shape this is about the least GPU time a kernel that reads its input
        # and writes its output takes; at a large one, the bandwidth of a plain kernel at that size.
        if baselines.PASSES[op]["fused"] == 4:
            return lambda d: torch.cat([d["x"], d["residual"]])
        return lambda d: torch.neg(d["x"])
    if impl in OURS:
        be = "cuda" if impl == "cuda_v0" else impl
        calls = {
            "add_rmsnorm": lambda d: kernels.add_rmsnorm(d["x"], d["residual"], d["weight"], 1e-6, backend=be),
            "add_rmsnorm_": lambda d: kernels.add_rmsnorm_(d["x"], d["residual"], d["weight"], 1e-6, backend=be),
            "add_layernorm": lambda d: kernels.add_layernorm(d["x"], d["residual"], d["weight"], d["bias"], 1e-5,
                                                             backend=be),
            "bias_gelu": lambda d: kernels.bias_gelu(d["x"], d["bias"], "none", backend=be),
            "softmax": lambda d: kernels.softmax(d["x"], 1.0, backend=be),
        }
        return calls[op]
    base = {
        "add_rmsnorm": lambda x, residual, weight: baselines.add_rmsnorm(x, residual, weight, 1e-6),
        "add_rmsnorm_": lambda x, residual, weight: baselines.add_rmsnorm_(x, residual, weight, 1e-6),
        "add_layernorm": lambda x, residual, weight, bias: baselines.add_layernorm(x, residual, weight, bias, 1e-5),
        "bias_gelu": lambda x, bias: baselines.bias_gelu(x, bias, "none"),
        "softmax": lambda x: baselines.softmax(x, 1.0),
    }[op]
    if impl == "compile":
        base = torch.compile(base, dynamic=False)
    return lambda d: base(**d)


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def time_batches(fn, sets, reps, inner, use_graph):
    """Median seconds per call over `reps` batches of `inner` calls, rotating over `sets`."""
    stream = torch.cuda.current_stream()
    for i in range(max(3, len(sets))):  # warm-up (compiles, autotunes, caches)
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    run = lambda: [fn(sets[i % len(sets)]) for i in range(inner)]  # noqa: E731
    if use_graph:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            run()
        stream.wait_stream(side)
        with torch.cuda.graph(graph):
            run()
        graph.replay()
        torch.cuda.synchronize()
        run = graph.replay
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def host_cost(fn, sets, calls=HOST_CALLS):
    """CPU seconds per call of plain launches (no graph): `calls` calls back to back, one sync at
    the end; when the GPU work per call is shorter than the host cost this is also the call rate."""
    for i in range(3):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(sets[i % len(sets)])
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls


class launch_variant:
    """Context: every CUDA op on its previous launch configuration (variant 0), restored after."""

    def __enter__(self):
        from kernels import _build

        self.old = {op: _build.set_launch_variant(op, 0) for op in _build.LAUNCH_OPS}

    def __exit__(self, *exc):
        from kernels import _build

        for op, v in self.old.items():
            _build.set_launch_variant(op, v)


def measure_empty_kernel(use_graph: bool) -> float:
    """Seconds per call of a CUDA kernel that does nothing (torch.cuda._sleep(0)), timed like the
    ops: the floor under any call at the decode shapes."""
    return time_batches(lambda _: torch.cuda._sleep(0), [None] * 64, reps=15, inner=256, use_graph=use_graph)


def measure_copy_bandwidth():
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = time_batches(lambda _: dst.copy_(src), [None], reps=10, inner=5, use_graph=False)
    return 2 * src.numel() / t  # read + write


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for bench_kernels.csv and bench_kernels.md")
    ap.add_argument("--quick", action="store_true", help="few shapes and reps (for nsys/ncu runs)")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ",".join(IMPLS))
    ap.add_argument("--shapes", default="", help="comma-separated TOKENSxHIDDEN list overriding the defaults")
    ap.add_argument("--no-graph", action="store_true",
                    help="time plain launches (includes host-side launch cost) instead of CUDA graph replays")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--no-host", action="store_true", help="skip the host-cost-per-call column")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA device.")
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 4096)
    dtype = getattr(torch, args.dtype)
    elem = torch.tensor([], dtype=dtype).element_size()
    ops = [o for o in args.ops.split(",") if o]
    impls = [i for i in args.impls.split(",") if i]
    shapes = QUICK if args.quick else DECODE + PREFILL
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    reps = 5 if args.quick else 15
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    peers = find_peers()
    print("peers found: " + (", ".join(f"{k} {v}" for k, v in peers.items()) or "none (torch.compile only)"),
          flush=True)
    if "liger" in impls and "liger" not in peers:
        impls.remove("liger")
    if any(i in impls for i in ("cuda", "cuda_v0", "auto")):
        from kernels import _build

        try:
            _build.ensure_loaded()
        except _build.KernelBuildError as exc:
            print(f"CUDA extension unavailable, cuda/cuda_v0 skipped: {exc}", flush=True)
            impls = [i for i in impls if i not in ("cuda", "cuda_v0")]

    t0 = time.time()
    dev = torch.cuda.get_device_properties(0)
    copy_bps = measure_copy_bandwidth()
    empty_s = measure_empty_kernel(not args.no_graph)
    import triton

    header = (f"# {dev.name}, {dev.multi_processor_count} SMs; torch {torch.__version__}, triton "
              f"{triton.__version__}; {args.dtype}; measured copy bandwidth {copy_bps / 1e9:.0f} GB/s "
              f"(datasheet {DATASHEET_BPS / 1e9:.0f}); empty kernel {empty_s * 1e6:.2f} µs; peers: "
              + (", ".join(f"{k} {v}" for k, v in peers.items()) or "none") + f"; {time.strftime('%Y-%m-%d')}")
    print(header, flush=True)
    rows_out = []
    for op in ops:
        for rows, hidden in shapes:
            shape = f"{rows}x{hidden}"
            nbytes = fused_bytes(op, rows, hidden, elem)
            sets = rotation_sets(op, rows, hidden, dtype)
            n_sets = len(sets)
            small = rows <= 64
            use_graph = not args.no_graph
            if small:  # many calls per graph; their launch overhead is not measured
                inner = 4 * n_sets
            else:  # batches of about 2 ms, at least one pass over all buffer sets
                inner = max(n_sets, min(20, math.ceil(2e-3 / (nbytes / 3e12))))
            res, host, ran = {}, {}, []
            for impl in impls:
                fn = make_fn(op, impl)
                if fn is None:
                    continue
                ran.append(impl)
                ctx = launch_variant() if impl == "cuda_v0" else _nullctx()
                try:
                    with ctx, nvtx_range(f"{op}.{impl}.{shape}"):
                        res[impl] = time_batches(fn, sets, reps, inner, use_graph=use_graph)
                        host[impl] = float("nan") if args.no_host else host_cost(fn, sets)
                except Exception as exc:  # record and go on: one failing backend must not hide the rest
                    print(f"  {op}/{impl}/{shape}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    res[impl] = host[impl] = float("nan")
            peer_times = {p: res[p] for p in PEERS if p in res and res[p] == res[p]}
            best_peer = min(peer_times, key=peer_times.get) if peer_times else ""
            for impl in ran:
                t = res[impl]
                rows_out.append(dict(
                    op=op, shape=shape, tokens=rows, hidden=hidden, dtype=args.dtype, impl=impl,
                    median_us=t * 1e6, gbps=nbytes / t / 1e9, pct_copy=100 * nbytes / t / copy_bps,
                    pct_datasheet=100 * nbytes / t / DATASHEET_BPS,
                    speedup_vs_eager=res.get("eager", float("nan")) / t,
                    speedup_vs_compile=res.get("compile", float("nan")) / t,
                    bytes_bound_vs_eager=baselines.PASSES[op]["eager"] / baselines.PASSES[op]["fused"],
                    cuda_graph=use_graph,
                    host_us=host[impl] * 1e6,
                    best_peer=best_peer,
                    best_peer_us=peer_times[best_peer] * 1e6 if best_peer else float("nan"),
                    speedup_vs_best_peer=(peer_times[best_peer] / t) if best_peer else float("nan"),
                ))
            line = "  ".join(f"{i} {res[i] * 1e6:6.2f}us/h{host[i] * 1e6:5.1f}" for i in ran)
            print(f"{op:14s} {shape:>11s}  {line}", flush=True)
            del sets
            torch.cuda.empty_cache()

    cols = list(rows_out[0].keys())
    with open(out_dir / "bench_kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows_out)
    md = [header + ("; plain launches" if args.no_graph else "; CUDA graph replays"), "",
          f"ran: ops {', '.join(ops)}; shapes {', '.join(f'{a}x{b}' for a, b in shapes)}; impls {', '.join(impls)}", "",
          "| op | shape | impl | median µs | host µs/call | GB/s | % copy BW | × vs eager | best peer | peer µs | × vs best peer |",
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    for r in rows_out:
        md.append(f"| {r['op']} | {r['shape']} | {r['impl']} | {r['median_us']:.2f} | {r['host_us']:.1f} | "
                  f"{r['gbps']:.0f} | {r['pct_copy']:.0f} | {r['speedup_vs_eager']:.2f} | {r['best_peer'] or '-'} | "
                  f"{r['best_peer_us']:.2f} | {r['speedup_vs_best_peer']:.2f} |")
    md.append("")
    md.append("median µs: GPU time per call (CUDA graph replays unless noted), median of batches; host µs/call: "
              f"CPU time per call of {HOST_CALLS} plain launches back to back (no graph); × vs best peer: "
              "best of liger/compile time / this time (>= 1.00 means at or ahead).")
    md.append(f"total benchmark wall time {time.time() - t0:.0f} s")
    (out_dir / "bench_kernels.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()

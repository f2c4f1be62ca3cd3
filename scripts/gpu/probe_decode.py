"""Decode-shape probes behind analyses/kernels_h200.md (an experiment, not the benchmark).

    python scripts/gpu/probe_decode.py time    # -> $OUT/probe_time.json: a Triton softmax copy with its
                                           #    load/store hints, index width and precision toggled
                                           #    one at a time, beside ours and Liger's; bias+GELU
                                           #    cuda/triton/compile at decode shapes
    python scripts/gpu/probe_decode.py empty   # -> $OUT/probe_decode.json: empty kernels (Triton, CUDA),
                                           #    softmax/add_layernorm launch variants 0/2/3, bias+GELU
    ncu --profile-from-start off --clock-control none --metrics ... --csv \
        python scripts/gpu/probe_decode.py ncu # one call of each case between cudaProfilerStart/Stop

Timing is scripts/bench/bench_kernels.py's (CUDA-graph replays over rotated input sets).  Needs a GPU,
the CUDA extension and Liger-Kernel.
"""
import os, sys, glob, json
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
import torch, triton, triton.language as tl
import kernels
import bench_kernels as bk

MODE = sys.argv[1] if len(sys.argv) > 1 else "time"

@triton.jit
def k_soft(X, OUT, N, scale, BLOCK: tl.constexpr, I64: tl.constexpr, EVF: tl.constexpr, CA: tl.constexpr,
           F32: tl.constexpr):
    if I64:
        row = tl.program_id(0).to(tl.int64)
    else:
        row = tl.program_id(0)
    base = row * N
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if EVF:
        x = tl.load(X + base + cols, mask=mask, other=-float("inf"), eviction_policy="evict_first")
    elif CA:
        x = tl.load(X + base + cols, mask=mask, other=-float("inf"), cache_modifier=".ca")
    else:
        x = tl.load(X + base + cols, mask=mask, other=-float("inf"))
    if F32:
        x = x.to(tl.float32)
        x = tl.where(mask, x * scale, -float("inf"))
        m = tl.max(x, axis=0)
        e = tl.exp2((x - m) * 1.4426950408889634)
        e = tl.where(mask, e, 0.0)
        s = tl.sum(e, axis=0)
        y = e / s
    else:
        m = tl.max(x, axis=0)
        e = tl.exp(x - m)
        s = tl.sum(e, axis=0)
        y = e / s
    if CA:
        tl.store(OUT + base + cols, y.to(OUT.dtype.element_ty), mask=mask, cache_modifier=".cs")
    else:
        tl.store(OUT + base + cols, y.to(OUT.dtype.element_ty), mask=mask)

@triton.jit
def k_empty(X):
    pass


VARIANTS = {
    "v_ours(i64,evf,f32)": dict(I64=True, EVF=True, CA=False, F32=True),
    "v_noi64": dict(I64=False, EVF=True, CA=False, F32=True),
    "v_noevict": dict(I64=True, EVF=False, CA=False, F32=True),
    "v_ca_cs_f32": dict(I64=True, EVF=False, CA=True, F32=True),
    "v_bf16_evf": dict(I64=True, EVF=True, CA=False, F32=False),
    "v_liger_like": dict(I64=False, EVF=False, CA=True, F32=False),
}

def soft_fn(kw, warps):
    def f(d):
        x = d["x"]; n = x.shape[-1]; rows = x.numel() // n
        out = torch.empty_like(x)
        k_soft[(rows,)](x, out, n, 1.0, BLOCK=triton.next_power_of_2(n), num_warps=warps, **kw)
        return out
    return f

def cases_softmax():
    from liger_kernel.ops.softmax import LigerSoftmaxFunction as L
    c = {"triton": lambda d: kernels.softmax(d["x"], 1.0, backend="triton"),
         "cuda": lambda d: kernels.softmax(d["x"], 1.0, backend="cuda"),
         "liger": lambda d: L.apply(d["x"])}
    for name, kw in VARIANTS.items():
        c[name] = soft_fn(kw, 8)
    c["v_ours_4w"] = soft_fn(VARIANTS["v_ours(i64,evf,f32)"], 4)
    c["v_liger_like_4w"] = soft_fn(VARIANTS["v_liger_like"], 4)
    return c

def sets_for(op, rows, hidden):
    sets = bk.rotation_sets(op, rows, hidden, torch.bfloat16)
    return sets, len(sets)

def time_cases(op, shapes, cases, rounds=3):
    res = {}
    for rows, hidden in shapes:
        sets, n_sets = sets_for(op, rows, hidden)
        inner = 4 * n_sets if rows <= 64 else max(n_sets, 20)
        for r in range(rounds):  # interleaved rounds: drift shows as spread
            for name, fn in cases.items():
                try:
                    t = bk.time_batches(fn, sets, 15, inner, True)
                except Exception as e:
                    print(op, name, "FAILED", type(e).__name__, str(e)[:200]); t = float("nan")
                res.setdefault(f"{op} {rows}x{hidden} {name}", []).append(t * 1e6)
        for name in cases:
            v = res[f"{op} {rows}x{hidden} {name}"]
            print(f"{op:12s} {rows}x{hidden:<6d} {name:24s} " + " ".join(f"{x:7.2f}" for x in v), flush=True)
    return res

def gelu_cases():
    base = lambda x, bias: kernels.baselines.bias_gelu(x, bias, "none")
    comp = torch.compile(base, dynamic=False)
    return {"cuda": lambda d: kernels.bias_gelu(d["x"], d["bias"], "none", backend="cuda"),
            "triton": lambda d: kernels.bias_gelu(d["x"], d["bias"], "none", backend="triton"),
            "compile": lambda d: comp(**d)}

if MODE == "time":
    from kernels import _build; _build.ensure_loaded()
    out = {}
    out.update(time_cases("softmax", [(1, 4096), (16, 4096), (64, 8192)], cases_softmax()))
    out.update(time_cases("bias_gelu", [(1, 4096), (16, 4096)], gelu_cases()))
    json.dump(out, open(os.environ["OUT"] + "/probe_time.json", "w"), indent=1)
    # inductor's kernel for bias+GELU
    for f in glob.glob("/tmp/torchinductor_*/**/*.py", recursive=True):
        s = open(f).read()
        if "gelu" in s and "triton_poi" in s and "@triton.jit" in s:
            print("==== inductor", f); print(s[:4000])
    # PTX loads/stores of the probe softmax variants
    for name in ("v_ours(i64,evf,f32)", "v_liger_like"):
        x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16); o = torch.empty_like(x)
        ck = k_soft[(16,)](x, o, 4096, 1.0, BLOCK=4096, num_warps=8, **VARIANTS[name])
        ptx = ck.asm["ptx"]
        print("==== ptx", name, [l.strip() for l in ptx.splitlines() if "ld.global" in l or "st.global" in l][:6])
        print("   regs", ck.n_regs, "spills", ck.n_spills)

if MODE == "ncu":
    from kernels import _build; _build.ensure_loaded()
    import torch.cuda.nvtx as nv
    todo = []
    sc = cases_softmax()
    for name in ("triton", "cuda", "liger", "v_ours(i64,evf,f32)", "v_liger_like"):
        todo.append(("softmax", 16, 4096, name, sc[name]))
    gc = gelu_cases()
    for shp in ((1, 4096), (16, 4096), (65536, 8192)):
        for name in ("cuda", "triton", "compile"):
            todo.append(("bias_gelu", shp[0], shp[1], name, gc[name]))
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as LF
    base_ = torch.compile(lambda x, residual, weight: kernels.baselines.add_rmsnorm_(x, residual, weight, 1e-6), dynamic=False)
    nc = {"cuda": lambda d: kernels.add_rmsnorm_(d["x"], d["residual"], d["weight"], 1e-6, backend="cuda"),
          "triton": lambda d: kernels.add_rmsnorm_(d["x"], d["residual"], d["weight"], 1e-6, backend="triton"),
          "compile": lambda d: base_(**d),
          "liger": lambda d: LF.apply(d["x"], d["residual"], d["weight"], 1e-6, 0.0, "llama", True)}
    for name in nc:
        todo.append(("add_rmsnorm_", 16384, 4096, name, nc[name]))
    prepared = []
    for op, rows, hidden, name, fn in todo:
        d = bk.make_set(op, rows, hidden, torch.bfloat16)
        for _ in range(3):
            fn(d)
        prepared.append((f"{op}.{rows}x{hidden}.{name}", fn, d))
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src); dst.copy_(src)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for tag, fn, d in prepared:
        with nv.range(tag):
            fn(d)
    with nv.range("copy.1GiB"):
        dst.copy_(src)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("ncu cases", len(prepared) + 1)

if MODE == "empty":
    from kernels import _build
    _build.ensure_loaded()

    def with_variant(op, v, fn):
        def f(d):
            _build.set_launch_variant(op, v)
            return fn(d)
        return f

    out = {}
    # A. empty kernels (graph replays)
    z = torch.zeros(1, device="cuda")
    empties = {"triton_empty_1w": lambda d: k_empty[(1,)](z, num_warps=1),
               "triton_empty_8w": lambda d: k_empty[(1,)](z, num_warps=8),
               "torch_sleep0": lambda d: torch.cuda._sleep(0),
               "torch_fill1": lambda d: z.fill_(1.0)}
    sets = [None] * 64
    for name, fn in empties.items():
        ts = [bk.time_batches(fn, sets, 15, 256, True) * 1e6 for _ in range(3)]
        out[f"empty {name}"] = ts
        print(f"empty {name:20s} " + " ".join(f"{t:6.3f}" for t in ts), flush=True)

    sm = lambda d: kernels.softmax(d["x"], 1.0, backend="cuda")
    from liger_kernel.ops.softmax import LigerSoftmaxFunction as L
    sc = {f"cuda_v{v}": with_variant("softmax", v, sm) for v in (0, 2, 3)}
    sc["triton"] = lambda d: kernels.softmax(d["x"], 1.0, backend="triton")
    sc["liger"] = lambda d: L.apply(d["x"])
    out.update(time_cases("softmax", [(1, 4096), (16, 4096), (64, 8192), (4096, 4096)], sc))
    _build.set_launch_variant("softmax", 0)

    ln = lambda d: kernels.add_layernorm(d["x"], d["residual"], d["weight"], d["bias"], 1e-5, backend="cuda")
    lc = {f"cuda_v{v}": with_variant("add_layernorm", v, ln) for v in (0, 2, 3)}
    lc["triton"] = lambda d: kernels.add_layernorm(d["x"], d["residual"], d["weight"], d["bias"], 1e-5, backend="triton")
    out.update(time_cases("add_layernorm", [(1, 4096), (16, 4096), (64, 8192), (4096, 4096)], lc))
    _build.set_launch_variant("add_layernorm", 0)

    gc = gelu_cases()
    out.update(time_cases("bias_gelu", [(1, 4096), (16, 4096), (64, 8192), (4096, 4096)], gc))
    json.dump(out, open(os.environ["OUT"] + "/probe_decode.json", "w"), indent=1)

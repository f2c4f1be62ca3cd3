"""PK108 code-load-per-step: new GPU code is built and loaded inside the steady-state iterations.

What
    Module or library loads (``cuModuleLoadData``, ``cuLibraryLoadData``...) inside most steady
    iterations, each after a long stretch of CPU time: a library compiling a kernel for a shape it
    has not seen yet. cuDNN's runtime-compiled engines (its SDPA attention, fused convolutions)
    build and load one per new shape; so do NVRTC kernels and a ``torch.compile`` that recompiles.
Why
    A shape that changes every iteration pays the compilation every iteration: a KV cache grown by
    ``torch.cat`` gives the attention a new key length at each token, variable sequence lengths a
    new GEMM or attention shape per batch. The compilation takes milliseconds to seconds of CPU
    time while the GPU waits. The cache holds each shape once, so a long enough run stops paying
    it (every length seen); a short capture, or a program whose shapes never repeat, pays it each
    step, and the first pass over every shape pays it in any case.
Evidence
    The loads per iteration and the CPU time right before each (the compilation), from the step
    model; the kernel launched next names the library.
Fix
    Fixed shapes: a preallocated cache of the maximum length attended with a mask, sequences padded
    to a few bucket sizes; or a backend that does not compile per shape
    (``torch.nn.attention.sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])``
    in place of cuDNN attention); or compile the shapes once before the timed loop (warm-up over
    every bucket). With fixed shapes, a CUDA graph of the step (PK103) becomes possible as well.
Expected gain
    Graph edit: each load call and the CPU time right before it take no time (the kernel is
    cached), replayed by the step model at the calibrated CPU scale. It describes a run whose
    shapes are all compiled; whatever the fix (fixed shapes, another backend) costs in the
    kernels' own time is not in it. Where the capture was cut short (``--max-iterations``) while
    every iteration still compiled, the action says the trace may hold only the program's first
    pass over its shapes (evidence ``capture_cut_while_compiling``): a KV-cache sampler whose
    cache grows by a token each step compiled a cuDNN attention per token in its 20 captured
    steps (81 ms each), while its steps after the first batch of prompts, every shape built,
    took 9 ms; a beam search of 48-token searches, 33 ms a token in its first 30, 1.7 ms after.
    ``profkit capture`` now tells such a run by its trace (profkit.run.warmup: code loaded in
    nearly every iteration up to the cut) and captures it again with four times the iterations,
    so that the window starts after the warm-up where the shapes come back; a trace that still
    compiles throughout is a program whose shapes do not. On a trace cut while compiling
    (captured before, or still compiling after the longer run) the finding promises nothing
    (1.0x, its most in ``bound`` and the basis): the trace cannot say whether the shapes come
    back, and the beam search's 8.29x on such a trace measured nothing at its steady state.
References
    cuDNN developer guide, "Runtime fusion engines" (kernels compiled at plan build time); PyTorch
    ``torch.nn.attention.sdpa_kernel``; CUDA Driver API, module and library management.
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table
from profkit.run.step.transform import drop_cpu
from profkit.run.warmup import CODE_LOAD_RE as LOAD_RE, still_loading

RULE = RuleMeta(
    code="PK108", name="code-load-per-step",
    summary="GPU code compiled and loaded inside every step: shapes that change each step",
    tables=(Table.RUNTIME,), example="traces/corpus/kv_decode_sampling.sqlite.xz",
    quiet_on="traces/real/train_llama.sqlite.xz",
    params=(Param("min_per_iteration", 0.5, "loads per iteration (on average)"),
            Param("min_share", 0.05, "the CPU time before the loads, as a share of the iteration")))


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None or m.graph.window.is_all:  # a script of phases compiles once per phase: no step
        return []
    g = m.graph
    is_load = np.array([bool(LOAD_RE.match(str(n))) for n in g.call_names], dtype=bool)
    if not is_load.any():
        return []
    calls = np.flatnonzero(is_load[g.c_name])
    its = max(len(g.iter_call) - 1, 1)
    # in most iterations, not a burst in one (a first call of a new op, a late autotune)
    with_loads = len(np.unique(np.searchsorted(g.iter_call, calls, side="right")))
    if len(calls) < RULE.param("min_per_iteration") * its or with_loads < RULE.param("min_per_iteration") * its:
        return []
    spent = float((g.c_gap[calls] + g.c_own[calls]).sum()) / its
    if spent < RULE.param("min_share") * m.iteration_ns:
        return []
    # the compilation before each load goes with it
    gain, basis = ctx.price(lambda gr: drop_cpu(gr, calls), f"{len(calls) / its:.1f} load(s) per iteration and the "
                                    f"{spent / 1e6:.1f} ms of CPU time before them gone (every "
                                    "shape compiled once)")
    # A capture cut short (--max-iterations) while nearly every iteration still compiled holds
    # only the program's first pass over its shapes: where they come back (a decode loop over
    # batches of the same lengths: a KV-cache sampler's 20 captured tokens each compiled, its
    # steady token 9 ms against 81), the loads stop once each shape is built, and the trace cannot
    # say which. Nothing is promised then: the price is the most it could be, never the gain.
    cut = ctx.prof.full_trace.meta.get("profiled_run_cut")
    first_pass = bool(cut) and still_loading(ctx.prof.full_trace)
    bound, tail = gain, ""
    if first_pass:
        n = cut.split()[2] if len(str(cut).split()) > 2 else "a few"   # "cut after N RANGE"
        gain = 1.0
        basis = (f"not promised: the capture stopped after {n} iterations, nearly every one compiling, "
                 "so its steady step is not in this trace; if the program's shapes never come back, "
                 f"{bound:.2f}x ({basis})")
        tail = (f"; the capture stopped after {n} iterations, every one compiling: if the program's "
                "shapes come back later (batches of the same lengths), only its first pass pays this "
                "and its steady step is not in this trace: capture it again with more iterations "
                "(--max-iterations; profkit capture does this itself when it sees such a run)")
    return [Finding(RULE.code, RULE.name,
                    f"stop compiling GPU code every step: {len(calls) / its:.1f} module load(s) per "
                    f"iteration, each after {spent / max(len(calls) / its, 1) / 1e6:.1f} ms of CPU time "
                    "(a library building a kernel for a new shape: cuDNN attention or convolution "
                    "engines, NVRTC, a recompile); keep shapes fixed (a preallocated cache with a mask, "
                    "padding to a few sizes) or use a backend that does not compile per shape "
                    f"(sdpa_kernel with flash/efficient attention){tail}",
                    Rung.LIBRARY, {"loads_per_iteration": round(len(calls) / its, 2),
                                   "cpu_before_loads_ns_per_iteration_profiled": int(spent),
                                   "capture_cut_while_compiling": first_pass},
                    gain, basis, bound)]

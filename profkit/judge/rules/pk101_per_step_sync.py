"""PK101 per-step-sync: a synchronising call every step drains the GPU's queue.

What
    The CPU blocks in a synchronising call (``loss.item()``, ``.cpu()``, printing a GPU tensor,
    ``cudaStreamSynchronize``, a synchronous device-to-host copy) inside the step, and the GPU
    then idles while the CPU does the work that follows it and refills the queue.
Why
    Without the sync the CPU runs ahead and its work overlaps the GPU's. That only pays when
    the sync is what the step waits on; when the CPU's own work per step is longer than the
    GPU's, the CPU sets the pace with or without it, and removing the sync gains nothing.
Evidence
    The step model's calls that wait for the GPU in a synchronising call or a device-to-host
    copy, grouped by the range they run in (the site), with their count per iteration. Where the
    capture holds the op record (``profkit capture`` on a GPU), the program's lines that made the
    host wait in one iteration of the calibration run, with the torch API each went through
    (``program_lines``: ``torch/distributions/categorical.py:__init__`` for a distribution's
    argument validation, which reads a check back for every distribution made).
Fix
    Keep values on the GPU and read them every N steps (accumulate the loss in a tensor; take a
    data-dependent branch on the GPU with ``torch.where``); use ``non_blocking=True`` copies
    into pinned memory and an event for the few values needed. Where the op record finds the
    waits inside a library's own checks (``LIBRARY_CHECKS``: torch.distributions validating each
    distribution's parameters and each ``log_prob``'s value), the action names the switch that
    turns the checks off first (``validate_args=False``): a VAE's three distributions read six
    checks back a step, and without them its step ran 1.17x faster (priced 1.04x: the checks'
    own kernels and Python go too, which the edit does not remove).
    Where the waits are torch's own (the op record's sync watch finds them inside an op's
    implementation or inside torch's code outside the ops the dispatch shows; or a record made
    before the watch ran a backward, in grad mode, and found none of the trace's reads), no line
    of the program asks for them and there is no value to keep on the GPU: the finding says so,
    with what they cost (``without_them_speedup``), and offers no fix. Eager QAT's fake
    quantization read back 27 values an iteration from its hooks; its step was priced 1.33x for
    keeping them on the GPU, where its convolutions' layout was the measured best
    (channels_last 1.18x, priced 1.22x).
Expected gain
    Graph edit (``remove_syncs``): the values stay on the GPU, so the site's sync calls go (their
    wait, their CPU time and the dispatch before each), with the device-to-host copy that fetched
    each value (``.item()`` is a copy call and a stream sync). A site that reads
    ``loop_reads`` values or more an iteration reads them in a loop (one per parameter, per
    layer): the fix computes them together and keeps them on the GPU (``torch._foreach_norm``,
    ``torch.stack``), so the kernel that produced each value joins the others of its iteration
    in one kernel (their time summed), and the loop's body goes: every call between its first
    value and its last on that thread and in that range (each item's kernel-name look-up, the
    memset of its reduction buffer, its launch and the Python between them) is replaced by the
    one call; the action prices both fixes, the values kept on the GPU with the loop as it is
    (``kept_on_gpu_speedup``: ``keep_values``, each copy left as a call that no longer waits, for
    the GPU op that now consumes the value) and computed together (``read_together_speedup``, its
    number): a hand-written LAMB reading each parameter's trust ratio back (459 reads a step among
    ten elementwise passes per parameter) measured 0.98x with the ratio kept on the GPU (priced
    1.12x with its copies removed as well), where its loop vectorised measured 2.01x, priced
    2.22x for the reads computed together (measured: 152 per-parameter ``.item()`` calls of a ViT step cost about 56 us each
    without a profiler, although each waited only about 6 us; with ``torch._foreach_norm`` the
    step ran 27.9 ms, GPU-bound, priced 28.8 ms from the baseline's capture). A loop is such a
    loop only where it computes the values alone: no GEMM, convolution or attention kernel between
    its first read and its last (``values_loop``), and no copy from the host in its range
    (``host_fed_sites``: the host's data enters each pass). A PPO rollout whose ``Categorical``
    validated its logits and samples every environment step (160 reads an iteration, between the
    policy's GEMMs, the observations copied in each step) was priced 1.80x by removing the
    rollout and the update whole; their reads removed alone, 1.03x. The sync that ends a blocking
    host-to-device copy (``.to(device)`` from pageable memory) is the copy's, not a read: PK104's
    (``value_reads``). The step model replays the edited graph at the
    calibrated CPU scale; the gain is the iteration before over after. Not modelled: other
    Python around a removed ``.item()`` (a branch, a logging call), which goes too when the fix
    removes it, so a sync that guards much CPU work gains more than priced.
References
    PyTorch performance tuning guide, "Avoid unnecessary CPU-GPU synchronization";
    Nsight Systems ``nsys analyze`` rule ``cuda_api_sync``.
"""
from __future__ import annotations

import numpy as np

from profkit.model import Rung
from profkit.judge.rules.base import Finding, Param, RuleContext, RuleMeta, Table
from profkit.run.step.graph import CallKind, StepGraph
from profkit.run.replacements import program_synchronize
from profkit.run.summary import GEMM_RE
from profkit.run.step.transform import keep_values, remove_syncs, sync_calls

RULE = RuleMeta(
    code="PK101", name="per-step-sync",
    summary="a sync every step drains the GPU queue: remove it only when the GPU work sets the step",
    tables=(Table.RUNTIME, Table.KERNEL), example="traces/corpus/early_exit_sync.sqlite.xz",
    quiet_on="traces/real/sync_loop_nosync.sqlite.xz",
    params=(Param("min_per_iteration", 0.9, "synchronising calls per iteration (on average)"),
            Param("loop_reads", 8, "values read at one site per iteration that make a loop over "
                                   "tensors (fewer are separate values: a loss, an accuracy)")))


def site_of(g: StepGraph, calls: np.ndarray) -> np.ndarray:
    """The site of each sync call: the range it runs in."""
    return np.asarray(g.range_names, dtype=object)[g.c_range[calls]]


def sites(g: StepGraph, calls: np.ndarray) -> dict[str, int]:
    """Sync calls per site (the range each runs in), most first."""
    out: dict[str, int] = {}
    for where in site_of(g, calls):
        out[where] = out.get(where, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# what each kind of recorded wait is in the program's terms (profkit.capture.syncsites)
WAIT_TEXT = {"item": ".item()/bool() of a GPU value", "copy to host": "a blocking copy to the host",
             "boolean index": "a boolean-mask index (nonzero)", "nonzero": "nonzero",
             "masked_select": "masked_select", "unique": "unique", "repeat_interleave": "repeat_interleave",
             "synchronize": "a synchronize() call", "in op": "a wait inside torch's own code"}


def program_lines(ctx: RuleContext, limit: int = 3) -> tuple[str, list[dict]]:
    """The program's lines that made the host wait in the capture's op record (one iteration of
    its calibration run; profkit.capture.syncsites), most first, as text and as evidence; empty
    for a trace without the record."""
    rec = sorted(ctx.replacements.recorded("sync"), key=lambda s: -int(s.get("count", 0)))
    if not rec:
        return "", []
    parts = [f"{s.get('file')}:{s.get('line')} in {s.get('function')}() "
             f"({WAIT_TEXT.get(_kind(s), s.get('op'))}"
             + (f" {s['inside']}" if s.get("inside") else "")
             + (f" inside {s['via']}" if s.get("via") else "") + f", {s.get('count')} an iteration)"
             for s in rec[:limit]]
    more = f" and {len(rec) - limit} more" if len(rec) > limit else ""
    return f"; where the program waits (the op record of one iteration): {'; '.join(parts)}{more}", rec[:10]


# Waits a library makes for its own checks, by the API they went through: the checks' name and
# the switch that turns them off (the values are not the program's: nothing needs keeping on the GPU)
LIBRARY_CHECKS = {"torch/distributions/": (
    "torch.distributions' argument validation",
    "pass validate_args=False (or call torch.distributions.Distribution.set_default_validate_args(False)) "
    "once the model is debugged")}


def library_checks(rec: list[dict]) -> tuple[str, str, float]:
    """The library checks behind the recorded waits ``rec`` (program_lines' evidence): their
    name, the switch that turns them off, and the share of the waits they are; ("", "", 0)
    where none."""
    total = sum(int(s.get("count", 0)) for s in rec)
    for where, (name, switch) in LIBRARY_CHECKS.items():
        n = sum(int(s.get("count", 0)) for s in rec if str(s.get("via", "")).startswith(where))
        if n and total:
            return name, switch, n / total
    return "", "", 0.0


def _kind(site: dict) -> str:
    """A recorded wait's kind as the rule reads it: a ``synchronize`` that torch.cuda's APIs did
    not make is a wait inside torch's code (records before ``in op`` covered it)."""
    op = str(site.get("op"))
    return "in op" if op == "synchronize" and not program_synchronize(site.get("via")) else op


def inside_ops(rec: list[dict]) -> tuple[float, list[tuple[str, int]]]:
    """The share of the recorded waits ``rec`` (the op record's, every one) made inside torch's
    own code (found by CUDA's sync debug mode: ``in op``, and a ``synchronize`` that torch.cuda's
    APIs did not make, as records before ``in op`` covered it said), and where, with their waits
    per iteration, most first."""
    total = sum(int(s.get("count", 0)) for s in rec)
    ops: dict[str, int] = {}
    for s in rec:
        if _kind(s) == "in op":
            where = str(s.get("inside") or s.get("via"))
            ops[where] = ops.get(where, 0) + int(s.get("count", 0))
    inside = sum(ops.values())
    return (inside / total if total else 0.0), sorted(ops.items(), key=lambda kv: -kv[1])


UNSEEN = "unseen"   # inside_ops' name for the waits a record without the watch could not place


def unseen_reads(record: object) -> bool:
    """Whether the op record shows that the trace's waits are torch's own: it recorded an
    iteration that ran a backward (grad mode, where every op a program calls to read a value
    back is one the record names: ``_local_scalar_dense``, ``_to_copy``, ``nonzero``) in full,
    found none, and predates the sync watch that would say where they were made. Eager QAT's
    fake quantization and a float64 Cholesky's error checks read back so (the record held
    nothing while the trace held 54 and 2 syncs an iteration; with the watch, QAT's came from
    its fake-quantize hooks). Not in inference mode, where the dispatch shows ``item`` and
    ``to`` and records made before they were read missed the program's own reads."""
    if not isinstance(record, dict) or not record.get("range") or "sync_watch" in record:
        return False
    if record.get("sync") != [] or record.get("backward") is not True:
        return False
    return not any("op record" in str(n) for n in record.get("notes") or [])


def host_to_device_calls(g: StepGraph) -> np.ndarray:
    """Per call: whether it launched a host-to-device copy."""
    copies = np.flatnonzero((g.c_kind == int(CallKind.COPY)) & (np.diff(g.ops_ptr) > 0))
    h2d = np.array(["Host-to-Device" in str(n) for n in g.op_names] + [False], dtype=bool)
    first = g.ops_idx[g.ops_ptr[copies]]
    out = np.zeros(g.n_calls, dtype=bool)
    out[copies[h2d[np.where(g.g_name[first] >= 0, g.g_name[first], len(g.op_names))]]] = True
    return out


def value_reads(g: StepGraph, calls: np.ndarray, h2d: np.ndarray) -> tuple[np.ndarray, int]:
    """Among the sync ``calls``, those the fix removes, and how many blocking host-to-device
    copies' syncs it leaves out (``h2d``: host_to_device_calls): ``.to(device)`` from pageable
    memory is a copy and a stream sync, and that sync is the copy's (its fix is pinned memory and
    ``non_blocking``, PK104), not a value the program reads back."""
    pred = g.c_pred[calls]
    ends_copy = (g.c_kind[calls] == int(CallKind.SYNC)) & (pred >= 0) & h2d[np.maximum(pred, 0)]
    return calls[~ends_copy], len(np.unique(pred[ends_copy]))


def _not_round_trips(g: StepGraph, calls: np.ndarray) -> tuple[np.ndarray, int]:
    """The sync ``calls`` less the copies to the host whose bytes come back later in the step
    (PK104's round trips: offloaded activations, whose fix is not to send them) and the stream
    syncs right after those; and how many such copies there were."""
    from profkit.judge.rules.pk104_pageable_copy import round_trip_ops
    trip = round_trip_ops(g)
    if trip is None:
        return calls, 0
    down = np.unique(g.g_call[trip[0]])
    pred = g.c_pred[calls]
    mine = np.isin(calls, down) | ((g.c_kind[calls] == int(CallKind.SYNC)) & np.isin(pred, down))
    return calls[~mine], len(down)


def values_loop(g: StepGraph, reads: np.ndarray, lib_calls: np.ndarray) -> bool:
    """Whether the loop that makes one site's reads only computes the values it reads: no
    library kernel (a GEMM, a convolution, attention; ``lib_calls``: library_calls) is launched
    between its first read and its last in any iteration. A per-parameter norm loop computes
    values; a loop of minibatches or environment steps that validates a distribution in each
    does the model's work between its reads, which keeping the values on the GPU does not
    remove."""
    if len(reads) < 2:
        return False
    it = np.searchsorted(g.iter_call, reads, side="right")
    for k in np.unique(it):
        mine = reads[it == k]
        lo, hi = np.searchsorted(lib_calls, [mine.min(), mine.max()])
        if hi > lo:
            return False
    return True


def library_calls(g: StepGraph) -> np.ndarray:
    """The calls that launched a library kernel (GEMM_RE), in order."""
    lib = np.array([bool(GEMM_RE.match(str(n))) for n in g.op_names] + [False], dtype=bool)
    launched = np.flatnonzero(g.g_call >= 0)
    names = np.where(g.g_name[launched] >= 0, g.g_name[launched], len(g.op_names))
    return np.sort(g.g_call[launched[lib[names]]])


def host_fed_sites(g: StepGraph, h2d: np.ndarray) -> set[str]:
    """The ranges in which the host copies data to the GPU (``h2d``: host_to_device_calls): a
    loop there carries the host's work from one pass to the next (an environment's
    observations), so its values cannot be computed together ahead of it."""
    return set(np.asarray(g.range_names, dtype=object)[g.c_range[h2d]].tolist())


def detect(ctx: RuleContext) -> list[Finding]:
    m = ctx.model
    if m is None:
        return []
    g = m.graph
    h2d = host_to_device_calls(g)
    calls, n_h2d = value_reads(g, sync_calls(g), h2d)
    calls, n_trip = _not_round_trips(g, calls)
    its = max(len(g.iter_call) - 1, 1)
    if len(calls) < RULE.param("min_per_iteration") * its:
        return []
    where = sites(g, calls)
    names = ", ".join(f"{w} ({n / its:.0f} per iteration)" for w, n in list(where.items())[:3])
    fed = host_fed_sites(g, h2d)
    many = [w for w, n in where.items() if n / its >= RULE.param("loop_reads") and w not in fed]
    lib_calls = library_calls(g) if many else np.empty(0, np.int64)
    loops = [w for w in many if values_loop(g, calls[site_of(g, calls) == w], lib_calls)]
    batch = calls[np.isin(site_of(g, calls), loops)] if loops else None
    gone = f"the {len(calls) / its:.0f} syncs per iteration and the device-to-host copies before them gone"
    gain, basis = ctx.price(lambda gr: remove_syncs(gr, calls, batch), gone +
                            (f", the values read in a loop in {', '.join(loops[:2])} computed in one "
                             "kernel an iteration" if loops else ""))
    ev = {"syncs_per_iteration": round(len(calls) / its, 1),
          "sites": {w: round(n / its, 1) for w, n in list(where.items())[:5]}}
    alternatives = {}
    if loops:
        # Two fixes, each priced: the values kept on the GPU (torch.where) leave the loop as it
        # is, its launches and its Python; computing them together removes the loop's body.
        def kept_edit(gr):
            return keep_values(gr, calls)
        kept, _ = ctx.price(kept_edit, gone + ", the loop kept")
        ev["kept_on_gpu_speedup"], ev["read_together_speedup"] = round(kept, 3), round(gain, 3)
        alternatives = {"kept_on_gpu_speedup": kept_edit}
    lines, ev_lines = program_lines(ctx)
    if ev_lines:
        ev["program_lines"] = ev_lines
    if n_h2d:
        ev["host_to_device_copy_syncs_left_out"] = round(n_h2d / its, 1)
        lines += (f" (not counted: the syncs of {n_h2d / its:.0f} blocking host-to-device copies an "
                  "iteration, PK104's)")
    if n_trip:
        ev["round_trip_copies_left_out"] = round(n_trip / its, 1)
        lines += (f" (not counted: {n_trip / its:.0f} copies to the host an iteration whose bytes come "
                  "back later in the step, PK104's)")
    checks, switch, covered = library_checks(ev_lines)
    if checks:
        ev["library_checks_share"] = round(covered, 3)
    in_share, in_ops = inside_ops(ctx.replacements.recorded("sync"))
    if unseen_reads(ctx.replacements.record):
        in_share, in_ops = 1.0, [(UNSEEN, int(round(len(calls) / its)))]
    if in_ops:
        ev["inside_ops_share"], ev["inside_ops"] = round(in_share, 3), dict(in_ops[:5])
    if in_share > 0.5:
        # Most waits are the ops' own: nothing the program computes is read back, so nothing can
        # be kept on the GPU; the price says what they cost, not a fix the program can make.
        ops = ("the op record, which sees every read a program's own ops make in grad mode, found none of "
               "them" if in_ops[0][0] == UNSEEN else ", ".join(f"{op} ({n} an iteration)" for op, n in in_ops[:2]))
        ev["without_them_speedup"] = round(gain, 3)
        return [Finding(RULE.code, RULE.name,
                        f"leave the per-step synchronisations in {names}: {in_share:.0%} of them are made "
                        f"inside torch's own code ({ops}), which reads values back to the host itself; no "
                        "line of the program asks for them, so there is no value to keep on the GPU (they "
                        f"cost {gain:.2f}x of the step: what an implementation that keeps those values on "
                        "the GPU could gain)" + lines,
                        Rung.NONE, ev, 1.0, f"inside torch's ops: {basis}", max(gain, 1.0))]
    head = (f"remove the per-step synchronisation in {names}: keep the values on the GPU and read "
            "them every N steps (or branch on the GPU with torch.where)"
            + (f"; {in_share:.0%} of the recorded waits are inside torch's own {in_ops[0][0]} and stay"
               if in_ops else ""))
    if checks and covered >= 0.99:
        head = (f"turn off {checks}: {switch}: the per-step synchronisations in {names} are its "
                "checks, each read back to the host")
    elif checks:
        head = (f"turn off {checks}: {switch} ({covered:.0%} of the recorded waits are its checks); "
                f"then {head}")
    if gain >= 1.02:
        return [Finding(RULE.code, RULE.name, head
                        + (f" ({ev['kept_on_gpu_speedup']:.2f}x, the loop kept); the values read one by "
                           f"one in {', '.join(loops[:2])}: compute them together (torch._foreach_norm, "
                           f"torch.stack) and read them once ({gain:.2f}x, the number below)"
                           if loops else "") + lines,
                        Rung.LIBRARY, ev, gain, basis, gain, alternatives=alternatives)]
    # CPU-paced: the sync is not what the step waits on. The expectation is no gain.
    return [Finding(RULE.code, RULE.name,
                    f"leave the per-step sync in {names} for now: without it the CPU's own work "
                    "still sets the pace; cut the CPU work per step first"
                    + (f" (the waits are {checks}'s checks: turning them off saves their "
                       "CPU work too, which this price leaves out)" if checks else "") + lines, Rung.NONE, ev, 1.0,
                    f"CPU-paced: {basis}", max(gain, 1.0))]

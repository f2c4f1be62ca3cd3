"""Can a run without a profiler tell how much CPU an iteration of a GPU-bound program takes?

For a GPU-bound loop the wall time of an iteration is the GPU's, with or without a profiler, so
the calibration run's iteration times say nothing of the CPU. This probe times BERT-base
inference (batch 32 x 256, the corpus's bert_fp32_infer) per iteration with the wall clock, the
thread's CPU clock (``time.thread_time_ns``) and the process's, in fp32 (GPU-bound: the launch
queue fills), TF32 and bf16 autocast, and once more with the launch queue kept short (a sync after
every iteration, so no launch waits for a slot): if the thread's CPU clock does not count the
waits for a queue slot, it measures the CPU work of a GPU-bound iteration directly.

Measured on the H200 (2026-12-02): the thread's CPU clock equals the wall clock in every
variant (fp32 35.49 / 35.49 ms, TF32 7.51 / 7.51, bf16 autocast 10.92 / 10.93): CUDA's waits spin
(the default schedule with fewer contexts than cores), so a run without a profiler cannot time
the CPU work of a GPU-bound iteration this way; the step model estimates it (per-call tracing
cost) and says so.

    python3 scripts/gpu/probe_cpu_time.py [--iters 30] > probe.txt
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from transformers import BertConfig, BertModel


def timed(run, iters: int, sync_each: bool) -> dict:
    walls, threads, procs = [], [], []
    for i in range(iters):
        w0, t0, p0 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
        run()
        if sync_each:
            torch.cuda.synchronize()
        walls.append(time.perf_counter_ns() - w0)
        threads.append(time.thread_time_ns() - t0)
        procs.append(time.process_time_ns() - p0)
    torch.cuda.synchronize()
    k = iters // 3  # the first third is warm-up
    med = lambda x: statistics.median(x[k:]) / 1e6  # noqa: E731
    return {"wall_ms": med(walls), "thread_cpu_ms": med(threads), "process_cpu_ms": med(procs)}


def bert(iters: int) -> None:
    dev = torch.device("cuda")
    model = BertModel(BertConfig()).to(dev).eval()
    ids = torch.randint(0, 30522, (32, 256), device=dev)
    for variant in ("fp32", "tf32", "bf16_autocast"):
        torch.backends.cuda.matmul.allow_tf32 = variant == "tf32"
        amp = (torch.autocast("cuda", dtype=torch.bfloat16) if variant == "bf16_autocast"
               else contextlib.nullcontext())

        def run() -> None:
            with torch.no_grad(), amp:
                model(input_ids=ids)
        for sync_each in (False, True):
            r = timed(run, iters, sync_each)
            print(f"bert {variant:14s} sync_each={sync_each!s:5s} " +
                  " ".join(f"{k} {v:8.3f}" for k, v in r.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    bert(a.iters)


if __name__ == "__main__":
    main()

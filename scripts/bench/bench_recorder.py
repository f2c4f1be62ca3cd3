"""Overhead of profkit's aten recorder against emit_nvtx, on the real training step (GPU).

The step of scripts/workloads/train_llama.py (2-layer HF Llama, random weights, bf16 autocast,
AdamW foreach, batch 8, sequence 512), timed three ways in one process, in alternating rounds:
plain, under ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``, and under
``profkit.capture.recorder.recorder()``. Each step is synchronised; the median over the measured steps
(after warm-up) is reported. Then one step under the recorder counts the ops recorded on
threads other than the main one (the autograd engine's device threads run backward).

    python scripts/bench/bench_recorder.py [--steps 12] [--warmup 3] [--rounds 2] [--out bench.json]
    nsys profile -t cuda,nvtx -o rec python scripts/bench/bench_recorder.py   # the same, under nsys

Exit status 1 when no backward op was recorded off the main thread.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from profkit.capture.recorder import recorder  # noqa: E402


def build(batch: int, seq: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def timed(step, ctx, n: int, warmup: int) -> list[float]:
    out = []
    with ctx:
        for i in range(warmup + n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if i >= warmup:
                out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    t_start = time.perf_counter()
    step = build(args.batch, args.seq)
    modes = {"plain": contextlib.nullcontext,
             "emit_nvtx": lambda: torch.autograd.profiler.emit_nvtx(record_shapes=True),
             "recorder": recorder}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m, make in modes.items():
            times[m] += timed(step, make(), args.steps, args.warmup)
    med = {m: statistics.median(v) * 1e3 for m, v in times.items()}

    # Backward runs on the autograd engine's device thread: count what was recorded there.
    with recorder(count_threads=True) as rec:
        step()
        torch.cuda.synchronize()
    off_main = rec.off_main_thread()
    on_main = sum(c for tid, d in rec.per_thread.items() if tid == rec.main_thread
                  for c in d.values())
    res = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "median_step_ms": {m: round(v, 3) for m, v in med.items()},
        "overhead_vs_plain": {m: round(med[m] / med["plain"] - 1, 4) for m in ("emit_nvtx", "recorder")},
        "recorder_vs_emit_nvtx": round(med["recorder"] / med["emit_nvtx"] - 1, 4),
        "steps_per_mode": {m: len(v) for m, v in times.items()},
        "recorded_ops_main_thread": on_main,
        "recorded_ops_other_threads": sum(off_main.values()),
        "recorded_mm_other_threads": sum(v for k, v in off_main.items() if k.startswith("aten::mm")),
        "other_thread_ops": dict(sorted(off_main.items(), key=lambda kv: -kv[1])[:12]),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    for m in modes:
        print(f"{m:10s} median step {med[m]:8.2f} ms"
              + ("" if m == "plain" else f"  (+{(med[m] / med['plain'] - 1) * 100:.1f}% vs plain)"))
    print(f"recorder vs emit_nvtx: {res['recorder_vs_emit_nvtx'] * 100:+.1f}%")
    print(f"ops recorded: {on_main} on the main thread, {res['recorded_ops_other_threads']} on "
          f"other threads (aten::mm there: {res['recorded_mm_other_threads']})")
    print(json.dumps(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["recorded_mm_other_threads"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

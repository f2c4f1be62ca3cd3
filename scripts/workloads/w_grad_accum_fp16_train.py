"""GPT-2 small pre-training step with gradient accumulation and fp16 mixed precision, written the
way nanoGPT and most hand-rolled loops are: HF ``GPT2LMHeadModel`` from ``GPT2Config()`` (12
layers, hidden 768, vocabulary 50257, dropout 0.1, random weights), 8 micro-batches of 2 x
1024 tokens per optimizer step, each micro-batch's forward under ``torch.autocast(float16)``
and ``scaler.scale(loss / 8).backward()`` with ``torch.amp.GradScaler``; then
``scaler.unscale_``, ``clip_grad_norm_(1.0)``, ``scaler.step``, ``scaler.update``. AdamW with
PyTorch's default implementation (foreach on CUDA; 124M parameters). The loss of every
micro-batch is logged with ``loss.item()``.

Each optimizer step is an NVTX range ``train_step`` holding, per micro-batch, ``forward``,
``backward`` and ``log``, then ``optimizer`` (unscale, clip, step, update, zero_grad).

Defects: small micro-batches on an H200 (2 x 1024 tokens: each forward and backward is
launch-heavy, some thousand kernels, for ~4 ms of GPU work); a wait for the GPU after every
micro-batch (``.item()``) and one more in ``scaler.step`` (it reads the inf check before
stepping a foreach optimizer); fp16 that needs the scaler's extra passes where bf16 would not.

    python w_grad_accum_fp16_train.py [--steps 20] [--fix bf16] [--fix bigger_micro]
                                      [--fix no_item] [--fix fused_adamw]

Fixes:
  bf16          ``torch.autocast(bfloat16)``, the GradScaler disabled (``enabled=False``, as
                nanoGPT writes it): no unscale pass, no inf check, no wait in ``scaler.step``.
  bigger_micro  2 micro-batches of 8 x 1024 tokens instead of 8 of 2 x 1024: the same 16,384
                tokens a step in a quarter of the launches.
  no_item       each micro-batch's loss added to a GPU tensor, read once per step.
  fused_adamw   ``AdamW(fused=True)``: one fused pass, and GradScaler hands it the scale and
                the inf flag instead of reading the flag on the host (no wait in
                ``scaler.step``).
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from _corpus import nvtx, program_args, run  # noqa: E402 (the workloads' shared helpers)

FIXES = ("bf16", "bigger_micro", "no_item", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], list]:
    """The model, optimizer and scaler with ``fixes`` applied; returns one optimizer step
    (accumulated over the micro-batches; the losses logged so far)."""
    accum, micro, seq = (2, 8, 1024) if "bigger_micro" in fixes else (8, 2, 1024)
    cfg = GPT2Config()  # GPT-2 small
    if args.small:
        cfg = GPT2Config(vocab_size=256, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                         eos_token_id=0)
        accum, micro, seq = (1, 4, 16) if "bigger_micro" in fixes else (2, 2, 16)
    model = GPT2LMHeadModel(cfg).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95),
                            fused=True if "fused_adamw" in fixes else None)
    dtype = torch.bfloat16 if "bf16" in fixes else torch.float16
    scaler = torch.amp.GradScaler(dev.type, enabled=dtype == torch.float16)
    logged: list = []  # per micro-batch floats, or (no_item) one float per step
    running = torch.zeros((), device=dev)

    def step() -> list:
        with nvtx("train_step"):
            for _ in range(accum):
                ids = torch.randint(0, cfg.vocab_size, (micro, seq), device=dev)
                with nvtx("forward"), torch.autocast(dev.type, dtype=dtype):
                    loss = model(input_ids=ids, labels=ids).loss / accum
                with nvtx("backward"):
                    scaler.scale(loss).backward()
                with nvtx("log"):
                    if "no_item" in fixes:
                        running.add_(loss.detach())
                    else:
                        logged.append(loss.item() * accum)  # waits for the micro-batch
            with nvtx("optimizer"):
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
            if "no_item" in fixes:
                with nvtx("log"):
                    logged.append(running.item())  # once a step
                    running.zero_()
        return logged
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=20,
                                    steps_help="optimizer steps (the first ones are warm-up)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_grad_accum_fp16_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1][-1]:.3f}")


if __name__ == "__main__":
    main()

"""Knowledge distillation of a text classifier, DistilBERT-style: a BERT-base-shaped teacher (12
post-LayerNorm layers of hidden 768, 12 heads, FFN 3072; the encoder of
w_padded_encoder_infer.py) and a 6-layer student of the same width, random weights, batch 64 of
128 tokens, 3 classes. The student is trained on the temperature-softened KL divergence to the
teacher's logits (T = 2, scaled by T^2) plus cross-entropy on the labels, both models' forwards
under ``torch.autocast(bfloat16)``, AdamW (PyTorch's default: foreach on CUDA) over the
student's parameters. Fresh random token ids and labels made on the GPU each step; no read of
the loss inside the step.

Each step is an NVTX range ``train_step`` holding ``forward`` (teacher, student and loss),
``backward`` and ``optimizer``.

Defect: the teacher was put in eval mode but never frozen nor run under ``torch.no_grad()``, so
its logits keep their autograd history: ``loss.backward()`` runs the teacher's backward too
(its activation and weight gradients, accumulated into ``.grad`` tensors no optimizer reads),
about twice the teacher's forward, and the teacher's activations are kept for it.

    python w_distill_teacher_train.py [--steps 40] [--fix teacher_no_grad] [--fix fused_adamw]
                                      [--fix compile]

Fixes:
  teacher_no_grad  the teacher's forward under ``torch.no_grad()`` (its logits carry no history):
                   no backward through the teacher, nothing saved for it.
  fused_adamw      ``AdamW(fused=True)`` for the student.
  compile          ``torch.compile`` of the teacher and of the student (default mode).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)
from w_padded_encoder_infer import Encoder  # noqa: E402 (BERT's encoder, written once)

FIXES = ("teacher_no_grad", "fused_adamw", "compile")
CUDA_ONLY: tuple[str, ...] = ()
TEMPERATURE = 2.0
ALPHA = 0.5       # the distillation term's weight; the labels' cross-entropy has the rest


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """Teacher, student and optimizer with ``fixes`` applied; returns one training step (fresh
    tokens and labels; its loss, kept on the GPU)."""
    vocab, d, heads, ffn, teacher_layers, student_layers, seq, batch, classes = \
        30522, 768, 12, 3072, 12, 6, 128, 64, 3
    if args.small:
        vocab, d, heads, ffn, teacher_layers, student_layers, seq, batch, classes = 500, 32, 4, 64, 2, 1, 16, 4, 3
    torch.manual_seed(0)
    teacher = Encoder(vocab, d, heads, teacher_layers, ffn, seq, classes).to(dev).eval()
    student = Encoder(vocab, d, heads, student_layers, ffn, seq, classes).to(dev).train()
    opt = torch.optim.AdamW(student.parameters(), lr=5e-5, weight_decay=0.01,
                            fused=True if "fused_adamw" in fixes else None)
    t_net, s_net = (torch.compile(teacher), torch.compile(student)) if "compile" in fixes else (teacher, student)
    teacher_ctx = torch.no_grad if "teacher_no_grad" in fixes else contextlib.nullcontext
    amp = bf16_autocast(dev)
    mask = torch.ones(batch, seq, dtype=torch.long, device=dev)

    def loss_of(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with teacher_ctx():
            t_logits = t_net(ids, mask)
        s_logits = s_net(ids, mask)
        soft = F.kl_div(F.log_softmax(s_logits.float() / TEMPERATURE, -1),
                        F.log_softmax(t_logits.float() / TEMPERATURE, -1),
                        reduction="batchmean", log_target=True) * TEMPERATURE ** 2
        return ALPHA * soft + (1 - ALPHA) * F.cross_entropy(s_logits.float(), labels)

    def step() -> torch.Tensor:
        ids = torch.randint(1000 % vocab, vocab, (batch, seq), device=dev)
        labels = torch.randint(0, classes, (batch,), device=dev)
        return train_step(lambda: loss_of(ids, labels), opt, amp).detach()
    step.teacher_grads = lambda: sum(p.grad is not None for p in teacher.parameters())
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY,
                                    small_help="tiny encoders, short texts and small batches, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_distill_teacher_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}, teacher tensors with a gradient {ran[0].teacher_grads()}")


if __name__ == "__main__":
    main()

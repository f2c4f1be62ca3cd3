"""A BERT-base-shaped encoder (12 layers, hidden 768, 12 heads, FFN 3072; the encoder of
w_padded_encoder_infer.py) trained for sequence classification with a hand-written LAMB
optimizer, as research code carries one: a Python loop over the 153 parameters, each updated by
its own Adam moments, weight decay and layer-wise trust ratio ``|w| / |update|``, the ratio read
back to the host to scale the step (``trust = (w_norm / u_norm).item() if w_norm > 0 and
u_norm > 0 else 1.0``). Batch 32 x 128 tokens drawn afresh each step, bf16 autocast over fp32
weights.

Each step is an NVTX range ``train_step`` holding ``forward``, ``backward`` and ``optimizer``.

Defect: the optimizer issues about ten small kernels per parameter and waits for the GPU three
times per parameter (two comparisons and ``.item()``): 1,500 launches and 460 waits a step, one
after another, while the GPU's forward and backward take a few milliseconds.

    python w_lamb_python_optim_train.py [--steps 40] [--fix no_sync] [--fix foreach] [--fix fused_adamw]

Fixes:
  no_sync      the same loop with the trust ratio kept on the GPU (``torch.where``, one multiply
               more): no wait, the launches stay.
  foreach      the same LAMB over all parameters at once with ``torch._foreach_*`` ops and
               ``torch._foreach_norm``: a few dozen launches, no wait.
  fused_adamw  ``AdamW(fused=True)`` instead of LAMB (another algorithm: what the step costs with a
               library optimizer's single pass).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from _corpus import bf16_autocast, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)
from w_padded_encoder_infer import CLS, Encoder  # noqa: E402 (BERT's encoder, written once)

FIXES = ("no_sync", "foreach", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019) with bias-corrected Adam moments and decoupled weight decay;
    ``mode``: ``"loop"`` (a parameter at a time, the trust ratio read on the host), ``"no_sync"``
    (the loop, the ratio on the GPU) or ``"foreach"`` (all parameters at once)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01, mode: str = "loop") -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.mode = mode

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            for p in ps:
                st = self.state[p]
                if not st:
                    st["step"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
            (self._foreach if self.mode == "foreach" else self._loop)(group, ps)

    def _loop(self, group: dict, ps: list[torch.Tensor]) -> None:
        (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
        for p in ps:
            st = self.state[p]
            m, v, t = st["m"], st["v"], st["step"]
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            update = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
            update.add_(p, alpha=wd)
            w_norm, u_norm = p.norm(), update.norm()
            if self.mode == "no_sync":
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
                p.add_(update * trust, alpha=-lr)
            else:
                trust = (w_norm / u_norm).item() if w_norm > 0 and u_norm > 0 else 1.0  # three waits
                p.add_(update, alpha=-lr * trust)

    def _foreach(self, group: dict, ps: list[torch.Tensor]) -> None:
        (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
        t = self.state[ps[0]]["step"]
        ms, vs, gs = [self.state[p]["m"] for p in ps], [self.state[p]["v"] for p in ps], [p.grad for p in ps]
        torch._foreach_mul_(ms, b1)
        torch._foreach_add_(ms, gs, alpha=1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
        denom = torch._foreach_div(vs, 1 - b2 ** t)
        torch._foreach_sqrt_(denom)
        torch._foreach_add_(denom, eps)
        updates = torch._foreach_div(ms, 1 - b1 ** t)
        torch._foreach_div_(updates, denom)
        torch._foreach_add_(updates, ps, alpha=wd)
        w_norm, u_norm = torch.stack(torch._foreach_norm(ps)), torch.stack(torch._foreach_norm(updates))
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0) * -lr
        torch._foreach_mul_(updates, list(trust.unbind()))
        torch._foreach_add_(ps, updates)


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model and optimizer with ``fixes`` applied; returns one training step (fresh token
    ids and labels; the step's loss)."""
    vocab, d, heads, layers, ffn, batch, seq, classes = 30522, 768, 12, 12, 3072, 32, 128, 4
    if args.small:
        vocab, d, heads, layers, ffn, batch, seq, classes = 1000, 64, 4, 2, 256, 4, 16, 4
    torch.manual_seed(0)
    model = Encoder(vocab, d, heads, layers, ffn, seq, classes).to(dev).train()
    if "fused_adamw" in fixes:
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01,
                                                       fused=True)
    else:
        mode = "foreach" if "foreach" in fixes else "no_sync" if "no_sync" in fixes else "loop"
        opt = Lamb(model.parameters(), lr=1e-4, mode=mode)
    amp = bf16_autocast(dev)
    mask = torch.ones(batch, seq, dtype=torch.long, device=dev)

    def step() -> torch.Tensor:
        ids = torch.randint(vocab // 30, vocab, (batch, seq), device=dev)
        ids[:, 0] = CLS
        labels = torch.randint(0, classes, (batch,), device=dev)
        return train_step(lambda: F.cross_entropy(model(ids, mask).float(), labels), opt, amp)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, steps=40,
                                    alternatives=(("no_sync", "foreach"), ("no_sync", "fused_adamw"),
                                                  ("foreach", "fused_adamw")))
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_lamb_python_optim_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}")


if __name__ == "__main__":
    main()

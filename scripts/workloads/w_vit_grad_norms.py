"""ViT-B/16 training step (timm, random weights) that logs every parameter's gradient norm with
one ``.item()`` per parameter, as hand-written training loops often do.

bf16 autocast, AdamW with PyTorch's default implementation (foreach on CUDA), batch 64 of
224 x 224 images, fresh random images and labels every step. Each step is an NVTX range
``train_step`` holding ``forward``, ``backward``, ``grad_norms`` and ``optimizer``.

Defect: ``{name: p.grad.norm().item() ...}`` is about 150 device-to-host reads a step. The
first one waits for the whole backward; each of the others launches one small kernel and
waits for it, so the GPU idles while the CPU crawls through the list, and the CPU can never
queue the next step ahead of the GPU.

    python w_vit_grad_norms.py [--steps 40] [--fix no_item,fused_adamw]

Fixes:
  no_item      the norms computed with one ``torch._foreach_norm`` and ``torch.stack``d into
               one tensor that stays on the GPU; the history is read once, after the loop.
  fused_adamw  ``AdamW(fused=True)``: one fused kernel instead of about ten foreach passes over
               the 86M fp32 weights and states.
"""
from __future__ import annotations

import timm
import torch

from _corpus import nvtx, program_args  # noqa: E402 (the workloads' shared helpers)

FIXES = ("no_item", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY)

    if args.small:
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=10)
        batch, size, classes = 2, 32, 10
    else:
        model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)
        batch, size, classes = 64, 224, 1000
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if "fused_adamw" in fixes else None)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    history: list = []  # per-step gradient norms: floats (baseline) or one GPU tensor a step (no_item)
    for _ in range(args.steps):
        x = torch.randn(batch, 3, size, size, device=dev)
        y = torch.randint(0, classes, (batch,), device=dev)
        with nvtx("train_step"):
            with nvtx("forward"), torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with nvtx("backward"):
                loss.backward()
            with nvtx("grad_norms"):
                if "no_item" in fixes:
                    norms = torch._foreach_norm([p.grad for _, p in named])
                    history.append(torch.stack(norms))  # stays on the GPU
                else:
                    history.append({n: p.grad.norm().item() for n, p in named})  # one sync each
            with nvtx("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    if "no_item" in fixes:
        top = torch.stack(history).max().item()  # the only read of the norms
    else:
        top = max(max(h.values()) for h in history)
    print(f"w_vit_grad_norms: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
          f"loss {loss.item():.3f}, largest grad norm {top:.3g}")


if __name__ == "__main__":
    main()

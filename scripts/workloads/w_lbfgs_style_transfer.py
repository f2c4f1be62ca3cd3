"""Neural style transfer as PyTorch's tutorial writes it: the image itself optimised with
``torch.optim.LBFGS`` (its defaults: up to 20 evaluations a step, a history of 100) to match a
content image's features and a style image's Gram matrices through VGG19's first five
convolutions (torchvision's layout, random weights, frozen), a 512 x 512 image, fp32 (cuDNN's
convolutions in TF32, PyTorch's default).

Each ``optimizer.step(closure)`` is an NVTX range ``lbfgs_step``; each evaluation of the closure
inside it a range ``closure``.

Defect: LBFGS's two-loop recursion passes each history entry's coefficient, a GPU scalar, as
``alpha=`` of ``add_``: every one is read back to the host, two waits per history entry, about
200 a step of the algorithm once the history is full, each around a tiny kernel. The GPU idles
between them; the convolutions are a small share of the time.

    python w_lbfgs_style_transfer.py [--steps 30] [--fix gpu_two_loop|history10] [--fix bf16] [--fix channels_last]

Fixes:
  gpu_two_loop   the same LBFGS (the same iterates) with the recursion's coefficients kept on the GPU
                 (``q -= al * y`` as tensor arithmetic): no wait inside the two loops.
  history10      ``LBFGS(history_size=10)``: ten times fewer history entries (a different
                 optimiser, more evaluations to the same loss).
  bf16           bf16 autocast around the VGG features (the losses in fp32).
  channels_last  the VGG layers in channels_last, the image copied to it at each evaluation (LBFGS
                 flattens the image's gradient, which must stay contiguous).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import nvtx, program_args, run  # noqa: E402

FIXES = ("gpu_two_loop", "history10", "bf16", "channels_last")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("gpu_two_loop", "history10"),)
VGG19_HEAD = (64, 64, "M", 128, 128, "M", 256)  # conv1_1 .. conv3_1 of torchvision's VGG19


def vgg_head(widths=VGG19_HEAD) -> nn.ModuleList:
    """The convolutions (3x3, padding 1, each followed by ReLU) and max-pools of ``widths``."""
    layers, c = nn.ModuleList(), 3
    for w in widths:
        if w == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers.append(nn.Sequential(nn.Conv2d(c, w, 3, padding=1), nn.ReLU()))
            c = w
    return layers


def gram(f: torch.Tensor) -> torch.Tensor:
    b, c, h, w = f.shape
    f = f.reshape(b * c, h * w)
    return f @ f.t() / (b * c * h * w)


def features(layers: nn.ModuleList, x: torch.Tensor) -> list[torch.Tensor]:
    """Each convolution's output (after its ReLU), the tutorial's conv_1 .. conv_5, in fp32."""
    out = []
    for layer in layers:
        x = layer(x)
        if isinstance(layer, nn.Sequential):
            out.append(x.float())
    return out


class TwoLoopOnGPU(torch.optim.LBFGS):
    """``torch.optim.LBFGS`` (no line search) whose two-loop recursion keeps its coefficients on
    the device: the same iterates as LBFGS, without a host read of each coefficient."""

    @torch.no_grad()
    def step(self, closure):  # noqa: C901 (LBFGS.step's structure, kept to show it is the same)
        closure = torch.enable_grad()(closure)
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change, history = group["tolerance_grad"], group["tolerance_change"], group["history_size"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = closure()
        loss, evals = float(orig_loss), 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if flat_grad.abs().max() <= tol_grad:
            return orig_loss
        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        h_diag, prev_flat_grad = state.get("H_diag"), state.get("prev_flat_grad")
        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, h_diag = flat_grad.neg(), [], [], [], 1
            else:
                y, s = flat_grad.sub(prev_flat_grad), d.mul(t)
                ys = y.dot(s)
                if ys > 1e-10:
                    if len(old_dirs) == history:
                        old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
                    old_dirs.append(y), old_stps.append(s), ro.append(1.0 / ys)
                    h_diag = ys / y.dot(y)
                al = [None] * len(old_dirs)
                q = flat_grad.neg()
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = old_stps[i].dot(q) * ro[i]
                    q.sub_(old_dirs[i] * al[i])  # LBFGS: q.add_(old_dirs[i], alpha=-al[i]), a host read
                d = r = torch.mul(q, h_diag)
                for i in range(len(old_dirs)):
                    be_i = old_dirs[i].dot(r) * ro[i]
                    r.add_(old_stps[i] * (al[i] - be_i))
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone(memory_format=torch.contiguous_format)
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss
            t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr if state["n_iter"] == 1 else lr
            if flat_grad.dot(d) > -tol_change:
                break
            self._add_grad(t, d)
            opt_cond, ls_evals = False, 0
            if n_iter != max_iter:
                with torch.enable_grad():
                    loss = float(closure().detach())
                flat_grad = self._gather_flat_grad()
                opt_cond, ls_evals = bool(flat_grad.abs().max() <= tol_grad), 1
            evals += ls_evals
            state["func_evals"] += ls_evals
            if n_iter == max_iter or evals >= max_eval or opt_cond:
                break
            if d.mul(t).abs().max() <= tol_change or abs(loss - prev_loss) < tol_change:
                break
        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The style transfer with ``fixes`` applied; returns one LBFGS step (its first loss)."""
    size, widths = 512, VGG19_HEAD
    if args.small:
        size, widths = 16, (4, 4, "M", 8, 8, "M", 8)
    torch.manual_seed(0)
    layers = vgg_head(widths).to(dev).eval().requires_grad_(False)
    fmt = torch.channels_last if "channels_last" in fixes else torch.contiguous_format
    layers = layers.to(memory_format=fmt)
    # LBFGS flattens the image's gradient with view(-1): the image itself stays contiguous, and
    # channels_last is a copy of it at each evaluation
    amp = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if "bf16" in fixes else contextlib.nullcontext
    g = torch.Generator(device=dev).manual_seed(1)

    def smooth_image() -> torch.Tensor:  # a photograph's scale of detail, not pixel noise
        low = torch.rand(1, 3, size // 8, size // 8, device=dev, generator=g)
        return F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)

    content, style = smooth_image(), smooth_image()
    with torch.no_grad(), amp():
        content_target = features(layers, content.contiguous(memory_format=fmt))[3]  # conv_4: the content layer
        style_targets = [gram(f) for f in features(layers, style.contiguous(memory_format=fmt))]
    image = content.clone().requires_grad_(True)
    opt_cls = TwoLoopOnGPU if "gpu_two_loop" in fixes else torch.optim.LBFGS
    opt = opt_cls([image], history_size=10 if "history10" in fixes else 100)
    style_weight, content_weight = 1e6, 1.0

    def closure() -> torch.Tensor:
        with nvtx("closure"):
            with torch.no_grad():
                image.clamp_(0, 1)
            opt.zero_grad()
            with amp():
                feats = features(layers, image.contiguous(memory_format=fmt))
            style_loss = sum(F.mse_loss(gram(f), s) for f, s in zip(feats, style_targets))
            loss = style_weight * style_loss + content_weight * F.mse_loss(feats[3], content_target)
            loss.backward()
            return loss

    def step() -> torch.Tensor:
        with nvtx("lbfgs_step"):
            return opt.step(closure)
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=30,
                                    steps_help="LBFGS steps (each up to 20 evaluations; the first ones "
                                               "fill the history)")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_lbfgs_style_transfer: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.4f}")


if __name__ == "__main__":
    main()

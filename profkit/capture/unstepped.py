"""Parameters that get gradients no optimizer steps: what the op record reports (``unstepped``)
and what the ``freeze_unstepped`` switch freezes.

A parameter that requires gradients gets one in every backward that reaches it, whether or not an
optimizer updates it. A distillation's teacher put in eval mode but neither frozen nor run under
``torch.no_grad()`` has its whole backward computed every step (its activations kept for it, its
weight gradients accumulated into ``.grad`` tensors nothing reads): a BERT-base teacher beside a
6-layer student took 31.5 ms a step, 17.2 ms with the teacher under ``no_grad`` (H100,
2026-12-06). A trace cannot tell such a backward from the student's; the program's objects can.

``find`` looks at the process's live objects once (``gc.get_objects()``: tens of milliseconds):
every ``torch.optim.Optimizer`` (its parameters are the stepped ones), and every ``nn.Module``
that no other module holds (a root: the teacher, the student, a loss with weights). A root's
parameters that require gradients, hold one, and belong to no optimizer are unstepped. Where the
process has no optimizer at all, nothing is said: a program that updates its weights by hand
reads its gradients itself.
"""
from __future__ import annotations

import gc
from typing import Any


def find(torch: Any) -> list[dict]:
    """Per root module with unstepped parameters: its class (``module``), the tensors and elements
    that are unstepped, and the parameters themselves (``params``, for the switch), largest first."""
    mods, opts = [], []
    module_cls, optim_cls = torch.nn.Module, torch.optim.Optimizer
    for o in gc.get_objects():
        t = type(o)   # not isinstance: it reads __class__, which some objects warn or fail on
        if issubclass(t, module_cls):
            mods.append(o)
        elif issubclass(t, optim_cls):
            opts.append(o)
    if not opts:
        return []
    stepped = {id(p) for o in opts for g in o.param_groups for p in g["params"]}
    held = {id(c) for m in mods for c in m.children()}
    out = []
    for root in (m for m in mods if id(m) not in held):
        params = {id(p): p for p in root.parameters()}.values()
        loose = [p for p in params if p.requires_grad and p.grad is not None and id(p) not in stepped]
        if loose:
            out.append({"module": type(root).__name__, "tensors": len(loose),
                        "elements": int(sum(p.numel() for p in loose)), "params": loose})
    return sorted(out, key=lambda r: -r["elements"])


def summary(found: list[dict]) -> list[dict]:
    """``find``'s result without the parameters: what the op record keeps."""
    return [{k: v for k, v in r.items() if k != "params"} for r in found]

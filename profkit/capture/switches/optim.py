"""``fused_optim``: ``fused=True`` for the torch.optim optimizers that have it (Adam, AdamW, SGD,
Adagrad), whatever the program passed; ``freeze_unstepped`` (FreezeUnstepped, below).

The constructors are wrapped when the script imports torch. An explicit ``foreach`` is dropped
(``fused=True`` with ``foreach=True`` raises); ``params`` given as a generator is made a list
first (the optimizer does the same), so that the original call can be made again when the fused
one is refused at construction (``differentiable=True``): that optimizer then stays as the
program made it, and the trial says why. Parameters that are not floating point, or on a device
without a fused kernel, torch refuses only at the first ``step()``: those it can see at
construction are checked first (Adagrad has no fused CUDA kernel: on an H200 with torch 2.11,
``Adagrad(fused=True).step()`` on CUDA parameters raises, while Adam, AdamW and SGD run), and such
an optimizer is left as it was, with the reason. A subclass's constructor that calls its parent's is patched once. Other optimizers (RMSprop,
a library's Lion) are counted and named, never changed.

The switch toggles: an optimizer it made fused is turned back to what the program asked for
(its ``fused`` and ``foreach``, and GradScaler's unscaling pass before the step) and fused again
between iterations. The step counts move with it: the fused kernels keep them on the
parameters' device, the foreach and per-tensor paths on the host (on the device they would read
each count back, a wait per parameter); a ``capturable`` group keeps them where they are.
"""
from __future__ import annotations

import inspect
import weakref
from collections import Counter
from typing import Any

from profkit.capture.switches.base import Handler, Report
from profkit.model import Switch

FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")


class FusedOptim(Handler):
    switch = Switch.FUSED_OPTIM
    toggles = True

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        state = trial.shared.setdefault("optim", {"fused": Counter(), "already": Counter(),
                                                  "refused": {}, "other": Counter(),
                                                  "foreach_dropped": 0, "made": weakref.WeakKeyDictionary()})
        for name in FUSABLE:
            cls = getattr(torch.optim, name, None)
            if cls is not None and "__init__" in cls.__dict__:
                trial.patch(cls, "__init__", _fused_init(cls.__init__, name, state))
        base = torch.optim.Optimizer
        trial.patch(base, "__init__", _counting_init(base.__init__, state))

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        """On: the optimizers this switch made fused, fused; off: as the program asked for them."""
        st = trial.shared.get("optim")
        for opt, asked in list((st or {}).get("made", {}).items()):
            _set_fused(torch, opt, asked, on)

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        st = trial.shared.get("optim")
        if st is None:
            return
        parts = [f"{n}(fused=True) x{c}" for n, c in st["fused"].items()]
        if st["foreach_dropped"]:
            parts.append(f"an explicit foreach dropped x{st['foreach_dropped']}")
        parts += [f"{n} already fused x{c}" for n, c in st["already"].items()]
        parts += [f"{n}: fused=True refused ({why})" for n, why in st["refused"].items()]
        others = {n: c for n, c in st["other"].items() if n not in FUSABLE}
        parts += [f"{n} x{c} (no fused version)" for n, c in others.items()]
        if not parts:
            parts = ["no optimizer was constructed"]
        report.note(", ".join(parts), applied=bool(st["fused"]))


def _fused_init(orig: Any, name: str, state: dict) -> Any:
    sig = inspect.signature(orig)

    def __init__(self, *args, **kwargs):  # noqa: N807
        if getattr(self, "_profkit_fused_seen", False):  # a subclass's constructor chose already
            return orig(self, *args, **kwargs)
        self._profkit_fused_seen = True
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:  # let the constructor say what is wrong with the call
            return orig(self, *args, **kwargs)
        given = bound.arguments
        if "params" in given and not isinstance(given["params"], (list, tuple)):
            given["params"] = list(given["params"])
        first = (tuple(bound.args), dict(bound.kwargs))
        # what the program asked for (before the fused call's arguments replace it): the toggle's off
        asked = {k: given.get(k, _default(sig, k)) for k in ("fused", "foreach")}
        if given.get("fused"):
            state["already"][name] += 1
            return orig(*first[0], **first[1])
        why = _unfusable(name, given.get("params"))
        if why:
            state["refused"][name] = why
            return orig(*first[0], **first[1])
        if given.pop("foreach", None) is not None:
            state["foreach_dropped"] += 1
        given["fused"] = True
        try:
            result = orig(*bound.args, **bound.kwargs)
        except (RuntimeError, ValueError, TypeError) as exc:
            from profkit.capture.switches import one_line
            state["refused"][name] = one_line(exc, 160)
            return orig(*first[0], **first[1])
        state["fused"][name] += 1
        state["made"][self] = asked
        return result
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    return __init__


def _default(sig: inspect.Signature, name: str) -> Any:
    """``name``'s default in the constructor's signature (None where it has none)."""
    p = sig.parameters.get(name)
    return None if p is None or p.default is inspect.Parameter.empty else p.default


def _set_fused(torch: Any, opt: Any, asked: dict, on: bool) -> None:
    """``opt`` fused (``on``) or as the program asked, between two of its steps."""
    for group in opt.param_groups:
        group["fused"] = True if on else asked["fused"]
        group["foreach"] = None if on else asked["foreach"]
        if group.get("capturable"):
            continue
        for p in group["params"]:
            step = opt.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                opt.state[p]["step"] = step.to(p.device) if on else step.to("cpu")
    # torch sets it for fused optimizers only: GradScaler then hands them the scale, else unscales first
    opt._step_supports_amp_scaling = on


def _unfusable(name: str, params: Any) -> str:
    """Why torch would refuse fused=True for these parameters at the first step ('' if not)."""
    tensors = []
    for p in params or []:
        if isinstance(p, dict):
            if not isinstance(p.get("params"), (list, tuple)):  # torch makes it a list too
                p["params"] = list(p.get("params") or [])
            tensors += list(p["params"])
        elif isinstance(p, tuple) and len(p) == 2:  # (name, parameter) pairs
            tensors.append(p[1])
        else:
            tensors.append(p)
    tensors = [t for t in tensors if hasattr(t, "device")]
    if name == "Adagrad" and any(t.device.type == "cuda" for t in tensors):
        return "torch has no fused Adagrad for CUDA parameters"
    if any(not t.is_floating_point() for t in tensors):
        return "parameters that are not floating point"
    return ""


def _counting_init(orig: Any, state: dict) -> Any:
    def __init__(self, *args, **kwargs):  # noqa: N807
        # Counted once, and only where no fusable constructor saw it first
        if not getattr(self, "_profkit_fused_seen", False) and not getattr(self, "_profkit_counted", False):
            self._profkit_counted = True
            state["other"][type(self).__name__] += 1
        return orig(self, *args, **kwargs)
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    return __init__


class FreezeUnstepped(Handler):
    """``freeze_unstepped``: at the second step of any optimizer (every optimizer of the program has
    stepped once, every backward has run), the parameters that hold gradients no optimizer steps
    (profkit.capture.unstepped.find) are set ``requires_grad_(False)`` and their ``.grad`` dropped,
    once: from the next forward on, no autograd history is kept for them and the backward stops
    where only they needed it (a teacher never frozen: its whole backward). A program that reads
    such gradients itself (a hand-written update of those weights) then fails, and the trial says
    so: the fix is not for it."""
    switch = Switch.FREEZE_UNSTEPPED

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        st = trial.shared.setdefault("unstepped", {"steps": Counter(), "frozen": [], "done": False})
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def hook(opt, args, kwargs):
            if st["done"]:
                return
            st["steps"][id(opt)] += 1
            if st["steps"][id(opt)] < 2:
                return
            st["done"] = True
            from profkit.capture import unstepped
            try:
                found = unstepped.find(torch)
                with torch.no_grad():
                    for r in found:
                        for p in r["params"]:
                            p.requires_grad_(False)
                            p.grad = None
            except Exception as exc:  # noqa: BLE001 - the program goes on as it was
                from profkit.capture.switches import one_line
                st["error"] = one_line(exc, 160)
                return
            st["frozen"] = unstepped.summary(found)
        handle = register_optimizer_step_pre_hook(hook)
        trial.on_restore(handle.remove)

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        from profkit.capture.switches.base import count_params
        st = trial.shared.get("unstepped")
        if st is None or not st["steps"]:
            report.note("no optimizer stepped", applied=False)
        elif not st["done"]:
            report.note("no optimizer stepped twice", applied=False)
        elif st.get("error"):
            report.note(f"could not look for them ({st['error']})", applied=False)
        elif not st["frozen"]:
            report.note("every parameter holding a gradient is stepped by an optimizer", applied=False)
        else:
            report.note("froze " + ", ".join(f"{r['tensors']} tensors of {r['module']} ({count_params(r['elements'])} "
                                             "params)" for r in st["frozen"]) + ", which no optimizer steps",
                        applied=True)


HANDLERS = {Switch.FUSED_OPTIM: FusedOptim(), Switch.FREEZE_UNSTEPPED: FreezeUnstepped()}

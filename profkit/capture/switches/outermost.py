"""Switches applied to the outermost module: ``bf16``, ``channels_last``, ``compile``,
``compile_graphs``, ``compile_frozen``, ``inference_mode`` and ``fp32``.

The outermost module is found at run time: ``torch.nn.Module.__call__`` is wrapped (once, when
the script imports torch) to see each module call made from the program's own code rather than
from inside another module's forward (a call depth per thread), and of those the module with the
most parameters on CUDA (any device where CUDA is not available) is the one: a training loop's
model, not its loss function; ``generate()``'s model, called from HF's own loop. A larger module
called later takes over, and the trial names each in turn. What each switch does to it:

* ``bf16``: its calls run under ``torch.autocast(device_type, dtype=torch.bfloat16)``, on the
  device of its parameters; the loss computed outside it gets bf16 outputs, as a program that
  autocasts only the forward does. So do the calls of every other module with parameters that
  the program's own code calls: a GAN's generator and critic, a VAE's encoder and decoder, one
  feeding the other (autocast around one alone hands bf16 tensors to the other's fp32 weights,
  which a convolution or a matmul refuses: two such trials failed before).
* ``channels_last``: its 4-D weights and buffers are converted once to
  ``torch.channels_last`` (5-D: ``torch.channels_last_3d``), and its 4-D (5-D) floating-point
  tensor arguments at each call; the other modules the program calls too, as for ``bf16``.
* ``compile``: its calls go to ``torch.compile(module)``; ``compile_graphs`` to
  ``torch.compile(module, mode="reduce-overhead")`` (CUDA graphs through cudagraph trees; a
  program that keeps a step's outputs across steps, or accumulates gradients over several
  backwards before the optimizer step, can then fail with "overwritten by a subsequent run": the
  trial records it as its error, and ``--try auto`` does not pick it where PK103 sees the
  accumulation). Its outputs are cloned as they come out (one device copy each): a module
  called twice in a step, a guided diffusion model's denoiser on the conditional and the
  unconditional input, would otherwise find its first output overwritten by the second call's
  replay, and the trial failed so. The program's other modules with parameters stay eager: the trial says so
  (``left_out``: it measured part of the fix). A module that is already compiled
  (``OptimizedModule``, or ``module.compile()``) is left as it is: "already compiled".
  Compilation happens in the first calls: the iterations the trial leaves out as warm-up.
  ``compile_frozen`` is ``compile`` with Inductor's freezing (``torch._inductor.config.freezing``:
  the weights taken as constants, BatchNorm folded into the convolutions; PK403's fix). Freezing
  changes only graphs run without autograd: where every call of the module ran with gradients
  enabled the trial is not applied (it would time a plain compile).
* ``inference_mode``: its calls run under ``torch.inference_mode()``: no autograd graph nor saved
  tensors, and ``nn.TransformerEncoderLayer`` takes its inference fast path. For a program that
  runs inference with autograd left on; a program that calls ``backward`` on what the module
  returned fails (its outputs have no autograd graph), and the trial records the error.
* ``fp32``: its float64 weights and buffers are converted to float32 once (in place: an
  optimizer built on them keeps them), its float64 tensor arguments at each call, and its
  floating-point outputs are returned as float64, so that a loss or a metric computed outside
  it in float64 still gets float64. So do the program's other modules with parameters. With
  ``tf32`` (``fp32+tf32``) the float32 GEMMs then run in TF32; with ``bf16`` under autocast.

While Dynamo traces (``torch.compiler.is_compiling()``) the wrapper steps aside: a compiled
module's inner calls go straight to the original ``__call__``.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Optional

from profkit.capture.switches.base import Handler, Report, count_params
from profkit.model import Switch


class Outermost:
    """The ``nn.Module.__call__`` wrapper: finds the outermost module and applies what the
    trial's switches enabled (``autocast``, ``memory_format``, ``compile_mode``)."""

    def __init__(self, torch: Any, backend: Optional[str] = None) -> None:
        self.torch = torch
        self.backend = backend
        self.autocast = False
        self.memory_format = False
        self.compile: Optional[str] = None   # "default" or "reduce-overhead"
        self.compile_on = True   # off: the compiled module kept, the calls eager (alternating trials)
        self.inference = False
        self.float32 = False
        self.float32_converted = 0
        self.float32_inputs = 0
        self.narrowed: "weakref.WeakSet[Any]" = weakref.WeakSet()   # modules that held float64
        self.local = threading.local()
        self.params: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self.best: Optional[weakref.ref] = None
        self.best_n = 0
        self.chosen: list[str] = []
        self.compiled: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
        self.already_compiled: list[str] = []
        self.converted = 0
        self.inputs_converted = 0
        self.calls = 0
        self.grad_calls = 0   # calls of the outermost made with autograd on (freezing skips them)
        self.prepared: "weakref.WeakSet[Any]" = weakref.WeakSet()   # weights converted
        # the program's other modules met: whether each is one (not a part of the outermost)
        self.others: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
        # (id, text) of each, in the order met: said at the run's end, when the modules may be gone
        self.other_names: list[tuple[int, str]] = []
        self.best_id: Optional[int] = None
        self.cuda = bool(torch.cuda.is_available())

    def install(self, trial: Any) -> None:
        torch = self.torch
        module_cls = torch.nn.Module
        orig = module_cls.__call__
        is_compiling = torch.compiler.is_compiling
        patch = self

        def __call__(mod, *args, **kwargs):  # noqa: N807
            if is_compiling():
                return orig(mod, *args, **kwargs)
            local = patch.local
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            try:
                if depth:
                    return orig(mod, *args, **kwargs)
                return patch.outer_call(orig, mod, args, kwargs)
            finally:
                local.depth = depth
        __call__.__wrapped__ = orig  # type: ignore[attr-defined]
        trial.patch(module_cls, "__call__", __call__)

    # -- which module ----------------------------------------------------------------------
    def _count(self, mod: Any) -> int:
        n = self.params.get(mod)
        if n is None:
            n = sum(p.numel() for p in mod.parameters() if p.is_cuda or not self.cuda)
            if n:  # a module with none may be moved to the GPU later: counted again then
                self.params[mod] = n
        return n

    def is_outermost(self, mod: Any) -> bool:
        n = self._count(mod)
        if n > self.best_n:
            self.best, self.best_n = weakref.ref(mod), n
            self.chosen.append(f"module {type(mod).__name__} ({count_params(n)} params)")
            self.best_id = id(mod)
            self._prepare(mod)
        return self.best is not None and self.best() is mod

    def _prepare(self, mod: Any) -> None:
        torch = self.torch
        self._prepare_weights(mod)
        if self.compile is not None:
            from torch._dynamo.eval_frame import OptimizedModule
            if isinstance(mod, OptimizedModule) or getattr(mod, "_compiled_call_impl", None) is not None:
                self.already_compiled.append(type(mod).__name__)
                return
            opts: dict[str, Any] = {}
            if self.backend:
                opts["backend"] = self.backend
            elif self.compile != "default":
                opts["mode"] = self.compile
            self.compiled[mod] = torch.compile(mod, **opts)

    def _prepare_weights(self, mod: Any) -> None:
        """channels_last: ``mod``'s 4-D (5-D) weights and buffers converted, once; fp32: its
        float64 ones to float32, once."""
        torch = self.torch
        if not (self.memory_format or self.float32) or mod in self.prepared:
            return
        self.prepared.add(mod)
        if self.float32:
            def narrow(t):
                if t.dtype != torch.float64:
                    return t
                self.float32_converted += 1
                self.narrowed.add(mod)
                return t.float()
            with torch.no_grad():
                mod._apply(narrow)
        if not self.memory_format:
            return
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}
        done = []

        def convert(t):
            f = fmt.get(t.dim())
            if f is None:
                return t
            done.append(t.dim())
            return t.contiguous(memory_format=f)
        with torch.no_grad():
            mod._apply(convert)
        self.converted += len(done)

    # -- the call --------------------------------------------------------------------------
    def outer_call(self, orig: Any, mod: Any, args: tuple, kwargs: dict) -> Any:
        outer = self.is_outermost(mod)
        if not outer:
            # bf16 and channels_last also apply to the program's other modules with parameters
            if not self._count(mod):
                return orig(mod, *args, **kwargs)
            if mod not in self.others:
                # (a part of the outermost module, called on its own, is the outermost's: as is)
                best = self.best() if self.best is not None else None
                self.others[mod] = not (best is not None and any(m is mod for m in best.modules()))
                if self.others[mod]:
                    self.other_names.append((id(mod), f"{type(mod).__name__} ({count_params(self._count(mod))} params)"))
                    self._prepare_weights(mod)
            if not self.others[mod] and self.float32:
                # a part of the outermost, its weights converted with it: its float64 inputs too
                return self._float32_call(lambda a, k: orig(mod, *a, **k), mod, args, kwargs)
            if not self.others[mod] or not (self.autocast or self.memory_format or self.float32):
                return orig(mod, *args, **kwargs)   # (a compile reaches the outermost alone)
        else:
            self.calls += 1
            self.grad_calls += int(self.torch.is_grad_enabled() and not self.inference)
        if self.memory_format:
            args = tuple(self._format(a) for a in args)
            kwargs = {k: self._format(v) for k, v in kwargs.items()}
        compiled = self.compiled.get(mod) if outer and self.compile_on else None

        def call(a: tuple, k: dict) -> Any:
            with contextlib.ExitStack() as around:
                if self.inference and outer:
                    around.enter_context(self.torch.inference_mode())
                if self.autocast:
                    device = next((p.device.type for p in mod.parameters()), "cuda" if self.cuda else "cpu")
                    around.enter_context(self.torch.autocast(device_type=device, dtype=self.torch.bfloat16))
                out = compiled(*a, **k) if compiled is not None else orig(mod, *a, **k)
            if compiled is not None and self.compile == "reduce-overhead":
                out = self._clone(out)
            return out
        if self.float32:
            return self._float32_call(call, mod, args, kwargs)
        return call(args, kwargs)

    def _float32_call(self, call: Any, mod: Any, args: tuple, kwargs: dict) -> Any:
        """``call(args, kwargs)`` with its float64 tensors (nested too) as float32, float32 the
        default dtype meanwhile (a tensor made inside the forward, a GRU's first state, would be
        float64 under ``set_default_dtype(torch.float64)``), and its outputs handed back as float64
        where it took or held float64."""
        torch = self.torch
        from torch.utils._pytree import tree_map
        before = self.float32_inputs
        args, kwargs = tree_map(self._narrow, (args, kwargs))
        widen = self.float32_inputs > before or mod in self.narrowed
        default = torch.get_default_dtype()
        if default == torch.float64:
            torch.set_default_dtype(torch.float32)
        try:
            out = call(args, kwargs)
        finally:
            torch.set_default_dtype(default)
        return self._widen(out) if widen else out

    def _clone(self, out: Any) -> Any:
        """A CUDA-graph replay's outputs copied out of the graph's memory, which its next replay
        overwrites."""
        torch = self.torch
        from torch.utils._pytree import tree_map
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)

    def _narrow(self, x: Any) -> Any:
        torch = self.torch
        if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
            self.float32_inputs += 1
            return x.float()
        return x

    def _widen(self, out: Any) -> Any:
        """The module's float32 outputs as float64, for the float64 code after it."""
        torch = self.torch
        from torch.utils._pytree import tree_map
        return tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t,
                        out)

    def _format(self, x: Any) -> Any:
        torch = self.torch
        if isinstance(x, torch.Tensor) and x.dim() in (4, 5) and x.is_floating_point():
            f = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            if not x.is_contiguous(memory_format=f):
                self.inputs_converted += 1
            return x.contiguous(memory_format=f)
        return x

    # -- what it did -----------------------------------------------------------------------
    def other_modules(self) -> list[str]:
        """The modules with parameters the program called itself, other than the outermost."""
        return [text for i, text in self.other_names if i != self.best_id]

    def module_text(self) -> str:
        text = ", then ".join(self.chosen)
        others = self.other_modules()
        if (self.autocast or self.memory_format) and others:
            text += f" and the program's other module{'s' if len(others) > 1 else ''} {', '.join(others)}"
        return text

    def none_text(self) -> str:
        where = "on CUDA " if self.cuda else ""
        return f"no module with parameters {where}was called"


def outermost(torch: Any, trial: Any) -> Outermost:
    """The trial's one wrapper, installed on first use."""
    patch = trial.shared.get("outermost")
    if patch is None:
        patch = Outermost(torch, trial.options.get("compile_backend"))
        patch.install(trial)
        trial.shared["outermost"] = patch
    return patch


class Flag(Handler):
    """A switch that sets the wrapper's flag ``attr``; ``said`` what it did, once the outermost
    module was called."""
    attr = ""

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        setattr(outermost(torch, trial), self.attr, True)

    def said(self, p: Outermost, report: Report) -> None:
        raise NotImplementedError

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        p = trial.shared["outermost"]
        if not p.calls:
            report.note(p.none_text(), applied=False)
            return
        self.said(p, report)


class Around(Flag):
    """A switch that runs the outermost module's calls inside a context, ``what`` said around the
    module."""
    toggles = True

    def __init__(self, switch: Switch, attr: str, what: str) -> None:
        self.switch, self.attr, self.what = switch, attr, what

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        setattr(outermost(torch, trial), self.attr, on)

    def said(self, p: Outermost, report: Report) -> None:
        report.note(f"{self.what} around {p.module_text()}", applied=True)


class Converts(Flag):
    """A switch that converts the outermost module's weights once and its inputs at each call:
    ``counts`` what it converted, ``none`` said where there was nothing to convert, ``done`` what
    it did."""
    none = ""

    def counts(self, p: Outermost) -> tuple[int, int]:
        raise NotImplementedError

    def done(self, p: Outermost) -> str:
        raise NotImplementedError

    def said(self, p: Outermost, report: Report) -> None:
        if not any(self.counts(p)):
            report.note(f"{p.module_text()}: {self.none}", applied=False)
            return
        report.note(self.done(p), applied=True)


class ChannelsLast(Converts):
    switch = Switch.CHANNELS_LAST
    attr = "memory_format"
    none = "no 4-D or 5-D weights or inputs"

    def counts(self, p: Outermost) -> tuple[int, int]:
        return p.converted, p.inputs_converted

    def done(self, p: Outermost) -> str:
        return (f"{p.module_text()} to channels_last ({p.converted} weights and buffers, "
                f"{p.inputs_converted} input tensors converted)")


class Float32(Converts):
    switch = Switch.FP32
    attr = "float32"
    none = "no float64 weights or inputs"

    def counts(self, p: Outermost) -> tuple[int, int]:
        return p.float32_converted, p.float32_inputs

    def done(self, p: Outermost) -> str:
        return (f"{p.module_text()} in float32 ({p.float32_converted} float64 weights and buffers, "
                f"{p.float32_inputs} float64 input tensors converted; outputs returned as float64)")


class Compile(Handler):
    toggles = True

    def __init__(self, switch: Switch, mode: str) -> None:
        self.switch = switch
        self.mode = mode

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        # off, the calls go to the module itself; the compiled one (its code, its graphs) is kept
        outermost(torch, trial).compile_on = on

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        outermost(torch, trial).compile = self.mode

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        p = trial.shared["outermost"]
        if p.already_compiled:
            report.note(f"already compiled ({', '.join(p.already_compiled)})", applied=False)
            return
        if not p.calls:
            report.note(p.none_text(), applied=False)
            return
        how = (f"backend {p.backend}" if p.backend else
               "default mode" if self.mode == "default" else f"mode {self.mode}")
        how += ", Inductor freezing" if self.switch == Switch.COMPILE_FROZEN else ""
        report.note(f"torch.compile ({how}) of {p.module_text()}", applied=True)
        others = p.other_modules()
        if others:
            left = f"the program's other module{'s' if len(others) > 1 else ''} {', '.join(others)}, not compiled"
            report.note(left)
            report.left_out.append(left)


class CompileFrozen(Compile):
    """``compile`` with Inductor's freezing, set for the run and put back by ``restore``."""

    def __init__(self) -> None:
        super().__init__(Switch.COMPILE_FROZEN, "default")

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        super().install(torch, trial, report)
        import torch._inductor.config as inductor_config
        trial.patch(inductor_config, "freezing", True)

    def finish(self, torch: Any, trial: Any, report: Report) -> None:
        p = trial.shared["outermost"]
        if p.calls and p.grad_calls == p.calls and not p.already_compiled:
            report.note(f"{p.module_text()} was called with gradients enabled ({p.calls} call"
                        f"{'s' if p.calls != 1 else ''}, all of them), where freezing does nothing (run it "
                        "under torch.no_grad() or torch.inference_mode())", applied=False)
            return
        super().finish(torch, trial, report)


HANDLERS = {Switch.BF16: Around(Switch.BF16, "autocast", "autocast bf16"), Switch.CHANNELS_LAST: ChannelsLast(),
            Switch.INFERENCE_MODE: Around(Switch.INFERENCE_MODE, "inference", "torch.inference_mode()"),
            Switch.FP32: Float32(), Switch.COMPILE: Compile(Switch.COMPILE, "default"),
            Switch.COMPILE_GRAPHS: Compile(Switch.COMPILE_GRAPHS, "reduce-overhead"),
            Switch.COMPILE_FROZEN: CompileFrozen()}

"""Backend settings: ``tf32`` and ``cudnn_benchmark``, set right after the script imports torch.

``tf32``: matmuls through ``torch.set_float32_matmul_precision("high")`` and cuDNN convolutions
through ``torch.backends.cudnn.conv.fp32_precision = "tf32"`` (torch 2.9 and later; before it,
``torch.backends.cudnn.allow_tf32 = True``). The matmul setting goes through the public function,
not ``torch.backends.cuda.matmul.fp32_precision``: in torch 2.13 setting that attribute directly
makes a later read of the legacy ``allow_tf32`` flag raise ("mix of the legacy and new APIs"),
and scripts and libraries read it; the function sets both. cuDNN already runs convolutions in
TF32 by default; cuBLAS matmuls do not. A script that sets the precision itself after importing
torch wins: the trial then says the setting did not hold; where the trial alternates, from the
last block it was on for (a mesh network that set ``allow_tf32 = False`` every step measured
1.03x "with" TF32, the same fix by hand 1.32x).

``cudnn_benchmark``: ``torch.backends.cudnn.benchmark = True`` (cuDNN times its algorithms for
each new convolution shape and keeps the fastest; the first iterations pay for the search, which
the warm-up the trial leaves out holds).
"""
from __future__ import annotations

from typing import Any, Optional

from profkit.capture.switches.base import Handler, Report
from profkit.model import Switch


def _conv_setting(torch: Any) -> tuple[Any, str, Any, str]:
    """cuDNN's TF32 setting: (its owner, its name, its TF32 value, how the trial says it), torch
    2.9's ``conv.fp32_precision`` where there is one, else the legacy ``allow_tf32``."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):
        return conv, "fp32_precision", "tf32", "torch.backends.cudnn.conv.fp32_precision = \"tf32\""
    return torch.backends.cudnn, "allow_tf32", True, "torch.backends.cudnn.allow_tf32 = True"


def _matmul_tf32(torch: Any) -> bool:
    """Whether cuBLAS matmuls may use TF32: the legacy flag, which both APIs set and which reads
    even after a script set it (then ``get_float32_matmul_precision`` raises on the mix); the
    precision where the flag cannot be read (the new API set directly); True where neither can
    (not ours to judge)."""
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        pass
    try:
        return torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:
        return True


def _conv_tf32(torch: Any) -> bool:
    owner, name, tf32, _ = _conv_setting(torch)
    return bool(getattr(owner, name) == tf32)


class Tf32(Handler):
    switch = Switch.TF32
    toggles = True

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        old = torch.get_float32_matmul_precision()
        owner, name, tf32, how = _conv_setting(torch)
        trial.shared["tf32_off"] = (old, getattr(owner, name))
        trial.on_restore(lambda: torch.set_float32_matmul_precision(old))
        torch.set_float32_matmul_precision("high")
        trial.patch(owner, name, tf32)
        report.note("matmuls: torch.set_float32_matmul_precision(\"high\"); cuDNN convolutions: " + how,
                    applied=True)

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        """On: TF32; off: the settings the script had when it imported torch."""
        old_matmul, old_conv = trial.shared["tf32_off"]
        owner, name, tf32, _ = _conv_setting(torch)
        torch.set_float32_matmul_precision("high" if on else old_matmul)
        setattr(owner, name, tf32 if on else old_conv)

    def holds(self, torch: Any, trial: Any) -> Optional[str]:
        if not _matmul_tf32(torch):
            return "the script set the matmul precision back to \"highest\""
        if not _conv_tf32(torch):
            return "the script turned TF32 off for cuDNN convolutions"
        return None


class CudnnBenchmark(Handler):
    switch = Switch.CUDNN_BENCHMARK
    toggles = True

    def toggle(self, torch: Any, trial: Any, on: bool) -> None:
        # off, cuDNN's heuristics pick the algorithms again; on, the ones it timed are cached
        torch.backends.cudnn.benchmark = on

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        trial.patch(torch.backends.cudnn, "benchmark", True)
        report.note("torch.backends.cudnn.benchmark = True", applied=True)

    def holds(self, torch: Any, trial: Any) -> Optional[str]:
        return None if torch.backends.cudnn.benchmark else "the script set it back to False"


HANDLERS = {Switch.TF32: Tf32(), Switch.CUDNN_BENCHMARK: CudnnBenchmark()}

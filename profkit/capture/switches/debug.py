"""Debugging modes left on: ``no_anomaly``.

``no_anomaly``: autograd's anomaly detection is never turned on. ``torch.autograd.detect_anomaly``
and ``torch.autograd.set_detect_anomaly`` (context manager or call) both switch it through
``torch.set_anomaly_enabled``, which the switch wraps when the script imports torch: a request to
turn it on turns it off instead, and is counted. The program's backward then keeps no Python stack
per autograd node and reads no gradient back to the host to look for NaNs; a NaN it would have
caught goes on unreported.
"""
from __future__ import annotations

from typing import Any

from profkit.capture.switches.base import CallCounter, Report
from profkit.model import Switch


class NoAnomaly(CallCounter):
    switch = Switch.NO_ANOMALY
    key, done, never = ("anomaly_calls", "autograd anomaly detection left off",
                        "autograd anomaly detection was never turned on")

    def install(self, torch: Any, trial: Any, report: Report) -> None:
        calls = self.calls(trial)
        original = torch.set_anomaly_enabled

        def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
            if enabled:
                calls[0] += 1
            original(False, check_nan)
        set_anomaly_enabled.__doc__ = "profkit --try no_anomaly: anomaly detection stays off."
        trial.patch(torch, "set_anomaly_enabled", set_anomaly_enabled)
        if torch.is_anomaly_enabled():   # turned on before the switch was installed
            original(False, True)
            calls[0] += 1


HANDLERS = {Switch.NO_ANOMALY: NoAnomaly()}

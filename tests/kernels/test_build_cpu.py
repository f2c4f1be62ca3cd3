"""The launch-variant choice from PROFKIT_KERNELS_LAUNCH (no GPU, no build)."""
import pytest

from kernels import _build


def test_launch_choice_defaults_legacy_and_overrides():
    assert _build.launch_choice("") == _build.LAUNCH_DEFAULTS
    assert set(_build.launch_choice("legacy").values()) == {0}
    got = _build.launch_choice("softmax=2, add_layernorm=2")
    assert got["softmax"] == 2 and got["add_layernorm"] == 2
    assert got["bias_gelu"] == _build.LAUNCH_DEFAULTS["bias_gelu"]
    with pytest.raises(ValueError, match="OP=VARIANT"):
        _build.launch_choice("softmx=1")

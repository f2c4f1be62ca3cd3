"""The launch-variant choice from PROFKIT_KERNELS_LAUNCH (no GPU, no build)."""
import pytest

from kernels import _build


def test_launch_choice_defaults_legacy_and_overrides():
    assert _build.launch_choice("") == _build.LAUNCH_DEFAULTS
    assert set(_build.launch_choice("legacy").values()) == {0}
    got = _build.launch_choice("softmax=2, add_layernorm = 2")
    assert got["softmax"] == 2 and got["add_layernorm"] == 2
    assert got["bias_gelu"] == _build.LAUNCH_DEFAULTS["bias_gelu"]
    with pytest.raises(ValueError, match="OP=VARIANT"):
        _build.launch_choice("softmx=1")
    with pytest.raises(ValueError, match="VARIANT 0 to 3"):
        _build.launch_choice("softmax=7")


def test_bad_launch_env_fails_before_any_build(monkeypatch, tmp_path):
    # The value is checked first: no toolchain, GPU or build is consulted, and nothing is loaded.
    monkeypatch.setenv("PROFKIT_KERNELS_LAUNCH", "softmax=fast")
    monkeypatch.setenv("PROFKIT_KERNELS_CACHE", str(tmp_path))
    monkeypatch.setattr(_build, "_LOADED", False)  # as in a fresh process, even after a GPU test loaded it
    with pytest.raises(ValueError, match="PROFKIT_KERNELS_LAUNCH: 'softmax=fast'"):
        _build.ensure_loaded()
    assert not _build.is_loaded()
    assert not any(tmp_path.iterdir())

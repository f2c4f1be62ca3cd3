"""Find the Nsight Systems (``nsys``) and Nsight Compute (``ncu``) command-line tools.

Search order for nsys:
  1. ``$PROFKIT_NSYS`` (the executable, or a directory holding it): when set it must be valid;
  2. ``nsys`` on ``$PATH``;
  3. the usual install places: ``/opt/nvidia/nsight-systems/*/bin``, ``/usr/local/cuda/bin``,
     ``/usr/local/cuda-*/bin`` and the full CLI that ships inside Nsight Compute,
     ``/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys``.
ncu likewise with ``$PROFKIT_NCU``, ``$PATH``, ``/usr/local/cuda/bin`` and
``/opt/nvidia/nsight-compute/*/ncu``. The newest version wins among globbed install places.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from profkit.errors import ProfkitError

NSYS_PLACES: list[str] = [
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
]
NCU_PLACES: list[str] = [
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
]

NSYS_INSTALL_HINT = (
    "install Nsight Systems (https://developer.nvidia.com/nsight-systems, or "
    "`apt-get install nsight-systems-cli` from NVIDIA's CUDA repository), put nsys on PATH "
    "or set PROFKIT_NSYS=/path/to/nsys"
)
NCU_INSTALL_HINT = (
    "install Nsight Compute (it comes with the CUDA toolkit; or "
    "`apt-get install nsight-compute` from NVIDIA's CUDA repository), put ncu on PATH "
    "or set PROFKIT_NCU=/path/to/ncu"
)


def _version_key(path: str) -> tuple:
    """Sort key: the numbers in the path (so .../2025.3.1/... beats .../2024.1/...)."""
    return tuple(int(n) for n in re.findall(r"\d+", path))


def _is_exe(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _from_env(var: str, exe: str) -> Optional[str]:
    value = os.environ.get(var)
    if not value:
        return None
    p = Path(value).expanduser()
    if p.is_dir():
        p = p / exe
    if not _is_exe(p):
        raise ProfkitError(f"{var}={value} is not an executable {exe}; "
                           f"point it at the {exe} binary or unset it")
    return str(p)


def _find(exe: str, env_var: str, places: Sequence[str]) -> Optional[str]:
    found = _from_env(env_var, exe)
    if found:
        return found
    on_path = shutil.which(exe)
    if on_path:
        return on_path
    for pattern in places:
        hits = sorted((h for h in glob.glob(pattern) if _is_exe(Path(h))), key=_version_key)
        if hits:
            return hits[-1]
    return None


def find_nsys() -> str:
    """Path of an nsys executable, or a ProfkitError that says what to install."""
    found = _find("nsys", "PROFKIT_NSYS", NSYS_PLACES)
    if not found:
        raise ProfkitError(f"nsys (Nsight Systems CLI) not found on PATH, in PROFKIT_NSYS or in "
                           f"/opt/nvidia/nsight-systems, /usr/local/cuda/bin, "
                           f"/opt/nvidia/nsight-compute/*/host/target-linux-x64: {NSYS_INSTALL_HINT}")
    return found


def find_ncu() -> str:
    """Path of an ncu executable, or a ProfkitError that says what to install."""
    found = _find("ncu", "PROFKIT_NCU", NCU_PLACES)
    if not found:
        raise ProfkitError(f"ncu (Nsight Compute CLI) not found on PATH, in PROFKIT_NCU or in "
                           f"/usr/local/cuda/bin, /opt/nvidia/nsight-compute: {NCU_INSTALL_HINT}")
    return found


def tool_version(exe: str, timeout: float = 30.0) -> str:
    """First line of ``exe --version`` that names a version ("" when it cannot be read)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [ln.strip() for ln in (out.stdout + "\n" + out.stderr).splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\d+\.\d+", ln):
            # ncu prints its name and its version on separate lines: keep both
            return ln if ln == lines[0] or "nsight" in ln.lower() else f"{lines[0]} {ln}"
    return lines[0] if lines else ""

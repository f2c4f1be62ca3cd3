"""Compressed traces (``trace.sqlite.gz``, ``.xz``, ``.bz2``, ``.zst``): read through a private cache.

SQLite needs a file it can seek in, so a compressed export is decompressed once into a per-user
cache and read there; the input is only read. The cache entry is named by the SHA-256 of the
compressed bytes, so an edited file never reads a stale copy and two names for one content share
one entry. Decompression writes a temporary file in the cache and renames it into place, so two
runs racing on the same trace each see a whole file. The cache is kept under a size bound
(``PROFKIT_CACHE_MAX_BYTES``, 4 GiB by default) by removing the entries used least recently.

The cache lives in ``PROFKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/profkit/traces``, else
``~/.cache/profkit/traces``.
"""
from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import lzma
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Optional

from profkit.errors import ProfkitError, TraceError

DEFAULT_MAX_BYTES = 4 << 30
_CHUNK = 1 << 20


def _zstd_open(path: Path) -> BinaryIO:
    try:
        import zstandard
    except ImportError:
        raise TraceError(f"{path}: reading .zst traces needs the zstandard package "
                         "(pip install zstandard), or decompress it with `zstd -d`") from None
    return zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)


OPENERS: dict[str, Callable[[Path], BinaryIO]] = {
    ".gz": lambda p: gzip.open(p, "rb"),
    ".xz": lambda p: lzma.open(p, "rb"),
    ".bz2": lambda p: bz2.open(p, "rb"),
    ".zst": _zstd_open,
}
# The first bytes of each format: a compressed file with the wrong suffix is named, not misread.
MAGIC = {".gz": b"\x1f\x8b", ".xz": b"\xfd7zXZ\x00", ".bz2": b"BZh", ".zst": b"\x28\xb5\x2f\xfd"}
ERRORS = (OSError, EOFError, lzma.LZMAError, ValueError)


def is_compressed(path: str | Path) -> bool:
    """Whether ``path`` names a compressed trace (by its suffix)."""
    return Path(path).suffix.lower() in OPENERS


def cache_dir() -> Path:
    env = os.environ.get("PROFKIT_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "profkit" / "traces"


def max_cache_bytes() -> int:
    try:
        return int(os.environ.get("PROFKIT_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


def content_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


# (resolved path, size, mtime) -> cache entry: a trace opened many times in one run is hashed once.
_SEEN: dict[tuple[str, int, int], Path] = {}


def decompressed(path: str | Path) -> Path:
    """The decompressed copy of the compressed trace ``path`` in the cache (made on first use).

    Raises TraceError, naming ``path``, when it cannot be read or does not decompress."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if key in _SEEN and _SEEN[key].is_file():
        return _SEEN[key]
    _SEEN[key] = target = _decompress(p)
    return target


def _decompress(p: Path) -> Path:
    suffix = p.suffix.lower()
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
        digest = content_hash(p)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if not head.startswith(MAGIC[suffix]):
        other = next((s for s, m in MAGIC.items() if head.startswith(m)), None)
        hint = (f" (it is {other[1:]}-compressed: rename it to end in {other})" if other
                else " (it is not compressed: rename it to .sqlite)")
        raise TraceError(f"{p}: not a {suffix[1:]} file{hint}")
    root = cache_dir()
    target = root / f"{digest}.sqlite"
    if target.is_file():
        with contextlib.suppress(OSError):
            os.utime(target)  # most recently used: the last to be evicted
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{digest[:16]}-", suffix=".part", dir=root)
    except OSError as exc:
        raise TraceError(f"{p}: cannot write the decompressed copy to {root} ({exc.strerror}); "
                         "set PROFKIT_CACHE_DIR to a writable folder") from None
    try:
        with os.fdopen(fd, "wb") as out, OPENERS[suffix](p) as src:
            shutil.copyfileobj(src, out, _CHUNK)
        os.replace(tmp, target)  # atomic: a racing run sees no file or a whole one
    except TraceError:
        raise
    except ERRORS as exc:
        raise TraceError(f"{p}: damaged {suffix[1:]} file ({exc}); compress the export again") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    evict(root, keep=target)
    return target


def evict(root: Path, keep: Optional[Path] = None, limit: Optional[int] = None) -> list[Path]:
    """Remove the least recently used entries until the cache holds at most ``limit`` bytes
    (never ``keep``, the entry just made); returns what was removed."""
    limit = max_cache_bytes() if limit is None else limit
    entries = []
    for f in root.glob("*.sqlite"):
        with contextlib.suppress(OSError):
            st = f.stat()
            entries.append((st.st_mtime, st.st_size, f))
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, f in sorted(entries):
        if total <= limit:
            break
        if keep is not None and f == keep:
            continue
        with contextlib.suppress(OSError):
            f.unlink()
            total -= size
            removed.append(f)
    return removed


TRACE_SUFFIXES = (".sqlite",) + tuple(f".sqlite{s}" for s in OPENERS)


def is_trace_name(path: str | Path) -> bool:
    """Whether ``path`` is named like an export: ``.sqlite``, plain or compressed."""
    return Path(path).name.lower().endswith(TRACE_SUFFIXES)


def trace_stem(path: str | Path) -> str:
    """The name without ``.sqlite`` and its compression suffix (``rank0.sqlite.xz`` -> ``rank0``)."""
    name = Path(path).name
    for s in sorted(TRACE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(s):
            return name[: -len(s)]
    return Path(name).stem


def find_traces(folder: str | Path, recursive: bool = False) -> list[Path]:
    """The exports in ``folder`` (plain or compressed), sorted."""
    files = Path(folder).rglob("*") if recursive else Path(folder).glob("*")
    return sorted(p for p in files if p.is_file() and is_trace_name(p))


def expand_inputs(paths: Iterable[str | Path]) -> list[Path]:
    """The trace files that command-line arguments name: files as given, a directory's exports
    (``find_traces``, not recursive) in its place; each file once, in the order given."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = find_traces(p)
            if not found:
                raise ProfkitError(f"{p}: not a file, and the directory holds no .sqlite exports; pass "
                                   "an .sqlite trace, or a directory of one export per rank "
                                   "(`nsys export --type sqlite` each rank's report)")
            out.extend(found)
        else:
            out.append(p)
    seen, uniq = set(), []
    for p in out:
        k = str(p.resolve()) if p.exists() else str(p)
        if k not in seen:
            seen.add(k)
            uniq.append(p)
    return uniq

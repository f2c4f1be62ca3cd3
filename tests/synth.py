"""Build small nsys-shaped SQLite files by hand, one per schema variant the reader must handle."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Iterable, Optional

PID = 100 << 24          # globalPid of process 100 (nsys serialised GlobalId)
TID = PID + 7            # globalTid of thread 7 in that process


def make_trace(path: Path, *, kernels: Iterable[tuple] = (), runtime: Iterable[tuple] = (),
               nvtx: Iterable[tuple] = (), memcpy: Iterable[tuple] = (),
               kernel_table: str = "CUPTI_ACTIVITY_KIND_KERNEL", nvtx_text_id: bool = True,
               with_runtime: bool = True, with_nvtx: bool = True, gpu_name: Optional[str] = "NVIDIA H200",
               strings: Optional[dict[int, str]] = None, short_name_only: bool = False,
               grids: Optional[dict[int, tuple]] = None) -> Path:
    """kernels: (start, end, corr, name_id[, device, stream, pid]); runtime: (start, end, corr[, tid]);
    nvtx: (start, end, text, tid[, eventType, endGlobalTid]); memcpy: (start, end, corr, bytes, copyKind);
    grids: launch dimensions by correlation id, (gridX, gridY, gridZ, blockX, blockY, blockZ)
    (the kernel table has no launch dimensions without it)."""
    strings = strings or {1: "kernel_a", 2: "kernel_b", 3: "range_text", 9: "cudaLaunchKernel"}
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", strings.items())
    con.execute("CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT)")
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', '2099.1.0')")
    if gpu_name is not None:
        con.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, smCount INTEGER, "
                    "clockRate INTEGER, memoryBandwidth INTEGER, computeMajor INTEGER, computeMinor INTEGER)")
        con.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, ?, 100, 1500000000, 2000000000000, 9, 0)",
                    (gpu_name,))
    name_cols = "shortName INTEGER NOT NULL" if short_name_only else \
        "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER"
    con.execute(f"CREATE TABLE {kernel_table} (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                "deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, "
                f"correlationId INTEGER, globalPid INTEGER, {name_cols}, graphNodeId INTEGER"
                + (", gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, "
                   "blockZ INTEGER" if grids is not None else "") + ")")
    for k in kernels:
        start, end, corr, name = k[:4]
        dev, stream, pid = (list(k[4:]) + [0, 7, PID][len(k[4:]):])[:3]
        if short_name_only:
            con.execute(f"INSERT INTO {kernel_table} (start, end, deviceId, streamId, correlationId, "
                        "globalPid, shortName) VALUES (?,?,?,?,?,?,?)", (start, end, dev, stream, corr, pid, name))
        elif grids is not None:
            con.execute(f"INSERT INTO {kernel_table} (start, end, deviceId, streamId, correlationId, "
                        "globalPid, demangledName, shortName, gridX, gridY, gridZ, blockX, blockY, blockZ) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (start, end, dev, stream, corr, pid, name, name, *grids.get(corr, (None,) * 6)))
        else:
            con.execute(f"INSERT INTO {kernel_table} (start, end, deviceId, streamId, correlationId, "
                        "globalPid, demangledName, shortName) VALUES (?,?,?,?,?,?,?,?)",
                        (start, end, dev, stream, corr, pid, name, name))
    if memcpy:
        con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                    "deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, "
                    "globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL)")
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,0,7,?,?,?,?)",
                        [(s, e, c, PID, b, kind) for s, e, c, b, kind in memcpy])
    if with_runtime:
        con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                    "eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
                    "returnValue INTEGER)")
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,0,?,?,9,0)",
                        [(r[0], r[1], r[3] if len(r) > 3 else TID, r[2]) for r in runtime])
    if with_nvtx:
        id_col = ", textId INTEGER" if nvtx_text_id else ""
        con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, "
                    f"text TEXT, globalTid INTEGER, endGlobalTid INTEGER, domainId INTEGER{id_col})")
        for n in nvtx:
            start, end, text, tid = n[:4]
            etype = n[4] if len(n) > 4 else 59
            end_tid = n[5] if len(n) > 5 else None
            if nvtx_text_id and isinstance(text, int):
                con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, endGlobalTid, "
                            "domainId, textId) VALUES (?,?,?,?,?,0,?)", (start, end, etype, tid, end_tid, text))
            else:
                con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, endGlobalTid, "
                            "domainId) VALUES (?,?,?,?,?,?,0)", (start, end, etype, text, tid, end_tid))
    con.commit()
    con.close()
    return path


WHOLE = ("classify", "diff", "report", "roofline", "timeline", "export-perfetto")


def whole(args: list) -> list:
    """CLI arguments for golden outputs over the whole capture with per-thread projection (as
    Nsight Systems computes them): --window all --attribution thread unless a window is given."""
    args = [str(a) for a in args]
    if args and args[0] in WHOLE and "--window" not in args:
        return [args[0], "--window", "all", "--attribution", "thread", *args[1:]]
    return args


def plain(path) -> Path:
    """The uncompressed export behind a committed trace (``*.sqlite.xz``), from profkit's own
    cache: read it, or copy it before changing it, never write to it."""
    from profkit.read.compressed import decompressed, is_compressed
    return decompressed(path) if is_compressed(path) else Path(path)


class Launches:
    """A hand-built program's kernel launches: each ``launch(name, tid)`` is a 4 us launch call on
    thread ``tid``, its kernel ``kernel_ns`` long, started 3 us after the call or 0.5 us after the
    GPU's previous kernel ends; calls ``every_ns`` apart (the Python between launches). Kernel name
    ids come from ``names`` (from 10 on); ``strings`` holds them beside cudaLaunchKernel (9) and the
    NVTX text ``range_text`` (3), for make_trace."""

    def __init__(self, names: Iterable[str], kernel_ns: int, every_ns: int, range_text: str = "step") -> None:
        self.ids = {n: 10 + i for i, n in enumerate(sorted(set(names)))}
        self.strings = {i: n for n, i in self.ids.items()}
        self.strings.update({9: "cudaLaunchKernel", 3: range_text})
        self.kernel_ns, self.every_ns = kernel_ns, every_ns
        self.kernels: list[tuple] = []
        self.runtime: list[tuple] = []
        self.corr = self.t = self.gpu = 0

    def launch(self, name: str, tid: int) -> None:
        self.corr += 1
        self.runtime.append((self.t, self.t + 4_000, self.corr, tid))
        start = max(self.t + 3_000, self.gpu + 500)
        self.kernels.append((start, start + self.kernel_ns, self.corr, self.ids[name]))
        self.gpu = start + self.kernel_ns
        self.t += self.every_ns

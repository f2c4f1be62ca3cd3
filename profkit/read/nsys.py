"""Read an Nsight Systems SQLite export into typed frames. Read-only, schema-drift tolerant.

The file is opened with SQLite's ``mode=ro&immutable=1``: nothing is written, locked, or left
beside the user's trace. Every table is optional except the string table and at least one kind
of GPU activity; versioned names (``CUPTI_ACTIVITY_KIND_KERNEL_V2``) are resolved to the newest.
"""
from __future__ import annotations

import re
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from profkit.errors import NoGpuActivityError, TraceError
from profkit.read import db
from profkit.read.assemble import (NameTable, calls_at, direct_match, join_calls, kernel_names, text_column,
                                   time_order)
# Opening and integer columns live in profkit.read.db (free of pandas); named here as before.
from profkit.read.db import (REEXPORT, _unreadable, columns_of, damaged, list_tables,  # noqa: F401
                             open_readonly, resolve_table)
from profkit.read.peaks import GpuInfo
from profkit.read import runtime
from profkit.read.runtime import RuntimeCalls
from profkit.read.text import as_text, visible

# Timestamps are ns since the session start (or the epoch): a value outside [0, 1e18] (year
# 2001 + 31 years of ns since the epoch is ~1e18) cannot come from a clock.
MAX_TIMESTAMP = 10 ** 18

# NVTX event types (ENUM_NSYS_EVENT_TYPE), stable across versions.
NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 70, 71, 75
NVTX_RANGE_TYPES = (NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND)
NVTX_MARK = 34

_MEMCPY_LABELS = {0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array",
                  4: "Array-to-Host", 5: "Array-to-Array", 6: "Array-to-Device",
                  7: "Device-to-Array", 8: "Device-to-Device", 9: "Host-to-Host",
                  10: "Peer-to-Peer", 11: "Unified Host-to-Device",
                  12: "Unified Device-to-Host", 13: "Unified Device-to-Device"}

KINDS = ("kernel", "memcpy", "memset")  # in name order
ACTIVITY_COLUMNS = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "kind",
                    "name", "short_name", "bytes", "graphNodeId", "globalTid", "api_start",
                    "api_end"]


class SharedCodes(tuple):
    """(codes, names) kept in the activities' ``attrs``. pandas deep-copies ``attrs`` into every
    frame and column derived from a frame (a column read, a mask, a take): for these arrays that
    was about a fifth of an analysis. They are never written to, so derived frames share them."""

    def __deepcopy__(self, memo) -> "SharedCodes":
        return self


@dataclass
class ExportInfo:
    path: str
    nsys_version: Optional[str] = None
    schema_version: Optional[str] = None
    session_start_utc: Optional[str] = None
    tables: list[str] = field(default_factory=list)


def _opt_text(value: object) -> Optional[str]:
    return None if value is None else as_text(value)


def _opt_count(value: object) -> Optional[int]:
    """A non-negative integer, or None for anything else (NULL, text, a real, a blob)."""
    return value if isinstance(value, int) and 0 <= value < 2 ** 62 else None


def per_name(names, fn, dtype: type = object) -> np.ndarray:
    """``fn(name)`` for each of ``names`` (a column or array, or ``(codes, distinct names)``
    already factorised, as Trace.range_codes_of gives), evaluated once per distinct name; an
    array of ``dtype``: None (object) or False (bool) for a missing name (code -1).

    Traces repeat a few hundred names millions of times; calling ``fn`` per row would dominate.
    A categorical column is used through its codes, with no factorisation at all. ``dtype=bool``
    gives a mask without a million-element conversion from objects."""
    if isinstance(names, tuple):
        codes, uniq = names
    elif isinstance(getattr(names, "dtype", None), pd.CategoricalDtype):
        codes, uniq = np.asarray(names.cat.codes), names.cat.categories
    else:
        codes, uniq = pd.factorize(pd.Series(names, dtype=object))
    values = np.empty(len(uniq) + 1, dtype=dtype)
    values[:-1] = [fn(str(u)) for u in uniq]
    values[-1] = None if dtype is object else False  # code -1: a missing name
    return values[codes]


def match_names(names: "pd.Series | tuple[np.ndarray, np.ndarray]", pattern: "re.Pattern[str]") -> np.ndarray:
    """``pattern.match`` over a column of names (or ``(codes, distinct names)``), evaluated once
    per distinct name (per_name)."""
    return per_name(names, lambda n: bool(pattern.match(n)), bool)


def _lookup(ids: Optional[pd.Series], strings: dict[int, str], n: int) -> np.ndarray:
    """Map StringIds ids to text, looking each distinct id up once."""
    if ids is None:
        return np.full(n, None, dtype=object)
    # Distinct ids by hashing, not sorting: a million ids hold a few hundred values.
    inverse, uniq = pd.factorize(ids.to_numpy())
    return np.array([strings.get(int(u)) for u in uniq], dtype=object)[inverse]


class TraceReader:
    """Typed access to one export. All methods are read-only queries."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.conn = open_readonly(path)
        try:
            self.tables = list_tables(self.conn)
        except (sqlite3.DatabaseError, UnicodeError) as exc:
            raise _unreadable(Path(path), f"{path}: damaged SQLite file ({exc}); {REEXPORT}") from None
        if not self.tables:
            raise TraceError(f"{path}: empty SQLite database, not an Nsight Systems export")
        self.kernel_table = resolve_table(self.tables, "CUPTI_ACTIVITY_KIND_KERNEL")
        self.memcpy_table = resolve_table(self.tables, "CUPTI_ACTIVITY_KIND_MEMCPY")
        self.memset_table = resolve_table(self.tables, "CUPTI_ACTIVITY_KIND_MEMSET")
        self.runtime_table = resolve_table(self.tables, "CUPTI_ACTIVITY_KIND_RUNTIME")
        self.nvtx_table = resolve_table(self.tables, "NVTX_EVENTS")
        nsys_markers = {"StringIds", "META_DATA_EXPORT", "TARGET_INFO_GPU", "ThreadNames"}
        if not (nsys_markers & set(self.tables)) and not (self.kernel_table or self.nvtx_table):
            raise TraceError(f"{path}: SQLite file but not an Nsight Systems export (no nsys tables); "
                             "export one with `nsys export --type sqlite`")
        self._strings: Optional[dict[int, str]] = None
        self.unclosed_ranges = 0
        # The API table as activities() read it (profkit.read.runtime), or as a Trace hands it
        # on: the API-call queries below answer from it instead of scanning the table again.
        self.runtime: Optional[RuntimeCalls] = None
        # The kernels' start times in rowid order, as activities() read them (or a Trace hands
        # them on): kernel_shapes finds the rows of a stretch from them.
        self.kernel_starts: Optional[np.ndarray] = None
        # Whether no two activities share a launch call, as activities() found it (None: unknown).
        self.one_activity_per_call: Optional[bool] = None

    def close(self) -> None:
        self.conn.close()

    def _query(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        try:
            return pd.read_sql_query(sql, self.conn, params=params)
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            raise _unreadable(Path(self.path), f"{self.path}: damaged or unreadable export ({exc}); "
                                               f"{REEXPORT}") from None

    # -- metadata -----------------------------------------------------------------------------
    def export_info(self) -> ExportInfo:
        info = ExportInfo(path=self.path, tables=list(self.tables))
        if "META_DATA_EXPORT" in self.tables:
            meta = {as_text(k): v for k, v in
                    self.conn.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall()}
            info.nsys_version = _opt_text(meta.get("EXPORT_PRODUCT_VERSION"))
            info.schema_version = _opt_text(meta.get("EXPORT_SCHEMA_VERSION"))
        if "TARGET_INFO_SESSION_START_TIME" in self.tables:
            cols = columns_of(self.conn, "TARGET_INFO_SESSION_START_TIME")
            row = (self.conn.execute("SELECT utcTime FROM TARGET_INFO_SESSION_START_TIME").fetchone()
                   if "utcTime" in cols else None)
            info.session_start_utc = _opt_text(row[0]) if row else None
        return info

    def gpus(self) -> dict[int, GpuInfo]:
        """GPU description per device id (TARGET_INFO_GPU; columns vary by version)."""
        if "TARGET_INFO_GPU" not in self.tables:
            return {}
        cols = columns_of(self.conn, "TARGET_INFO_GPU")
        want = ["id", "name", "smCount", "clockRate", "memoryBandwidth", "computeMajor",
                "computeMinor", "l2CacheSize", "totalMemory"]
        sel = ", ".join(c if c in cols else f"NULL AS {c}" for c in want)
        out: dict[int, GpuInfo] = {}
        for row in self.conn.execute(f"SELECT {sel} FROM TARGET_INFO_GPU"):
            rec = dict(zip(want, row))
            # Numbers that are not positive integers (a damaged row) are treated as unknown.
            for k in want:
                if k != "name":
                    rec[k] = _opt_count(rec[k])
            cc = (f"{rec['computeMajor']}.{rec['computeMinor']}"
                  if rec["computeMajor"] is not None else None)
            dev = rec["id"] if rec["id"] is not None else len(out)
            out[dev] = GpuInfo(name=visible(rec["name"] or "") or "unknown GPU", sm_count=rec["smCount"],
                               clock_hz=rec["clockRate"], memory_bandwidth=rec["memoryBandwidth"],
                               compute_capability=cc, l2_bytes=rec["l2CacheSize"],
                               total_memory=rec["totalMemory"])
        return out

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            if "StringIds" in self.tables:
                cur = self.conn.execute("SELECT id, value FROM StringIds")
                # A damaged row (a text id, a blob or number for a name) must not raise later.
                # Names are made visible here, once: a control character or escape sequence in a
                # name the program chose must not act on the user's terminal in any output.
                self._strings = {i: visible(v) for i, v in cur.fetchall()
                                 if isinstance(i, int) and v is not None}
            else:
                self._strings = {}
        return self._strings

    def profkit_meta(self) -> dict[str, Optional[str]]:
        """``PROFKIT_META`` (key, value), written by ``profkit capture``; empty for other exports."""
        if "PROFKIT_META" not in self.tables or not {"key", "value"} <= columns_of(self.conn, "PROFKIT_META"):
            return {}
        return {as_text(k): (None if v is None else as_text(v))
                for k, v in self.conn.execute("SELECT key, value FROM PROFKIT_META") if k is not None}

    # -- GPU activity ---------------------------------------------------------------------------
    def _name_expr(self, table: str, candidates: list[str]) -> tuple[str, bool]:
        """The first name column present; whether it holds StringIds ids (vs text)."""
        cols = columns_of(self.conn, table)
        for c in candidates:
            if c in cols:
                typ = self.conn.execute(f'SELECT typeof("{c}") FROM "{table}" WHERE "{c}" IS NOT NULL LIMIT 1').fetchone()
                return c, (typ is None or typ[0] == "integer")
        return "NULL", False

    def int_columns(self, table: str, exprs: dict[str, str], where: str = "",
                    chunk: int = 250_000, rowids: Optional[tuple[int, int]] = None) -> dict[str, np.ndarray]:
        """Integer columns of ``table`` as numpy arrays (profkit.read.db.int_columns)."""
        return db.int_columns(self.conn, self.path, table, exprs, where, chunk, rowids)

    def check_timestamps(self, table: str, frame: "pd.DataFrame | dict[str, np.ndarray]",
                         cols: tuple[str, ...] = ("start", "end")) -> None:
        """Raise when a timestamp cannot be one: negative, beyond 1e18 ns, or an end before its start."""
        for c in cols:
            v = np.asarray(frame[c])
            bad = (v < 0) | (v > MAX_TIMESTAMP)
            if bad.any():
                raise damaged(self.path, f"{table}.{c} holds {int(bad.sum())} impossible "
                                         f"timestamp(s) (e.g. {int(v[bad][0])}; expected 0 to 1e18 ns)")
        if {"start", "end"} <= set(cols):
            back = np.asarray(frame["end"]) < np.asarray(frame["start"])
            if back.any():
                raise damaged(self.path, f"{table}: {int(back.sum())} row(s) end before they start")

    def _names(self, table: str, candidates: list[str]) -> tuple[str, Optional[pd.Series]]:
        """The name column to use; its values when they are text rather than StringIds ids."""
        col, is_id = self._name_expr(table, candidates)
        if col == "NULL" or is_id:
            return col, None
        values = self._query(f'SELECT "{col}" AS v FROM "{table}" ORDER BY rowid')["v"]
        return col, values.map(lambda v: None if v is None else visible(v))

    def runtime_calls(self) -> Optional[RuntimeCalls]:
        """The whole API table as arrays (profkit.read.runtime), or None when it lacks a column
        or holds anything but integers in one (then the queries read what they need). Taken
        from a read the command line started early, where there is one."""
        started = runtime.take_prefetched(self.path)
        if started is not None:
            try:
                return started.result()
            except Exception:  # read again here, which reports what is wrong the usual way
                pass
        return runtime.read_calls(self.conn, self.path)

    def _launch_calls(self, corr_sources: list[str],
                      correlation_ids: Optional[np.ndarray] = None) -> pd.DataFrame:
        """Runtime calls that launched GPU work: correlationId, pid key, globalTid, start, end.

        ``correlation_ids``: those of the activities read from ``corr_sources``, to select the
        calls from ``self.runtime`` when it is there rather than join in SQL."""
        cols = ["correlationId", "pidkey", "globalTid", "api_start", "api_end"]
        if not self.runtime_table or not corr_sources:
            return pd.DataFrame({c: np.empty(0, dtype=np.int64) for c in cols})
        pos = (self.runtime.launches(correlation_ids)
               if self.runtime is not None and correlation_ids is not None else None)
        if pos is not None:
            rc = self.runtime
            rt = {"correlationId": rc.correlationId[pos], "pidkey": np.right_shift(rc.globalTid[pos], 24),
                  "globalTid": rc.globalTid[pos], "api_start": rc.start[pos], "api_end": rc.end[pos]}
        else:
            union = " UNION ".join(f'SELECT correlationId FROM "{t}"' for t in corr_sources)
            rt = self.int_columns(self.runtime_table, {
                "correlationId": "a.correlationId", "pidkey": "a.globalTid >> 24",
                "globalTid": "a.globalTid", "api_start": "a.start", "api_end": "a.end"},
                where=f"a.correlationId IN ({union}) AND a.globalTid IS NOT NULL")
        df = pd.DataFrame(rt, columns=cols, copy=False)
        self.check_timestamps(self.runtime_table, {"start": df["api_start"], "end": df["api_end"]})
        return df

    def _launch_columns(self, sources: list[str], corr: np.ndarray, pidkey: np.ndarray
                        ) -> tuple[Optional[np.ndarray], dict[str, np.ndarray]]:
        """Each activity's launch call (globalTid, api_start, api_end) as join_calls gives it,
        found by a binary search in the API table where it allows one (one process, rising
        correlation ids: as exports write it); sets ``one_activity_per_call``."""
        rc = self.runtime
        pos = (direct_match(rc.correlationId, np.right_shift(rc.globalTid, 24), corr, pidkey)
               if rc is not None else None)
        if pos is None:
            row, api, self.one_activity_per_call = join_calls(corr, pidkey, self._launch_calls(sources, corr))
            return row, api
        used = np.sort(pos[pos >= 0], kind="stable")  # the calls checked, in table order
        used = used[np.r_[True, used[1:] != used[:-1]]] if len(used) else used
        self.check_timestamps(self.runtime_table, {"start": rc.start[used], "end": rc.end[used]})
        api, self.one_activity_per_call = calls_at(pos, rc.start, rc.end, rc.globalTid)
        return None, api

    def activities(self) -> pd.DataFrame:
        """Kernels, memcpys and memsets, one row each, with the launch call they came from.

        Columns: ACTIVITY_COLUMNS. ``kind`` is kernel | memcpy | memset; ``bytes`` is set for
        memcpy/memset; ``name`` is the demangled kernel name (as ``nsys stats`` shows it) or
        ``[CUDA memcpy Host-to-Device]``-style names for copies. A GPU activity is tied to its
        launch call by correlationId within the same process (the bits of globalTid/globalPid
        above the 24-bit thread id). The API table read on the way is kept in ``self.runtime``.
        """
        sources = [t for t in (self.kernel_table, self.memcpy_table, self.memset_table) if t]
        # The API table is the largest read; SQLite releases the GIL, so it runs on its own
        # connection in a thread while the activity tables are read here.
        pool = ThreadPoolExecutor(max_workers=1)

        def runtime_calls() -> Optional[RuntimeCalls]:
            reader = TraceReader(self.path)
            try:
                return reader.runtime_calls()
            finally:
                reader.close()

        runtime_future = pool.submit(runtime_calls)
        try:
            return self._activities(sources, runtime_future)
        finally:
            # Also when reading failed here: the thread must not outlive the call.
            pool.shutdown(wait=True)

    def _activities(self, sources: list[str], runtime_future: Future) -> pd.DataFrame:
        # Each table's columns as arrays, its names as a small table of distinct ones (``uid``
        # per row): the frame is built once, in time order, from arrays (no frame per table,
        # no concat, merge or sort of a million-row frame).
        parts: list[tuple[dict[str, np.ndarray], NameTable, int]] = []
        strings = self.strings()
        base = {"start": "a.start", "end": "a.end", "deviceId": "a.deviceId",
                "streamId": "a.streamId", "correlationId": "coalesce(a.correlationId, -1)",
                "globalPid": "coalesce(a.globalPid, 0)"}

        def gnode(t: str) -> str:
            return "coalesce(a.graphNodeId, -1)" if "graphNodeId" in columns_of(self.conn, t) else "-1"

        if self.kernel_table:
            t = self.kernel_table
            full, full_text = self._names(t, ["demangledName", "mangledName", "shortName", "name"])
            short, short_text = self._names(t, ["shortName", "demangledName", "name"])
            exprs = {**base, "graphNodeId": gnode(t)}
            if full_text is None and full != "NULL":
                exprs["name_id"] = f'coalesce(a."{full}", -1)'
            if short_text is None and short != "NULL":
                exprs["short_id"] = f'coalesce(a."{short}", -1)'
            cols = self.int_columns(t, exprs)
            self.check_timestamps(t, cols)
            self.kernel_starts = cols["start"]
            names = kernel_names(cols.pop("name_id", None), cols.pop("short_id", None),
                                 full_text, short_text, strings, len(cols["start"]))
            cols["bytes"] = np.full(len(cols["start"]), np.nan)
            parts.append((cols, names, KINDS.index("kernel")))
        if self.memcpy_table:
            t = self.memcpy_table
            labels = dict(_MEMCPY_LABELS)
            if "ENUM_CUDA_MEMCPY_OPER" in self.tables:
                labels.update({i: as_text(v) for i, v in
                               self.conn.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER")
                               if isinstance(i, int)})
            kind = "coalesce(a.copyKind, 0)" if "copyKind" in columns_of(self.conn, t) else "0"
            cols = self.int_columns(t, {**base, "graphNodeId": gnode(t), "bytes": "a.bytes", "copyKind": kind})
            self.check_timestamps(t, cols)
            uid, kinds = pd.factorize(cols.pop("copyKind"))
            text = np.array([f"[CUDA memcpy {labels.get(int(k), 'Unknown')}]" for k in kinds], dtype=object)
            parts.append((cols, NameTable(uid.astype(np.int64), text, text, -10 - np.asarray(kinds, dtype=np.int64)),
                          KINDS.index("memcpy")))
        if self.memset_table:
            t = self.memset_table
            cols = self.int_columns(t, {**base, "graphNodeId": gnode(t), "bytes": "a.bytes"})
            self.check_timestamps(t, cols)
            text = np.array(["[CUDA memset]"], dtype=object)
            parts.append((cols, NameTable(np.zeros(len(cols["start"]), dtype=np.int64), text, text,
                                          np.array([-5], dtype=np.int64)), KINDS.index("memset")))
        parts = [p for p in parts if len(p[0]["start"])]
        if not parts:
            raise NoGpuActivityError(
                f"{self.path}: no GPU activity (no kernel, memcpy or memset rows); profile with "
                "`nsys profile -t cuda,nvtx` (or `profkit capture`) and make sure the script runs GPU work")
        # One table (kernels alone, as most traces): its arrays as they are; else joined (and the
        # tables' own arrays let go, one column at a time).
        kind = np.concatenate([np.full(len(p[0]["start"]), p[2], dtype=np.int8) for p in parts])
        names = NameTable.concat([p[1] for p in parts])
        cols = {}
        for c in ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "graphNodeId", "bytes"):
            arrays = [p[0].pop(c).astype(np.float64 if c == "bytes" else np.int64, copy=False) for p in parts]
            cols[c] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        del parts, arrays
        runtime.help_prefetched(self.path, self.conn)
        self.runtime = runtime_future.result()
        row, api = self._launch_columns(sources, cols["correlationId"], np.right_shift(cols["globalPid"], 24))
        if row is not None:  # a launch call repeated: the rows it matched are repeated too
            cols = {c: v[row] for c, v in cols.items()}
            kind, names = kind[row], names.take(row)
        gnid = cols["graphNodeId"]
        if (gnid < 0).any():  # no graph node: NaN (as Series.where leaves an int column otherwise)
            cols["graphNodeId"] = np.where(gnid >= 0, gnid, np.nan)
        order = time_order(cols["start"], cols["end"])
        # A categorical of the kinds present, in name order (what astype("category") of their
        # names gives), built from small integer codes rather than a million strings.
        present = sorted(set(np.unique(kind).tolist()), key=lambda k: KINDS[k])
        remap = np.full(len(KINDS), -1, dtype=np.int8)
        remap[present] = np.arange(len(present))
        uid = names.uid[order]
        # Columns in time order, each let go once taken (rows already in order keep theirs).
        in_order = bool((order == np.arange(len(order))).all())
        take = (lambda v: v) if in_order else (lambda v: v[order])
        frame = {"kind": pd.Categorical.from_codes(remap[take(kind)], categories=[KINDS[k] for k in present]),
                 "name": text_column(names.name, uid), "short_name": text_column(names.short, uid)}
        for c in ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "graphNodeId"):
            frame[c] = take(cols.pop(c))
        for c in list(api):
            frame[c] = take(api.pop(c))
        acts = pd.DataFrame(frame, columns=ACTIVITY_COLUMNS, copy=False)
        acts.attrs["name_codes"] = SharedCodes(names.codes(uid))
        return acts

    def copy_memory_kinds(self) -> pd.DataFrame:
        """Host-side memory of each memcpy: start, correlationId, copyKind, srcKind, dstKind.

        Kinds follow ENUM_CUDA_MEM_KIND (0 pageable, 1 pinned, 2 device, ...): a host-to-device
        copy from pageable memory is staged by the CPU and cannot overlap with its caller."""
        t = self.memcpy_table
        cols = ["start", "correlationId", "copyKind", "srcKind", "dstKind"]
        if not t or not {"srcKind", "dstKind", "copyKind"} <= columns_of(self.conn, t):
            return pd.DataFrame(columns=cols)
        return pd.DataFrame(self.int_columns(t, {"start": "a.start",
                                                 "correlationId": "coalesce(a.correlationId, -1)",
                                                 "copyKind": "coalesce(a.copyKind, 0)",
                                                 "srcKind": "coalesce(a.srcKind, -1)",
                                                 "dstKind": "coalesce(a.dstKind, -1)"}))

    def synchronization(self) -> pd.DataFrame:
        """CUPTI's synchronization records: correlationId, pidkey (globalPid >> 24), streamId,
        eventSyncId (-1 where the export has none).

        They name the stream a ``cudaStreamSynchronize`` or ``cudaStreamWaitEvent`` call was about
        (the runtime table does not), and for a wait the recording of the event it waits for
        (``eventSyncId``, as event_records() has it); the record type is read from the call's
        name instead of ``syncType``, whose numbering differs between versions."""
        return self._stream_records("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", event_sync_required=False)

    def event_records(self) -> pd.DataFrame:
        """CUPTI's records of CUDA events (``cudaEventRecord``): correlationId, pidkey, streamId
        and eventSyncId (this recording of the event, which a stream's wait names); empty where
        the export has none."""
        return self._stream_records("CUPTI_ACTIVITY_KIND_CUDA_EVENT", event_sync_required=True)

    def _stream_records(self, table: str, event_sync_required: bool) -> pd.DataFrame:
        """correlationId, pidkey, streamId and eventSyncId of a CUPTI table that names a stream
        per call; empty where the table or its columns are missing (``eventSyncId`` -1 where it
        is missing and not required)."""
        cols = ["correlationId", "pidkey", "streamId", "eventSyncId"]
        t = resolve_table(self.tables, table)
        have = columns_of(self.conn, t) if t else set()
        need = {"correlationId", "streamId", "globalPid"} | ({"eventSyncId"} if event_sync_required else set())
        if not t or not need <= have:
            return pd.DataFrame({c: np.empty(0, dtype=np.int64) for c in cols})
        return pd.DataFrame(self.int_columns(t, {
            "correlationId": "coalesce(a.correlationId, -1)", "pidkey": "coalesce(a.globalPid, 0) >> 24",
            "streamId": "coalesce(a.streamId, -1)",
            "eventSyncId": "coalesce(a.eventSyncId, -1)" if "eventSyncId" in have else "-1"}), columns=cols)

    def kernel_shapes(self, between: tuple[int, int], min_ns: int = 0) -> pd.DataFrame:
        """Each kernel's launch shape in [t0, t1] ns: start, correlationId, grid and block (the
        products of their x, y, z); only kernels of ``min_ns`` or longer where given; empty where
        the export has no launch dimensions."""
        cols = ["start", "correlationId", "grid", "block"]
        t = self.kernel_table
        have = columns_of(self.conn, t) if t else set()
        if not t or not {"gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"} <= set(have):
            return pd.DataFrame({c: pd.Series(dtype="int64") for c in cols})
        return pd.DataFrame(self.int_columns(t, {
            "start": "a.start", "correlationId": "coalesce(a.correlationId, -1)",
            "grid": "coalesce(a.gridX, 1) * coalesce(a.gridY, 1) * coalesce(a.gridZ, 1)",
            "block": "coalesce(a.blockX, 1) * coalesce(a.blockY, 1) * coalesce(a.blockZ, 1)"},
            where=f"a.start BETWEEN {int(between[0])} AND {int(between[1])}"
                  + (f" AND a.end - a.start >= {int(min_ns)}" if min_ns > 0 else ""),
            rowids=self._kernel_rowids(between)))[cols]

    def _kernel_rowids(self, between: tuple[int, int]) -> Optional[tuple[int, int]]:
        """The rowids, first and last, of the kernels that start in ``between``, from the start
        times activities() read (``kernel_starts``), when the table's rowids run without a gap
        (as exports write them): a stretch of a long trace is then read without scanning the
        whole table for it. None (scan) otherwise."""
        starts = self.kernel_starts
        if starts is None or not len(starts):
            return None
        t = self.kernel_table
        lo = self.conn.execute(f'SELECT min(rowid) FROM "{t}"').fetchone()[0]
        hi = self.conn.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0]
        if lo is None or hi - lo + 1 != len(starts):
            return None
        pos = np.flatnonzero((starts >= int(between[0])) & (starts <= int(between[1])))
        return (lo + int(pos[0]), lo + int(pos[-1])) if len(pos) else None

    def api_calls(self, name_ids: Optional[list[int]] = None,
                  between: Optional[tuple[int, int]] = None) -> pd.DataFrame:
        """CUDA runtime/driver API calls: start, end, globalTid, correlationId, name.

        ``name_ids``: only calls with these names (StringIds ids, see Trace._name_ids), so a trace
        with millions of launch calls is not read whole to find its few synchronize calls.
        ``between``: only calls that start in [t0, t1] ns (one window of a long trace).
        Names are as the export stores them, versioned (``cudaStreamSynchronize_v3020``): match
        them by prefix.
        """
        cols = ["start", "end", "globalTid", "correlationId", "name"]
        empty = pd.DataFrame({c: pd.Series(dtype="int64" if c != "name" else "object") for c in cols})
        if not self.runtime_table or "nameId" not in columns_of(self.conn, self.runtime_table):
            return empty
        where = ""
        if name_ids is not None:
            if not name_ids:
                return empty
            where = f"a.nameId IN ({','.join(str(int(i)) for i in name_ids)})"
        if between is not None:
            where = " AND ".join(w for w in (where, f"a.start BETWEEN {int(between[0])} AND "
                                                    f"{int(between[1])}") if w)
        if self.runtime is not None:  # read already: select instead of scanning the table again
            rc = self.runtime
            pos = rc.select(name_ids, between)
            df = pd.DataFrame({"start": rc.start[pos], "end": rc.end[pos], "globalTid": rc.globalTid[pos],
                               "correlationId": rc.correlationId[pos], "nameId": rc.nameId[pos]}, copy=False)
        else:
            df = pd.DataFrame(self.int_columns(self.runtime_table, {
                "start": "a.start", "end": 'a."end"', "globalTid": "coalesce(a.globalTid, 0)",
                "correlationId": "coalesce(a.correlationId, -1)", "nameId": "coalesce(a.nameId, -1)"},
                where=where))
        self.check_timestamps(self.runtime_table, df)
        df["name"] = _lookup(df["nameId"], self.strings(), len(df))
        # Millions of calls, a few hundred names: a categorical keeps memory and matching cheap.
        df["name"] = df["name"].fillna("<unnamed call>").astype("category")
        return df[cols].sort_values(["start", "end"], kind="stable").reset_index(drop=True)

    def api_span(self, pid: Optional[int] = None) -> Optional[tuple[int, int]]:
        """First start and last end of the API calls (of one process: globalTid >> 24)."""
        if not self.runtime_table:
            return None
        if self.runtime is not None:
            return self.runtime.span(pid)
        cond, args = ("WHERE globalTid >> 24 = ?", (pid,)) if pid is not None else ("", ())
        row = self.conn.execute(f'SELECT min(start), max("end") FROM "{self.runtime_table}" {cond}',
                                args).fetchone()
        return None if row is None or row[0] is None else (int(row[0]), int(row[1]))

    # -- NVTX -----------------------------------------------------------------------------------
    def nvtx_ranges(self) -> pd.DataFrame:
        """Push/pop and start/end ranges: start, end, globalTid, name, domain, style.

        A range that never closed (the program exited, or crashed, inside it) ends at the end of
        the capture, the latest GPU, API or NVTX timestamp (see :meth:`capture_end`); their number
        is left in ``self.unclosed_ranges``. Start/end ranges closed on another thread
        (endGlobalTid set) are left out, since their launches cannot be tied to one thread.
        """
        empty = pd.DataFrame({"start": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64"),
                              "globalTid": pd.Series(dtype="int64"), "name": pd.Series(dtype="object"),
                              "domain": pd.Series(dtype="object"), "style": pd.Series(dtype="object")})
        if not self.nvtx_table:
            return empty
        t = self.nvtx_table
        cols = columns_of(self.conn, t)
        types = ",".join(str(x) for x in NVTX_RANGE_TYPES)
        end_tid = "a.endGlobalTid IS NULL" if "endGlobalTid" in cols else "1"
        where = f"a.eventType IN ({types}) AND {end_tid}"
        # Columns read only where needed (10^5 ranges and more): the row ids where some range's
        # name is text rather than a string id, the domain ids where a domain was created.
        has_text = "text" in cols and self.conn.execute(
            f'SELECT 1 FROM "{t}" AS a WHERE {where} AND a.text IS NOT NULL LIMIT 1').fetchone() is not None
        domains = self._domain_names()
        exprs = {"rowid": "a.rowid", "start": "a.start", "end": 'coalesce(a."end", -1)',
                 "globalTid": "coalesce(a.globalTid, 0)",
                 "textId": "coalesce(a.textId, -1)" if "textId" in cols else "-1",
                 "domainId": "coalesce(a.domainId, 0)" if "domainId" in cols else "0",
                 "eventType": "a.eventType"}
        if not has_text:
            del exprs["rowid"]
        if not domains:
            del exprs["domainId"]
        df = pd.DataFrame(self.int_columns(t, exprs, where=where), copy=False)
        if df.empty:
            return empty
        # Text that is not a registered string is rare: fetch it for those rows only.
        text = pd.Series(None, index=df.index, dtype=object)
        if has_text:
            tx = self._query(f'SELECT rowid AS rowid, text FROM "{t}" AS a WHERE {where} AND a.text IS NOT NULL')
            if len(tx):
                text = df["rowid"].map(tx.set_index("rowid")["text"].map(visible)).astype(object)
        self.check_timestamps(t, df, cols=("start",))
        closed = df["end"].to_numpy() >= 0
        self.check_timestamps(t, df[closed])
        self.unclosed_ranges = int((~closed).sum())
        name = pd.Series(_lookup(df["textId"].where(df["textId"] >= 0, -1), self.strings(), len(df)),
                         index=df.index, dtype=object)
        df["name"] = name.fillna(text).fillna("<unnamed range>")
        if self.unclosed_ranges:
            df["end"] = df["end"].where(closed, max(self.capture_end(), int(df["start"].max())))
        df["end"] = df["end"].astype(np.int64)
        push_pop = df["eventType"].isin([NVTX_PUSHPOP, NVTXT_PUSHPOP]).to_numpy()
        df["style"] = text_column(np.array(["StartEnd", "PushPop"], dtype=object), push_pop.astype(np.int64))
        df["domain"] = (df["domainId"].map(domains).astype(object).fillna("") if domains else
                        pd.Series(np.full(len(df), "", dtype=object), index=df.index, dtype=object))
        named = df["domain"] != ""
        df.loc[named, "name"] = df.loc[named, "domain"] + ":" + df.loc[named, "name"]
        return df[["start", "end", "globalTid", "name", "domain", "style"]].reset_index(drop=True)

    def nvtx_marks(self, prefix: str) -> list[str]:
        """The texts of the NVTX marks (instant events) that start with ``prefix``, in time order."""
        if not self.nvtx_table:
            return []
        cols = columns_of(self.conn, self.nvtx_table)
        text = "a.text" if "text" in cols else "NULL"
        text_id = "a.textId" if "textId" in cols else "NULL"
        rows = self.conn.execute(f'SELECT {text}, {text_id} FROM "{self.nvtx_table}" AS a '
                                 "WHERE a.eventType = ? ORDER BY a.start", (NVTX_MARK,)).fetchall()
        strings = self.strings()
        texts = [visible(t) if t is not None else strings.get(tid, "") for t, tid in rows]
        return [t for t in texts if isinstance(t, str) and t.startswith(prefix)]

    def capture_end(self) -> int:
        """The latest timestamp of the capture: the end of GPU work, API calls and NVTX events."""
        ends = []
        for t in (self.kernel_table, self.memcpy_table, self.memset_table, self.runtime_table,
                  self.nvtx_table):
            if t:
                cols = columns_of(self.conn, t)
                parts = [f'max("{c}")' for c in ("start", "end") if c in cols]
                if parts:
                    row = self.conn.execute(
                        f'SELECT {", ".join(parts)} FROM "{t}"').fetchone()
                    ends += [v for v in row if isinstance(v, int) and 0 <= v <= MAX_TIMESTAMP]
        return max(ends, default=0)

    def _domain_names(self) -> dict[int, str]:
        if not self.nvtx_table:
            return {}
        cols = columns_of(self.conn, self.nvtx_table)
        if "domainId" not in cols:
            return {}
        text = "text" if "text" in cols else "NULL"
        text_id = "textId" if "textId" in cols else "NULL"
        rows = self.conn.execute(
            f'SELECT domainId, {text}, {text_id} FROM "{self.nvtx_table}" WHERE eventType = ?',
            (NVTX_DOMAIN_CREATE,)).fetchall()
        strings = self.strings()
        return {d: (visible(t) if t is not None else strings.get(tid, "")) for d, t, tid in rows
                if isinstance(d, int)}

"""Read an Nsight Systems SQLite export into typed frames. Read-only, schema-drift tolerant.

The file is opened with SQLite's ``mode=ro&immutable=1``: nothing is written, locked, or left
beside the user's trace. Every table is optional except the string table and at least one kind
of GPU activity; versioned names (``CUPTI_ACTIVITY_KIND_KERNEL_V2``) are resolved to the newest.
"""
from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import quote

import numpy as np
import pandas as pd

from profkit.errors import NoGpuActivityError, TraceError
from profkit.peaks import GpuInfo

SQLITE_MAGIC = b"SQLite format 3\x00"

# NVTX event types (ENUM_NSYS_EVENT_TYPE), stable across versions.
NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND, NVTX_DOMAIN_CREATE = 59, 60, 70, 71, 75
NVTX_RANGE_TYPES = (NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND)

_MEMCPY_LABELS = {0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array",
                  4: "Array-to-Host", 5: "Array-to-Array", 6: "Array-to-Device",
                  7: "Device-to-Array", 8: "Device-to-Device", 9: "Host-to-Host",
                  10: "Peer-to-Peer", 11: "Unified Host-to-Device",
                  12: "Unified Device-to-Host", 13: "Unified Device-to-Device"}

ACTIVITY_COLUMNS = ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "kind",
                    "name", "short_name", "bytes", "graphNodeId", "globalTid", "api_start",
                    "api_end"]


@dataclass
class ExportInfo:
    path: str
    nsys_version: Optional[str] = None
    schema_version: Optional[str] = None
    session_start_utc: Optional[str] = None
    tables: list[str] = field(default_factory=list)


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Open ``path`` read-only, with checks that give one clear message for each bad input."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file; pass the .sqlite that `nsys export --type sqlite` wrote")
    if not p.is_file():
        raise TraceError(f"{p}: not a file; pass an .sqlite trace exported by Nsight Systems")
    if p.stat().st_size == 0:
        raise TraceError(f"{p}: empty file (0 bytes); export the trace again with `nsys export --type sqlite`")
    try:
        with p.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if head != SQLITE_MAGIC:
        hint = (" (it looks like an .nsys-rep: run `nsys export --type sqlite` on it first)"
                if p.suffix in (".nsys-rep", ".qdrep", ".qdstrm") else
                "; export one with `nsys export --type sqlite report.nsys-rep`")
        raise TraceError(f"{p}: not an SQLite file{hint}")
    uri = f"file:{quote(str(p.resolve()))}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{p}: damaged or truncated SQLite file ({exc}); export the trace again") from None
    return conn


def list_tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def resolve_table(tables: list[str], base: str) -> Optional[str]:
    """``base`` itself, or its newest versioned form (``base_V3`` over ``base_V2``)."""
    best, best_v = (base, 0) if base in tables else (None, -1)
    pat = re.compile(re.escape(base) + r"_V(\d+)$")
    for t in tables:
        m = pat.match(t)
        if m and int(m.group(1)) > best_v:
            best, best_v = t, int(m.group(1))
    return best


def columns_of(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}


class TraceReader:
    """Typed access to one export. All methods are read-only queries."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.conn = open_readonly(path)
        try:
            self.tables = list_tables(self.conn)
        except sqlite3.DatabaseError as exc:
            raise TraceError(f"{path}: damaged SQLite file ({exc}); export the trace again") from None
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

    def close(self) -> None:
        self.conn.close()

    def _query(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        try:
            return pd.read_sql_query(sql, self.conn, params=params)
        except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
            raise TraceError(f"{self.path}: damaged or unreadable export ({exc}); export the trace again") from None

    # -- metadata -----------------------------------------------------------------------------
    def export_info(self) -> ExportInfo:
        info = ExportInfo(path=self.path, tables=list(self.tables))
        if "META_DATA_EXPORT" in self.tables:
            meta = dict(self.conn.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())
            info.nsys_version = meta.get("EXPORT_PRODUCT_VERSION")
            info.schema_version = meta.get("EXPORT_SCHEMA_VERSION")
        if "TARGET_INFO_SESSION_START_TIME" in self.tables:
            row = self.conn.execute("SELECT utcTime FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            info.session_start_utc = row[0] if row else None
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
            cc = (f"{rec['computeMajor']}.{rec['computeMinor']}"
                  if rec["computeMajor"] is not None else None)
            dev = int(rec["id"]) if rec["id"] is not None else len(out)
            out[dev] = GpuInfo(name=rec["name"] or "unknown GPU", sm_count=rec["smCount"],
                               clock_hz=rec["clockRate"], memory_bandwidth=rec["memoryBandwidth"],
                               compute_capability=cc, l2_bytes=rec["l2CacheSize"],
                               total_memory=rec["totalMemory"])
        return out

    def strings(self) -> dict[int, str]:
        if self._strings is None:
            if "StringIds" in self.tables:
                cur = self.conn.execute("SELECT id, value FROM StringIds")
                self._strings = dict(cur.fetchall())
            else:
                self._strings = {}
        return self._strings

    # -- GPU activity ---------------------------------------------------------------------------
    def _name_expr(self, table: str, candidates: list[str]) -> tuple[str, bool]:
        """The first name column present; whether it holds StringIds ids (vs text)."""
        cols = columns_of(self.conn, table)
        for c in candidates:
            if c in cols:
                typ = self.conn.execute(f'SELECT typeof("{c}") FROM "{table}" WHERE "{c}" IS NOT NULL LIMIT 1').fetchone()
                return c, (typ is None or typ[0] == "integer")
        return "NULL", False

    def _runtime_join(self, alias: str) -> tuple[str, str]:
        """SELECT columns and JOIN clause linking GPU work to its launch call (correlationId + process)."""
        if not self.runtime_table:
            return "NULL AS globalTid, NULL AS api_start, NULL AS api_end", ""
        cols = ("r.globalTid AS globalTid, r.start AS api_start, r.end AS api_end")
        # Same process: globalTid and globalPid share the bits above the 24-bit thread id.
        join = (f' LEFT JOIN "{self.runtime_table}" AS r ON r.correlationId = {alias}.correlationId'
                f" AND (r.globalTid >> 24) = ({alias}.globalPid >> 24)")
        return cols, join

    def activities(self) -> pd.DataFrame:
        """Kernels, memcpys and memsets, one row each, with the launch call they came from.

        Columns: ACTIVITY_COLUMNS. ``kind`` is kernel | memcpy | memset; ``bytes`` is set for
        memcpy/memset; ``name`` is the demangled kernel name (as ``nsys stats`` shows it) or
        ``[CUDA memcpy Host-to-Device]``-style names for copies.
        """
        frames = []
        rt_cols, rt_join = self._runtime_join("a")
        if self.kernel_table:
            t = self.kernel_table
            kcols = columns_of(self.conn, t)
            full, full_is_id = self._name_expr(t, ["demangledName", "mangledName", "shortName", "name"])
            short, short_is_id = self._name_expr(t, ["shortName", "demangledName", "name"])
            gnode = "a.graphNodeId" if "graphNodeId" in kcols else "NULL"
            df = self._query(
                f'SELECT a.start, a.end, a.deviceId, a.streamId, a.correlationId, a.globalPid, '
                f'a."{full}" AS name_ref, a."{short}" AS short_ref, NULL AS bytes, '
                f'{gnode} AS graphNodeId, {rt_cols} FROM "{t}" AS a{rt_join}')
            strings = self.strings()
            df["name"] = df["name_ref"].map(strings) if full_is_id else df["name_ref"]
            df["short_name"] = df["short_ref"].map(strings) if short_is_id else df["short_ref"]
            df["name"] = df["name"].fillna(df["short_name"]).fillna("<unnamed kernel>")
            df["short_name"] = df["short_name"].fillna(df["name"])
            df["kind"] = "kernel"
            frames.append(df.drop(columns=["name_ref", "short_ref"]))
        if self.memcpy_table:
            t = self.memcpy_table
            ccols = columns_of(self.conn, t)
            labels = dict(_MEMCPY_LABELS)
            if "ENUM_CUDA_MEMCPY_OPER" in self.tables:
                labels.update(dict(self.conn.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER")))
            kind_col = "a.copyKind" if "copyKind" in ccols else "0"
            gnode = "a.graphNodeId" if "graphNodeId" in ccols else "NULL"
            df = self._query(
                f'SELECT a.start, a.end, a.deviceId, a.streamId, a.correlationId, a.globalPid, '
                f'{kind_col} AS copyKind, a.bytes AS bytes, {gnode} AS graphNodeId, {rt_cols} '
                f'FROM "{t}" AS a{rt_join}')
            df["name"] = "[CUDA memcpy " + df["copyKind"].map(labels).fillna("Unknown") + "]"
            df["short_name"] = df["name"]
            df["kind"] = "memcpy"
            frames.append(df.drop(columns=["copyKind"]))
        if self.memset_table:
            t = self.memset_table
            gnode = "a.graphNodeId" if "graphNodeId" in columns_of(self.conn, t) else "NULL"
            df = self._query(
                f'SELECT a.start, a.end, a.deviceId, a.streamId, a.correlationId, a.globalPid, '
                f'a.bytes AS bytes, {gnode} AS graphNodeId, {rt_cols} FROM "{t}" AS a{rt_join}')
            df["name"] = "[CUDA memset]"
            df["short_name"] = df["name"]
            df["kind"] = "memset"
            frames.append(df)
        frames = [f for f in frames if len(f)]
        if not frames:
            raise NoGpuActivityError(
                f"{self.path}: no GPU activity (no kernel, memcpy or memset rows); profile with "
                "`nsys profile -t cuda,nvtx` (or `profkit capture`) and make sure the script runs GPU work")
        acts = pd.concat(frames, ignore_index=True)[ACTIVITY_COLUMNS]
        for c in ("start", "end"):
            acts[c] = acts[c].astype(np.int64)
        acts["kind"] = acts["kind"].astype("category")
        acts = acts.sort_values(["start", "end"], kind="stable").reset_index(drop=True)
        return acts

    # -- NVTX -----------------------------------------------------------------------------------
    def nvtx_ranges(self) -> pd.DataFrame:
        """Push/pop and start/end ranges: start, end, globalTid, name, domain, style.

        Follows nsys's projection: a range that never closed ends at the last NVTX timestamp;
        start/end ranges closed on another thread (endGlobalTid set) are left out, since their
        launches cannot be tied to one thread.
        """
        empty = pd.DataFrame({"start": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64"),
                              "globalTid": pd.Series(dtype="int64"), "name": pd.Series(dtype="object"),
                              "domain": pd.Series(dtype="object"), "style": pd.Series(dtype="object")})
        if not self.nvtx_table:
            return empty
        t = self.nvtx_table
        cols = columns_of(self.conn, t)
        text = "n.text" if "text" in cols else "NULL"
        text_id = "n.textId" if "textId" in cols else "NULL"
        domain = "n.domainId" if "domainId" in cols else "0"
        end_tid = "n.endGlobalTid IS NULL" if "endGlobalTid" in cols else "1"
        types = ",".join(str(x) for x in NVTX_RANGE_TYPES)
        df = self._query(
            f"SELECT n.start, n.end, n.globalTid, {text} AS text, {text_id} AS textId, "
            f"{domain} AS domainId, n.eventType FROM \"{t}\" AS n "
            f"WHERE n.eventType IN ({types}) AND {end_tid}")
        if df.empty:
            return empty
        last = self.conn.execute(
            f'SELECT max(max(start), coalesce(max("end"), 0)) FROM "{t}" '
            f"WHERE eventType IN ({types})").fetchone()[0]
        strings = self.strings()
        name = df["textId"].map(strings).astype(object) if df["textId"].notna().any() else \
            pd.Series(None, index=df.index, dtype=object)
        df["name"] = name.fillna(df["text"].astype(object)).fillna("<unnamed range>")
        df["end"] = df["end"].fillna(last).astype(np.int64)
        df["globalTid"] = df["globalTid"].fillna(0).astype(np.int64)
        df["style"] = np.where(df["eventType"].isin([NVTX_PUSHPOP, NVTXT_PUSHPOP]), "PushPop", "StartEnd")
        domains = self._domain_names()
        df["domain"] = df["domainId"].fillna(0).astype(np.int64).map(domains).astype(object).fillna("")
        named = df["domain"] != ""
        df.loc[named, "name"] = df.loc[named, "domain"] + ":" + df.loc[named, "name"]
        return df[["start", "end", "globalTid", "name", "domain", "style"]].reset_index(drop=True)

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
        return {int(d): (t if t is not None else strings.get(tid, "")) for d, t, tid in rows
                if d is not None}

"""Damaged copies of a real trace, for the fuzz test and ``scripts/tools/fuzz.py``.

Each mutation takes the bytes of a good export and returns the bytes of a damaged one, either at
the byte level (flipped bits, zeroed or random runs, truncation) or at the SQL level (a NULL in a
NOT NULL column, text or a blob in an integer column, invalid UTF-8, impossible timestamps,
dropped tables, escape sequences in names). Deterministic for a given ``random.Random``.
"""
from __future__ import annotations

import os
import random
import sqlite3
import tempfile
from pathlib import Path
from typing import Callable

# Tables and the columns worth damaging (what the reader uses).
TARGETS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId",
                                   "globalPid", "demangledName", "shortName", "graphNodeId"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "bytes", "copyKind", "deviceId"],
    "CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "bytes"],
    "NVTX_EVENTS": ["start", "end", "eventType", "text", "textId", "globalTid", "domainId",
                    "endGlobalTid"],
    "StringIds": ["id", "value"],
    "TARGET_INFO_GPU": ["id", "name", "smCount", "clockRate", "memoryBandwidth", "computeMajor",
                        "computeMinor", "l2CacheSize", "totalMemory"],
    "META_DATA_EXPORT": ["name", "value"],
    "ENUM_CUDA_MEMCPY_OPER": ["id", "label"],
    "PROFKIT_NCU_METRICS": ["kernel_start", "deviceId", "globalPid", "flops_fp32",
                            "dram_bytes_read", "gpu_time_ns", "kernel_name"],
}

ODD_VALUES: list[object] = [
    None, "abc", "12abc", "", 1.5, -0.0, 3.0, float("inf"), b"\xff\xfe\x00bin", -1, -(2 ** 63),
    2 ** 63 - 1, 10 ** 18 + 7, 0, "\x1b[31mred\x1b[0m", "<script>alert(1)</script>",
    "caf\xe9", "line\nbreak", "\u202eevil",
]


def _flip_bits(data: bytearray, rng: random.Random) -> None:
    for _ in range(rng.randint(1, 24)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)


def _zero_run(data: bytearray, rng: random.Random) -> None:
    i = rng.randrange(len(data))
    n = rng.randint(1, 4096)
    data[i:i + n] = bytes(min(n, len(data) - i))


def _random_run(data: bytearray, rng: random.Random) -> None:
    i = rng.randrange(len(data))
    n = rng.randint(1, 512)
    data[i:i + n] = bytes(rng.randrange(256) for _ in range(min(n, len(data) - i)))


def _invalid_utf8(data: bytearray, rng: random.Random) -> None:
    # Bytes that are never valid UTF-8, sprinkled where text (names, the schema) tends to be.
    for _ in range(rng.randint(1, 16)):
        i = rng.randrange(len(data))
        data[i] = rng.choice([0xFF, 0xFE, 0xC0, 0x80])


def _truncate(data: bytearray, rng: random.Random) -> None:
    del data[rng.randrange(len(data)):]


BYTE_MUTATIONS: list[Callable[[bytearray, random.Random], None]] = [
    _flip_bits, _zero_run, _random_run, _invalid_utf8, _truncate]


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _sql_mutation(conn: sqlite3.Connection, rng: random.Random) -> str:
    tables = [t for t in TARGETS if t in {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}]
    table = rng.choice(tables)
    cols = [c for c in TARGETS[table] if c in _columns(conn, table)]
    kind = rng.choice(["value", "value", "value", "all", "drop_table", "drop_column", "empty",
                       "swap", "unclosed"])
    if kind == "drop_table":
        conn.execute(f'DROP TABLE "{table}"')
        return f"drop {table}"
    if kind == "empty":
        conn.execute(f'DELETE FROM "{table}"')
        return f"empty {table}"
    if not cols:
        return "nothing"
    col = rng.choice(cols)
    if kind == "drop_column":
        try:
            conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
        except sqlite3.OperationalError:  # a primary key or indexed column
            return "nothing"
        return f"drop {table}.{col}"
    if kind == "swap" and {"start", "end"} <= set(cols):
        conn.execute(f'UPDATE "{table}" SET start = "end", "end" = start '
                     f"WHERE rowid IN (SELECT rowid FROM \"{table}\" ORDER BY random() LIMIT 3)")
        return f"swap start/end in {table}"
    if kind == "unclosed" and table == "NVTX_EVENTS":
        conn.execute('UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid IN '
                     "(SELECT rowid FROM NVTX_EVENTS ORDER BY random() LIMIT 2)")
        return "unclosed NVTX ranges"
    value = rng.choice(ODD_VALUES)
    if isinstance(value, str) and rng.random() < 0.3:
        value = value.encode("latin-1", "replace")  # invalid UTF-8 as a blob
    where = "" if kind == "all" else (
        f'WHERE rowid IN (SELECT rowid FROM "{table}" ORDER BY random() LIMIT {rng.randint(1, 3)})')
    try:
        conn.execute(f'UPDATE "{table}" SET "{col}" = ? {where}', (value,))
    except sqlite3.Error:  # a primary key clash or a constraint
        return "nothing"
    return f"{table}.{col} = {value!r} ({kind})"


def mutate(good: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A damaged copy of the export ``good`` and a one-line description of the damage."""
    if rng.random() < 0.45:
        data = bytearray(good)
        fn = rng.choice(BYTE_MUTATIONS)
        # Byte damage past the header, mostly: a damaged magic is already handled upfront.
        fn(data, rng)
        return bytes(data), f"bytes: {fn.__name__.lstrip('_')}"
    fd, name = tempfile.mkstemp(suffix=".sqlite")
    os.close(fd)
    path = Path(name)
    try:
        path.write_bytes(good)
        conn = sqlite3.connect(path)
        # Damage that nsys's NOT NULL constraints would refuse is what a broken writer leaves:
        # drop the constraints from the schema text (the stored rows do not change).
        conn.execute("PRAGMA writable_schema = ON")
        with conn:
            conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'NOT NULL', '') "
                         "WHERE type = 'table'")
        conn.close()
        conn = sqlite3.connect(path)
        # Random rows through sqlite's own random(): seed it from our generator.
        conn.create_function("random", 0, lambda: rng.randrange(-2 ** 62, 2 ** 62))
        done = []
        try:
            for _ in range(rng.randint(1, 3)):
                try:
                    with conn:
                        done.append(_sql_mutation(conn, rng))
                except sqlite3.Error as exc:  # a constraint the mutation ran into
                    done.append(f"refused ({exc})")
        finally:
            conn.close()
        return path.read_bytes(), "sql: " + "; ".join(done)
    finally:
        path.unlink()

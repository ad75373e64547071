"""Pull columns out of decoded event Structs, chunk by chunk, into an Accumulator.

Every column is extracted with `map(attrgetter(field), structs)` fed to `np.fromiter` (C loops);
the rare value of an unexpected type (a string stream id, a null) drops to a Python fallback for
that column of that chunk only. Kind-specific columns (kernel launch config, cpu_op shapes,
python ids, NCCL fields) are extracted only over the rows of the kinds that carry them. Rows that
fail validation (no numeric ts/dur, negative or absurd numbers, no name) are skipped and counted.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from profiler.trace._structs import COUNTERS_DECODER, MISSING
from profiler.trace.schema import KIND_ALIASES, KINDS

KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
FLOW_S, FLOW_F, INSTANT, COUNTER, META = 100, 101, 102, 103, 104
FLOW_CATS = ("ac2g", "async_cpu_to_gpu", "async")
PAIR_CODE: dict[tuple[str, str], int] = {("X", k): i for k, i in KIND_INDEX.items()}
PAIR_CODE.update({("X", alias): KIND_INDEX[k] for alias, k in KIND_ALIASES.items()})
PAIR_CODE.update({(ph, cat): code for cat in FLOW_CATS for ph, code in (("s", FLOW_S), ("f", FLOW_F))})
PH_CODE = {"i": INSTANT, "I": INSTANT, "C": COUNTER, "M": META}
ABSURD_US = 2.0**63 / 1e3  # beyond int64 nanoseconds: no real clock reads this

R_TS = "complete event without a finite numeric ts"
R_DUR = "complete event without a finite numeric dur"
R_NEG = "negative dur"
R_ABSURD = "absurd ts or dur (beyond int64 nanoseconds)"
R_NAME = "complete event without a string name"
R_FLOW = "flow event without an integer id or a finite ts"
VALIDATION_REASONS = frozenset({R_TS, R_DUR, R_NEG, R_ABSURD, R_NAME, R_FLOW})

_K = KIND_INDEX
NCCL_KINDS = (_K["kernel"], _K["cpu_op"], _K["user_annotation"])
OP_KINDS = (_K["cpu_op"], _K["user_annotation"])
# (column, Args attribute, kinds that carry it or None for every row)
INT_ARGS = (
    ("correlation", "correlation", None), ("device", "device", None), ("stream", "stream", None),
    ("bytes", "bytes", None),
    ("registers_per_thread", "registers_per_thread", (_K["kernel"],)),
    ("shared_memory_bytes", "shared_memory", (_K["kernel"],)),
    ("in_msg_nelems", "in_msg_nelems", NCCL_KINDS), ("out_msg_nelems", "out_msg_nelems", NCCL_KINDS),
    ("group_size", "group_size", NCCL_KINDS),
    ("sequence_number", "sequence_number", OP_KINDS), ("fwd_thread_id", "fwd_thread_id", OP_KINDS),
    ("python_id", "python_id", (_K["python_function"],)),
    ("python_parent_id", "python_parent_id", (_K["python_function"],)),
)
FLOAT_ARGS = (
    ("memory_bw_gb_s", "memory_bw", None),
    ("blocks_per_sm", "blocks_per_sm", (_K["kernel"],)), ("warps_per_sm", "warps_per_sm", (_K["kernel"],)),
    ("occupancy_pct", "occupancy_pct", (_K["kernel"],)),
)
STR_ARGS = (
    ("collective_name", "collective_name", NCCL_KINDS), ("comm_dtype", "dtype", NCCL_KINDS),
    ("process_group_name", "pg_name", NCCL_KINDS), ("process_group_desc", "pg_desc", NCCL_KINDS),
)
JSON_ARGS = (("input_dims", "input_dims", OP_KINDS), ("input_types", "input_types", OP_KINDS))
DIM3_ARGS = (("grid", "grid"), ("block", "block"))
MEMORY_ARGS = (("device_type", "device_type"), ("device_id", "device_id"), ("bytes", "mem_bytes"),
               ("total_allocated", "total_allocated"), ("total_reserved", "total_reserved"),
               ("addr", "addr"))

_PH, _CAT, _NAME, _TS, _DUR = (attrgetter(a) for a in ("ph", "cat", "name", "ts", "dur"))
_PID, _TID, _ID, _ARGS = (attrgetter(a) for a in ("pid", "tid", "id", "args"))
_DIGITS = re.compile(r"-?\d+")


@dataclass
class Accumulator:
    """Per-chunk column pieces of one file, concatenated once at the end."""

    rows: dict[str, list] = field(default_factory=dict)
    flows: dict[str, list] = field(default_factory=dict)
    memory: dict[str, list] = field(default_factory=dict)
    counters: list[tuple] = field(default_factory=list)
    process_names: dict[str, str] = field(default_factory=dict)
    thread_names: dict[str, str] = field(default_factory=dict)
    json_cache: dict[bytes, str] = field(default_factory=dict)
    id_cache: dict[str, int] = field(default_factory=dict)
    n_rows: int = 0

    def add(self, table: dict[str, list], col: str, piece: Any) -> None:
        table.setdefault(col, []).append(piece)


def undecodable(skipped: Counter) -> int:
    """Skipped events that never decoded (as opposed to decoded rows failing validation)."""
    return sum(v for k, v in skipped.items() if k not in VALIDATION_REASONS)


def ints(objs: list, get: Any) -> np.ndarray:
    """int64 column; absent or non-integer values become MISSING (numeric strings parse)."""
    try:
        return np.fromiter(map(get, objs), np.int64, len(objs))
    except (TypeError, ValueError, OverflowError):
        return np.fromiter((v if type(v) is int else MISSING for v in map(get, objs)), np.int64, len(objs))


def floats(objs: list, get: Any) -> np.ndarray:
    try:
        return np.fromiter(map(get, objs), np.float64, len(objs))
    except (TypeError, ValueError):
        return np.fromiter((v if type(v) in (int, float) else np.nan for v in map(get, objs)),
                           np.float64, len(objs))


def ids(objs: list, get: Any, cache: dict[str, int]) -> np.ndarray:
    """pid/tid: ints, or strings like "stream 7" / "5555" -> 7 / 5555; other strings -> MISSING."""
    try:
        return np.fromiter(map(get, objs), np.int64, len(objs))
    except (TypeError, ValueError, OverflowError):
        pass

    def conv(v: Any) -> int:
        if type(v) is int:
            return v
        if isinstance(v, str):
            got = cache.get(v)
            if got is None:
                m = _DIGITS.search(v)
                got = int(m.group()) if m and -(2**63) < int(m.group()) < 2**63 else MISSING
                cache[v] = got
            return got
        return MISSING

    return np.fromiter(map(conv, map(get, objs)), np.int64, len(objs))


def compact_json(raws: list, cache: dict[bytes, str]) -> list:
    """msgspec.Raw values -> compact JSON text (cached: shapes repeat a lot), empty -> None."""
    out = []
    for raw in raws:
        data = bytes(raw)
        if not data:
            out.append(None)
            continue
        text = cache.get(data)
        if text is None:
            try:
                text = msgspec.json.encode(msgspec.json.decode(data)).decode()
            except msgspec.DecodeError:
                text = None
            cache[data] = text
        out.append(text)
    return out


def _subset(kinds: np.ndarray, codes: tuple[int, ...] | None) -> np.ndarray | None:
    if codes is None:
        return None
    return np.flatnonzero(np.isin(kinds, codes))


def _rows(evs: list, idx: np.ndarray, kinds: np.ndarray, acc: Accumulator, skipped: Counter) -> None:
    rows = [evs[i] for i in idx.tolist()]
    ts, dur = floats(rows, _TS), floats(rows, _DUR)
    names = list(map(_NAME, rows))
    ok = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (np.abs(ts) < ABSURD_US) & (dur < ABSURD_US)
    name_ok = set(map(type, names)) == {str}
    if not name_ok:
        ok &= np.fromiter((type(x) is str for x in names), bool, len(names))
    if not ok.all():
        for reason, bad in ((R_TS, ~np.isfinite(ts)), (R_DUR, np.isfinite(ts) & ~np.isfinite(dur))):
            skipped[reason] += int(bad.sum())
        fin = np.isfinite(ts) & np.isfinite(dur)
        skipped[R_NEG] += int((fin & (dur < 0)).sum())
        skipped[R_ABSURD] += int((fin & (dur >= 0) & ((np.abs(ts) >= ABSURD_US) | (dur >= ABSURD_US))).sum())
        if not name_ok:
            skipped[R_NAME] += int((fin & (dur >= 0) & (np.abs(ts) < ABSURD_US) & (dur < ABSURD_US)
                                    & ~np.fromiter((type(x) is str for x in names), bool, len(names))).sum())
        keep = np.flatnonzero(ok)
        rows = [rows[i] for i in keep.tolist()]
        names = [names[i] for i in keep.tolist()]
        ts, dur, kinds = ts[keep], dur[keep], kinds[keep]
    n = len(rows)
    if n == 0:
        return
    acc.n_rows += n
    R = acc.rows
    acc.add(R, "kind", kinds.astype(np.int8))
    acc.add(R, "name", pd.Categorical(names))
    acc.add(R, "ts", ts)
    acc.add(R, "dur", dur)
    acc.add(R, "pid", ids(rows, _PID, acc.id_cache))
    acc.add(R, "tid", ids(rows, _TID, acc.id_cache))
    args = list(map(_ARGS, rows))
    ext = ints(args, attrgetter("external_id"))
    if (ext == MISSING).any():
        ext = np.where(ext == MISSING, ints(args, attrgetter("external_id_2021")), ext)
    acc.add(R, "external_id", ext)
    subsets: dict[Any, tuple[np.ndarray, list]] = {}

    def sub(codes: tuple[int, ...] | None) -> tuple[np.ndarray | None, list]:
        if codes is None:
            return None, args
        if codes not in subsets:
            where = _subset(kinds, codes)
            subsets[codes] = (where, [args[i] for i in where.tolist()])
        return subsets[codes]

    for col, attr, codes in INT_ARGS:
        where, objs = sub(codes)
        vals = ints(objs, attrgetter(attr))
        acc.add(R, col, vals if where is None else _scatter(n, where, vals, MISSING, np.int64))
    for col, attr, codes in FLOAT_ARGS:
        where, objs = sub(codes)
        vals = floats(objs, attrgetter(attr))
        acc.add(R, col, vals if where is None else _scatter(n, where, vals, np.nan, np.float64))
    for col, attr, codes in STR_ARGS + JSON_ARGS:
        where, objs = sub(codes)
        vals = list(map(attrgetter(attr), objs))
        if (col, attr, codes) in JSON_ARGS:
            vals = compact_json(vals, acc.json_cache)
        else:
            vals = [v if isinstance(v, str) else None for v in vals]
        full = np.full(n, None, dtype=object)
        full[where] = vals
        acc.add(R, col, full)
    where, objs = sub((_K["kernel"],))
    for col, attr in DIM3_ARGS:
        full = np.full((n, 3), MISSING, np.int64)
        vals = list(map(attrgetter(attr), objs))
        good = [i for i, v in enumerate(vals) if type(v) is list and len(v) == 3]
        if good:
            full[where[good]] = [vals[i] for i in good]
        acc.add(R, col, full)


def _scatter(n: int, where: np.ndarray, vals: np.ndarray, fill: Any, dtype: Any) -> np.ndarray:
    out = np.full(n, fill, dtype)
    out[where] = vals
    return out


def _flows(evs: list, idx: np.ndarray, codes: np.ndarray, acc: Accumulator, skipped: Counter) -> None:
    objs = [evs[i] for i in idx.tolist()]
    ts, fid = floats(objs, _TS), ints(objs, _ID)
    ok = np.isfinite(ts) & (fid != MISSING)
    if not ok.all():
        skipped[R_FLOW] += int((~ok).sum())
    keep = np.flatnonzero(ok)
    F = acc.flows
    acc.add(F, "is_start", (codes[idx] == FLOW_S)[keep])
    acc.add(F, "id", fid[keep])
    acc.add(F, "ts", ts[keep])
    acc.add(F, "pid", ids(objs, _PID, acc.id_cache)[keep])
    acc.add(F, "tid", ids(objs, _TID, acc.id_cache)[keep])


def _memory(evs: list, idx: np.ndarray, acc: Accumulator) -> None:
    objs = [evs[i] for i in idx.tolist() if evs[i].name == "[memory]"]
    if not objs:
        return
    ts = floats(objs, _TS)
    keep = np.flatnonzero(np.isfinite(ts))
    objs = [objs[i] for i in keep.tolist()]
    args = list(map(_ARGS, objs))
    acc.add(acc.memory, "ts", ts[keep])
    for col, attr in MEMORY_ARGS:
        acc.add(acc.memory, col, ints(args, attrgetter(attr)))


def _counters(chunk: bytes, acc: Accumulator) -> None:
    try:
        events = COUNTERS_DECODER.decode(chunk)
    except msgspec.ValidationError:
        return  # counters are optional side data; a chunk with broken ones keeps its rows
    for ev in events:
        if ev.ph != "C" or not isinstance(ev.args, dict) or not isinstance(ev.name, str):
            continue
        if not (isinstance(ev.ts, (int, float)) and np.isfinite(ev.ts)):
            continue
        device = ev.pid if type(ev.pid) is int else MISSING
        numeric = {k: v for k, v in ev.args.items() if type(v) in (int, float)}
        for key, value in numeric.items():
            series = ev.name if len(numeric) == 1 else f"{ev.name}.{key}"
            acc.counters.append((float(ev.ts), device, series, float(value)))


def _metadata(evs: list, idx: np.ndarray, acc: Accumulator) -> None:
    for i in idx.tolist():
        ev = evs[i]
        label = ev.args.meta_name
        if not isinstance(label, str):
            continue
        if ev.name == "process_name":
            acc.process_names[str(ev.pid)] = label
        elif ev.name == "thread_name":
            acc.thread_names[f"{ev.pid}:{ev.tid}"] = label


def process_chunk(evs: list, chunk: bytes, acc: Accumulator, skipped: Counter) -> None:
    """Classify one chunk's events and append their columns to `acc`."""
    n = len(evs)
    if n == 0:
        return
    phs = list(map(_PH, evs))
    codes = np.fromiter(map(PAIR_CODE.get, zip(phs, map(_CAT, evs)), repeat(-1)), np.int16, n)
    other = codes < 0
    if other.any():
        codes = np.where(other, np.fromiter(map(PH_CODE.get, phs, repeat(-1)), np.int16, n), codes)
    is_row = (codes >= 0) & (codes < len(KINDS))
    idx = np.flatnonzero(is_row)
    if len(idx):
        _rows(evs, idx, codes[idx], acc, skipped)
    idx = np.flatnonzero((codes == FLOW_S) | (codes == FLOW_F))
    if len(idx):
        _flows(evs, idx, codes, acc, skipped)
    idx = np.flatnonzero(codes == INSTANT)
    if len(idx):
        _memory(evs, idx, acc)
    if (codes == COUNTER).any():
        _counters(chunk, acc)
    idx = np.flatnonzero(codes == META)
    if len(idx):
        _metadata(evs, idx, acc)

"""`load_trace`: one or more Kineto trace files -> one Trace (see DESIGN.md, "The Trace").

Pipeline: sources.iter_payloads (bytes per file, bounded decompression) -> decode.decode_payload
(columns per file) -> per-file links (flows, steps) -> ranks assigned, clocks aligned on the
earliest event of all ranks -> typed DataFrame with the columns of schema.COLUMNS.
Rows keep file order (not sorted by time); sort in the analysis that needs it.
"""
from __future__ import annotations

import gc
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from profiler.trace import links
from profiler.trace._columns import CODED_COLUMNS
from profiler.trace._structs import MISSING
from profiler.trace.decode import FileData, decode_payload
from profiler.trace.model import Trace, TraceError
from profiler.trace.schema import COLUMNS, COUNTER_COLUMNS, KINDS, MEMORY_COLUMNS, SCHEMA_VERSION
from profiler.trace.sources import iter_payloads

_K = {k: i for i, k in enumerate(KINDS)}
_NP_INT = {"Int64": np.int64, "Int32": np.int32, "Int16": np.int16, "int32": np.int32}


@dataclass
class FileFrame:
    """One file's columns (raw clock) with links resolved, before rank and t0 are known."""

    label: str
    cols: dict[str, Any]
    vocab: dict[str, list[str]]  # coded columns: code -> text
    memory: dict[str, np.ndarray]
    counters: list[tuple]
    meta: dict[str, Any]
    skipped: Counter
    unbound_flows: int

    @property
    def n(self) -> int:
        return len(self.cols["ts"])

    def min_ts(self) -> float:
        if self.n:  # the earliest kept event; memory samples only when there is no event
            return float(self.cols["ts"].min())
        mem = self.memory.get("ts", ())
        return float(mem.min()) if len(mem) else float("inf")


@contextmanager
def _no_gc() -> Iterator[None]:
    """Millions of small objects are made and dropped: the cyclic GC would only rescan them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _cat(pieces: list) -> Any:
    if not pieces:
        return np.empty(0)
    return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def _file_frame(fd: FileData) -> FileFrame:
    acc = fd.acc
    cols = {k: _cat(v) for k, v in acc.rows.items()}
    acc.rows.clear()
    if not cols:
        cols = {"ts": np.empty(0), "dur": np.empty(0), "kind": np.empty(0, np.int8),
                "name": np.empty(0, np.int32), "pid": np.empty(0, np.int64), "tid": np.empty(0, np.int64),
                "correlation": np.empty(0, np.int64)}
    for dim in ("grid", "block"):
        if dim in cols:
            arr = cols.pop(dim)  # (n, 3) -> three columns
            for j, axis in enumerate("xyz"):
                cols[f"{dim}_{axis}"] = arr[:, j]
    kind = cols["kind"]
    if "device" in cols:  # GPU rows without args.device/stream: Kineto's pid/tid are those
        gpu = np.isin(kind, links.DEVICE_SIDE)
        for col, src in (("device", "pid"), ("stream", "tid")):
            fill = gpu & (cols[col] == MISSING)
            cols[col] = np.where(fill, cols[src], cols[col])
    flows = {k: _cat(v) for k, v in acc.flows.items()}
    cols["flow_id"], unbound = links.bind_flows(kind, cols["pid"], cols["tid"], cols["ts"], flows)
    vocab = {col: list(v) for col, v in acc.vocab.items()}
    cols["step"] = links.assign_steps(kind, cols["name"], vocab.get("name", []), cols["ts"], cols["dur"],
                                      cols["correlation"])
    memory = {k: _cat(v) for k, v in acc.memory.items()}
    return FileFrame(fd.label, cols, vocab, memory, acc.counters, fd.meta, fd.skipped, unbound)


def _assign_ranks(frames: list[FileFrame], rank: Any) -> list[tuple[int, str]]:
    """(rank, how it was decided) per file; duplicates raise."""
    if rank is not None:
        given = [rank] if isinstance(rank, (int, np.integer)) else list(rank)
        if len(given) != len(frames) or not all(isinstance(r, (int, np.integer)) for r in given):
            raise TraceError(f"rank= gives {len(given)} rank(s) for {len(frames)} trace file(s)")
        explicit: list[int | None] = [int(r) for r in given]
        how = "given by the caller"
    else:
        explicit = []
        for f in frames:
            r = (f.meta.get("distributed_info") or {}).get("rank")
            explicit.append(int(r) if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else None)
        how = "distributedInfo.rank"
    owner: dict[int, str] = {}
    for f, r in zip(frames, explicit):
        if r is None:
            continue
        if r in owner:
            raise TraceError(f"{f.label} and {owner[r]} both claim rank {r}")
        owner[r] = f.label
    out, free = [], 0
    for pos, (f, r) in enumerate(zip(frames, explicit)):
        if r is not None:
            out.append((r, how))
            continue
        while free in owner:
            free += 1
        owner[free] = f.label
        out.append((free, f"default: no distributedInfo.rank; lowest free rank for file #{pos} in load order"))
    return out


def _masked(values: np.ndarray, dtype: str) -> Any:
    np_dtype = _NP_INT[dtype]
    info = np.iinfo(np_dtype)
    mask = (values == MISSING) | (values < info.min) | (values > info.max)
    data = np.where(mask, 0, values).astype(np_dtype)
    return pd.arrays.IntegerArray(data, mask) if dtype[0] == "I" else data


def _column(name: str, dtype: str, pieces: list, n: int) -> Any:
    values = (np.concatenate(pieces) if len(pieces) > 1 else pieces[0]) if pieces else None
    if dtype in _NP_INT:
        return _masked(values if values is not None else np.full(n, MISSING, np.int64), dtype)
    if dtype == "float64":
        return values if values is not None else np.full(n, np.nan)
    raise TypeError(f"unhandled dtype {dtype} for column {name}")


def _coded(col: str, dtype: str, frames: list[FileFrame]) -> Any:
    """Merge per-file dictionary codes into one Categorical (or Arrow-backed string) column."""
    texts: dict[str, int] = {}
    pieces = []
    for f in frames:
        codes = f.cols.get(col)
        vocab = f.vocab.get(col, [])
        if codes is None or not vocab:
            pieces.append(np.full(f.n, -1, np.int32))
            continue
        lut = np.fromiter((texts.setdefault(t, len(texts)) for t in vocab), np.int32, len(vocab))
        pieces.append(codes if np.array_equal(lut, np.arange(len(vocab))) else
                      np.where(codes >= 0, lut[codes], -1).astype(np.int32))
    codes = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    if dtype == "category":
        return pd.Categorical.from_codes(codes, categories=list(texts))
    dictionary = pa.array(list(texts), pa.string())
    arr = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), dictionary).dictionary_decode()
    return pd.arrays.ArrowStringArray(arr)


def _events_frame(frames: list[FileFrame], ranks: list[int], t0: float) -> pd.DataFrame:
    n = sum(f.n for f in frames)
    data: dict[str, Any] = {}
    for col, (dtype, _doc) in COLUMNS.items():
        if col == "rank":
            data[col] = np.concatenate([np.full(f.n, r, np.int32) for f, r in zip(frames, ranks)] or
                                       [np.empty(0, np.int32)])
        elif col == "kind":
            codes = np.concatenate([f.cols["kind"] for f in frames]).astype(np.int8)
            data[col] = pd.Categorical.from_codes(codes, categories=list(KINDS))
        elif col == "ts_us":
            data[col] = np.concatenate([f.cols["ts"] for f in frames]) - t0
        elif col == "dur_us":
            data[col] = np.concatenate([f.cols["dur"] for f in frames])
        elif col in ("flops", "bytes_moved"):
            data[col] = np.full(n, np.nan)  # unknown for uploaded traces; capture fills them
        elif col in CODED_COLUMNS:
            data[col] = _coded(col, dtype, frames)
        else:
            pieces = [f.cols[col] for f in frames if col in f.cols]
            if pieces and len(pieces) != len(frames):  # some files lack the column: pad
                pieces = [f.cols[col] if col in f.cols else _missing_like(pieces[0], f.n) for f in frames]
            data[col] = _column(col, dtype, pieces, n)
        for f in frames:
            f.cols.pop(col, None)
    return pd.DataFrame(data, copy=False)


def _missing_like(example: Any, n: int) -> Any:
    if example.dtype == np.float64:
        return np.full(n, np.nan)
    return np.full(n, MISSING, np.int64)


def _memory_frame(frames: list[FileFrame], ranks: list[int], t0: float) -> pd.DataFrame:
    parts = []
    for f, r in zip(frames, ranks):
        if not len(f.memory.get("ts", ())):
            continue
        part = {"rank": np.full(len(f.memory["ts"]), r, np.int32), "ts_us": f.memory["ts"] - t0}
        for col, dtype in MEMORY_COLUMNS.items():
            if col not in part:
                part[col] = _masked(f.memory[col], dtype)
        parts.append(pd.DataFrame(part))
    if not parts:
        return Trace.__dataclass_fields__["memory"].default_factory()
    return pd.concat(parts, ignore_index=True)


def _counters_frame(frames: list[FileFrame], ranks: list[int], t0: float) -> pd.DataFrame:
    rows = [(r, ts - t0, dev, name, val) for f, r in zip(frames, ranks) for ts, dev, name, val in f.counters]
    if not rows:
        return Trace.__dataclass_fields__["counters"].default_factory()
    rank, ts, dev, name, val = (np.array(x) for x in zip(*rows))
    return pd.DataFrame({"rank": rank.astype(np.int32), "ts_us": ts.astype(np.float64),
                         "device": _masked(dev.astype(np.int64), COUNTER_COLUMNS["device"]),
                         "name": pd.Categorical(name), "value": val.astype(np.float64)})


def _meta(frames: list[FileFrame], ranks: list[tuple[int, str]], t0: float) -> dict[str, Any]:
    skipped: Counter = Counter()
    per_rank = {}
    for f, (r, how) in zip(frames, ranks):
        skipped.update(f.skipped)
        per_rank[r] = {"source": f.label, "rank_source": how, "events": f.n,
                       "device_properties": f.meta["device_properties"],
                       "distributed_info": f.meta["distributed_info"], "versions": f.meta["versions"],
                       "settings": f.meta["settings"], "skipped_events": sum(f.skipped.values()),
                       "skipped_reasons": dict(f.skipped), "unbound_flows": f.unbound_flows,
                       "process_names": f.meta.get("process_names", {}),
                       "thread_names": f.meta.get("thread_names", {})}
    first = frames[int(np.argmin([r for r, _ in ranks]))]
    meta = {"schema_version": SCHEMA_VERSION, "sources": tuple(f.label for f in frames), "t0_us": t0,
            "ranks": tuple(sorted(r for r, _ in ranks)), "skipped_events": sum(skipped.values()),
            "skipped_reasons": dict(skipped), "device_properties": first.meta["device_properties"],
            "per_rank": per_rank, "unbound_flows": sum(f.unbound_flows for f in frames),
            "distributed_info": first.meta["distributed_info"], "versions": first.meta["versions"],
            "flops_source": "none (uploaded trace: flops and bytes_moved are NaN)"}
    return meta


def load_trace(source_or_sources: Any, *, rank: int | Sequence[int] | None = None,
               max_decompressed_bytes: int = 4 << 30) -> Trace:
    """Load one or more PyTorch profiler (Kineto) traces into one Trace.

    Args:
        source_or_sources: a path (str/Path) to a `.json`/`.json.gz` file, a directory of them, a
            `.zip` of them, bytes, a binary file-like, or a list of any of these (one file per rank).
        rank: override the rank of each file (an int for one file, else one int per file).
            By default it is `distributedInfo.rank`; files without one get the lowest free rank.
        max_decompressed_bytes: refuse once this many bytes of JSON were decompressed/read.
    Returns:
        A Trace whose `ts_us` counts from the earliest event over all ranks (`meta["t0_us"]`).
    Raises:
        TraceError: one line naming the file and what is wrong with it.
    """
    frames: list[FileFrame] = []
    with _no_gc():
        for payload in iter_payloads(source_or_sources, max_decompressed_bytes):
            try:
                fd = decode_payload(payload)
            finally:
                payload.release()
            frames.append(_file_frame(fd))
            del fd
        ranks = _assign_ranks(frames, rank)
        t0 = min(f.min_ts() for f in frames)
        t0 = 0.0 if not np.isfinite(t0) else t0
        rank_ids = [r for r, _ in ranks]
        meta = _meta(frames, ranks, t0)
        memory = _memory_frame(frames, rank_ids, t0)
        counters = _counters_frame(frames, rank_ids, t0)
        events = _events_frame(frames, rank_ids, t0)
    return Trace(events=events, meta=meta, memory=memory, counters=counters)

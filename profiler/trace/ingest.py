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
from typing import Any, Iterator, Sequence

import numpy as np

from profiler.trace import links
from profiler.trace._columns import tally_unread
from profiler.trace._structs import MISSING
from profiler.trace.decode import FileData, decode_payload
from profiler.trace.demangle import demangle_kernel_names
from profiler.trace.frame import FileFrame, counters_frame, events_frame, memory_frame
from profiler.trace.model import NotATraceError, Trace, TraceError
from profiler.trace.schema import SCHEMA_VERSION
from profiler.trace.sources import iter_payloads


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


def _file_frame(fd: FileData) -> FileFrame:
    """One file's accumulated columns, with kind-specific ones kept sparse, and its links resolved."""
    acc = fd.acc
    cols = {k: acc.rows.pop(k).array() for k in list(acc.rows)}
    if not cols:
        cols = {"ts": np.empty(0), "dur": np.empty(0), "kind": np.empty(0, np.int8),
                "name": np.empty(0, np.int32), "pid": np.empty(0, np.int64), "tid": np.empty(0, np.int64),
                "correlation": np.empty(0, np.int64), "external_id": np.empty(0, np.int64)}
    sparse: dict[str, tuple[np.ndarray, Any]] = {}
    for col in list(acc.sparse):
        idx, vals = (g.array() for g in acc.sparse.pop(col))
        if col in ("grid", "block"):  # (m, 3) -> three columns
            for j, axis in enumerate("xyz"):
                sparse[f"{col}_{axis}"] = (idx, np.ascontiguousarray(vals[:, j]))
        else:
            sparse[col] = (idx, vals)
    kind = cols["kind"]
    gpu = np.flatnonzero(np.isin(kind, links.DEVICE_SIDE))
    for col, src in (("device", "pid"), ("stream", "tid")):  # GPU rows: Kineto's pid/tid when no arg
        vals = cols[src][gpu]
        if col in sparse:
            idx, got = sparse[col]
            pos = np.searchsorted(gpu, idx)
            vals[pos] = np.where(got != MISSING, got, vals[pos])
        sparse[col] = (gpu, vals)
    flows = {k: v.array() for k, v in acc.flows.items()}
    rows, ids, unbound = links.bind_flows(kind, cols["pid"], cols["tid"], cols["ts"], flows)
    sparse["flow_id"] = (rows, ids)
    vocab = {col: list(v) for col, v in acc.vocab.items()}
    cols["step"] = links.assign_steps(kind, cols["name"], vocab.get("name", []), cols["ts"], cols["dur"],
                                      cols["correlation"])
    memory = {k: v.array() for k, v in acc.memory.items()}
    return FileFrame(fd.label, cols, sparse, vocab, memory, acc.counters, fd.meta, fd.skipped, unbound,
                     acc.ts_base or 0)


MAX_RANK = 2**31 - 1  # the `rank` column is int32


def _assign_ranks(frames: list[FileFrame], rank: Any) -> list[tuple[int, str]]:
    """(rank, how it was decided) per file; duplicates raise. A distributedInfo.rank that is not
    an integer in [0, MAX_RANK] counts as absent; a caller's rank out of that range raises."""
    if rank is not None:
        given = [rank] if isinstance(rank, (int, np.integer)) else list(rank)
        if len(given) != len(frames) or not all(isinstance(r, (int, np.integer)) for r in given):
            raise TraceError(f"rank= gives {len(given)} rank(s) for {len(frames)} trace file(s)")
        if not all(0 <= r <= MAX_RANK for r in given):
            raise TraceError(f"rank= must be between 0 and {MAX_RANK}, got {[int(r) for r in given]}"[:300])
        explicit: list[int | None] = [int(r) for r in given]
        how = "given by the caller"
    else:
        explicit = []
        for f in frames:
            r = (f.meta.get("distributed_info") or {}).get("rank")
            ok = isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_RANK
            explicit.append(int(r) if ok else None)
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


def _meta(frames: list[FileFrame], ranks: list[tuple[int, str]], t0: float) -> dict[str, Any]:
    skipped: Counter = Counter()
    unread: Counter = Counter()
    per_rank = {}
    for f, (r, how) in zip(frames, ranks):
        skipped.update(f.skipped)
        for label, n in f.meta["unread_events"].items():  # bounded over all files, as within one
            tally_unread(unread, label, n)
        per_rank[r] = {"source": f.label, "rank_source": how, "events": f.n,
                       "device_properties": f.meta["device_properties"],
                       "distributed_info": f.meta["distributed_info"], "versions": f.meta["versions"],
                       "settings": f.meta["settings"], "skipped_events": sum(f.skipped.values()),
                       "skipped_reasons": dict(f.skipped), "unread_events": f.meta["unread_events"],
                       "unbound_flows": f.unbound_flows,
                       "process_names": f.meta.get("process_names", {}),
                       "thread_names": f.meta.get("thread_names", {})}
    first = frames[int(np.argmin([r for r, _ in ranks]))]
    meta = {"schema_version": SCHEMA_VERSION, "sources": tuple(f.label for f in frames), "t0_us": t0,
            "ranks": tuple(sorted(r for r, _ in ranks)), "skipped_events": sum(skipped.values()),
            "skipped_reasons": dict(skipped), "unread_events": dict(unread.most_common()),
            "device_properties": first.meta["device_properties"],
            "per_rank": per_rank, "unbound_flows": sum(f.unbound_flows for f in frames),
            "distributed_info": first.meta["distributed_info"], "versions": first.meta["versions"],
            "flops_source": "none (uploaded trace: flops and bytes_moved are NaN)"}
    return meta


def load_trace(source_or_sources: Any, *, rank: int | Sequence[int] | None = None,
               max_decompressed_bytes: int = 4 << 30, workers: int | None = None,
               parallel_min_bytes: int | None = None) -> Trace:
    """Load one or more PyTorch profiler (Kineto) traces into one Trace.

    Args:
        source_or_sources: a path (str/Path) to a `.json`/`.json.gz` file, a directory of them, a
            `.zip` or `.tar(.gz)` of them, bytes, a binary file-like, or a list of any of these (one file per rank).
        rank: override the rank of each file (an int for one file, else one int per file).
            By default it is `distributedInfo.rank`; files without one get the lowest free rank.
        max_decompressed_bytes: refuse once this many bytes of JSON were decompressed/read.
        workers: processes that decode one large plain `.json` file together (same result);
            None: $FUSIONLENS_INGEST_WORKERS, else the CPU count (at most 4); 1: this process only.
        parallel_min_bytes: smaller files are decoded in this process only (default 64 MiB).
    Returns:
        A Trace whose `ts_us` counts from the earliest event over all ranks (`meta["t0_us"]`).
        Events that cannot be read (missing or wrongly typed fields, negative or absurd numbers,
        integers beyond int64) are skipped and counted in `meta["skipped_events"]` and
        `meta["skipped_reasons"]`; events of kinds no column models (another category, a
        `ph: B` pair) are counted by label in `meta["unread_events"]`; rows keep file order. Itanium-mangled kernel names (ROCm traces:
        `_ZN7ck_tile...`) are demangled as Kineto does for CUDA; `meta["demangled_names"]` maps
        each changed name back to the name as written ({demangled: mangled}; empty when none).
    Raises:
        TraceError: one line naming the file and what is wrong with it (also when more than
            max(10, 10%) of a file's events are unreadable, or none is usable); NotATraceError, its
            subclass, for JSON that is not a Kineto trace (no traceEvents list, or events of which
            none is of a kind FusionLens reads), which a folder or archive passes over.
    """
    frames: list[FileFrame] = []
    passed_over: list[str] = []  # JSON found beside the traces that is not one (a config.json)
    with _no_gc():
        for payload in iter_payloads(source_or_sources, max_decompressed_bytes):
            try:
                fd = decode_payload(payload, workers, parallel_min_bytes)
            except NotATraceError as exc:
                if not payload.found:  # a file the caller named: it had to be a trace
                    raise
                passed_over.append(str(exc))
                continue
            finally:
                payload.release()
            frames.append(_file_frame(fd))
            del fd
        if not frames:  # every file found was JSON of another kind
            more = f" (and {len(passed_over) - 1} more such file(s))" if len(passed_over) > 1 else ""
            raise TraceError(f"{passed_over[0]}{more}; no trace found" if passed_over else "no trace found")
        ranks = _assign_ranks(frames, rank)
        # One clock for all files: the earliest base of the files with exact epoch timestamps (0
        # when none has): their ts stay exact; float64 files move onto it (integers: exactly).
        base = min((f.ts_base for f in frames if f.ts_base), default=0)
        for f in frames:
            f.rebase(base)
        t0 = min(f.min_ts() for f in frames)
        t0 = 0.0 if not np.isfinite(t0) else t0
        rank_ids = [r for r, _ in ranks]
        meta = _meta(frames, ranks, base + t0)
        meta["passed_over_files"] = passed_over
        memory = memory_frame(frames, rank_ids, t0)
        counters = counters_frame(frames, rank_ids, t0)
        events = events_frame(frames, rank_ids, t0)
        events, meta["demangled_names"] = demangle_kernel_names(events)
    return Trace(events=events, meta=meta, memory=memory, counters=counters)

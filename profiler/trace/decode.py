"""Decode one trace file's JSON bytes straight into column arrays (no dict per event).

The top-level object is decoded once with `traceEvents` kept raw (that pass also validates the
whole document as JSON). The events array is then cut into ~4 MB chunks at `}, {` boundaries and
each chunk is decoded by msgspec into typed Structs (`_structs.Event`), from which columns are
pulled with C-level `map(attrgetter)` + `np.fromiter`. A split that lands inside an event cannot
decode (its brackets do not balance), so it is widened to the next boundary; a chunk with a
wrongly typed event falls back to per-event decoding, which skips and counts the bad events.

A large plain `.json` file (>= 64 MiB, several CPUs) skips the whole-document pass and is decoded
by several processes over the same chunks (`_parallel`); the output is the serial one exactly, and
anything unexpected there (an invalid chunk, a worker failing) makes it decode serially instead.

Timestamps that float64 cannot hold to the nanosecond (Unix-epoch µs with a fraction, as some
Kineto versions write: 1712195495519689.047, where float64 steps by 0.25 µs) are found by a look
at the first MiB (`ts_base`); such a file is decoded with `ExactEvent`s, whose `ts` stays text and
becomes an exact offset from the file's `ts_base` (`_columns.exact_ts`).
"""
from __future__ import annotations

import mmap
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec
import numpy as np

from profiler.trace import _columns as C
from profiler.trace._structs import (DOC_DECODER, EVENT_DECODER, EVENTS_DECODER, EXACT_EVENT_DECODER,
                                     EXACT_EVENTS_DECODER, RAW_LIST_DECODER, SETTING_KEYS, VERSION_KEYS)
from profiler.trace.model import NotATraceError, TraceError
from profiler.trace.sources import Payload, other_format

CHUNK_BYTES = 4 << 20  # small enough that a chunk's Structs stay in cache across column passes
_SPLIT = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
_FRACTIONAL_TS = re.compile(rb'"ts"\s*:\s*(-?\d+)\.\d')
# From 2**42 µs (51 days, an uptime clock too) on, float64 steps by ~1 ns or more, so a difference
# of two parsed timestamps can be off by a nanosecond: keep the text. torch 2.13 writes uptime µs.
EXACT_FROM_US = 1 << 42
SNIFF_BYTES = 1 << 20
_DECODERS = {False: (EVENTS_DECODER, EVENT_DECODER), True: (EXACT_EVENTS_DECODER, EXACT_EVENT_DECODER)}


@dataclass
class FileData:
    """Everything decoded from one file, before ranks are assigned and clocks aligned."""

    label: str
    acc: C.Accumulator
    meta: dict[str, Any]
    skipped: Counter = field(default_factory=Counter)


def _json_error(label: str, buf: Any, exc: Exception) -> TraceError:
    what = other_format(bytes(buf[:64]))
    if what:  # a file of another kind handed over by mistake: say what it is
        return TraceError(f"{label}: not a JSON trace: {what}")
    msg = str(exc)
    m = re.search(r"byte (\d+)", msg)
    if m:
        pos = int(m.group(1))
        near = bytes(buf[pos:pos + 9])
        if near.startswith((b"NaN", b"Infinity", b"-Infinity")):
            return TraceError(f"{label}: invalid JSON: {near.split(b',')[0].decode(errors='replace')} "
                              f"at byte {pos} is not a JSON number")
    if "truncated" in msg:
        return TraceError(f"{label}: invalid JSON: the file ends early (truncated)")
    return TraceError(f"{label}: invalid JSON ({msg.replace('JSON is malformed: ', '')})")


def _top_level(payload: Payload) -> tuple[Any, Any]:
    """(Doc or None, memoryview of the traceEvents array) with one-line errors for non-traces."""
    buf, label = payload.buf, payload.label
    if bytes(buf[:3]) == b"\xef\xbb\xbf":  # a UTF-8 byte-order mark (some editors write one)
        buf = memoryview(buf)[3:]
    if not bytes(buf[:4096]).strip(_WS) and not bytes(buf).strip(_WS):
        raise TraceError(f"{label}: empty file")
    try:
        doc = DOC_DECODER.decode(buf)
    except msgspec.ValidationError as exc:  # (a subclass of DecodeError: catch it first)
        if "got `array`" in str(exc) and "$." not in str(exc):
            head = bytes(buf[:4096])
            lead = len(head) - len(head.lstrip(_WS))
            return None, memoryview(buf)[lead:]  # Chrome's JSON Array Format: the top level is the events
        kind = str(exc).split("got `")[-1].split("`")[0] if "got `" in str(exc) else "something else"
        raise NotATraceError(f"{label}: JSON that is not a trace: the top level is {kind!s}, not an object "
                         "with traceEvents") from None
    except msgspec.DecodeError as exc:
        raise _json_error(label, buf, exc) from None
    view = memoryview(doc.traceEvents)
    if view.nbytes == 0:
        raise NotATraceError(f"{label}: JSON that is not a trace: no traceEvents list")
    if bytes(view[:1]) != b"[":
        raise NotATraceError(f"{label}: JSON that is not a trace: traceEvents is not a list")
    return doc, view


def _next_split(view: memoryview, stop: int, end_arr: int) -> int:
    m = _SPLIT.search(view, stop, end_arr)
    return m.start() + 1 if m else end_arr


def ts_base(view: Any) -> Optional[int]:
    """The integer part of the first fractional `ts` in the first MiB of the events array when
    float64 cannot hold such timestamps to the nanosecond (|ts| >= 2**42 µs), else None. Absurd
    ones (beyond int64 ns, skipped as rows anyway) are passed over: int64 arithmetic on them fails."""
    for m in _FRACTIONAL_TS.finditer(view[:SNIFF_BYTES]):
        whole = int(m.group(1))
        if EXACT_FROM_US <= abs(whole) < C.ABSURD_US:
            return whole
    return None


def _accumulator(view: memoryview) -> C.Accumulator:
    """The column accumulator for one file's events array (~250 B a row), on its timestamp clock."""
    return C.Accumulator(capacity=max(1 << 12, view.nbytes // 250), ts_base=ts_base(view))


def _decode_chunk(chunk: bytes, skipped: Counter, exact: bool = False) -> list:
    """Typed decode; on a type error, decode event by event and count the ones that fail."""
    events_decoder, event_decoder = _DECODERS[exact]
    try:
        return events_decoder.decode(chunk)
    except msgspec.ValidationError:
        pass
    good = []
    for raw in RAW_LIST_DECODER.decode(chunk):
        try:
            good.append(event_decoder.decode(raw))
        except msgspec.ValidationError as exc:
            msg = str(exc)
            where = msg.rsplit(" - at `", 1)
            reason = (f"{where[1].rstrip('`').replace('$.', '')}: {where[0]}" if len(where) == 2 else msg)
            skipped[re.sub(r"\$\[\d+\]", "", reason)] += 1
    return good


class Unaligned(Exception):
    """A planned chunk did not decode on its own (a split inside a string): decode serially."""


def array_end(view: memoryview) -> int:
    """Offset of the closing `]` of the events array in `view`."""
    end_arr = view.nbytes - 1
    while end_arr > 0 and view[end_arr] != ord("]"):
        end_arr -= 1
    return end_arr


def _chunk_bytes(view: memoryview, cur: int, stop: int) -> bytearray:
    chunk = bytearray(stop - cur + 2)  # "[" + events + "]", one copy
    chunk[0], chunk[-1] = 0x5B, 0x5D
    chunk[1:-1] = view[cur:stop]
    return chunk


def _after(view: memoryview, stop: int, end_arr: int) -> int:
    m = _SPLIT.match(view, stop - 1) if stop < end_arr else None
    return (m.end() - 1) if m else end_arr


def plan_chunks(view: memoryview) -> list[tuple[int, int]]:
    """The (start, stop) byte spans `_iter_event_lists` decodes when no chunk needs widening:
    regex searches only, so a parallel decode cuts the array exactly where the serial one does."""
    end_arr = array_end(view)
    spans, cur = [], 1
    while cur < end_arr:
        stop = _next_split(view, cur + CHUNK_BYTES, end_arr) if end_arr - cur > CHUNK_BYTES * 1.5 else end_arr
        spans.append((cur, stop))
        cur = _after(view, stop, end_arr)
    return spans


def decode_spans(view: memoryview, spans: Any, acc: C.Accumulator, skipped: Counter, release: Any) -> int:
    """Decode planned chunks into `acc` (number of events decoded); raises Unaligned when one
    does not decode on its own."""
    total = 0
    for cur, stop in spans:
        chunk = _chunk_bytes(view, cur, stop)
        try:
            events = _decode_chunk(chunk, skipped, acc.ts_base is not None)
        except msgspec.DecodeError:
            raise Unaligned(f"chunk at byte {cur} does not decode on its own") from None
        total += len(events)
        C.process_chunk(events, chunk, acc, skipped)
        del events, chunk
        if release is not None:
            release(cur, stop)
    return total


def _iter_event_lists(view: memoryview, label: str, skipped: Counter, release: Any, exact: bool):
    """Decode the events array chunk by chunk, widening chunks whose split was not a boundary."""
    end_arr = array_end(view)
    cur = 1
    while cur < end_arr:
        stop = _next_split(view, cur + CHUNK_BYTES, end_arr) if end_arr - cur > CHUNK_BYTES * 1.5 else end_arr
        while True:
            chunk = _chunk_bytes(view, cur, stop)
            try:
                events = _decode_chunk(chunk, skipped, exact)
                break
            except msgspec.DecodeError as exc:
                if stop >= end_arr:
                    raise TraceError(f"{label}: invalid JSON in traceEvents ({exc})") from None
                stop = _next_split(view, cur + 2 * (stop - cur), end_arr)  # widen by doubling
        yield events, chunk
        if release is not None:
            release(cur, stop)
        cur = _after(view, stop, end_arr)


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None), list, dict)) else None


def _file_meta(doc: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if doc is None:
        return {"device_properties": [], "distributed_info": None, "versions": {}, "settings": {}}
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    meta["device_properties"] = [p for p in props if isinstance(p, dict)]
    meta["distributed_info"] = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None
    meta["schema_version_in_file"] = _plain(doc.schemaVersion)
    versions = {k: getattr(doc, k) for k in VERSION_KEYS if getattr(doc, k) is not None}
    if "torch_version" not in versions and memoryview(doc.metadata).nbytes:
        try:  # TraceLens-style metadata.system.torch_env_info.torch_version (nothing else is kept)
            md = msgspec.json.decode(doc.metadata)
            tv = md.get("system", {}).get("torch_env_info", {}).get("torch_version")
            if isinstance(tv, str):
                versions["torch_version"] = tv
        except (msgspec.DecodeError, AttributeError):
            pass
    if isinstance(meta["distributed_info"], dict) and "nccl_version" in meta["distributed_info"]:
        versions["nccl_version"] = meta["distributed_info"]["nccl_version"]
    meta["versions"] = {k: _plain(v) for k, v in versions.items()}
    meta["settings"] = {k: _plain(getattr(doc, k)) for k in SETTING_KEYS if getattr(doc, k) is not None}
    return meta


def _offset_in(view: memoryview, buf: Any) -> int:
    """Byte offset of `view` (a slice of `buf`, as msgspec.Raw is) inside `buf`."""
    addr = np.frombuffer(view, np.uint8).ctypes.data
    start = np.frombuffer(buf, np.uint8).ctypes.data
    if not start <= addr <= start + len(buf):
        raise ValueError("view is not inside buf")
    return addr - start


def decode_payload(payload: Payload, workers: int | None = 1, parallel_min_bytes: int | None = None) -> FileData:
    """Decode one file into columns; raises TraceError (one line, naming the file) when unusable.

    A mapped plain file of at least `parallel_min_bytes` (default 64 MiB) is decoded by up to
    `workers` processes (None: $FUSIONLENS_INGEST_WORKERS, else the CPU count), same output.
    """
    from profiler.trace import _parallel as P  # (it imports this module)

    n_proc = P.worker_count(payload, workers, P.MIN_BYTES if parallel_min_bytes is None else parallel_min_bytes)
    procs = []
    if n_proc > 1:
        try:
            procs = P.start_workers(n_proc - 1)
        except OSError:  # cannot start a process here: decode serially
            procs = []
    try:
        return _decode(payload, procs)
    finally:
        P.stop_workers(procs)


def _releaser(payload: Payload, view: memoryview) -> Any:
    """release(start, stop): hand back the mapped pages of view[start:stop] once decoded, so the
    JSON never sits in RSS next to the columns (None when the bytes are not an mmap)."""
    buf = payload.mm
    if buf is None or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    base = _offset_in(view, buf)

    def release(start: int, stop: int) -> None:
        lo = ((base + start) // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = ((base + stop) // mmap.PAGESIZE) * mmap.PAGESIZE
        if hi > lo:
            buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return release


def _decode(payload: Payload, procs: list) -> FileData:
    if procs:
        from profiler.trace import _parallel as P

        located = P.locate_events(payload.mm)
        if located is not None:
            doc, start, end = located
            view = memoryview(payload.mm)[start:end + 1]
            acc, skipped = _accumulator(view), Counter()
            try:
                total = P.decode_parallel(view, start, payload.path, procs, acc, skipped,
                                          _releaser(payload, view), plan_chunks(view))
            except Exception:  # a chunk that needs widening or is invalid, a worker that died: serial
                P.stop_workers(procs)
            else:
                return _finish(payload, _file_meta(doc), acc, skipped, total)
            finally:
                view.release()
    return _decode_serial(payload)


def _decode_serial(payload: Payload) -> FileData:
    doc, view = _top_level(payload)
    meta = _file_meta(doc)
    del doc
    acc, skipped, total = _accumulator(view), Counter(), 0
    release = _releaser(payload, view)
    if release is not None and payload.file_backed:
        # A mapped file's pages (all touched by the validation pass) can all go now: they are
        # re-read from the page cache; decompressed data is handed back only once consumed.
        payload.mm.madvise(mmap.MADV_DONTNEED)
    for events, chunk in _iter_event_lists(view, payload.label, skipped, release, acc.ts_base is not None):
        total += len(events)
        C.process_chunk(events, chunk, acc, skipped)
    del view
    return _finish(payload, meta, acc, skipped, total)


def _finish(payload: Payload, meta: dict[str, Any], acc: C.Accumulator, skipped: Counter, total: int) -> FileData:
    total += C.undecodable(skipped)
    meta["process_names"] = acc.process_names
    meta["thread_names"] = acc.thread_names
    n_bad = sum(skipped.values())
    if n_bad and (acc.n_rows == 0 or n_bad > max(10, 0.1 * total)):
        worst = skipped.most_common(1)[0]
        raise TraceError(f"{payload.label}: {n_bad} of {total} events are unreadable "
                         f"(most often: {worst[0]} x{worst[1]}); not a usable trace")
    meta["unread_events"] = dict(acc.unread.most_common())
    if acc.n_rows == 0 and acc.unread:  # events, none of them Kineto's: another tool's Chrome trace
        n = sum(acc.unread.values())
        which = f"none of its {n:,} events is" if n > 1 else "its one event is not"
        raise NotATraceError(f"{payload.label}: not a PyTorch profiler (Kineto) trace: {which} of a kind "
                             f"FusionLens reads (seen: {C.describe_unread(acc.unread)})")
    return FileData(payload.label, acc, meta, skipped)

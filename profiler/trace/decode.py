"""Decode one trace file's JSON bytes straight into column arrays (no dict per event).

The top-level object is decoded once with `traceEvents` kept raw (that pass also validates the
whole document as JSON). The events array is then cut into ~4 MB chunks at `}, {` boundaries and
each chunk is decoded by msgspec into typed Structs (`_structs.Event`), from which columns are
pulled with C-level `map(attrgetter)` + `np.fromiter`. A split that lands inside an event cannot
decode (its brackets do not balance), so it is widened to the next boundary; a chunk with a
wrongly typed event falls back to per-event decoding, which skips and counts the bad events.
"""
from __future__ import annotations

import mmap
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy as np

from profiler.trace import _columns as C
from profiler.trace._structs import (DOC_DECODER, EVENT_DECODER, EVENTS_DECODER, RAW_LIST_DECODER,
                                     SETTING_KEYS, VERSION_KEYS)
from profiler.trace.model import TraceError
from profiler.trace.sources import Payload

CHUNK_BYTES = 4 << 20  # small enough that a chunk's Structs stay in cache across column passes
_SPLIT = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"


@dataclass
class FileData:
    """Everything decoded from one file, before ranks are assigned and clocks aligned."""

    label: str
    acc: C.Accumulator
    meta: dict[str, Any]
    skipped: Counter = field(default_factory=Counter)


def _json_error(label: str, buf: Any, exc: Exception) -> TraceError:
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
        raise TraceError(f"{label}: JSON that is not a trace: the top level is {kind!s}, not an object "
                         "with traceEvents") from None
    except msgspec.DecodeError as exc:
        raise _json_error(label, buf, exc) from None
    view = memoryview(doc.traceEvents)
    if view.nbytes == 0:
        raise TraceError(f"{label}: JSON that is not a trace: no traceEvents list")
    if bytes(view[:1]) != b"[":
        raise TraceError(f"{label}: JSON that is not a trace: traceEvents is not a list")
    return doc, view


def _next_split(view: memoryview, stop: int, end_arr: int) -> int:
    m = _SPLIT.search(view, stop, end_arr)
    return m.start() + 1 if m else end_arr


def _decode_chunk(chunk: bytes, skipped: Counter) -> list:
    """Typed decode; on a type error, decode event by event and count the ones that fail."""
    try:
        return EVENTS_DECODER.decode(chunk)
    except msgspec.ValidationError:
        pass
    good = []
    for raw in RAW_LIST_DECODER.decode(chunk):
        try:
            good.append(EVENT_DECODER.decode(raw))
        except msgspec.ValidationError as exc:
            msg = str(exc)
            where = msg.rsplit(" - at `", 1)
            reason = (f"{where[1].rstrip('`').replace('$.', '')}: {where[0]}" if len(where) == 2 else msg)
            skipped[re.sub(r"\$\[\d+\]", "", reason)] += 1
    return good


def _iter_event_lists(view: memoryview, label: str, skipped: Counter, release: Any):
    """Decode the events array chunk by chunk, widening chunks whose split was not a boundary."""
    n = view.nbytes
    end_arr = n - 1
    while end_arr > 0 and view[end_arr] != ord("]"):
        end_arr -= 1
    cur = 1
    while cur < end_arr:
        stop = _next_split(view, cur + CHUNK_BYTES, end_arr) if end_arr - cur > CHUNK_BYTES * 1.5 else end_arr
        while True:
            chunk = bytearray(stop - cur + 2)  # "[" + events + "]", one copy
            chunk[0], chunk[-1] = 0x5B, 0x5D
            chunk[1:-1] = view[cur:stop]
            try:
                events = _decode_chunk(chunk, skipped)
                break
            except msgspec.DecodeError as exc:
                if stop >= end_arr:
                    raise TraceError(f"{label}: invalid JSON in traceEvents ({exc})") from None
                stop = _next_split(view, cur + 2 * (stop - cur), end_arr)  # widen by doubling
        yield events, chunk
        if release is not None:
            release(cur, stop)
        m = _SPLIT.match(view, stop - 1) if stop < end_arr else None
        cur = (m.end() - 1) if m else end_arr


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


def decode_payload(payload: Payload) -> FileData:
    """Decode one file into columns; raises TraceError (one line, naming the file) when unusable."""
    doc, view = _top_level(payload)
    meta = _file_meta(doc)
    del doc
    skipped: Counter = Counter()
    acc = C.Accumulator(capacity=max(1 << 12, view.nbytes // 250))  # ~250 B of JSON per kept row
    release = None
    buf = payload.mm
    if buf is not None and hasattr(mmap, "MADV_DONTNEED"):
        # Hand back each chunk's pages once decoded, so the JSON never sits in RSS next to the
        # columns. A mapped file's pages (all touched by the validation pass) can all go now:
        # they are re-read from the page cache; decompressed data only once consumed.
        base = _offset_in(view, buf)
        if payload.file_backed:
            buf.madvise(mmap.MADV_DONTNEED)

        def release(start: int, stop: int) -> None:
            lo = ((base + start) // mmap.PAGESIZE) * mmap.PAGESIZE
            hi = ((base + stop) // mmap.PAGESIZE) * mmap.PAGESIZE
            if hi > lo:
                buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    total = 0
    for events, chunk in _iter_event_lists(view, payload.label, skipped, release):
        total += len(events)
        C.process_chunk(events, chunk, acc, skipped)
    total += C.undecodable(skipped)
    del view
    meta["process_names"] = acc.process_names
    meta["thread_names"] = acc.thread_names
    n_bad = sum(skipped.values())
    if n_bad and (acc.n_rows == 0 or n_bad > max(10, 0.1 * total)):
        worst = skipped.most_common(1)[0]
        raise TraceError(f"{payload.label}: {n_bad} of {total} events are unreadable "
                         f"(most often: {worst[0]} x{worst[1]}); not a usable trace")
    return FileData(payload.label, acc, meta, skipped)

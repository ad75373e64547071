"""Decode one large, plain (mapped) JSON trace on several cores, with the serial output exactly.

The events array is cut into the very chunks the serial decoder uses (`decode.plan_chunks`), and
consecutive runs of chunks of about equal bytes go one per process: the calling process decodes
the first run itself while worker processes map the file again and decode the others into their own
Accumulators. Workers are fresh interpreters (`python -c`, started by subprocess's fork+exec, so
safe from Streamlit's threads, and never re-running the caller's `__main__` as multiprocessing's
spawn does); they import only the decoder (numpy, msgspec, pandas for factorize) and start while the
caller validates the document. Each sends back numpy columns as raw pickle-5 buffers (no extra
copy on either side) plus its vocabularies in first-seen order; merging in file order (codes remapped through a
lookup array, sparse row indices shifted, side tables appended) rebuilds the serial Accumulator:
same rows, order, codes, counters, names and skipped counts. A chunk that does not decode on its
own (a split inside a string) or a failing worker makes the caller decode the file serially.
"""
from __future__ import annotations

import mmap
import os
import pickle
import re
import struct
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from profiler.trace import _columns as C
from profiler.trace._structs import DOC_DECODER
from profiler.trace.decode import decode_spans

ENV_WORKERS = "FUSIONLENS_INGEST_WORKERS"
MIN_BYTES = 64 << 20  # below this, starting a process costs more than it saves
MAX_WORKERS = 4  # each worker holds its share of the columns while merging: memory grows with it


def worker_count(payload: Any, workers: int | None, min_bytes: int) -> int:
    """Processes to decode `payload` with (1 = serial): only a mapped plain file of at least
    `min_bytes`. `workers`, else $FUSIONLENS_INGEST_WORKERS, else the CPU count (at most
    MAX_WORKERS; 1 on a one-CPU machine) says how many."""
    if not (payload.file_backed and payload.path and payload.mm is not None and len(payload.mm) >= min_bytes):
        return 1
    if workers is None:
        env = os.environ.get(ENV_WORKERS, "").strip()
        workers = int(env) if env.isdigit() else min(os.cpu_count() or 1, MAX_WORKERS)
    return max(1, int(workers))


_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# A worker that neither answers nor dies (a hang) is killed after this long, and the file is decoded
# again in one process: generous, since a loaded machine can decode 10x slower than an idle one.
WATCHDOG_MIN_S = 60.0
WATCHDOG_S_PER_BYTE = 1 / (2 << 20)  # allow 2 MB/s at worst
TAIL_BYTES = 1 << 20  # where the end of the events array is looked for
_WS = b" \t\r\n"


def locate_events(buf: Any) -> tuple[Any, int, int] | None:
    """(Doc of everything but the events, offset of the events array's `[`, offset of its `]`)
    found without parsing the events, or None (then the caller parses the whole document).

    The `[` follows the first `"traceEvents":`; the `]` is the last one in the tail that closes an
    object (or the empty array) and leaves a document that decodes, with its traceEvents exactly
    there. Chunk decodes validate the events in between: together that is the whole document."""
    if bytes(buf[:3]) == b"\xef\xbb\xbf":
        return None
    m = _KEY.search(buf)
    if m is None:
        return None
    start = m.end() - 1
    lo = max(start + 1, len(buf) - TAIL_BYTES)
    tail = bytes(buf[lo:])
    prefix = bytes(buf[:start])
    pos, tries = len(tail), 0
    while tries < 16:
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            return None
        j = pos - 1
        while j >= 0 and tail[j] in _WS:
            j -= 1
        if not ((j >= 0 and tail[j] == 0x7D) or (j < 0 and lo == start + 1)):  # `}` or the `[`
            continue
        tries += 1
        rest = tail[pos + 1:]
        synthetic = prefix + b"[]" + rest
        try:
            doc = DOC_DECODER.decode(synthetic)
        except Exception:  # not the end (or not a trace at all: the full parse will say)
            continue
        raw = memoryview(doc.traceEvents)
        if raw.nbytes == 2 and np.frombuffer(raw, np.uint8).ctypes.data == \
                np.frombuffer(synthetic, np.uint8).ctypes.data + start:
            return doc, start, lo + pos
    return None


_PKG_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds `profiler/`
_SERVE = "from profiler.trace._parallel import serve; serve()"
_LEN = struct.Struct("<Q")


def start_workers(n: int) -> list[subprocess.Popen]:
    """`n` worker interpreters, started now (their imports overlap the caller's first chunks);
    each waits on stdin for one task."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_ROOT, env.get("PYTHONPATH", "")) if p)
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))
    except OSError:
        stop_workers(procs)
        raise
    return procs


def stop_workers(procs: list[subprocess.Popen]) -> None:
    """Kill the workers still running (their result is read or no longer wanted) and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        for fh in (p.stdin, p.stdout):
            try:
                if fh is not None:
                    fh.close()
            except OSError:
                pass
        p.wait()


def _read_exact(fh: BinaryIO, n: int) -> bytearray:
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = fh.readinto(view[got:])
        if not k:
            raise EOFError("worker ended early")
        got += k
    return out


def _send(fh: BinaryIO, obj: Any) -> None:
    """obj as a pickle-5 header plus its raw out-of-band buffers (numpy data written as is)."""
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    fh.write(_LEN.pack(len(head)) + head + _LEN.pack(len(raws)))
    for raw in raws:
        fh.write(_LEN.pack(raw.nbytes))
        fh.write(raw)
    fh.flush()


def _receive(fh: BinaryIO) -> Any:
    head = _read_exact(fh, _LEN.unpack(_read_exact(fh, 8))[0])
    n = _LEN.unpack(_read_exact(fh, 8))[0]
    bufs = [_read_exact(fh, _LEN.unpack(_read_exact(fh, 8))[0]) for _ in range(n)]
    return pickle.loads(head, buffers=bufs)


def serve() -> None:
    """Worker main: read one task from stdin, decode it, write the result to stdout."""
    path, spans, capacity, base = pickle.loads(sys.stdin.buffer.read())
    _send(sys.stdout.buffer, decode_file_spans(path, spans, capacity, base))


def _export(acc: C.Accumulator) -> dict[str, Any]:
    return {"rows": {k: g.array() for k, g in acc.rows.items()},
            "sparse": {k: (i.array(), v.array()) for k, (i, v) in acc.sparse.items()},
            "flows": {k: g.array() for k, g in acc.flows.items()},
            "memory": {k: g.array() for k, g in acc.memory.items()},
            "vocab": {k: list(v) for k, v in acc.vocab.items()}, "counters": acc.counters,
            "process_names": acc.process_names, "thread_names": acc.thread_names, "n_rows": acc.n_rows,
            "unread": dict(acc.unread)}


def decode_file_spans(path: str, spans: list[tuple[int, int]], capacity: int,
                      ts_base: int | None = None) -> tuple[dict, Counter, int]:
    """Worker: decode `spans` (absolute byte offsets) of the file at `path` into columns (`ts`
    relative to the caller's `ts_base` when it decodes exact timestamps)."""
    acc, skipped = C.Accumulator(capacity=capacity, ts_base=ts_base), Counter()
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)

    def release(start: int, stop: int) -> None:  # pages are re-read from the page cache if needed
        lo, hi = (start // mmap.PAGESIZE) * mmap.PAGESIZE, (stop // mmap.PAGESIZE) * mmap.PAGESIZE
        if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    try:
        total = decode_spans(view, spans, acc, skipped, release)
    finally:
        view.release()
        mm.close()
    return _export(acc), skipped, total


def _remap(codes: np.ndarray, lut: np.ndarray) -> np.ndarray:
    if not len(lut):
        return np.full(len(codes), -1, np.int32)
    return np.where(codes >= 0, np.take(lut, np.maximum(codes, 0)), -1).astype(np.int32)


def merge(acc: C.Accumulator, part: dict[str, Any]) -> None:
    """Append a later part's columns to `acc` as if `acc` had decoded them itself."""
    base = acc.n_rows
    luts = {}
    for col, words in part["vocab"].items():
        vocab = acc.vocab.setdefault(col, {})
        luts[col] = np.fromiter((vocab.setdefault(w, len(vocab)) for w in words), np.int32, len(words))

    def coded(col: str, vals: np.ndarray) -> np.ndarray:
        return _remap(vals, luts[col]) if col in C.CODED_COLUMNS and col in luts else vals

    for col in list(part["rows"]):
        acc.add(acc.rows, col, coded(col, part["rows"].pop(col)))
    for col in list(part["sparse"]):
        idx, vals = part["sparse"].pop(col)
        acc.add_sparse(col, idx + base, coded(col, vals))
    for table in ("flows", "memory"):
        for col, vals in part[table].items():
            acc.add(getattr(acc, table), col, vals)
    acc.counters.extend(part["counters"])
    acc.process_names.update(part["process_names"])
    acc.thread_names.update(part["thread_names"])
    for label, n in part["unread"].items():
        C.tally_unread(acc.unread, label, n)
    acc.n_rows += part["n_rows"]


CALLER_WEIGHT = 1.1  # the caller starts decoding while workers still import (~0.4 s): its share is larger


def _split(spans: list[tuple[int, int]], n: int) -> list[list[tuple[int, int]]]:
    """Consecutive runs of spans, one per process (at most n, none empty): the caller's run gets
    CALLER_WEIGHT times the bytes of each worker's."""
    if not spans:
        return [spans]
    ends = np.cumsum([b - a for a, b in spans])
    marks = (CALLER_WEIGHT + np.arange(n - 1)) / (CALLER_WEIGHT + n - 1)
    cuts = np.searchsorted(ends, ends[-1] * marks) + 1
    bounds = [0, *sorted(set(int(c) for c in cuts if 0 < c < len(spans))), len(spans)]
    return [spans[lo:hi] for lo, hi in zip(bounds, bounds[1:])]


def decode_parallel(view: memoryview, base: int, path: str, procs: list[subprocess.Popen],
                    acc: C.Accumulator, skipped: Counter, release: Any, spans: list[tuple[int, int]]) -> int:
    """Decode `spans` of `view` (at file offset `base`) into `acc` with this process and `procs`;
    returns the number of events decoded. Raises (decode.Unaligned, a worker's failure) for a
    serial retry."""
    runs = _split(spans, len(procs) + 1)
    for proc, run in zip(procs, runs[1:]):
        cap = max(1 << 12, sum(b - a for a, b in run) // 250)
        proc.stdin.write(pickle.dumps((path, [(base + a, base + b) for a, b in run], cap, acc.ts_base)))
        proc.stdin.close()
    watchdogs = [threading.Timer(WATCHDOG_MIN_S + WATCHDOG_S_PER_BYTE * sum(b - a for a, b in run), proc.kill)
                 for proc, run in zip(procs, runs[1:])]
    for dog in watchdogs:
        dog.daemon = True
        dog.start()
    try:
        total = decode_spans(view, runs[0], acc, skipped, release)
        for proc in procs[:len(runs) - 1]:
            part, part_skipped, part_total = _receive(proc.stdout)  # a killed worker: EOF -> raises
            merge(acc, part)
            del part
            skipped.update(part_skipped)
            total += part_total
    finally:
        for dog in watchdogs:
            dog.cancel()
    return total

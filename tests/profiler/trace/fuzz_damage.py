"""Byte- and container-level damage for the trace fuzzer (tests/profiler/trace/fuzz_ingest.py):
cut, flipped or spliced bytes, the ranks packed into a zip or a tar with damaged headers, and
overwritten bytes in a saved Trace's Parquet files. Each draws only from the rng it is given."""
from __future__ import annotations

import gzip
import io
import random
import tarfile
import zipfile
from pathlib import Path
from typing import Callable


def corrupt_bytes(rng: random.Random, data: bytes) -> bytes:
    """Truncated, flipped or spliced bytes, sometimes gzipped afterwards."""
    how = rng.choice(("truncate", "flip", "splice", "gzip_truncate"))
    if how == "truncate":
        return data[: rng.randrange(len(data) + 1)]
    if how == "flip":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(buf))
            buf[i] = rng.randrange(256)
        return bytes(buf)
    if how == "splice":
        i, j = sorted(rng.randrange(len(data) + 1) for _ in range(2))
        return data[:i] + data[j:] + data[i:j]
    packed = gzip.compress(data, compresslevel=1)
    return packed[: rng.randrange(len(packed) + 1)]


ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def zipped(rng: random.Random, payloads: list) -> bytes:
    """The payloads as members of one zip (any of Python's four methods, gzipped members as
    .json.gz, maybe a directory entry and a non-trace file), and in a third of the cases a few
    bytes of its headers damaged: the local header, or the central directory and its end record
    (flags, methods, sizes, offsets, name lengths)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", rng.choice(ZIP_METHODS)) as zf:
        if rng.random() < 0.3:
            zf.writestr("traces/", b"")
            zf.writestr("README.txt", b"not a trace")
        for i, data in enumerate(payloads):
            zf.writestr(f"traces/rank{i}.json" + (".gz" if data[:2] == b"\x1f\x8b" else ""), data)
    data = bytearray(buf.getvalue())
    if rng.random() < 1 / 3:
        directory = data.rfind(b"PK\x01\x02")
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(64) if rng.random() < 0.5 else rng.randrange(max(0, directory - 64), len(data))
            data[min(i, len(data) - 1)] = rng.randrange(256)
    return bytes(data)


def tarred(rng: random.Random, payloads: list) -> bytes:
    """The payloads as members of one tar (ustar, GNU or pax; gzipped members as .json.gz, maybe a
    directory, a non-trace file and a symlink), the whole maybe gzipped, and in a third of the
    cases a few bytes of its member headers damaged or the archive cut short."""
    buf = io.BytesIO()
    fmt = rng.choice((tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT))
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        extras = [("traces", tarfile.DIRTYPE, b""), ("traces/README.txt", tarfile.REGTYPE, b"not a trace"),
                  ("traces/link.json", tarfile.SYMTYPE, b"")] if rng.random() < 0.3 else []
        members = [(f"traces/rank{i}.json" + (".gz" if d[:2] == b"\x1f\x8b" else ""), tarfile.REGTYPE, d)
                   for i, d in enumerate(payloads)]
        for name, kind, data in extras + members:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            if kind == tarfile.SYMTYPE:
                info.linkname = "rank0.json"
            tf.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    data = bytearray(buf.getvalue())
    if rng.random() < 1 / 3:
        headers = [i for i in range(0, len(data) - 511, 512) if data[i + 257:i + 262] == b"ustar"]
        for _ in range(rng.randint(1, 4)):
            data[rng.choice(headers) + rng.randrange(512)] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[:rng.randrange(len(data))]
    return gzip.compress(bytes(data), compresslevel=1) if rng.random() < 0.5 else bytes(data)


ARCHIVES: dict[str, Callable[[random.Random, list], bytes]] = {"zip": zipped, "tar": tarred}


def flip_parquet_bytes(folder: Path, seed: int) -> None:
    """1-6 random bytes of one of a saved Trace folder's Parquet files overwritten (half of them in
    the footer, where Parquet keeps its schema and pandas' metadata)."""
    rng = random.Random(seed)
    path = folder / rng.choice(["counters.parquet", "events.parquet", "memory.parquet"])
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(data)) if rng.random() < 0.5 else rng.randrange(max(0, len(data) - 3000), len(data))
        data[i] = rng.randrange(256)
    path.write_bytes(bytes(data))

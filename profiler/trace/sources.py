"""Turn what a user hands us (paths, bytes, file-likes, lists, directories, zips, tars) into JSON bytes.

Each trace file becomes one `Payload` (a label naming it and its decompressed bytes), produced
lazily so that only one file's bytes are alive at a time. Compression is sniffed from magic
bytes, not from names. Decompression streams in bounded steps against a shared byte budget, so a
decompression bomb is refused after at most one step past the cap. Zip and tar members with
absolute or `..` paths are refused; a tar's links and devices are passed over. Nothing is
unpickled: the only decoder downstream is a JSON parser.
"""
from __future__ import annotations

import io
import lzma
import mmap
import os
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator

from profiler.errors import first_line
from profiler.trace.model import TraceError

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
STEP_BYTES = 16 << 20  # decompress at most this much per step before checking the budget
TRACE_SUFFIXES = (".json", ".json.gz")
# Files users hand over by mistake, by their first bytes: (magic, what it is and what to do instead).
# Only named when the JSON parse fails, so a trace that happens to start so still loads.
OTHER_FORMATS: tuple[tuple[bytes, str], ...] = (
    (b"SQLite format 3\x00", "an SQLite database (an Nsight Systems `nsys export --type sqlite`?); "
                             "export the PyTorch profiler's JSON trace instead"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data; decompress it (`zstd -d`) or recompress it with gzip"),
    (b"BZh", "bzip2-compressed data; decompress it (`bunzip2`) or recompress it with gzip"),
    (b"\xfd7zXZ\x00", "xz-compressed data; decompress it (`unxz`) or recompress it with gzip"),
    (b"PAR1", "a Parquet file; a saved FusionLens Trace is opened as its folder"),
    (b"\x89HDF\r\n", "an HDF5 file"),
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\x7fELF", "an executable (ELF)"),
)
PICKLE_PROTOCOLS = range(2, 6)  # b"\x80" + protocol: a CUDA memory snapshot (`_dump_snapshot`) is one


def other_format(head: bytes) -> str | None:
    """What a file that is not JSON looks like from its first bytes (None: nothing recognised)."""
    for magic, what in OTHER_FORMATS:
        if head.startswith(magic):
            return what
    if len(head) > 1 and head[0] == 0x80 and head[1] in PICKLE_PROTOCOLS:
        return ("a Python pickle (a CUDA memory snapshot from `torch.cuda.memory._dump_snapshot`?); FusionLens "
                "reads the profiler's JSON trace and never unpickles")
    if b"\x00" in head[:64]:
        return "binary data, not JSON text"
    return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB" if n >= (1 << 30) else f"{n / (1 << 20):.3g} MiB"


@dataclass
class Budget:
    """Decompressed bytes still allowed for this load (shared by every file of it)."""

    limit: int
    used: int = 0

    def take(self, n: int, label: str) -> None:
        self.used += n
        if self.used > self.limit:
            raise TraceError(f"{label}: decompressed data exceeds the limit of {_gib(self.limit)} "
                             "(a decompression bomb or a trace too large; raise --max-decompressed-gb / "
                             "max_decompressed_bytes)")


@dataclass
class Payload:
    """One trace file's JSON bytes and its label.

    `buf` is bytes, a bytearray or a view of `mm`, an mmap that the decoder may release page by
    page as it goes: a read-only map of the file itself (`file_backed`: pages can be dropped and
    re-read) or an anonymous map holding decompressed data (pages can be dropped once consumed).
    """

    label: str
    buf: Any
    mm: mmap.mmap | None = None
    file_backed: bool = False
    path: str | None = None  # the file itself when file_backed (parallel decoders map it again)
    found: bool = False  # found inside a directory or an archive, not named by the caller

    def release(self) -> None:
        """Drop the bytes (and unmap) once decoded."""
        try:
            if isinstance(self.buf, memoryview):
                self.buf.release()
            if self.mm is not None:
                self.mm.close()
        except BufferError:  # a view is still alive somewhere; the GC unmaps it later
            pass
        self.buf = self.mm = None


class _Sink:
    """Decompressed output: into an anonymous mmap of the expected size when known (its pages can
    be handed back while decoding), else into a growing bytearray."""

    def __init__(self, size_hint: int | None) -> None:
        # private, so pages handed back with MADV_DONTNEED are really freed (not kept as shmem)
        self.mm = mmap.mmap(-1, size_hint, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if size_hint else None
        self.data = bytearray()
        self.n = 0

    def write(self, piece: bytes) -> None:
        end = self.n + len(piece)
        if self.mm is not None and end > len(self.mm):  # the hint was wrong: spill to a bytearray
            self.data = bytearray(self.mm[:self.n])
            self.mm.close()
            self.mm = None
        if self.mm is not None:
            self.mm[self.n:end] = piece
        else:
            self.data += piece
        self.n = end

    def payload(self, label: str) -> Payload:
        if self.mm is None:
            return Payload(label, self.data)
        buf = self.mm if self.n == len(self.mm) else memoryview(self.mm)[:self.n]
        return Payload(label, buf, self.mm)


def gzip_size_hint(tail: bytes, compressed: int, budget: Budget) -> int | None:
    """The gzip trailer's ISIZE (uncompressed size mod 2**32) when plausible, capped by the budget."""
    if len(tail) != 4:
        return None
    size = int.from_bytes(tail, "little")
    if size == 0 or compressed > (1 << 31):  # empty, or possibly beyond 4 GiB (ISIZE wraps)
        return None
    return min(size, budget.limit - budget.used + 1)


def gunzip(chunks: Iterator[bytes], label: str, budget: Budget, size_hint: int | None = None) -> Payload:
    """Stream-decompress (possibly multi-member) gzip data under the budget."""
    out = _Sink(size_hint)
    dec = zlib.decompressobj(wbits=31)
    started = False  # the current member has received input
    try:
        for chunk in chunks:
            data = chunk
            while data:
                started = True
                piece = dec.decompress(data, STEP_BYTES)
                budget.take(len(piece), label)
                out.write(piece)
                if dec.eof:  # end of one member: maybe another follows
                    rest = dec.unused_data
                    dec, started = zlib.decompressobj(wbits=31), False
                    data = rest if rest.strip(b"\x00") else b""
                    continue
                data = dec.unconsumed_tail
                if not data and len(piece) == STEP_BYTES:
                    data = b""
                    while len(piece) == STEP_BYTES and not dec.eof:  # drain pending output
                        piece = dec.decompress(b"", STEP_BYTES)
                        budget.take(len(piece), label)
                        out.write(piece)
    except zlib.error as exc:
        raise TraceError(f"{label}: corrupt gzip data ({exc})") from None
    if started and not dec.eof:
        raise TraceError(f"{label}: truncated gzip file (the compressed stream ends early)")
    return out.payload(label)


def _chunks_of(buf: Any, size: int = STEP_BYTES) -> Iterator[bytes]:
    view = memoryview(buf)
    for i in range(0, len(view), size):
        yield view[i:i + size]


def _file_chunks(fh: Any, size: int = STEP_BYTES) -> Iterator[bytes]:
    while True:
        block = fh.read(size)
        if not block:
            return
        yield block


def _from_bytes(buf: Any, label: str, budget: Budget) -> Iterator[Payload]:
    head = bytes(buf[:4])
    if head[:2] == GZIP_MAGIC:
        hint = gzip_size_hint(bytes(buf[-4:]), len(buf), budget)
        yield gunzip(_chunks_of(buf), label, budget, hint)
    elif head == ZIP_MAGIC:
        yield from _from_zip(io.BytesIO(buf), label, budget)
    else:
        budget.take(len(buf), label)
        yield Payload(label, buf)


# What zipfile and its decompressors raise on damaged or unsupported archives: BadZipFile, zlib /
# LZMA errors, bz2's OSError ("Invalid data stream"), EOFError, NotImplementedError (a compression
# method Python lacks), RuntimeError (an encrypted member), ValueError (a negative seek from a
# damaged offset). Found by fuzzing zip bytes: each used to escape load_trace as itself.
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, NotImplementedError,
              RuntimeError, ValueError)


def _one_line(exc: BaseException) -> str:
    return first_line(exc) or type(exc).__name__


def _member_problem(exc: BaseException) -> str:
    """What is wrong with a zip member, in words, from the exception reading it raised."""
    if isinstance(exc, RuntimeError) and "encrypted" in str(exc):
        return "encrypted zip member (password-protected archives are not supported)"
    if isinstance(exc, NotImplementedError):
        return f"zip member compressed with a method this Python cannot read ({_one_line(exc)})"
    return f"corrupt zip member ({_one_line(exc)})"


def _is_trace_member(name: str) -> bool:
    """An archive member that holds a trace by its name: .json / .json.gz, not macOS's resource
    forks (`__MACOSX/...` in zips, `._name` in tars and zips made on a Mac)."""
    base = PurePosixPath(name.replace("\\", "/")).name
    return name.lower().endswith(TRACE_SUFFIXES) and not name.startswith("__MACOSX/") and not base.startswith("._")


def _trace_members(infos: list, name_of: Callable[[Any], str], is_file: Callable[[Any], bool], label: str,
                   kind: str) -> list:
    """An archive's trace members sorted by name, after refusing the whole archive when any member
    has an absolute or `..` path; TraceError when none holds a trace."""
    for info in infos:
        _check_member_name(name_of(info), label)
    members = sorted((i for i in infos if is_file(i) and _is_trace_member(name_of(i))), key=name_of)
    if not members:
        names = [name_of(i) for i in infos]
        hint = (" (a torch.save checkpoint: its tensors, not a profile)"
                if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names) else "")
        raise TraceError(f"{label}: the {kind} archive holds no .json or .json.gz trace{hint}")
    return members


def _check_member_name(name: str, label: str) -> None:
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or ".." in parts:
        raise TraceError(f"{label}: refusing zip member with an absolute or '..' path: {name!r}")


def _from_zip(fh: Any, label: str, budget: Budget) -> Iterator[Payload]:
    try:
        zf = zipfile.ZipFile(fh)
    except ZIP_ERRORS as exc:  # a damaged directory: BadZipFile, or a negative seek (ValueError)
        raise TraceError(f"{label}: not a readable zip archive ({_one_line(exc)})") from None
    with zf:
        members = _trace_members(zf.infolist(), lambda i: i.filename, lambda i: not i.is_dir(), label, "zip")
        for info in members:
            mlabel = f"{label}!{info.filename}"
            try:
                with zf.open(info) as member:
                    head = member.read(2)
                    rest = _file_chunks(member)
                    if head == GZIP_MAGIC:
                        payload = gunzip(_prepend(head, rest), mlabel, budget)
                    else:
                        buf = bytearray()
                        for block in _prepend(head, rest):
                            budget.take(len(block), mlabel)
                            buf += block
                        payload = Payload(mlabel, buf)
            except TraceError:  # over the budget, or a bad gzip inside: already one line
                raise
            except ZIP_ERRORS as exc:
                raise TraceError(f"{mlabel}: {_member_problem(exc)}") from None
            payload.found = True
            yield payload


def _prepend(head: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if head:
        yield head
    yield from rest


TAR_MAGIC_AT = 257  # POSIX ustar and GNU tar headers say "ustar" at this offset of each 512-byte block


def _is_tar(buf: Any, label: str) -> bool:
    """A tar header first: "ustar" at 257 and the header's own checksum right (the sum of its 512
    bytes with the checksum field read as spaces), so a JSON file can never be taken for one. The
    magic with a wrong checksum and no JSON start is a tar whose first header is damaged."""
    if len(buf) < 512 or bytes(buf[TAR_MAGIC_AT:TAR_MAGIC_AT + 5]) != b"ustar":
        return False
    header = bytes(buf[:512])
    try:
        stored = int(header[148:156].replace(b"\x00", b" ").strip() or b"-1", 8)
    except ValueError:
        stored = -1
    if stored == sum(header[:148]) + 8 * 32 + sum(header[156:]):
        return True
    if header.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] not in (b"{", b"["):
        raise TraceError(f"{label}: not a readable tar archive (its first header fails its checksum)")
    return False


class _ViewReader(io.RawIOBase):
    """A read-only, seekable file over a buffer (bytes, an mmap, a view) without copying it, for
    tarfile (io.BytesIO would copy a whole decompressed archive)."""

    def __init__(self, buf: Any) -> None:
        super().__init__()
        self.view, self.pos = memoryview(buf).cast("B"), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self.view) - self.pos))
        b[:n] = self.view[self.pos:self.pos + n]
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.view)}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.view.release()
        super().close()


# What tarfile raises on a damaged archive: TarError (ReadError, HeaderError, ...), EOFError,
# OSError, ValueError (bad numbers in a header; UnicodeDecodeError in a name).
TAR_ERRORS = (tarfile.TarError, EOFError, OSError, ValueError)


def _untar(payload: Payload, budget: Budget) -> Iterator[Payload]:
    """A tar archive's trace members (.json as views into the archive's bytes, .json.gz gunzipped
    under the budget), by name; the archive's bytes were charged to the budget already, and stay
    mapped until the last member's view is released. Other payloads pass through."""
    if not _is_tar(payload.buf, payload.label):
        yield payload
        return
    label = payload.label
    reader = _ViewReader(payload.buf)
    try:
        try:
            with tarfile.open(fileobj=reader, mode="r:") as tf:
                members = _trace_members(tf.getmembers(), lambda i: i.name, lambda i: i.isfile(), label, "tar")
                data = [(f"{label}!{i.name}", reader.view[i.offset_data:i.offset_data + i.size]) for i in members]
                # Decoded in name order; when that is also the archive's order, each member may hand
                # back the archive's pages as it goes (a page it shares with the member before is
                # that member's, decoded already); otherwise the archive stays whole until the end.
                offsets = [i.offset_data for i in members]
                shared_mm = payload.mm if offsets == sorted(offsets) else None
        except TraceError:
            raise
        except TAR_ERRORS as exc:
            raise TraceError(f"{label}: not a readable tar archive ({_one_line(exc)})") from None
        for mlabel, view in data:
            if bytes(view[:2]) == GZIP_MAGIC:
                member = gunzip(_chunks_of(view), mlabel, budget)
                view.release()
            else:  # a view into the archive, not a copy
                member = Payload(mlabel, view, shared_mm)
            member.found = True
            yield member
    finally:
        reader.close()
        payload.release()


def _from_path(path: Path, budget: Budget) -> Iterator[Payload]:
    label = str(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(TRACE_SUFFIXES))
        if not files:
            raise TraceError(f"{label}: the directory holds no .json or .json.gz trace")
        for p in files:
            for payload in _from_path(p, budget):
                payload.found = True
                yield payload
        return
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise TraceError(f"{label}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{label}: cannot open ({exc.strerror or exc})") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(4)
        if size == 0:
            raise TraceError(f"{label}: empty file")
        if head[:2] == GZIP_MAGIC:
            fh.seek(-4, os.SEEK_END)
            hint = gzip_size_hint(fh.read(4), size, budget)
            fh.seek(0)
            yield gunzip(_file_chunks(fh), label, budget, hint)
            return
        if head == ZIP_MAGIC:
            fh.seek(0)
            yield from _from_zip(fh, label, budget)
            return
        budget.take(size, label)
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    yield Payload(label, mm, mm, file_backed=True, path=str(path))


def iter_payloads(sources: Any, max_decompressed_bytes: int) -> Iterator[Payload]:
    """Yield one Payload per trace file found in `sources` (see load_trace for what it accepts)."""
    if isinstance(max_decompressed_bytes, bool) or not isinstance(max_decompressed_bytes, (int, float)) \
            or not max_decompressed_bytes >= 1 or max_decompressed_bytes == float("inf"):
        raise TraceError(f"max_decompressed_bytes must be a number of bytes >= 1, got {max_decompressed_bytes!r}")
    budget = Budget(int(max_decompressed_bytes))
    items = list(sources) if isinstance(sources, (list, tuple)) else [sources]
    if not items:
        raise TraceError("no trace given")
    for i, src in enumerate(items):
        if isinstance(src, (str, os.PathLike)):
            found = _from_path(Path(src), budget)
        elif isinstance(src, (bytes, bytearray, memoryview)):
            label = f"<bytes #{i}>" if len(items) > 1 else "<bytes>"
            if len(src) == 0:
                raise TraceError(f"{label}: empty input")
            found = _from_bytes(src, label, budget)
        elif hasattr(src, "read"):
            label = str(getattr(src, "name", None) or (f"<file-like #{i}>" if len(items) > 1 else "<file-like>"))
            data = src.read()
            if isinstance(data, str):
                data = data.encode()
            if not data:
                raise TraceError(f"{label}: empty file")
            found = _from_bytes(data, label, budget)
        else:
            raise TraceError(f"cannot read a trace from a {type(src).__name__} (give a path, bytes or a file)")
        for payload in found:  # a tar (plain or gzipped) becomes its trace members
            yield from _untar(payload, budget)

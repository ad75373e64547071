"""Pull columns out of decoded event Structs, chunk by chunk, into an Accumulator.

Every column is extracted with `map(attrgetter(field), structs)` fed to `np.fromiter` (C loops);
the rare value of an unexpected type (a string stream id, a null) drops to a Python fallback for
that column of that chunk only. Kind-specific columns (kernel launch config, cpu_op shapes,
python ids, NCCL fields) are extracted only over the rows of the kinds that carry them. Kind-specific
columns are kept sparse (row index, values) until the final frame is built, so a column that only
kernels carry costs memory only for kernels. Rows that
fail validation (no numeric ts/dur, negative or absurd numbers, no name) are skipped and counted.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Mapping, Optional

import msgspec
import numpy as np
import pandas as pd

from profiler.trace._structs import (COUNTER_DECODER, COUNTERS_DECODER, EMPTY_ARGS, EMPTY_RAW, MISSING, NAN,
                                     RAW_LIST_DECODER)
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
# Events no column reads are tallied by label (their category for `ph: X`, else their phase), so a
# trace of another tool (a JAX/TensorFlow Chrome trace, Nsight's export) says what it held instead
# of loading as an empty Trace. Not tallied: flows of other categories (Kineto's `fwdbwd` links) and
# Kineto's own whole-capture span ("PyTorch Profiler (0)", category "Trace"): not events of the run.
KINETO_SPAN_CAT = "Trace"
FLOW_PHASES = frozenset({"s", "t", "f"})
MAX_UNREAD_LABELS = 20  # distinct labels kept; the rest are counted together
UNREAD_OTHER = "(other categories)"

_K = KIND_INDEX
NCCL_KINDS = (_K["kernel"], _K["cpu_op"], _K["user_annotation"])
OP_KINDS = (_K["cpu_op"], _K["user_annotation"])
KERNEL = (_K["kernel"],)
DEVICE_KINDS = (_K["kernel"], _K["gpu_memcpy"], _K["gpu_memset"], _K["gpu_user_annotation"], _K["cuda_sync"])
COPY_KINDS = (_K["gpu_memcpy"], _K["gpu_memset"])
# Args-derived columns: (column, Args attribute, value type, kinds that carry it or None = all rows).
ARG_COLUMNS = (
    ("correlation", "correlation", "int", None),
    ("device", "device", "int", DEVICE_KINDS), ("stream", "stream", "int", DEVICE_KINDS),
    ("bytes", "bytes", "int", COPY_KINDS), ("memory_bw_gb_s", "memory_bw", "float", COPY_KINDS),
    ("grid", "grid", "dim3", KERNEL), ("block", "block", "dim3", KERNEL),
    ("registers_per_thread", "registers_per_thread", "int", KERNEL),
    ("shared_memory_bytes", "shared_memory", "int", KERNEL),
    ("blocks_per_sm", "blocks_per_sm", "float", KERNEL), ("warps_per_sm", "warps_per_sm", "float", KERNEL),
    ("occupancy_pct", "occupancy_pct", "float", KERNEL),
    ("collective_name", "collective_name", "str", NCCL_KINDS), ("comm_dtype", "dtype", "str", NCCL_KINDS),
    ("process_group_name", "pg_name", "str", NCCL_KINDS), ("process_group_desc", "pg_desc", "str", NCCL_KINDS),
    ("in_msg_nelems", "in_msg_nelems", "int", NCCL_KINDS), ("out_msg_nelems", "out_msg_nelems", "int", NCCL_KINDS),
    ("group_size", "group_size", "int", NCCL_KINDS),
    ("sequence_number", "sequence_number", "int", OP_KINDS), ("fwd_thread_id", "fwd_thread_id", "int", OP_KINDS),
    ("input_dims", "input_dims", "json", OP_KINDS), ("input_types", "input_types", "json", OP_KINDS),
    ("python_id", "python_id", "int", (_K["python_function"],)),
    ("python_parent_id", "python_parent_id", "int", (_K["python_function"],)),
)
MEMORY_ARGS = (("device_type", "device_type"), ("device_id", "device_id"), ("bytes", "mem_bytes"),
               ("total_allocated", "total_allocated"), ("total_reserved", "total_reserved"),
               ("addr", "addr"))
CODED_COLUMNS = frozenset({"name"} | {c for c, _, vt, _ in ARG_COLUMNS if vt in ("str", "json")})
_DEFAULT = {"int": MISSING, "float": NAN, "str": None, "json": EMPTY_RAW, "dim3": None}
MAX_TS_TEXT = 64  # bytes: longer `ts` texts (no plain number is) are read one by one
_SEP = "\x1e"  # never inside a JSON text (raw control characters are invalid JSON)
_SEP_B = _SEP.encode()

_PH, _CAT, _NAME, _TS, _DUR = (attrgetter(a) for a in ("ph", "cat", "name", "ts", "dur"))
_PID, _TID, _ID, _ARGS = (attrgetter(a) for a in ("pid", "tid", "id", "args"))
_DIGITS = re.compile(r"-?\d+")


class Growable:
    """An append-only array grown by doubling: chunks land in one large allocation (no list of
    small pieces to concatenate, no heap fragmentation); untouched capacity costs no RSS."""

    def __init__(self, first: np.ndarray, capacity: int) -> None:
        self.buf = np.empty((max(capacity, len(first)),) + first.shape[1:], first.dtype)
        self.n = 0
        self.append(first)

    def append(self, piece: np.ndarray) -> None:
        need = self.n + len(piece)
        if need > len(self.buf):
            bigger = np.empty((max(need, 2 * len(self.buf)),) + self.buf.shape[1:], self.buf.dtype)
            bigger[:self.n] = self.buf[:self.n]
            self.buf = bigger
        self.buf[self.n:need] = piece
        self.n = need

    def array(self) -> np.ndarray:
        return self.buf[:self.n]


@dataclass
class Accumulator:
    """Per-chunk column pieces of one file, concatenated once at the end."""

    rows: dict[str, Growable] = field(default_factory=dict)  # dense columns
    sparse: dict[str, tuple[Growable, Growable]] = field(default_factory=dict)  # (row index, values)
    flows: dict[str, Growable] = field(default_factory=dict)
    memory: dict[str, Growable] = field(default_factory=dict)
    capacity: int = 1 << 16  # initial rows per column (decode sets it from the file size)
    counters: list[tuple] = field(default_factory=list)
    process_names: dict[str, str] = field(default_factory=dict)
    thread_names: dict[str, str] = field(default_factory=dict)
    json_cache: dict[str, str | None] = field(default_factory=dict)
    vocab: dict[str, dict[str, int]] = field(default_factory=dict)  # coded column -> text -> code
    id_cache: dict[str, int] = field(default_factory=dict)
    n_rows: int = 0
    unread: Counter = field(default_factory=Counter)  # label -> events no column reads (see tally_unread)
    ts_base: Optional[int] = None  # None: ts decoded as float64; else events are ExactEvents, ts - ts_base

    def ts(self, objs: list) -> np.ndarray:
        """float64 `ts` of the decoded events: as decoded, or exact offsets from `ts_base`."""
        if self.ts_base is None:
            return floats(objs, _TS)
        return exact_ts(list(map(_TS, objs)), self.ts_base)

    def add(self, table: dict[str, Growable], col: str, piece: np.ndarray) -> None:
        if col in table:
            table[col].append(piece)
        else:
            table[col] = Growable(piece, self.capacity if table is self.rows else self.capacity // 8)

    def add_sparse(self, col: str, where: np.ndarray, vals: np.ndarray) -> None:
        if col in self.sparse:
            self.sparse[col][0].append(where)
            self.sparse[col][1].append(vals)
        else:
            cap = self.capacity // 8
            self.sparse[col] = (Growable(where, cap), Growable(vals, cap))

    def encode(self, col: str, values: list) -> np.ndarray:
        """int32 codes into this file's vocabulary of `col` (-1 for None): hashing in C."""
        codes, uniques = pd.factorize(np.asarray(values, dtype=object))
        vocab = self.vocab.setdefault(col, {})
        lut = np.fromiter((vocab.setdefault(u, len(vocab)) for u in uniques), np.int32, len(uniques))
        return np.where(codes >= 0, lut[codes] if len(lut) else -1, -1).astype(np.int32)


def tally_unread(unread: Counter, label: str, n: int = 1) -> None:
    """Count `n` unread events under `label` (cut to 60 characters, control characters and line
    breaks as '?': it goes into one-line messages); past MAX_UNREAD_LABELS distinct labels, under
    UNREAD_OTHER (a damaged file cannot grow the meta without bound)."""
    label = label if len(label) <= 60 else label[:59] + "…"
    if not label.isprintable():
        label = "".join(c if c.isprintable() else "?" for c in label)
    if label not in unread and len(unread) - (UNREAD_OTHER in unread) >= MAX_UNREAD_LABELS - 1:
        label = UNREAD_OTHER  # at most MAX_UNREAD_LABELS - 1 labels of their own, in any order of arrival
    unread[label] += n


def most_first(unread: Mapping[str, int]) -> dict[str, int]:
    """The unread counts, most frequent first (a saved Trace's meta.json comes back sorted by label)."""
    return {str(k): int(v) for k, v in sorted(unread.items(), key=lambda kv: -kv[1])}


def describe_unread(unread: Mapping[str, int], most: int = 4) -> str:
    """'(no category) x2, "XLA Ops" x1': the most frequent labels, for one-line messages."""
    shown = ", ".join(f"{k} x{v:,}" for k, v in list(most_first(unread).items())[:most])
    return shown + (f" and {len(unread) - most} more" if len(unread) > most else "")


def _unread(evs: list, idx: np.ndarray, phs: list, acc: "Accumulator") -> None:
    """Tally the events at `idx` (none of them read into a column) by category or phase."""
    for i in idx.tolist():
        ph = phs[i]
        if ph == "X":
            cat = evs[i].cat
            if cat != KINETO_SPAN_CAT:
                tally_unread(acc.unread, f'"{cat}"' if cat is not None else "(no category)")
        elif ph not in FLOW_PHASES:
            tally_unread(acc.unread, f'ph "{ph}" events' if ph is not None else "(no ph)")


def undecodable(skipped: Counter) -> int:
    """Skipped events that never decoded (as opposed to decoded rows failing validation)."""
    return sum(v for k, v in skipped.items() if k not in VALIDATION_REASONS)


def ints(objs: list, get: Any) -> np.ndarray:
    """int64 column of get(obj) (or of the values themselves when get is None); absent or
    non-integer values become MISSING."""
    try:
        return np.fromiter(objs if get is None else map(get, objs), np.int64, len(objs))
    except (TypeError, ValueError, OverflowError):
        vals = objs if get is None else map(get, objs)
        return np.fromiter((v if type(v) is int else MISSING for v in vals), np.int64, len(objs))


def floats(objs: list, get: Any) -> np.ndarray:
    """float64 column like `ints`; absent or non-numeric values become NaN."""
    try:
        return np.fromiter(objs if get is None else map(get, objs), np.float64, len(objs))
    except (TypeError, ValueError):
        vals = objs if get is None else map(get, objs)
        return np.fromiter((v if type(v) in (int, float) else np.nan for v in vals), np.float64, len(objs))


def exact_ts(texts: list, base: int) -> np.ndarray:
    """float64 value - `base` of each JSON number text (msgspec.Raw or bytes), exact to the
    nanosecond for epoch-µs timestamps: the integer part is subtracted as int64 before any rounding,
    the fraction (up to 9 digits) added after. NaN where the text is no JSON number (missing, a
    string, null); exponent forms go through float() (as exact as float64 is there)."""
    n = len(texts)
    if n == 0:
        return np.empty(0)
    short = texts
    long_ = np.fromiter(map(len, texts), np.int64, n) > MAX_TS_TEXT
    if long_.any():  # a damaged file's 4 MB string would widen every row of the fixed-width array
        short = [b"" if far else t for t, far in zip(texts, long_.tolist())]
    arr = np.array(_SEP_B.join(short).split(_SEP_B))  # fixed-width bytes, one C pass
    whole, dot, frac = np.strings.partition(arr, b".")
    neg = np.strings.startswith(whole, b"-")
    digits = np.where(neg, np.strings.lstrip(whole, b"-"), whole)
    plain = (np.strings.isdigit(digits) & (np.strings.str_len(digits) <= 18)
             & ((dot == b"") | np.strings.isdigit(frac)))
    frac = frac.astype("S9")  # beyond 9 digits (sub-femtosecond): cut
    k = np.strings.str_len(frac)
    ints_ = np.where(plain, whole, b"0").astype(np.int64)
    fracs = np.where(plain & (k > 0), frac, b"0").astype(np.int64)
    out = (ints_ - base).astype(np.float64) + np.where(neg, -fracs, fracs) / 10.0 ** k
    odd = ~plain
    if odd.any():
        out[odd] = np.nan
        for i in np.flatnonzero(odd & ((np.strings.str_len(arr) > 0) | long_)).tolist():
            try:  # 1.7e15, or 19+ integer digits: float64 is the best there is
                out[i] = float(bytes(texts[i])) - base
            except ValueError:  # a string, null, true, an object: no number
                pass
    return out


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


def compact_json(raws: list, cache: dict[str, str | None]) -> list:
    """msgspec.Raw values -> compact JSON text, empty -> None. Joined, decoded and split in C; each
    distinct text is re-encoded once (shapes and dtypes repeat a lot). A Raw is the file's bytes
    unchecked: invalid UTF-8 in one becomes U+FFFD (the separator, ASCII, survives), not an error."""
    texts = _SEP_B.join(map(bytes, raws)).decode("utf-8", "replace").split(_SEP) if raws else []
    for text in set(texts).difference(cache):
        try:
            cache[text] = msgspec.json.encode(msgspec.json.decode(text)).decode() if text else None
        except msgspec.DecodeError:
            cache[text] = None
    return list(map(cache.__getitem__, texts))


def _values(objs: list, attr: str, vtype: str, acc: "Accumulator", col: str) -> Any:
    """One args column over `objs`, or None when no object carries the field."""
    vals = list(map(attrgetter(attr), objs))
    if vals.count(_DEFAULT[vtype]) == len(vals):
        return None
    if vtype == "int":
        return ints(vals, None)
    if vtype == "float":
        return floats(vals, None)
    if vtype == "str":
        return acc.encode(col, [v if type(v) is str else None for v in vals])
    if vtype == "json":
        return acc.encode(col, compact_json(vals, acc.json_cache))
    out = np.full((len(vals), 3), MISSING, np.int64)  # dim3: [x, y, z] lists
    good = [i for i, v in enumerate(vals) if type(v) is list and len(v) == 3]
    if good:
        out[good] = [vals[i] for i in good]
    return out


def _empty(vtype: str, n: int) -> Any:
    if vtype == "int":
        return np.full(n, MISSING, np.int64)
    if vtype == "float":
        return np.full(n, np.nan)
    if vtype == "dim3":
        return np.full((n, 3), MISSING, np.int64)
    return np.full(n, -1, np.int32)  # str / json: codes


def _take(seq: list, idx: np.ndarray) -> list:
    """[seq[i] for i in idx], gathered in C."""
    if len(idx) < 2:
        return [seq[i] for i in idx.tolist()]
    return list(itemgetter(*idx.tolist())(seq))


def _rows(evs: list, idx: np.ndarray, kinds: np.ndarray, acc: Accumulator, skipped: Counter) -> None:
    rows = _take(evs, idx)
    ts, dur = acc.ts(rows), floats(rows, _DUR)
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
        rows, names = _take(rows, keep), _take(names, keep)
        ts, dur, kinds = ts[keep], dur[keep], kinds[keep]
    n = len(rows)
    if n == 0:
        return
    offset = acc.n_rows  # row index of this chunk's first row within the file
    acc.n_rows += n
    R = acc.rows
    acc.add(R, "kind", kinds.astype(np.int8))
    acc.add(R, "name", acc.encode("name", names))
    acc.add(R, "ts", ts)
    acc.add(R, "dur", dur)
    acc.add(R, "pid", ids(rows, _PID, acc.id_cache))
    acc.add(R, "tid", ids(rows, _TID, acc.id_cache))
    args = list(map(_ARGS, rows))
    if None in args:  # events without args
        args = [a if a is not None else EMPTY_ARGS for a in args]
    ext = ints(args, attrgetter("external_id"))
    if (ext == MISSING).any():
        ext = np.where(ext == MISSING, ints(args, attrgetter("external_id_2021")), ext)
    acc.add(R, "external_id", ext)
    subsets: dict[Any, tuple[np.ndarray | None, list]] = {None: (None, args)}
    for col, attr, vtype, codes in ARG_COLUMNS:
        if codes not in subsets:
            where = np.flatnonzero(np.isin(kinds, codes))
            subsets[codes] = (where, _take(args, where))
        where, objs = subsets[codes]
        vals = _values(objs, attr, vtype, acc, col) if objs else None
        if where is None:  # every row carries it: a dense column
            acc.add(R, col, vals if vals is not None else _empty(vtype, n))
        elif vals is not None:  # kind-specific: kept sparse as (row index, values)
            acc.add_sparse(col, where + offset, vals)


def _flows(evs: list, idx: np.ndarray, codes: np.ndarray, acc: Accumulator, skipped: Counter) -> None:
    objs = _take(evs, idx)
    ts, fid = acc.ts(objs), ints(objs, _ID)
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
    ts = acc.ts(objs)
    keep = np.flatnonzero(np.isfinite(ts))
    objs = [objs[i] for i in keep.tolist()]
    args = [a if a is not None else EMPTY_ARGS for a in map(_ARGS, objs)]
    acc.add(acc.memory, "ts", ts[keep])
    for col, attr in MEMORY_ARGS:
        acc.add(acc.memory, col, ints(args, attrgetter(attr)))


def _counter_events(chunk: bytes) -> list:
    """The chunk's events as CounterEvents; on a failure (a wrong type, or invalid UTF-8 in a
    string the row decoder never read), one by one, leaving out the ones that fail: counters are
    optional side data, and one broken sample must not take the chunk's others with it."""
    try:
        return COUNTERS_DECODER.decode(chunk)
    except msgspec.DecodeError:  # ValidationError included
        pass
    good = []
    try:
        raws = RAW_LIST_DECODER.decode(chunk)
    except msgspec.DecodeError:
        return good
    for raw in raws:
        try:
            good.append(COUNTER_DECODER.decode(raw))
        except msgspec.DecodeError:
            pass
    return good


def _counters(chunk: bytes, acc: Accumulator) -> None:
    events = _counter_events(chunk)
    base = acc.ts_base or 0  # counter samples keep float64 ts (ms-rate samples: 0.25 µs is nothing)
    for ev in events:
        if ev.ph != "C" or not isinstance(ev.args, dict) or not isinstance(ev.name, str):
            continue
        if not (isinstance(ev.ts, (int, float)) and np.isfinite(ev.ts)):
            continue
        device = ev.pid if type(ev.pid) is int else MISSING
        numeric = {k: v for k, v in ev.args.items() if type(v) in (int, float)}
        for key, value in numeric.items():
            series = ev.name if len(numeric) == 1 else f"{ev.name}.{key}"
            acc.counters.append((float(ev.ts) - base, device, series, float(value)))


def _metadata(evs: list, idx: np.ndarray, acc: Accumulator) -> None:
    for i in idx.tolist():
        ev = evs[i]
        label = ev.args.meta_name if ev.args is not None else None
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
        idx = np.flatnonzero(codes < 0)  # in a Kineto trace: a few (its span, fwdbwd flows)
        if len(idx):
            _unread(evs, idx, phs, acc)
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

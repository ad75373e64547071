"""Readable kernel names: Itanium C++ ABI demangling, shared by trace ingestion and the CUPTI backend.

Kineto demangles CUDA kernel names itself, but ROCm traces (roctracer) and raw CUPTI activity
records carry mangled ones (`_ZN7ck_tile6kentry...`), so the same kernel would be named two ways.
`demangle` turns one name into what Kineto writes (`void ck_tile::kentry<...>(...)`) through
libstdc++'s `abi::__cxa_demangle` reached with ctypes (no package):

- Only `_Z...` names (and the macOS `__Z...` spelling); anything else, or a name no demangler
  accepts, comes back unchanged. It never raises.
- libstdc++'s demangler is as old as the libstdc++ loaded: before GCC 13 it reads the
  `DF16b` (std::bfloat16_t) and `DF<N>_` (_FloatN) manglings that ROCm's ck_tile kernels use
  as fixed-point types (`_Z3fooDF16b` -> `foo(bool _Accum)`, status 0) or rejects them. A probe
  checks this once; then names containing `DF`, and names it rejects, go through binutils'
  `c++filt` (one subprocess per batch) when installed, and otherwise stay mangled: a name is
  never replaced by a wrong one.
- libstdc++ (and libc's `free`, for the buffer the demangler allocates) is found once, lazily;
  `demangle_status()` says what is limited (None: nothing).
- Thread-safe: `__cxa_demangle` with a NULL buffer allocates per call; the probe runs under a
  lock; results are memoised, bounded (`lru_cache` for libstdc++, a capped dict for c++filt).

`demangle_kernel_names` applies it to a Trace's events table: per unique name of `kernel` rows
(the name column is categorical: categories are mapped, not rows), at the cost of one vectorised
`startswith` over the categories when nothing is mangled (every Kineto trace from NVIDIA GPUs).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

MANGLED_PREFIXES = ("_Z", "__Z")  # Itanium; macOS prefixes C symbols (and so `_Z`) with `_`
MAX_MANGLED_CHARS = 1 << 16  # longer "names" are kept as they are (bounded work per name)
CACHE_NAMES = 65536  # distinct names memoised (kernel vocabularies are thousands at most)
CXXFILT_TIMEOUT_S = 20.0
# A GCC >= 13 demangler spells these right; older ones misread or reject them.
PROBE_EXTENDED_FLOAT = ("_Z3fooDF16b", "foo(std::bfloat16_t)")

_SYMBOL = re.compile(r"_?_Z[A-Za-z0-9_.$]*")
_lock = threading.Lock()


@dataclass(frozen=True)
class _Backend:
    cxa: Any  # abi::__cxa_demangle, or None
    free: Any  # libc free, or None
    extended_float_ok: bool  # libstdc++ spells `DF...` types right
    cxxfilt: str | None  # path of binutils' c++filt, the fallback
    reason: str | None  # what is limited; None when nothing is


_backend: _Backend | None = None
_cxxfilt_cache: dict[str, str] = {}


def _libraries(kind: str) -> list[str]:
    """Candidate sonames for libstdc++ ('cxx') or libc ('c'), most specific first."""
    if kind == "cxx":
        names = ["libstdc++.so.6", ctypes.util.find_library("stdc++")]
        if sys.platform == "darwin":  # libc++abi provides __cxa_demangle there
            names += ["libc++abi.dylib", "libc++.1.dylib", ctypes.util.find_library("c++")]
    else:
        names = ["libc.so.6", ctypes.util.find_library("c")]
    return [n for n in dict.fromkeys(names) if n]


def _symbol(kind: str, symbol: str) -> tuple[Any, str | None]:
    """(function, None) from the process's symbols or the first library that has it, else (None, why)."""
    errors = []
    for lib in [None, *_libraries(kind)]:  # None: symbols already loaded into this process
        try:
            return getattr(ctypes.CDLL(lib), symbol), None
        except (OSError, AttributeError) as exc:
            errors.append(f"{lib or 'process'}: {exc}")
    return None, f"{symbol} not found ({'; '.join(errors)})"


def _call_cxa(cxa: Any, free: Any, raw: bytes) -> str | None:
    """libstdc++'s demangling of `raw`, or None when it rejects it (status != 0)."""
    status = ctypes.c_int(-4)
    ptr = cxa(raw, None, None, ctypes.byref(status))
    if not ptr:
        return None
    try:
        text = ctypes.string_at(ptr) if status.value == 0 else b""
    finally:
        free(ptr)
    return text.decode("utf-8", "replace") if text else None


def _detect() -> _Backend:
    tool = shutil.which("c++filt")
    fallback = "such names go through c++filt" if tool else "such names are kept mangled (no c++filt)"
    cxa, why = _symbol("cxx", "__cxa_demangle")
    free, why_free = _symbol("c", "free") if cxa is not None else (None, None)
    if cxa is None or free is None:
        return _Backend(None, None, False, tool, f"libstdc++'s demangler unavailable ({why or why_free}): {fallback}")
    cxa.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    cxa.restype = ctypes.c_void_p  # a pointer we own and must free (c_char_p would copy and leak it)
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    probe, want = PROBE_EXTENDED_FLOAT
    got = _call_cxa(cxa, free, probe.encode())
    if got == want:
        return _Backend(cxa, free, True, tool, None)
    return _Backend(cxa, free, False, tool, f"this libstdc++ predates the DF (std::bfloat16_t, _FloatN) "
                                           f"manglings ({probe} -> {got!r}): {fallback}")


def _get_backend() -> _Backend:
    global _backend
    if _backend is None:
        with _lock:
            if _backend is None:
                _backend = _detect()
    return _backend


def demangle_status() -> str | None:
    """None when every name can be demangled in-process, else what is limited and what happens."""
    return _get_backend().reason


def is_mangled(name: Any) -> bool:
    """True for a str spelled like an Itanium C++ ABI symbol (`_Z...`, `__Z...`)."""
    return isinstance(name, str) and name.startswith(MANGLED_PREFIXES)


def _symbol_bytes(name: str) -> bytes | None:
    """The `_Z...` symbol to hand a demangler, or None when `name` cannot be one.

    Symbols are ASCII letters, digits, `_`, `.` (clone suffixes) and `$`; that is also one whole
    token to c++filt, which would otherwise demangle a `_Z...` prefix and pass the rest through.
    """
    if len(name) > MAX_MANGLED_CHARS or _SYMBOL.fullmatch(name) is None:
        return None
    raw = name.encode("ascii")
    return raw[1:] if raw.startswith(b"__Z") else raw


@functools.lru_cache(maxsize=CACHE_NAMES)
def _via_libstdcxx(name: str) -> str | None:
    """libstdc++'s answer when it can be trusted; None: unknown (ask c++filt, else keep)."""
    backend = _get_backend()
    raw = _symbol_bytes(name)
    if raw is None:
        return name
    if backend.cxa is None or (not backend.extended_float_ok and b"DF" in raw):
        return None
    return _call_cxa(backend.cxa, backend.free, raw)


def _via_cxxfilt(tool: str, names: list[str]) -> dict[str, str]:
    """One `c++filt` run over many names; names it leaves alone (or any failure) are left out."""
    raws = [(_symbol_bytes(n) or b"").decode() for n in names]
    try:
        out = subprocess.run([tool], input="\n".join(raws) + "\n", capture_output=True, text=True,
                             timeout=CXXFILT_TIMEOUT_S, check=False).stdout.splitlines()
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    if len(out) != len(names):
        return {}
    return {n: d for n, r, d in zip(names, raws, out) if r and d and d != r}


def demangle_many(names: Iterable[str]) -> dict[str, str]:
    """{name: demangled} for every distinct input (unchanged when not demangled); never raises."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for name in dict.fromkeys(names):
        if not is_mangled(name):
            out[name] = name
            continue
        try:
            got = _via_libstdcxx(name)
        except Exception:  # noqa: BLE001 - a name must never break ingestion; keep it as written
            got = name
        if got is not None:
            out[name] = got
        elif name in _cxxfilt_cache:
            out[name] = _cxxfilt_cache[name]
        else:
            pending.append(name)
    if pending:
        tool = _get_backend().cxxfilt
        found = _via_cxxfilt(tool, pending) if tool else {}
        with _lock:
            if len(_cxxfilt_cache) + len(pending) > CACHE_NAMES:
                _cxxfilt_cache.clear()
            for name in pending:
                out[name] = _cxxfilt_cache[name] = found.get(name, name)
    return out


def demangle(name: str) -> str:
    """The demangled form of an Itanium-mangled name; any other input is returned unchanged."""
    if not is_mangled(name):
        return name
    return demangle_many((name,))[name]


def cache_clear() -> None:
    """Forget memoised names and the probe (tests that change the environment)."""
    global _backend
    with _lock:
        _backend = None
        _cxxfilt_cache.clear()
    _via_libstdcxx.cache_clear()


def _kernel_rows(kind: pd.Series) -> np.ndarray:
    """Boolean mask of `kernel` rows (categorical kinds compare by code: no per-row string work)."""
    if isinstance(kind.dtype, pd.CategoricalDtype):
        kinds = kind.cat.categories
        return kind.cat.codes.to_numpy() == (kinds.get_loc("kernel") if "kernel" in kinds else -2)
    return np.asarray(kind == "kernel", dtype=bool)


def demangle_kernel_names(events: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Events with mangled names of `kernel` rows demangled, and {demangled: mangled} for those.

    Only categories that are mangled and used by kernel rows change. A mangled name also used by
    other rows keeps its category for them; a demangled name that already exists is merged into
    it. When two mangled names demangle alike, the mapping keeps the first in category order.
    """
    names = events["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype) or names.empty:
        return events, {}
    cats = names.cat.categories
    try:
        starts = cats.str.startswith(MANGLED_PREFIXES)
    except AttributeError:  # categories that are not strings: nothing to demangle
        return events, {}
    mangled = np.flatnonzero(np.asarray(starts.fillna(False) if hasattr(starts, "fillna") else starts, dtype=bool))
    if not len(mangled):  # the common case: one vectorised pass over the vocabulary
        return events, {}
    codes = names.cat.codes.to_numpy()
    kernel = _kernel_rows(events["kind"])
    n_cats = len(cats)
    in_kernel = np.bincount(codes[kernel & (codes >= 0)], minlength=n_cats) > 0
    in_other = np.bincount(codes[~kernel & (codes >= 0)], minlength=n_cats) > 0
    new_cats = list(cats)
    position = {c: i for i, c in enumerate(new_cats)}
    lut = np.arange(n_cats + 1, dtype=np.int64)
    lut[-1] = -1  # code -1 (missing) stays -1
    emptied = []  # categories whose only rows (kernels) moved to an existing name
    renamed: dict[str, str] = {}
    used = mangled[in_kernel[mangled]]
    readable = demangle_many(new_cats[c] for c in used)
    for c in used:
        old = new_cats[c]
        new = readable[old]
        if new == old:
            continue
        renamed.setdefault(new, old)
        if new in position:
            lut[c] = position[new]
            if not in_other[c]:
                emptied.append(old)
        elif not in_other[c]:  # only kernels use it: rename the category itself
            new_cats[c] = new
            position[new] = c
        else:
            position[new] = len(new_cats)
            new_cats.append(new)
            lut[c] = position[new]
    if not renamed:
        return events, {}
    new_codes = codes.astype(np.int64)
    new_codes[kernel] = lut[codes[kernel]]
    merged = pd.Categorical.from_codes(new_codes, categories=new_cats)
    if emptied:
        merged = merged.remove_categories(emptied)
    out = events.copy(deep=False)
    out["name"] = merged
    return out, renamed

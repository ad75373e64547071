"""Where measured provider choices are kept: in memory, and in one JSON file per data dir.

File: `<data dir>/tuning/provider_choice.json` (the data dir of `kernels/_build.py`, which also
holds the C++ extension cache):

    {"format": "fusionlens-provider-choice", "version": 2,
     "machines": {<fingerprint>: {"machine": {cpu, cpus, torch, cpu_ext, triton[, gpu, cuda]},
                                  "decisions": {<call key>: {"provider", "times_us", ...}}}}}

The fingerprint hashes the CPU model (or GPU name), torch's version and the provider builds (the
C++ extension's build hash, Triton's version), so a new build or another machine measures anew.
Writes are atomic (a temporary file in the same directory, then `os.replace`) and merge what other
processes wrote meanwhile. A damaged file or record is ignored with one warning, never raised; an
unwritable directory keeps the decisions in memory only.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernels import _build, choice_memo

FORMAT = "fusionlens-provider-choice"
# 2 (2026-12-02): version 1 files may hold decisions judged on first calls alone (a warm-up that
# counted as the only round), which picked the unfused reference 8x slower: measured anew.
VERSION = 2


def store_path() -> Path:
    """The decisions file of the current data dir (FUSIONLENS_DATA_DIR, default ./.fusionlens)."""
    return _path_for(os.environ.get("FUSIONLENS_DATA_DIR"), os.getcwd())


@functools.lru_cache(maxsize=16)
def _path_for(env_dir: str | None, cwd: str) -> Path:  # resolve() stats the path: once per value
    return _build.data_dir() / "tuning" / "provider_choice.json"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine(device_type: str, index: int | None = None) -> tuple[str, dict[str, Any]]:
    """(fingerprint, its parts) of this machine and provider builds, for decisions on `device_type`.

    Computed once per device in a process (the loaded C++ extension does not change either).
    """
    return _machine(device_type, index)


@functools.cache
def _machine(device_type: str, index: int | None) -> tuple[str, dict[str, Any]]:
    parts: dict[str, Any] = {
        "cpu": _build.cpuinfo(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "cpu_ext": _build.build_dir_for(_build._inputs()).name, "triton": _version("triton"),
    }
    if device_type == "cuda":
        parts["gpu"] = torch.cuda.get_device_name(index)
        parts["cuda"] = torch.version.cuda
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return digest, parts


def _valid_record(rec: Any) -> bool:
    if not isinstance(rec, dict) or not isinstance(rec.get("provider"), str):
        return False
    times = rec.get("times_us")
    return (isinstance(times, dict) and rec["provider"] in times
            and all(isinstance(v, (int, float)) and v >= 0 for v in times.values()))


@dataclass(slots=True)
class Entry:
    """One decision in memory: its JSON record, where it came from, and a memo for the caller."""

    record: dict
    how: str  # "cached" (measured by this process) or "stored" (read from the file)
    memo: Any = None  # the caller's ready-made answer for reuse (tuning keeps its Choice here)


class DecisionStore:
    """Decisions per (file, machine fingerprint): {call key: Entry}."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memory: dict[tuple[str, str], dict[str, Entry]] = {}
        self._warned: set[str] = set()

    def _warn(self, path: Path, what: str) -> None:
        if str(path) + what not in self._warned:
            self._warned.add(str(path) + what)
            warnings.warn(f"FusionLens provider choice: {what} ({path}); measuring anew", RuntimeWarning,
                          stacklevel=4)

    def _read(self, path: Path) -> dict[str, Any]:
        """The file's content, or an empty document if it is missing or damaged (warned once)."""
        try:
            doc = json.loads(path.read_text())
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._warn(path, f"ignored an unreadable decisions file: {type(exc).__name__}: {exc}")
            return {}
        if not (isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("machines"), dict)):
            self._warn(path, "ignored a decisions file of another format")
            return {}
        if doc.get("version") != VERSION:
            return {}
        return doc

    def _decisions(self, path: Path, fp: str) -> dict[str, Entry]:
        slot = (str(path), fp)
        if slot not in self._memory:
            section = self._read(path).get("machines", {}).get(fp, {})
            raw = section.get("decisions", {}) if isinstance(section, dict) else {}
            good = {k: v for k, v in raw.items() if _valid_record(v)} if isinstance(raw, dict) else {}
            if isinstance(raw, dict) and len(good) != len(raw):
                self._warn(path, f"ignored {len(raw) - len(good)} damaged decision(s)")
            self._memory[slot] = {k: Entry(v, "stored") for k, v in good.items()}
        return self._memory[slot]

    def get(self, key: str, device: torch.device) -> Entry | None:
        """The decision of a call key, or None when it was never measured."""
        fp, _ = machine(device.type, device.index)
        with self._lock:
            return self._decisions(store_path(), fp).get(key)

    def put(self, key: str, device: torch.device, record: dict) -> None:
        """Keep a decision in memory and write it to the file (merged, atomically)."""
        fp, parts = machine(device.type, device.index)
        path = store_path()
        with self._lock:
            self._decisions(path, fp)[key] = Entry(record, "cached")
            choice_memo.clear()
            doc = self._read(path) or {"format": FORMAT, "version": VERSION, "machines": {}}
            section = doc["machines"].get(fp)
            if not isinstance(section, dict) or not isinstance(section.get("decisions"), dict):
                section = doc["machines"][fp] = {"machine": parts, "decisions": {}}
            section["decisions"][key] = record
            self._write(path, doc)

    def _write(self, path: Path, doc: dict[str, Any]) -> None:
        """Replace the file with `doc` atomically; warns once when it cannot be written."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".provider_choice.",
                                             suffix=".tmp", delete=False) as tmp:
                json.dump(doc, tmp, indent=1, sort_keys=True)
            os.replace(tmp.name, path)
        except OSError as exc:
            self._warn(path, f"could not write the decisions file: {exc}")
            try:
                os.unlink(tmp.name)
            except (OSError, NameError):
                pass

    def stored(self, device: torch.device) -> dict[str, dict]:
        """Every decision this machine and build has for `device` type: {call key: record}."""
        fp, _ = machine(device.type, device.index)
        with self._lock:
            return {k: e.record for k, e in sorted(self._decisions(store_path(), fp).items())}

    def drop_machine(self, device: torch.device) -> int:
        """Forget (in memory and in the file) every decision of this machine and build for
        `device` type, so the next calls measure anew; other machines' sections stay. Returns how
        many were dropped."""
        fp, _ = machine(device.type, device.index)
        path = store_path()
        with self._lock:
            dropped = len(self._decisions(path, fp))
            self._memory.pop((str(path), fp), None)
            choice_memo.clear()
            doc = self._read(path)
            if doc and doc["machines"].pop(fp, None) is not None:
                self._write(path, doc)
            return dropped

    def forget(self) -> None:
        """Drop the in-memory decisions (the file stays; it is read again on the next lookup)."""
        with self._lock:
            self._memory.clear()
            choice_memo.clear()

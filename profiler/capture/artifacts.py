"""Files a capture leaves behind: the Trace as Parquet (+ meta JSON sidecar) and a summary JSON.

Layout of `save_trace(trace, folder)`: `events.parquet`, `memory.parquet`, `counters.parquet`
(pyarrow keeps categorical and nullable dtypes) and `meta.json`. `load_saved_trace(folder)` reads
them back into an equal Trace. Writes go to a temporary name first and are renamed, so a folder
never holds a half-written file. Nothing here is unpickled.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from profiler.errors import first_line
from profiler.trace.model import Trace, TraceError
from profiler.trace.schema import COLUMNS, COUNTER_COLUMNS, LATER_COLUMNS, MEMORY_COLUMNS

TABLES = {"events": COLUMNS, "memory": MEMORY_COLUMNS, "counters": COUNTER_COLUMNS}


def plain(value: Any) -> Any:
    """JSON-ready copy: mappings -> dict, tuples -> list, numpy scalars -> Python, NaN -> None."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def write_json(path: Path, payload: Any) -> Path:
    """Atomically write `payload` (made plain) as indented JSON."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(plain(payload), indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    df.reset_index(drop=True).to_parquet(tmp, index=False)
    os.replace(tmp, path)


def save_trace(trace: Trace, folder: str | Path) -> dict[str, Path]:
    """Write the Trace's tables as Parquet and its meta as JSON under `folder`; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in TABLES:
        paths[name] = folder / f"{name}.parquet"
        _write_parquet(getattr(trace, name), paths[name])
    paths["meta"] = write_json(folder / "meta.json", trace.meta)
    return paths


# What a capture writes into its --out folder (and nothing else there is ever removed).
RUN_OUTPUTS = ("kineto_rank*.pt.trace.json", "op_costs_rank*.parquet")
REPORT_OUTPUTS = ("roofline.csv", "roofline_modules.csv", "roofline_missing.txt", "summary.json")
MTIME_SLACK_S = 2.0  # file systems that keep whole-second mtimes date a file of this run up to 1 s early


def clear_outputs(folder: str | Path, patterns: tuple[str, ...], before: float | None = None) -> list[Path]:
    """Remove the files `patterns` name in `folder`, only those last written before `before` (a
    `time.time()`) when given: once a capture has run, an earlier capture's files it did not
    rewrite (a second rank's JSON, op costs of a run with the FLOPs pass on, a roofline beside this
    run's roofline_missing.txt) would be read as this run's. Called after the run succeeds, so a
    failed capture loses nothing of an earlier one. Returns what was removed."""
    folder = Path(folder)
    cutoff = None if before is None else before - MTIME_SLACK_S
    removed = [p for pattern in patterns for p in folder.glob(pattern)
               if p.is_file() and (cutoff is None or p.stat().st_mtime < cutoff)]
    for p in removed:
        p.unlink()
    return removed


def saved_trace_folder(path: str | Path) -> Path | None:
    """The saved-Trace folder (Parquet + meta.json, as `capture` writes) that `path` names: the
    folder itself, a capture's `--out` folder holding one under `trace/`, or one of its Parquet
    files; None otherwise."""
    p = Path(path)
    for folder in (p, p / "trace", p.parent if p.suffix == ".parquet" else p):
        if (folder / "events.parquet").is_file() and (folder / "meta.json").is_file():
            return folder
    return None


def is_rank_folder(path: str | Path) -> bool:
    """Whether `path` is a folder of per-rank captures without a saved Trace (what
    `capture_this_rank` leaves under torchrun): Kineto JSON and op costs per rank."""
    p = Path(path)
    return p.is_dir() and all(any(p.glob(pattern)) for pattern in RUN_OUTPUTS)


def recent_captures(root: str | Path, limit: int = 30) -> list[Path]:
    """Capture `--out` folders under `root` (the dashboard's `<data dir>/captures`) that hold a
    saved Trace, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if d.is_dir() and (d / "trace" / "meta.json").is_file()]
    return sorted(found, key=lambda d: (d / "trace" / "meta.json").stat().st_mtime, reverse=True)[:limit]


# The JSON types of the meta keys that ingestion writes and the pages and analyses read: a
# hand-edited meta.json with another type there is refused, not met later as an AttributeError.
_NUMBER = (int, float)
SAVED_META_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "sources": (list,), "t0_us": _NUMBER, "ranks": (list,), "skipped_events": (int,),
    "skipped_reasons": (dict,), "device_properties": (list,), "per_rank": (dict,), "unbound_flows": (int,),
    "distributed_info": (dict, type(None)), "versions": (dict,), "flops_source": (str,), "demangled_names": (dict,),
    "capture": (dict,), "passed_over_files": (list,), "unread_events": (dict,),
}


def _saved_meta_problem(meta: Any) -> str | None:
    """What is wrong with a saved meta.json's content, in a few words; None when it is usable."""
    if not isinstance(meta, dict):
        return f"is a JSON {type(meta).__name__}, not an object"
    for key, types in SAVED_META_TYPES.items():
        if key in meta and (not isinstance(meta[key], types) or isinstance(meta[key], bool)):
            want = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            return f"{key!r} should be {want}, got {type(meta[key]).__name__}"
    items = {"sources": str, "ranks": int, "device_properties": dict}
    for key, item in items.items():
        if any(not isinstance(v, item) or isinstance(v, bool) for v in meta.get(key, ())):
            return f"{key!r} should hold only {item.__name__} values"
    if any(not isinstance(v, dict) for v in meta.get("per_rank", {}).values()):
        return "'per_rank' should map each rank to an object"
    return None


def load_saved_trace(folder: str | Path) -> Trace:
    """Read a folder written by `save_trace`; TraceError (one line) when it is incomplete or damaged
    (unreadable Parquet or JSON, a missing column, a column that does not convert to its schema
    dtype, a meta.json of the wrong shape)."""
    folder = Path(folder)
    try:
        tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in TABLES}
        meta = json.loads((folder / "meta.json").read_text())
    except Exception as exc:  # noqa: BLE001 - see below
        # Damaged Parquet fails in many ways besides OSError / ValueError (ArrowInvalid): pyarrow's
        # ArrowNotImplementedError and ArrowIndexError, pandas' metadata KeyError and TypeError
        # (byte flips, found by fuzzing saved folders). All mean "unreadable", in one line.
        first = first_line(exc)
        raise TraceError(f"saved trace {folder}: unreadable ({type(exc).__name__}: {first})") from None
    problem = _saved_meta_problem(meta)
    if problem:
        raise TraceError(f"saved trace {folder}: meta.json {problem}")
    for name, columns in TABLES.items():
        dtypes = {k: (v[0] if isinstance(v, tuple) else v) for k, v in columns.items()}
        for c in LATER_COLUMNS & (set(dtypes) - set(tables[name].columns)):  # saved before the column existed
            tables[name][c] = pd.Series(pd.NA, index=tables[name].index, dtype="object")
        missing = [c for c in dtypes if c not in tables[name].columns]
        if missing:
            raise TraceError(f"saved trace {folder}: {name}.parquet lacks {', '.join(missing)}")
        try:
            tables[name] = tables[name][list(dtypes)].astype(dtypes)
        except (TypeError, ValueError) as exc:
            first = first_line(exc)
            raise TraceError(f"saved trace {folder}: {name}.parquet does not convert to its schema: {first}") from None
    return Trace(tables["events"], meta, tables["memory"], tables["counters"])


def load_traces_or_saved(paths: list[str], **load_kwargs: Any) -> Trace:
    """Trace files (JSON, one per rank; a directory, .zip or .tar(.gz) of them) through ingestion, or one saved
    Trace folder as it is (a capture's Parquet Trace keeps its joined FLOPs, modules and roofs,
    which its Kineto JSON lacks). What `analyze` and the Load page open. `load_kwargs` go to
    `profiler.trace.load_trace`."""
    from profiler.trace import load_trace

    saved = [f for f in map(saved_trace_folder, paths) if f is not None]
    if saved:
        if len(paths) > 1:
            raise TraceError(f"{saved[0]}: a saved Trace folder (Parquet) must be given alone, not with other traces")
        return load_saved_trace(saved[0])
    if len(paths) == 1 and is_rank_folder(paths[0]):  # ranks written by capture_this_rank (torchrun)
        from profiler.capture.ddp import load_ddp_trace

        return load_ddp_trace(paths[0], **load_kwargs)
    return load_trace(paths[0] if len(paths) == 1 else list(paths), **load_kwargs)

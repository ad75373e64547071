"""Plain records from the cupti-python tracer, and their conversion into a `Trace`.

The live tracer (`cupti_tracer.py`) copies every CUPTI activity record into a plain dict inside
the buffer callback (CUPTI reuses the buffer afterwards) and the dispatch-level recorder adds one
dict per aten op. This module turns those dicts into Trace rows with the columns of
`schema.COLUMNS`, so every analysis reads a CUPTI capture like a Kineto one:

- kernels, memcpys and memsets keep device, stream, correlation, grid, block, registers, shared
  memory; their External id comes from CUPTI's external-correlation records
  (correlation id -> the id the recorder pushed while the op ran);
- cpu_op rows come from the recorder (name, input dims/types, External id); `ProfilerStep#N`
  user_annotation rows mark the steps, and every row gets its `step` by time containment;
- timestamps are CUPTI nanoseconds; `unix_offset_ns` (Unix time minus CUPTI time, sampled at
  start) puts `meta["t0_us"]` on the Unix-µs clock Kineto uses, so NVML samples align the same way.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from profiler.trace.demangle import demangle_kernel_names
from profiler.trace.model import Trace, empty_frame
from profiler.trace.schema import COLUMNS, SCHEMA_VERSION

GPU_ROW_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
API_ROW_KINDS = ("cuda_runtime", "cuda_driver")
# torch dtype -> the spelling Kineto writes in "Input type" (what analyses expect).
KINETO_TYPE_NAMES = {"torch.float32": "float", "torch.float16": "c10::Half", "torch.bfloat16": "c10::BFloat16",
                     "torch.float64": "double", "torch.int64": "long int", "torch.int32": "int",
                     "torch.bool": "bool", "torch.uint8": "unsigned char", "torch.int8": "signed char"}


@dataclass
class CuptiRecords:
    """Everything one capture collected (mutable while capturing; converted once at the end)."""

    gpu: list[dict] = field(default_factory=list)  # kernel / gpu_memcpy / gpu_memset
    api: list[dict] = field(default_factory=list)  # cuda_runtime / cuda_driver
    external: dict[int, int] = field(default_factory=dict)  # correlation id -> external id
    ops: list[dict] = field(default_factory=list)  # recorder rows
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (step, start_ns, end_ns)
    errors: int = 0  # activity records that could not be copied (kept out of the trace)
    first_error: str = ""


def _steps_of(ts_ns: np.ndarray, steps: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Step index per timestamp by containment in the recorded step windows; -1 outside all."""
    out = np.full(len(ts_ns), -1, dtype=np.int64)
    for step, start, end in steps:
        out[(ts_ns >= start) & (ts_ns <= end)] = step
    return out


def build_trace(rec: CuptiRecords, unix_offset_ns: int, device_properties: Sequence[Mapping[str, Any]] = (),
                rank: int = 0, versions: Optional[Mapping[str, str]] = None) -> Trace:
    """A Trace from collected records (pure: no CUPTI calls, testable without a GPU)."""
    rows: list[dict] = []
    for r in rec.gpu:
        row = {k: r.get(k) for k in ("kind", "device", "stream", "correlation", "grid_x", "grid_y", "grid_z",
                                     "block_x", "block_y", "block_z", "registers_per_thread",
                                     "shared_memory_bytes", "bytes")}
        row.update(name=r["name"], start=r["start"], end=r["end"],
                   pid=r.get("device"), tid=r.get("stream"), external_id=rec.external.get(r["correlation"]))
        rows.append(row)
    for r in rec.api:
        rows.append({"kind": r["kind"], "name": r["name"], "start": r["start"], "end": r["end"], "pid": r["pid"],
                     "tid": r["tid"], "correlation": r["correlation"], "external_id": rec.external.get(r["correlation"])})
    for r in rec.ops:
        rows.append({"kind": "cpu_op", "name": r["name"], "start": r["start"], "end": r["end"], "pid": r["pid"],
                     "tid": r["tid"], "external_id": r["external_id"], "sequence_number": r.get("seq"),
                     "input_dims": r.get("input_dims"), "input_types": r.get("input_types")})
    for step, start, end in rec.steps:
        rows.append({"kind": "user_annotation", "name": f"ProfilerStep#{step}", "start": start, "end": end})
    events = empty_frame(COLUMNS)
    t0_ns = 0
    if rows:
        df = pd.DataFrame(rows)
        start = df["start"].to_numpy(np.int64)
        t0_ns = int(start.min())
        df["ts_us"] = (start - t0_ns) / 1e3
        df["dur_us"] = np.maximum(df["end"].to_numpy(np.int64) - start, 0) / 1e3
        df["step"] = _steps_of(start, rec.steps)
        df.loc[df["step"] < 0, "step"] = None
        df["rank"] = rank
        df = df.drop(columns=["start", "end"]).sort_values("ts_us", kind="stable")
        events = pd.concat([events, df[[c for c in df.columns if c in COLUMNS]]], ignore_index=True)
        events = events[list(COLUMNS)].astype({k: v[0] for k, v in COLUMNS.items()})
    events, demangled = demangle_kernel_names(events)  # CUPTI hands kernel names over mangled
    props = tuple(dict(p) for p in device_properties)
    meta = {"schema_version": SCHEMA_VERSION, "sources": ("cupti-python",), "t0_us": (t0_ns + unix_offset_ns) / 1e3,
            "ranks": (rank,), "skipped_events": rec.errors,
            "skipped_reasons": {f"cupti record not copied ({rec.first_error})": rec.errors} if rec.errors else {},
            "device_properties": props, "versions": dict(versions or {}), "demangled_names": demangled,
            "per_rank": {rank: {"source": "cupti-python", "device_properties": props, "distributed_info": None,
                                "versions": dict(versions or {})}}}
    return Trace(events, meta)


def input_signature(args: Iterable[Any]) -> tuple[str, str]:
    """(input_dims, input_types) as compact JSON in Kineto's spelling, for tensor and scalar args."""
    import torch

    dims, types = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            dims.append(list(a.shape))
            types.append(KINETO_TYPE_NAMES.get(str(a.dtype), str(a.dtype)))
        elif isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a):
            dims.append([list(t.shape) for t in a])
            types.append("TensorList")
        else:
            dims.append([])
            types.append("Scalar" if isinstance(a, (int, float, bool)) else "")
    return json.dumps(dims, separators=(",", ":")), json.dumps(types, separators=(",", ":"))


_API_SUFFIX = re.compile(r"_v\d+$")


def api_name(raw: str) -> str:
    """'cudaLaunchKernel_v7000' -> 'cudaLaunchKernel' (Kineto's spelling)."""
    return _API_SUFFIX.sub("", raw)

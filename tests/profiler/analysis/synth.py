"""Synthetic Kineto traces with known answers, written as real JSON and loaded through `load_trace`.

Tests describe a trace with a few calls on a `SynthTrace` builder (times in µs, relative to a
`base_us` clock origin that `load_trace` subtracts again) and get a `Trace` back, so every test
also exercises ingestion. Events follow the current Kineto JSON format: `ph: X` complete events
with `cat` in cpu_op / cuda_runtime / cuda_driver / kernel / gpu_memcpy / gpu_memset /
user_annotation, `args` as Kineto writes them, and `ac2g` flow pairs (`s` at the runtime call,
`f` at the GPU activity) keyed by correlation id.

    t = SynthTrace(rank=0)
    t.step(1, 0, 100)                                     # ProfilerStep#1 over [0, 100)
    t.launch("aten::mm", "sm80_xmma_gemm_f16", cpu_ts=5, kernel_ts=20, dur=30)
    trace = load([t], tmp_path)
"""
from __future__ import annotations

import gzip
import json
from decimal import Decimal
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable


HOST_PID = 4242
HOST_TID = 11

DEFAULT_DEVICE_PROPERTIES: dict[str, Any] = {
    "id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85031714816,
    "computeMajor": 8, "computeMinor": 0, "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "regsPerMultiprocessor": 65536,
    "warpSize": 32, "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 167936,
    "numSms": 108, "sharedMemPerBlockOptin": 166912,
}


@dataclass
class SynthTrace:
    """Builder for one rank's Kineto JSON. Times are µs after `base_us`."""

    rank: int = 0
    world_size: int = 1
    base_us: float = 1_700_000_000_000.0
    device: int = 0
    num_sms: int = 108
    events: list[dict[str, Any]] = field(default_factory=list)
    _next_corr: int = 1000
    _next_ext: int = 1

    # ---- raw events -------------------------------------------------------------------------
    def _x(self, cat: str, name: str, ts: float, dur: float, pid: int, tid: int,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
              "ts": self.base_us + ts, "dur": dur, "args": args or {}}
        self.events.append(ev)
        return ev

    def new_corr(self) -> int:
        self._next_corr += 1
        return self._next_corr

    def new_ext(self) -> int:
        self._next_ext += 1
        return self._next_ext

    def cpu_op(self, name: str, ts: float, dur: float, *, ext: int | None = None,
               tid: int = HOST_TID, **args: Any) -> dict[str, Any]:
        a = dict(args)
        if ext is not None:
            a["External id"] = ext
        return self._x("cpu_op", name, ts, dur, HOST_PID, tid, a)

    def annotation(self, name: str, ts: float, dur: float, *, tid: int = HOST_TID) -> dict[str, Any]:
        return self._x("user_annotation", name, ts, dur, HOST_PID, tid, {})

    def step(self, n: int, ts: float, dur: float) -> dict[str, Any]:
        return self.annotation(f"ProfilerStep#{n}", ts, dur)

    def runtime(self, name: str, ts: float, dur: float, *, corr: int, ext: int | None = None,
                tid: int = HOST_TID, cat: str = "cuda_runtime") -> dict[str, Any]:
        a: dict[str, Any] = {"correlation": corr}
        if ext is not None:
            a["External id"] = ext
        return self._x(cat, name, ts, dur, HOST_PID, tid, a)

    def kernel(self, name: str, ts: float, dur: float, *, corr: int, ext: int | None = None,
               stream: int = 7, grid: tuple[int, int, int] = (1, 1, 1),
               block: tuple[int, int, int] = (128, 1, 1), occupancy_pct: float | None = None,
               **args: Any) -> dict[str, Any]:
        a: dict[str, Any] = {"queued": 0, "device": self.device, "context": 1, "stream": stream,
                             "correlation": corr, "registers per thread": 32, "shared memory": 0,
                             "blocks per SM": grid[0] * grid[1] * grid[2] / self.num_sms,
                             "warps per SM": 4.0, "grid": list(grid), "block": list(block)}
        if ext is not None:
            a["External id"] = ext
        if occupancy_pct is not None:
            a["est. achieved occupancy %"] = occupancy_pct
        a.update(args)
        return self._x("kernel", name, ts, dur, self.device, stream, a)

    def memcpy(self, direction: str, ts: float, dur: float, nbytes: int, *, corr: int,
               ext: int | None = None, stream: int = 7, src: str = "Pageable",
               dst: str = "Device") -> dict[str, Any]:
        a: dict[str, Any] = {"device": self.device, "context": 1, "stream": stream,
                             "correlation": corr, "bytes": nbytes,
                             "memory bandwidth (GB/s)": nbytes / (dur * 1e3) if dur else 0.0}
        if ext is not None:
            a["External id"] = ext
        name = f"Memcpy {direction} ({src} -> {dst})"
        return self._x("gpu_memcpy", name, ts, dur, self.device, stream, a)

    def memset(self, ts: float, dur: float, nbytes: int, *, corr: int, stream: int = 7) -> dict[str, Any]:
        a = {"device": self.device, "context": 1, "stream": stream, "correlation": corr,
             "bytes": nbytes, "memory bandwidth (GB/s)": nbytes / (dur * 1e3) if dur else 0.0}
        return self._x("gpu_memset", "Memset (Device)", ts, dur, self.device, stream, a)

    def flow(self, corr: int, cpu_ts: float, gpu_ts: float, stream: int = 7) -> None:
        """ac2g flow pair binding the runtime call at `cpu_ts` to the GPU activity at `gpu_ts`."""
        self.events.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": HOST_TID,
                            "ts": self.base_us + cpu_ts, "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": corr, "pid": self.device, "tid": stream,
                            "ts": self.base_us + gpu_ts, "cat": "ac2g", "name": "ac2g", "bp": "e"})

    # ---- compound events --------------------------------------------------------------------
    def launch(self, op: str | None, kernel_name: str, *, cpu_ts: float, kernel_ts: float,
               dur: float, op_dur: float = 10.0, rt_offset: float = 1.0, rt_dur: float = 5.0,
               runtime_name: str = "cudaLaunchKernel", stream: int = 7, **kernel_args: Any) -> dict[str, int]:
        """cpu_op `op` (if given) -> runtime launch -> kernel, linked by External id, correlation and flow."""
        ext = self.new_ext()
        corr = self.new_corr()
        if op is not None:
            self.cpu_op(op, cpu_ts, op_dur, ext=ext)
        rt_ts = cpu_ts + rt_offset
        self.runtime(runtime_name, rt_ts, rt_dur, corr=corr, ext=ext)
        self.kernel(kernel_name, kernel_ts, dur, corr=corr, ext=ext, stream=stream, **kernel_args)
        self.flow(corr, rt_ts, kernel_ts, stream)
        return {"ext": ext, "corr": corr, "rt_ts": rt_ts}

    def to_json(self) -> dict[str, Any]:
        props = dict(DEFAULT_DEVICE_PROPERTIES, id=self.device, numSms=self.num_sms)
        meta = [{"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "python"}},
                {"ph": "M", "name": "process_name", "pid": self.device, "tid": 0, "args": {"name": f"GPU {self.device}"}}]
        return {"schemaVersion": 1, "deviceProperties": [props],
                "distributedInfo": {"backend": "nccl", "rank": self.rank, "world_size": self.world_size},
                "traceEvents": meta + self.events,
                "traceName": f"synth_rank{self.rank}.json", "baseTimeNanoseconds": 0}


def write(traces: Iterable[SynthTrace], directory: Path, stem: str = "synth") -> list[Path]:
    """Write one JSON file per rank into `directory` and return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in traces:
        p = directory / f"{stem}_rank{t.rank}.json"
        p.write_text(json.dumps(t.to_json()))
        paths.append(p)
    return paths


def load(traces: Iterable[SynthTrace] | SynthTrace, directory: Path, stem: str = "synth"):
    """Write the synthetic rank(s) and load them through the real loader into one Trace."""
    from profiler.trace import load_trace  # the loader under test, imported lazily

    if isinstance(traces, SynthTrace):
        traces = [traces]
    paths = write(traces, directory, stem)
    return load_trace([str(p) for p in paths] if len(paths) > 1 else str(paths[0]))


# ---- the real traces in tests/data/traces, loaded once per test process --------------------------
TRACES_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
REAL_TRACES: tuple[str, ...] = tuple(sorted(p.name for p in TRACES_DIR.glob("*.json.gz")))


@lru_cache(maxsize=None)
def real_trace(name: str):
    """The committed real trace `name` loaded through `load_trace` (cached per process)."""
    from profiler.trace import load_trace

    return load_trace(str(TRACES_DIR / name))


def _floats(v):
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, dict):
        return {k: _floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_floats(x) for x in v]
    return v


RAW_KEPT_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset",
                           "cuda_runtime", "Runtime", "cuda_driver"})


@lru_cache(maxsize=None)
def raw_events(name: str) -> tuple[dict, ...]:
    """The raw GPU and runtime `ph: X` events of a committed trace, straight from the JSON (the
    independent truth; CPU ops are left out to keep the per-process cache small).

    Numbers are parsed exactly (Decimal) and `ts` is returned as float µs after the earliest `ph: X`
    event: raw timestamps near 1.7e15 µs would lose 0.25 µs per value as float64.
    """
    with gzip.open(TRACES_DIR / name, "rt") as f:
        doc = json.load(f, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    base = min(Decimal(e["ts"]) for e in xs)
    return tuple(dict(_floats(e), ts=float(Decimal(e["ts"]) - base)) for e in xs if e.get("cat") in RAW_KEPT_CATS)


RAW_KINDS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "gpu_memcpy", "Memcpy": "gpu_memcpy",
             "gpu_memset": "gpu_memset", "Memset": "gpu_memset"}


def raw_gpu(name: str) -> list[dict]:
    """Raw kernel/memcpy/memset events with `kind` normalised (2021 spellings mapped)."""
    return [dict(e, kind=RAW_KINDS[e.get("cat")]) for e in raw_events(name) if e.get("cat") in RAW_KINDS]


@lru_cache(maxsize=4)
def columnar_trace(n_kernels: int, n_steps: int = 4, seed: int = 0):
    """A one-rank Trace built straight from columns (no JSON): `n_kernels` kernels over 5 names
    (one a collective) on 2 streams, each with a `cudaLaunchKernel` and a `cpu_op`, 200 memcpys,
    and `n_steps` ProfilerSteps. For scaling checks: cost must not grow with Python calls per event. Cached: do not mutate."""
    import numpy as np
    import pandas as pd

    from profiler.trace.model import Trace
    from profiler.trace.schema import COLUMNS

    rng = np.random.default_rng(seed)
    n, n_copies = n_kernels, 200
    kernel_names = np.array(["sm80_xmma_gemm_f16", "vectorized_elementwise_kernel", "ncclDevKernel_AllReduce_Sum",
                             "reduce_kernel", "softmax_warp_forward"])
    k_ts = np.cumsum(rng.uniform(1.0, 20.0, n))
    rt_ts = k_ts - rng.uniform(5.0, 50.0, n)
    span = float(k_ts[-1] + 100.0)
    kind = np.array(["kernel"] * n + ["cuda_runtime"] * n + ["cpu_op"] * n + ["gpu_memcpy"] * n_copies
                    + ["user_annotation"] * n_steps)
    name = np.concatenate([kernel_names[rng.integers(0, 5, n)], np.full(n, "cudaLaunchKernel"), np.full(n, "aten::op"),
                           np.full(n_copies, "Memcpy HtoD (Pageable -> Device)"),
                           np.array([f"ProfilerStep#{i}" for i in range(n_steps)])])
    ts = np.concatenate([k_ts, rt_ts, rt_ts - 2.0, rng.uniform(0.0, span, n_copies), np.linspace(0.0, span, n_steps + 1)[:-1]])
    dur = np.concatenate([rng.uniform(1.0, 30.0, n), np.full(n, 3.0), np.full(n, 8.0), np.full(n_copies, 5.0),
                          np.full(n_steps, span / n_steps)])
    m = len(kind)
    gpu = np.isin(kind, ["kernel", "gpu_memcpy"])
    corr = np.concatenate([np.arange(n), np.arange(n), np.zeros(n), np.arange(n_copies) + n, np.zeros(n_steps)])

    def col(values, dtype, mask=None):
        s = pd.Series(values).astype(dtype)
        return s.mask(~mask) if mask is not None else s

    ev = {c: pd.Series([None] * m, dtype="object").astype(d) if d in ("category", "string")
          else pd.Series(np.full(m, np.nan)).astype(d) if d == "float64"
          else pd.Series(pd.array([pd.NA] * m, dtype=d)) if d[0] in "IU"
          else pd.Series(np.zeros(m)).astype(d) for c, (d, _) in COLUMNS.items()}
    ev.update(kind=pd.Series(pd.Categorical(kind)), name=pd.Series(pd.Categorical(name)), ts_us=pd.Series(ts - ts.min()),
              dur_us=pd.Series(dur), device=col(np.zeros(m), "Int16", gpu),
              stream=col(np.where(np.arange(m) % 2 == 0, 7, 8), "Int32", gpu),
              correlation=col(corr, "Int64", gpu | (kind == "cuda_runtime")),
              occupancy_pct=pd.Series(np.where(kind == "kernel", 40.0, np.nan)),
              bytes=col(np.full(m, 1 << 20), "Int64", kind == "gpu_memcpy"))
    for g in ("grid_x", "block_x"):
        ev[g] = col(np.full(m, 64), "Int32", kind == "kernel")
    for g in ("grid_y", "grid_z", "block_y", "block_z"):
        ev[g] = col(np.ones(m), "Int32", kind == "kernel")
    events = pd.DataFrame({c: ev[c] for c in COLUMNS})
    props = ({"id": 0, "numSms": 108},)
    return Trace(events, {"ranks": (0,), "device_properties": props, "per_rank": {0: {"device_properties": props}}})

"""The Trace's column contract: names, dtypes and meaning, in one place.

Every producer (ingestion of uploaded Kineto JSON, live capture) emits exactly these columns and
every consumer (analyses, roofline, pages, reports) reads them. Units are in the names.

Conventions
- One row per complete event (`ph == "X"`) of a kept kind; flows become link columns.
- `ts_us` is microseconds since the earliest kept event over all ranks of the Trace (so several
  ranks share one clock origin); `meta["t0_us"]` is that origin in the file's own clock, so
  raw_ts = ts_us + t0_us (as float64: on Unix-epoch µs clocks t0_us itself is only good to
  0.25 µs, while `ts_us` keeps the file's nanoseconds).
- Missing values are <NA> in nullable integer columns and NaN in float columns.
"""
from __future__ import annotations

SCHEMA_VERSION = 1

# Event kinds kept, normalised to the current Kineto category names. The 2021 format's
# capitalised categories map onto these (see KIND_ALIASES).
KINDS: tuple[str, ...] = (
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
)

# 2021-format (and other historical) category spellings -> kind.
KIND_ALIASES: dict[str, str] = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "user_annotation": "user_annotation",
    "gpu_user_annotation": "gpu_user_annotation",
    "python_function": "python_function",
}

GPU_KINDS: frozenset[str] = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})

# name -> (pandas dtype, meaning). Order is the column order of Trace.events.
COLUMNS: dict[str, tuple[str, str]] = {
    "rank": ("int32", "distributed rank (from distributedInfo, else the file's position)"),
    "kind": ("category", "one of KINDS"),
    "name": ("category", "event name (kernel name, op name, ...)"),
    "ts_us": ("float64", "start, µs since the Trace's earliest event"),
    "dur_us": ("float64", "duration, µs (>= 0)"),
    "pid": ("Int64", "process id (GPU rows: device index as written by Kineto)"),
    "tid": ("Int64", "thread id (GPU rows: stream; 'stream 7' -> 7)"),
    "device": ("Int16", "GPU device index (GPU rows)"),
    "stream": ("Int32", "GPU stream (GPU rows)"),
    "correlation": ("Int64", "CUPTI/roctracer correlation id: runtime call <-> GPU activity"),
    "external_id": ("Int64", "External id: cpu_op <-> runtime call <-> GPU activity"),
    "flow_id": ("Int64", "ac2g / async_cpu_to_gpu flow id bound to this event (s at launch, f at GPU)"),
    "step": ("Int32", "ProfilerStep#N this event belongs to (GPU rows: via their launch)"),
    "grid_x": ("Int32", "kernel grid dims"),
    "grid_y": ("Int32", ""),
    "grid_z": ("Int32", ""),
    "block_x": ("Int32", "kernel block dims"),
    "block_y": ("Int32", ""),
    "block_z": ("Int32", ""),
    "registers_per_thread": ("Int32", "kernel registers per thread"),
    "shared_memory_bytes": ("Int64", "kernel static+dynamic shared memory, bytes"),
    "blocks_per_sm": ("float64", "kernel blocks per SM"),
    "warps_per_sm": ("float64", "kernel warps per SM"),
    "occupancy_pct": ("float64", "kernel est. achieved occupancy %"),
    "bytes": ("Int64", "memcpy/memset bytes"),
    "memory_bw_gb_s": ("float64", "memcpy/memset bandwidth as written by Kineto, GB/s"),
    "collective_name": ("category", "NCCL/RCCL collective name when recorded"),
    "in_msg_nelems": ("Int64", "collective input elements"),
    "out_msg_nelems": ("Int64", "collective output elements"),
    "group_size": ("Int32", "collective process-group size"),
    "comm_dtype": ("category", "collective dtype"),
    "process_group_name": ("category", "process group name"),
    "process_group_desc": ("category", "process group description"),
    "sequence_number": ("Int64", "autograd sequence number (cpu_op)"),
    "fwd_thread_id": ("Int64", "forward thread id of a backward op (cpu_op)"),
    "input_dims": ("string", "cpu_op input shapes as compact JSON, e.g. [[8,768],[768]]"),
    "input_types": ("string", "cpu_op input dtypes as compact JSON"),
    "python_id": ("Int64", "python_function Python id"),
    "python_parent_id": ("Int64", "python_function Python parent id"),
    "flops": ("float64", "FLOPs of the op/kernel when known (capture), else NaN"),
    "bytes_moved": ("float64", "algorithmic bytes (inputs+outputs) when known (capture), else NaN"),
    "module": ("category", "innermost nn.Module (qualified name) that ran the op in forward or backward, "
                           "when known (capture), else NA"),
}
# Columns added after traces were first saved: a saved trace without them loads with them all NA.
LATER_COLUMNS: frozenset[str] = frozenset({"module"})

# Side tables of a Trace.
MEMORY_COLUMNS: dict[str, str] = {  # `[memory]` instant events
    "rank": "int32",
    "ts_us": "float64",
    "device_type": "Int16",
    "device_id": "Int16",
    "bytes": "Int64",  # allocation (+) or free (-)
    "total_allocated": "Int64",
    "total_reserved": "Int64",
    "addr": "Int64",
}
COUNTER_COLUMNS: dict[str, str] = {  # counter tracks (NVML samples, `ph: C`)
    "rank": "int32",
    "ts_us": "float64",
    "device": "Int16",
    "name": "category",
    "value": "float64",
}

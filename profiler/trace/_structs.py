"""msgspec typed views of a Kineto / Chrome-trace JSON file: only the fields FusionLens keeps.

Decoding into these Structs skips every other key in C, never builds a dict per event, and
validates types on the way: an args field may also hold a string (real traces write `"stream":
"0x0"` or `"grid": "grid(100,)"`; those become missing values), but an integer beyond int64 or
an object where a number belongs is a ValidationError, which the decoder turns into a skipped,
counted event. Missing integers decode
to the sentinel `MISSING` and missing floats to NaN, so columns can be pulled out with
`np.fromiter(map(attrgetter(...)))` without a Python-level branch per value.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional, Union

import msgspec

MISSING = -(2**63)  # int64 sentinel for "absent"; real values are constrained above it
I64 = Annotated[int, msgspec.Meta(ge=-(2**63) + 1, le=2**63 - 1)]
NAN = float("nan")
EMPTY_RAW = msgspec.Raw(b"")


def _f(key: str) -> Any:
    return msgspec.field(name=key)


class Args(msgspec.Struct, gc=False):
    """The `args` of an event: every key any kept kind may carry (absent keys get defaults)."""

    external_id: Union[I64, str, None] = msgspec.field(name="External id", default=MISSING)
    external_id_2021: Union[I64, str, None] = msgspec.field(name="external id", default=MISSING)
    correlation: Union[I64, str, None] = MISSING
    device: Union[I64, str, None] = MISSING
    stream: Union[I64, str, None] = MISSING
    grid: Union[list[I64], str, None] = None
    block: Union[list[I64], str, None] = None
    registers_per_thread: Union[I64, str, None] = msgspec.field(name="registers per thread", default=MISSING)
    shared_memory: Union[I64, str, None] = msgspec.field(name="shared memory", default=MISSING)
    blocks_per_sm: Union[float, str, None] = msgspec.field(name="blocks per SM", default=NAN)
    warps_per_sm: Union[float, str, None] = msgspec.field(name="warps per SM", default=NAN)
    occupancy_pct: Union[float, str, None] = msgspec.field(name="est. achieved occupancy %", default=NAN)
    bytes: Union[I64, str, None] = MISSING
    memory_bw: Union[float, str, None] = msgspec.field(name="memory bandwidth (GB/s)", default=NAN)
    collective_name: Optional[str] = msgspec.field(name="Collective name", default=None)
    in_msg_nelems: Union[I64, str, None] = msgspec.field(name="In msg nelems", default=MISSING)
    out_msg_nelems: Union[I64, str, None] = msgspec.field(name="Out msg nelems", default=MISSING)
    group_size: Union[I64, str, None] = msgspec.field(name="Group size", default=MISSING)
    dtype: Optional[str] = None
    pg_name: Optional[str] = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Optional[str] = msgspec.field(name="Process Group Description", default=None)
    sequence_number: Union[I64, str, None] = msgspec.field(name="Sequence number", default=MISSING)
    fwd_thread_id: Union[I64, str, None] = msgspec.field(name="Fwd thread id", default=MISSING)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=EMPTY_RAW)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=EMPTY_RAW)
    python_id: Union[I64, str, None] = msgspec.field(name="Python id", default=MISSING)
    python_parent_id: Union[I64, str, None] = msgspec.field(name="Python parent id", default=MISSING)
    # `[memory]` instant events
    total_reserved: Union[I64, str, None] = msgspec.field(name="Total Reserved", default=MISSING)
    total_allocated: Union[I64, str, None] = msgspec.field(name="Total Allocated", default=MISSING)
    mem_bytes: Union[I64, str, None] = msgspec.field(name="Bytes", default=MISSING)
    addr: Union[I64, str, None] = msgspec.field(name="Addr", default=MISSING)
    device_id: Union[I64, str, None] = msgspec.field(name="Device Id", default=MISSING)
    device_type: Union[I64, str, None] = msgspec.field(name="Device Type", default=MISSING)
    # metadata (`ph: M`) events
    meta_name: Optional[str] = msgspec.field(name="name", default=None)


class Event(msgspec.Struct, gc=False):
    """One entry of `traceEvents`."""

    ph: Optional[str] = None
    cat: Optional[str] = None
    name: Any = None  # checked per kept row: must be a str
    ts: Optional[float] = NAN
    dur: Optional[float] = NAN
    pid: Union[I64, str, None] = MISSING
    tid: Union[I64, str, None] = MISSING
    id: Union[I64, str, None] = MISSING
    bp: Optional[str] = None
    args: Optional[Args] = None


class ExactEvent(Event, gc=False):
    """An Event whose `ts` is kept as its JSON text, for traces whose timestamps float64 cannot
    hold to the nanosecond (Unix-epoch µs with a fraction, ~1.7e15: float64 steps by 0.25 µs
    there). `_columns.exact_ts` turns the texts into exact offsets from the file's `ts_base`."""

    ts: msgspec.Raw = EMPTY_RAW


class CounterEvent(msgspec.Struct, gc=False):
    """A `ph: C` counter sample: every numeric arg is one series."""

    ph: Optional[str] = None
    name: Any = None
    ts: Optional[float] = NAN
    pid: Union[I64, str, None] = MISSING
    args: Optional[dict[str, Any]] = None


class Doc(msgspec.Struct):
    """The top-level object; `traceEvents` is kept raw and decoded in chunks."""

    traceEvents: msgspec.Raw = EMPTY_RAW
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    torch_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    hip_runtime_version: Any = None
    hip_driver_version: Any = None
    roctracer_version: Any = None
    record_shapes: Any = None
    with_flops: Any = None
    with_stack: Any = None
    with_modules: Any = None
    profile_memory: Any = None
    trace_id: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    metadata: msgspec.Raw = EMPTY_RAW


EMPTY_ARGS = Args()
VERSION_KEYS = ("torch_version", "cuda_runtime_version", "cuda_driver_version", "cupti_version",
                "hip_runtime_version", "hip_driver_version", "roctracer_version")
SETTING_KEYS = ("record_shapes", "with_flops", "with_stack", "with_modules", "profile_memory",
                "trace_id", "traceName", "displayTimeUnit", "baseTimeNanoseconds")

EVENTS_DECODER = msgspec.json.Decoder(list[Event])
EVENT_DECODER = msgspec.json.Decoder(Event)
EXACT_EVENTS_DECODER = msgspec.json.Decoder(list[ExactEvent])
EXACT_EVENT_DECODER = msgspec.json.Decoder(ExactEvent)
RAW_LIST_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
COUNTERS_DECODER = msgspec.json.Decoder(list[CounterEvent])
COUNTER_DECODER = msgspec.json.Decoder(CounterEvent)
DOC_DECODER = msgspec.json.Decoder(Doc)

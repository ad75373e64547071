"""cupti-python tracer: the no-driver path here, the Kineto/second-client guard, and the
records -> Trace conversion on hand-made records with known links."""
from __future__ import annotations

import json

import pytest
import torch

from profiler.analysis.roofline import roofline_points
from profiler.capture import backends
from profiler.capture.backends import CaptureError, CapturePlan
from profiler.capture.cupti_records import CuptiRecords, build_trace, input_signature
from profiler.capture.cupti_tracer import (CuptiConflictError, CuptiTracer, _GUARD, cupti_backend,
                                           cupti_driver_reason, cupti_unavailable_reason)
from profiler.capture.devices import Ceilings
from profiler.trace.schema import COLUMNS

NO_DRIVER = cupti_driver_reason() is not None


@pytest.mark.skipif(not NO_DRIVER, reason="this machine has a CUDA driver")
def test_no_driver_reason_is_kept_and_nothing_raises():
    reason = cupti_driver_reason()
    assert reason.startswith("CUPTI unavailable:") and "driver" in reason.lower()
    assert cupti_unavailable_reason() == reason
    assert backends.unavailable_reason("cupti") == reason  # the registry's probe says the same
    with pytest.raises(CaptureError, match=r"^backend 'cupti': CUPTI unavailable: .* \(usable here: kineto\)$"):
        backends.get_backend("cupti")  # what `capture --backend cupti` says, with the backend that works
    with pytest.raises(CaptureError, match="CUPTI unavailable"):
        cupti_backend(lambda i: None, CapturePlan(device="cuda", backend="cupti"), None)
    with pytest.raises(RuntimeError):  # starting anyway fails cleanly and frees the guard
        CuptiTracer().start()
    assert _GUARD.acquire(blocking=False)
    _GUARD.release()


def test_refuses_to_run_beside_kineto_or_a_second_tracer():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(CuptiConflictError, match="Kineto"):
            CuptiTracer().start()
    assert _GUARD.acquire(blocking=False)  # as if another tracer were active
    try:
        with pytest.raises(CuptiConflictError, match="already active"):
            CuptiTracer().start()
    finally:
        _GUARD.release()


def test_cpu_plan_is_refused():
    with pytest.raises(CaptureError, match="device cuda"):
        cupti_backend(lambda i: None, CapturePlan(device="cpu"), None)


def _records() -> CuptiRecords:
    rec = CuptiRecords()
    t = 1_000_000_000  # CUPTI ns
    rec.steps.append((2, t, t + 100_000))
    rec.ops.append({"external_id": 1, "name": "aten::mm", "start": t + 1_000, "end": t + 9_000, "pid": 11,
                    "tid": 12, "seq": 1, "input_dims": "[[64,64],[64,64]]", "input_types": '["c10::Half","c10::Half"]'})
    rec.api.append({"kind": "cuda_runtime", "name": "cudaLaunchKernel", "start": t + 2_000, "end": t + 5_000,
                    "pid": 11, "tid": 12, "correlation": 77})
    rec.external[77] = 1
    rec.gpu.append({"kind": "kernel", "name": "_Z10gemmKernelPfS_i", "start": t + 10_000, "end": t + 30_000,
                    "device": 0, "stream": 7, "correlation": 77, "grid_x": 4, "grid_y": 2, "grid_z": 1,
                    "block_x": 128, "block_y": 1, "block_z": 1, "registers_per_thread": 96,
                    "shared_memory_bytes": 49152})
    rec.gpu.append({"kind": "gpu_memcpy", "name": "Memcpy DTOH", "start": t + 200_000, "end": t + 204_000,
                    "device": 0, "stream": 7, "correlation": 78, "bytes": 4096})
    return rec


def test_records_become_a_linked_trace():
    offset_ns = 1_700_000_000_000_000_000 - 1_000_000_000  # Unix minus CUPTI clock
    trace = build_trace(_records(), offset_ns, [{"name": "NVIDIA H200", "numSms": 132}], versions={"torch": "x"})
    ev = trace.events
    assert list(ev.columns) == list(COLUMNS) and str(ev["kind"].dtype) == "category"
    assert trace.meta["t0_us"] == 1_700_000_000_000_000.0  # earliest event on the Unix-µs clock
    k = ev[ev["kind"] == "kernel"].iloc[0]
    assert k["name"] == "gemmKernel(float*, float*, int)"  # demangled, as Kineto writes it
    assert k["external_id"] == 1 and k["correlation"] == 77 and k["stream"] == 7 and k["device"] == 0
    assert (k["grid_x"], k["block_x"], k["registers_per_thread"], k["shared_memory_bytes"]) == (4, 128, 96, 49152)
    assert k["ts_us"] == 10.0 and k["dur_us"] == 20.0 and k["step"] == 2
    op = ev[ev["kind"] == "cpu_op"].iloc[0]
    assert op["external_id"] == 1 and json.loads(op["input_dims"]) == [[64, 64], [64, 64]]
    launch = ev[ev["kind"] == "cuda_runtime"].iloc[0]
    assert launch["external_id"] == 1 and launch["pid"] == 11
    copy = ev[ev["kind"] == "gpu_memcpy"].iloc[0]
    assert copy["bytes"] == 4096 and pd_isna(copy["external_id"]) and pd_isna(copy["step"])  # after the step
    assert ev[ev["kind"] == "user_annotation"]["name"].tolist() == ["ProfilerStep#2"]
    # The kernel inherits its op's dtype in the roofline through the External id.
    costed = trace.events.assign(flops=[2 * 64**3 if k in ("cpu_op", "kernel") else float("nan") for k in ev["kind"]],
                                 bytes_moved=[3 * 64 * 64 * 2.0 if k in ("cpu_op", "kernel") else float("nan") for k in ev["kind"]])
    pts, _ = roofline_points(type(trace)(costed, trace.meta), Ceilings({"fp32": 1e12, "fp16": 4e12}, 1e12, "measured"))
    assert set(pts["dtype"]) == {"fp16"}


def pd_isna(x) -> bool:
    import pandas as pd

    return bool(pd.isna(x))


def test_empty_records_give_an_empty_trace_and_signature_spelling():
    trace = build_trace(CuptiRecords(), 0)
    assert trace.events.empty and list(trace.events.columns) == list(COLUMNS)
    dims, types = input_signature((torch.zeros(2, 3, dtype=torch.bfloat16), 1.5, [torch.zeros(1)], None))
    assert json.loads(dims) == [[2, 3], [], [[1]], []]
    assert json.loads(types) == ["c10::BFloat16", "Scalar", "TensorList", ""]


def test_buffer_callback_copies_each_record_kind_and_counts_bad_ones():
    from types import SimpleNamespace as NS

    from cupti import cupti

    tracer = CuptiTracer()  # enums only: no CUPTI call is made until start()
    K = cupti.ActivityKind
    kernel = NS(kind=int(K.CONCURRENT_KERNEL), name="k", start=10, end=30, device_id=0, stream_id=7,
                correlation_id=5, grid_x=1, grid_y=1, grid_z=1, block_x=256, block_y=1, block_z=1,
                registers_per_thread=32, static_shared_memory=1024, dynamic_shared_memory=2048)
    copy = NS(kind=int(K.MEMCPY), copy_kind=int(cupti.ActivityMemcpyKind.HTOD), start=1, end=2, device_id=0,
              stream_id=7, correlation_id=6, bytes=64)
    memset = NS(kind=int(K.MEMSET), start=3, end=4, device_id=0, stream_id=7, correlation_id=8, bytes=32)
    ext = NS(kind=int(K.EXTERNAL_CORRELATION), correlation_id=5, external_id=42)
    launch = NS(kind=int(K.RUNTIME), cbid=211, start=5, end=9, process_id=1, thread_id=2, correlation_id=5)
    broken = NS(kind=int(K.CONCURRENT_KERNEL), name="no fields")
    tracer._buffer_completed([kernel, copy, memset, ext, launch, broken])
    rec = tracer.records
    assert rec.errors == 1 and "AttributeError" in rec.first_error
    assert [r["kind"] for r in rec.gpu] == ["kernel", "gpu_memcpy", "gpu_memset"]
    assert rec.gpu[0]["shared_memory_bytes"] == 3072 and rec.gpu[1]["name"] == "Memcpy HTOD"
    assert rec.external == {5: 42} and rec.api[0]["kind"] == "cuda_runtime"
    trace = build_trace(rec, 0)
    assert trace.meta["skipped_events"] == 1
    ev = trace.events.set_index("kind")
    assert ev.loc["kernel", "external_id"] == 42 and ev.loc["cuda_runtime", "external_id"] == 42


def test_start_and_stop_call_cupti_in_the_documented_order():
    """Register callbacks, enable each kind; at stop: flush, disable in reverse, flush forced,
    finalize, guard released (NVIDIA's cupti-python samples flush(0) -> disable -> flush(1)).
    A recording stand-in replaces the CUPTI module: this machine has no driver to run it."""
    from cupti import cupti

    calls = []

    class Recorder:
        ActivityKind = cupti.ActivityKind

        def __getattr__(self, name):
            return lambda *args: calls.append((name, *args)) or 0

    tracer = CuptiTracer()
    tracer._cupti = Recorder()
    tracer.start()
    assert not _GUARD.acquire(blocking=False)  # held while active
    tracer.stop()
    names = [c[0] for c in calls]
    kinds = tracer.kinds
    assert names == ["get_timestamp", "activity_register_callbacks"] + ["activity_enable"] * len(kinds) + \
        ["activity_flush_all"] + ["activity_disable"] * len(kinds) + ["activity_flush_all", "finalize"]
    assert [c[1] for c in calls if c[0] == "activity_flush_all"] == [0, 1]
    assert [c[1] for c in calls if c[0] == "activity_disable"] == list(reversed(kinds))
    assert _GUARD.acquire(blocking=False)
    _GUARD.release()


def test_kernel_records_get_the_shared_demangler_once_per_name():
    """CUPTI hands over mangled names (cupti-python has no demangle option): the buffer callback
    copies them as written and build_trace demangles them like ingestion of uploaded traces."""
    from types import SimpleNamespace as NS

    from cupti import cupti

    tracer = CuptiTracer()
    K = cupti.ActivityKind
    mangled = "_ZN2at6native6launchILi4EEEvPKfRSt6vectorIiSaIiEE"
    readable = "void at::native::launch<4>(float const*, std::vector<int, std::allocator<int> >&)"

    def kernel(name: str, start: int, corr: int):
        return NS(kind=int(K.CONCURRENT_KERNEL), name=name, start=start, end=start + 5, device_id=0, stream_id=7,
                  correlation_id=corr, grid_x=1, grid_y=1, grid_z=1, block_x=32, block_y=1, block_z=1,
                  registers_per_thread=16, static_shared_memory=0, dynamic_shared_memory=0)

    tracer._buffer_completed([kernel(mangled, 10, 1), kernel("triton_poi_fused_0", 20, 2), kernel(mangled, 30, 3),
                              kernel("_Zxx", 40, 4)])
    assert [r["name"] for r in tracer.records.gpu] == [mangled, "triton_poi_fused_0", mangled, "_Zxx"]  # as written
    trace = build_trace(tracer.records, 0)
    names = trace.events.loc[trace.events["kind"] == "kernel", "name"].astype(str).tolist()
    assert names == [readable, "triton_poi_fused_0", readable, "_Zxx"]
    assert trace.meta["demangled_names"] == {readable: mangled}
    assert len(names) == 4 and abs(trace.events["dur_us"].sum() - 4 * 0.005) < 1e-12  # rows and times unchanged
    assert build_trace(CuptiRecords(), 0).meta["demangled_names"] == {}

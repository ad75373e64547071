"""Distributed capture: profile a DistributedDataParallel training run, one trace per rank.

`capture_ddp(spec, plan, out_dir, nproc)` spawns `nproc` workers (torch.multiprocessing, spawn
start method) on one machine: gloo on CPU, NCCL on CUDA (rank r on cuda:r; under torchrun, the
LOCAL_RANK's GPU). Each worker resolves the spec itself (the same local path or zoo name), wraps
the model in DDP, and runs the normal capture (runner.capture), writing
`kineto_rank{r}.pt.trace.json` and `op_costs_rank{r}.parquet` into `out_dir`. The parent loads
every rank's JSON together (`load_trace([...])`: one Trace with a `rank` column, one clock
origin) and joins each rank's op costs to its rows.

torchrun recipe (same files, your launcher; docs/capture.md): run a script that calls
`profiler.capture.ddp.capture_this_rank(spec, plan, out_dir)` under
`torchrun --standalone --nproc-per-node N script.py`; it starts the process group from the
environment torchrun sets, and `load_ddp_trace(out_dir)` (what `python -m profiler analyze
out_dir` runs) merges the ranks.

find_unused_parameters: on when one plain step leaves a parameter without a grad on some rank
(the union over ranks: they must agree), or when a run fails with DDP's "Expected to have finished
reduction" (a parameter a later step leaves out, e.g. an expert no token reached): `capture_ddp`
then runs once more with it on, and says so.
"""
from __future__ import annotations

import atexit
import dataclasses
import datetime
import os
import queue
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import pandas as pd
import torch

from profiler.capture.artifacts import RUN_OUTPUTS, clear_outputs
from profiler.capture.backends import CaptureError, CapturePlan, CaptureResult, ProgressFn
from profiler.capture.isolated import HEARTBEAT_S, available_gib, death_cause, volunteer_for_oom_killer
from profiler.errors import FusionLensError, first_line

INIT_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture_this_rank(spec: str, plan: CapturePlan, out_dir: str | Path, *, size: str = "small",
                      batch: Optional[int] = None, overrides: Optional[Mapping[str, Any]] = None,
                      progress: Optional[ProgressFn] = None,
                      on_unused: Optional[Callable[[list[str]], None]] = None,
                      find_unused: bool = False) -> CaptureResult:
    """Capture this rank under DDP, in the caller's process group or, when none is initialised, in
    one started from the environment (torchrun's, or capture_ddp's workers'), kept for later calls
    and ended at exit. `on_unused(names)` hears which parameters got no grad (DDP then runs with
    find_unused_parameters); `find_unused=True` turns that on whatever the check finds (every rank
    must pass the same)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from profiler.capture.runner import capture, unused_parameters

    say = progress or (lambda done, total, msg: None)
    if plan.is_cuda:  # before NCCL starts: its communicator binds to the current device
        torch.cuda.set_device(local_gpu(os.environ, torch.cuda.device_count()))
        plan = dataclasses.replace(plan, device=f"cuda:{torch.cuda.current_device()}")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if plan.is_cuda else "gloo",
                                timeout=datetime.timedelta(seconds=INIT_TIMEOUT_S))
        # kept, not ended on return: a second group from the same torchrun store hangs in its first
        # collective; ended at exit, where NCCL otherwise warns of a group left open
        atexit.register(_end_process_group)

    def wrap(loaded: Any) -> torch.nn.Module:
        ids = [torch.cuda.current_device()] if plan.is_cuda else None
        # DDP's default waits for every parameter's grad and fails on the 2nd step when one never
        # comes (a pooler or head the loss does not use); detection costs a graph walk per step,
        # so it is on only for models that need it, as a user would set it. Every rank must agree
        # (ranks may see different data, e.g. experts one rank's tokens never reach; mixed settings
        # hang the first reduction), so the names are the union over ranks.
        unused = union_over_ranks(unused_parameters(loaded))
        if unused:
            more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
            say(0, plan.steps, f"DDP: {len(unused)} parameter(s) get no grad on some rank ({', '.join(unused[:3])}{more}): "
                               "find_unused_parameters=True")
        if on_unused is not None:
            on_unused(unused)
        return DDP(loaded.model, device_ids=ids, find_unused_parameters=find_unused or bool(unused))

    return capture(spec, plan, out_dir, size=size, batch=batch, overrides=overrides,
                   progress=progress, wrap_model=wrap)


def _end_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def local_gpu(env: Mapping[str, str], count: int) -> int:
    """This rank's GPU index on its machine: LOCAL_RANK (torchrun sets it; ranks need not be laid
    out node by node), else RANK modulo the GPUs this process sees (our own spawned workers)."""
    if count < 1:
        raise CaptureError("a CUDA capture rank sees no GPU")
    for key in ("LOCAL_RANK", "RANK"):
        value = env.get(key, "").strip()
        if value.isdigit():
            return int(value) % count
    return 0


def union_over_ranks(names: list[str]) -> list[str]:
    """The names any rank of the process group found, in first-seen order (rank 0's first)."""
    import torch.distributed as dist

    gathered: list[Optional[list[str]]] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(names))
    return list(dict.fromkeys(n for rank_names in gathered for n in (rank_names or [])))


def _worker(rank: int, world: int, port: int, spec: str, plan: CapturePlan, out_dir: str,
            size: str, batch: Optional[int], overrides: Optional[dict], messages: Any, find_unused: bool) -> None:
    """Spawned entry point: set up the process group, capture, report errors as one line."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    volunteer_for_oom_killer()  # out of memory: the OOM killer takes a rank, not the server that spawned it
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    def progress(done: int, total: int, msg: str) -> None:
        if rank == 0:
            messages.put(("progress", done, total, msg))

    try:  # capture_this_rank starts the process group from the environment set above
        result = capture_this_rank(spec, plan, out_dir, size=size, batch=batch, overrides=overrides, progress=progress,
                          on_unused=lambda names: messages.put(("unused", rank, list(names))) if rank == 0 else None,
                          find_unused=find_unused)
        if rank == 0:
            messages.put(("warnings", rank, list(result.trace.meta["capture"].get("warnings") or [])))
    except FusionLensError as exc:
        messages.put(("error", rank, str(exc)))
        raise SystemExit(2)
    except Exception as exc:  # any worker failure goes back to the parent as one line
        messages.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(2)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


RANK_TRACE_NAME = re.compile(r"kineto_rank(\d+)\.pt\.trace\.json")


def read_op_costs(path: Path) -> pd.DataFrame:
    """A rank's op costs (flops.COST_COLUMNS) as the FLOPs pass wrote them; CaptureError (one line)
    when the file is damaged, is another table, or holds values of the wrong type. A rank folder is
    opened from a path a person typed, so it may have been edited or cut short; pyarrow and pandas
    fail on such a file in many ways (ArrowInvalid, OSError, KeyError, UnicodeDecodeError, ...)."""
    from profiler.capture.flops import COST_COLUMNS

    try:
        costs = pd.read_parquet(path)
        missing = [c for c in ("name", "rule", "flops", "bytes_moved") if c not in costs.columns]
        if missing:
            raise CaptureError(f"{path}: not an op-costs table (no {', '.join(missing)} column)")
        return costs.astype({c: t for c, t in COST_COLUMNS.items() if c in costs.columns})
    except CaptureError:
        raise
    except Exception as exc:  # noqa: BLE001 - every way a damaged file fails reads as one line
        first = first_line(exc)
        raise CaptureError(f"{path}: unreadable op costs ({type(exc).__name__}: {first})") from None


def load_ddp_trace(out_dir: str | Path, meta_extra: Optional[Mapping[str, Any]] = None, **load_kwargs: Any):
    """Load every rank's Kineto JSON in `out_dir` as one Trace and join each rank's op costs.
    `load_kwargs` go to `profiler.trace.load_trace`."""
    from profiler.capture.join import join_costs
    from profiler.capture.kineto import _load_trace
    from profiler.trace.model import Trace

    out_dir = Path(out_dir)
    ranked = {int(m.group(1)): p for p in out_dir.glob("kineto_rank*.pt.trace.json")
              if (m := RANK_TRACE_NAME.fullmatch(p.name))}  # other names (kineto_rankX...) are not ours
    if not ranked:
        raise CaptureError(f"no per-rank traces (kineto_rank<N>.pt.trace.json) in {out_dir}")
    trace = _load_trace()([str(ranked[r]) for r in sorted(ranked)], **load_kwargs)
    parts, joins = [], {}
    for rank, events in trace.events.groupby("rank", observed=True, sort=True):
        costs_path = out_dir / f"op_costs_rank{rank}.parquet"
        if costs_path.is_file():
            events, stats = join_costs(events, read_op_costs(costs_path))
            joins[int(rank)] = stats.as_dict()
        parts.append(events)
    dtypes = {**trace.events.dtypes.to_dict(), "module": "category"}  # the join named modules the upload lacks
    events = pd.concat(parts, ignore_index=True).astype(dtypes)
    meta = dict(trace.meta)
    meta["capture"] = {**dict(meta_extra or {}), "join_per_rank": joins}
    return Trace(events, meta, trace.memory, trace.counters)


REDUCTION_NOT_FINISHED = "Expected to have finished reduction"  # DDP's error for a grad that never came


def _run_workers(spec: str, plan: CapturePlan, out_dir: Path, nproc: int, size: str, batch: Optional[int],
                 overrides: Optional[Mapping[str, Any]], progress: Optional[ProgressFn],
                 find_unused: bool, heartbeat: Optional[Callable[[], None]] = None,
                 ) -> tuple[dict[int, str], list[str], list[str]]:
    """Spawn the ranks and wait: ({rank: one-line error} of the ranks that failed, a rank killed by
    a signal first, then by rank; rank 0's names of the parameters that got no grad in the check
    step; rank 0's numeric warnings).
    heartbeat: as capture_isolated's; when it (or progress) raises, the ranks are killed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    free_gib = available_gib()
    procs = mp.start_processes(_worker, args=(nproc, _free_port(), spec, plan, str(out_dir), size, batch,
                                              dict(overrides or {}), messages, find_unused),
                               nprocs=nproc, join=False, start_method="spawn")
    errors: dict[int, str] = {}
    unused: list[str] = []
    warnings: list[str] = []

    def drain() -> None:
        while True:
            try:
                msg = messages.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "progress" and progress:
                progress(*msg[1:])
            elif msg[0] == "error":
                errors.setdefault(msg[1], msg[2])
            elif msg[0] == "unused":
                unused[:] = msg[2]
            elif msg[0] == "warnings":
                warnings[:] = msg[2]

    beat = time.monotonic()
    exitcodes: list[Optional[int]] = []  # filled when a rank failed
    try:
        while not procs.join(timeout=0.2):
            drain()
            if heartbeat is not None and time.monotonic() - beat >= HEARTBEAT_S:
                heartbeat()
                beat = time.monotonic()
    except BaseException as exc:  # a rank exited non-zero (its own message says why), or the wait was stopped
        if not hasattr(exc, "error_index"):  # stopped (Ctrl-C, the page's Stop or rerun): end the ranks
            for p in procs.processes:
                if p.is_alive():
                    p.kill()
            raise
        time.sleep(0.2)
        drain()
        exitcodes = [p.exitcode for p in procs.processes]
        if not errors:  # torch's own line ("process 1 terminated with signal SIGKILL")
            errors[-1] = " ".join(str(exc).split())[:300]
    drain()
    return errors_in_order(errors, exitcodes, free_gib), unused, warnings


def errors_in_order(errors: Mapping[int, str], exitcodes: list[Optional[int]],
                    free_gib: Optional[float]) -> dict[int, str]:
    """The ranks' one-line errors, the one to report first. A rank a signal ended (the OOM killer's
    SIGKILL; not the SIGTERM torch's join sends the others once one failed) said nothing, and its
    peers' errors ("Connection reset by peer") are its consequence: it goes first, with its likely
    cause. Otherwise by rank."""
    out = dict(errors)
    killed = [r for r, code in enumerate(exitcodes) if code is not None and code < 0 and code != -signal.SIGTERM]
    if killed:
        out.pop(-1, None)  # torch's line about it, said better here
        out[killed[0]] = death_cause(exitcodes[killed[0]], free_gib, f"rank {killed[0]}'s process")
    first = killed[0] if killed else None
    return dict(sorted(out.items(), key=lambda item: (item[0] != first, item[0])))


def capture_ddp(spec: str, plan: CapturePlan, out_dir: str | Path, nproc: int, *, size: str = "small",
                batch: Optional[int] = None, overrides: Optional[Mapping[str, Any]] = None,
                progress: Optional[ProgressFn] = None, heartbeat: Optional[Callable[[], None]] = None) -> CaptureResult:
    """Spawn `nproc` DDP workers, capture one trace per rank, return the merged multi-rank Trace."""
    if nproc < 2:
        raise CaptureError("--nproc must be >= 2 for a distributed capture")
    if plan.mode != "train":
        raise CaptureError("a distributed (DDP) capture profiles training: use --mode train")
    if plan.is_cuda and torch.cuda.device_count() < nproc:
        raise CaptureError(f"--nproc {nproc} needs {nproc} GPUs, found {torch.cuda.device_count()}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    say = progress or (lambda done, total, msg: None)
    attempt = time.time()
    errors, unused, warnings = _run_workers(spec, plan, out_dir, nproc, size, batch, overrides, progress,
                                            find_unused=False, heartbeat=heartbeat)
    forced = bool(errors) and any(REDUCTION_NOT_FINISHED in m for m in errors.values())
    if forced:
        say(0, plan.steps, "DDP: a later step left a parameter without a grad (data-dependent control flow, "
                           "e.g. an expert no token reached): running again with find_unused_parameters=True")
        attempt = time.time()
        errors, unused, warnings = _run_workers(spec, plan, out_dir, nproc, size, batch, overrides, progress,
                                                find_unused=True, heartbeat=heartbeat)
    if errors:
        rank, msg = next(iter(errors.items()))  # a killed rank's cause, else the lowest rank's error
        raise CaptureError(f"distributed capture failed on rank {rank}: {msg}")
    clear_outputs(out_dir, RUN_OUTPUTS, before=attempt)  # an earlier run's rank JSON or op costs must not join
    run_s = time.perf_counter() - t0
    off = {"nvml": "device is cpu (NVML samples NVIDIA GPUs only)"} if not plan.is_cuda else {}
    off["cupti"] = "not used: Kineto is this capture's backend (CUPTI callbacks are process-wide)"
    trace = load_ddp_trace(out_dir, {"spec": spec, "plan": dataclasses.asdict(plan), "nproc": nproc,
                                     "backend": "nccl" if plan.is_cuda else "gloo", "sources_off": dict(off),
                                     "ddp_unused_parameters": list(unused),
                                     "ddp_find_unused_parameters": forced or bool(unused),
                                     "warnings": list(warnings)})
    return CaptureResult(trace, out_dir / "kineto_rank0.pt.trace.json", off,
                         {"run_s": run_s, "total_s": time.perf_counter() - t0})


def capture_ranks(spec: str, plan: CapturePlan, out_dir: str | Path, nproc: int = 1, *, size: str = "small",
                  batch: Optional[int] = None, overrides: Optional[Mapping[str, Any]] = None,
                  progress: Optional[ProgressFn] = None, heartbeat: Optional[Callable[[], None]] = None) -> CaptureResult:
    """One capture in a child process (nproc 1; isolated.py) or a DDP capture over `nproc` ranks:
    what the CLI's `--nproc` and the dashboard's Ranks field run. heartbeat: see capture_isolated."""
    if nproc < 1:
        raise CaptureError(f"ranks must be >= 1, got {nproc}")
    if nproc == 1:  # in a child process, so that running out of memory is an error line (isolated.py)
        from profiler.capture.isolated import capture_isolated

        start = time.time()
        result = capture_isolated(spec, plan, out_dir, size=size, batch=batch, overrides=overrides, progress=progress,
                                  heartbeat=heartbeat)
        clear_outputs(out_dir, RUN_OUTPUTS, before=start)  # an earlier capture's other ranks or op costs
        return result
    return capture_ddp(spec, plan, out_dir, nproc, size=size, batch=batch, overrides=overrides, progress=progress,
                       heartbeat=heartbeat)

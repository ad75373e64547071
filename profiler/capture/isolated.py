"""A single-rank capture in a child process, so that a model that needs more memory than the
machine has (or crashes in native code) costs one error line, not the dashboard or the CLI.

Linux overcommits memory: a step that needs more than there is is not refused with a MemoryError;
the kernel's out-of-memory killer ends a process once the pages are touched. In-process, that was
the Streamlit server (every open page lost, "Connection error") or the CLI with a bare "Killed".
Here the capture runs in a child (forked from a forkserver that imported torch once, so after the
first capture a child starts in ~10 ms instead of the ~2 s of a fresh interpreter), the child
volunteers to the OOM killer (oom_score_adj 1000), and a child that dies is one SpecError naming
the spec, the signal and the memory there was. It gets the caller's environment, working
directory, sys.path and thread count; progress and the CaptureResult come back over a pipe.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from profiler.errors import first_line

if TYPE_CHECKING:  # torch and the capture modules load on use: prestart() runs before the caller imports torch
    from profiler.capture.backends import CapturePlan, CaptureResult, ProgressFn

# Imported once by the forkserver, not by every capture (torch._dynamo: what an optimizer's
# constructor imports, 1.5 s here; with it a tiny capture's child takes 0.14 s, not 1.2).
PRELOAD = ["torch", "torch._dynamo", "torch.profiler", "profiler.capture.runner", "profiler.capture.zoo.models"]
HEARTBEAT_S = 1.0  # how often a silent child's wait calls the caller's heartbeat
_context: Any = None


def _ctx() -> Any:
    """The forkserver context (preloading PRELOAD), or spawn where there is no forkserver."""
    global _context
    if _context is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(PRELOAD)
        else:
            _context = multiprocessing.get_context("spawn")
    return _context


def prestart() -> None:
    """Start the forkserver now, so that its imports run beside the caller's own work (the CLI's
    argument checks, a page being drawn) and the first capture waits less. Idempotent."""
    ctx = _ctx()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def available_gib() -> Optional[float]:
    """MemAvailable from /proc/meminfo in GiB (None where there is none): for the OOM message."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def volunteer_for_oom_killer() -> None:
    """Make this process the OOM killer's first pick (a capture, not the server that started it)."""
    try:  # raising one's own score needs no privilege
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _child(conn: Any, env: Mapping[str, str], threads: int, spec: str, plan: CapturePlan, out_dir: str,
           size: str, batch: Optional[int], overrides: dict) -> None:
    """Child entry point: the caller's environment, then the capture; every outcome is one message."""
    os.environ.clear()
    os.environ.update(env)  # a forkserver child starts with the forkserver's environment
    volunteer_for_oom_killer()
    import torch

    from profiler.capture.backends import CaptureError
    from profiler.capture.runner import capture

    torch.set_num_threads(threads)

    try:
        result = capture(spec, plan, out_dir, size=size, batch=batch, overrides=overrides,
                         progress=lambda done, total, msg: conn.send(("progress", done, total, msg)))
        conn.send(("result", result))
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # back to the caller as the same exception, with this traceback
        exc.add_note("in the capture process:\n" + "".join(traceback.format_exception(exc)).rstrip())
        try:
            conn.send(("error", exc))
        except Exception:  # an exception that does not pickle: its first line
            conn.send(("error", CaptureError(f"spec {spec!r}: {first_line(exc)}")))
    finally:
        conn.close()


def death_cause(exitcode: Optional[int], free_gib: Optional[float], what: str = "the capture process") -> str:
    """Why a capture process ended without a result, in one line (exitcode: multiprocessing's,
    minus the signal number when a signal ended it)."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == signal.SIGKILL:
            free = f"; {free_gib:.1f} GiB were free when it started" if free_gib is not None else ""
            return (f"ran out of memory: {what} was killed ({name}), most likely by the kernel's "
                    f"out-of-memory killer{free}; try a smaller batch or size")
        return f"{what} died of {name}"
    return f"{what} exited with status {exitcode} before sending its result"


def capture_isolated(spec: str, plan: CapturePlan, out_dir: str | Path, *, size: str = "small",
                     batch: Optional[int] = None, overrides: Optional[Mapping[str, Any]] = None,
                     progress: Optional[ProgressFn] = None,
                     heartbeat: Optional[Callable[[], None]] = None) -> CaptureResult:
    """runner.capture(spec, ...) in a child process: the same result, progress and errors
    (SpecError / CaptureError, re-raised here), and one SpecError line when the child dies.

    heartbeat: called every HEARTBEAT_S while the child is silent (a build that hangs, profiled
    steps, which report nothing to a page): an exception it raises (Streamlit's stop or rerun)
    ends the wait, and the child is killed."""
    import torch

    from profiler.capture.backends import CaptureError
    from profiler.capture.spec import SpecError

    say = progress or (lambda done, total, msg: None)
    ctx = _ctx()
    free_gib = available_gib()
    recv_end, send_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, name="fusionlens-capture",
                       args=(send_end, dict(os.environ), torch.get_num_threads(), spec, plan, str(out_dir),
                             size, batch, dict(overrides or {})))
    proc.start()
    send_end.close()  # the child holds the only send end: its death is EOF here
    answered = False
    try:
        while True:
            if heartbeat is not None and not recv_end.poll(HEARTBEAT_S):
                heartbeat()
                continue
            try:
                raw = recv_end.recv_bytes()  # an exception a signal handler raises meanwhile (a timeout) is its own
            except EOFError:
                break
            try:
                msg = pickle.loads(raw)
            except Exception as exc:  # a message that does not unpickle here
                answered = True
                raise CaptureError(f"spec {spec!r}: unreadable message from the capture process: {first_line(exc)}") from None
            if msg[0] == "progress":
                say(*msg[1:])
            else:
                answered = True
                if msg[0] == "error":
                    raise msg[1]
                return msg[1]
        proc.join()
        raise SpecError(f"spec {spec!r}: {death_cause(proc.exitcode, free_gib)}")
    finally:
        recv_end.close()
        if answered:  # the child is ending on its own
            proc.join(timeout=10)
        if proc.is_alive():  # interrupted (Ctrl-C, a page's Stop), or a child that will not end
            proc.kill()
            proc.join()

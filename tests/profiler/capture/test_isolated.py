"""Single-rank captures in a child process (profiler/capture/isolated.py): a child that dies is one
line, errors come back with their type, and the child sees the caller's environment."""
import json
import pickle
import textwrap
import time
from pathlib import Path

import pytest
import torch

from profiler.capture.backends import CapturePlan, CaptureResult
from profiler.capture.isolated import capture_isolated, death_cause
from profiler.capture.spec import SpecError
from profiler.trace import load_trace
from tests.processes import gone

PLAN = CapturePlan(wait=0, warmup=0, active=1)
DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_capture_comes_back_whole(tmp_path):
    seen = []
    res = capture_isolated("mlp", PLAN, tmp_path / "out", size="tiny", progress=lambda d, t, m: seen.append(m))
    assert isinstance(res, CaptureResult) and res.raw_path.is_file()
    assert res.trace.meta["capture"]["join"]["match_rate"] == 1.0
    assert seen[0] == "building the model" and seen[-1].startswith("captured in")
    assert res.sources_off["nvml"].startswith("device is cpu")


@pytest.mark.parametrize("body, expected", [
    ("import os, signal\ndef build():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
     "ran out of memory: the capture process was killed (SIGKILL), most likely by the kernel's out-of-memory killer"),
    ("import ctypes\ndef build():\n    ctypes.string_at(0)\n", "the capture process died of SIGSEGV"),
    ("import os\ndef build():\n    os._exit(3)\n", "the capture process exited with status 3 before sending its result"),
])
def test_a_child_that_dies_is_one_line_naming_the_spec(tmp_path, body, expected):
    spec = f"{write(tmp_path, 'dies.py', body)}:build"
    with pytest.raises(SpecError) as info:
        capture_isolated(spec, PLAN, tmp_path / "out")
    msg = str(info.value)
    assert msg.startswith(f"spec {spec!r}: ") and expected in msg and "\n" not in msg, msg


def test_the_oom_line_says_how_much_memory_was_free():
    assert death_cause(-9, 21.25).endswith("; 21.2 GiB were free when it started; try a smaller batch or size")
    assert "GiB" not in death_cause(-9, None)
    assert death_cause(-11, None, "rank 1's process") == "rank 1's process died of SIGSEGV"


def test_an_error_comes_back_with_its_type_and_the_child_traceback(tmp_path):
    spec = f"{write(tmp_path, 'raises.py', 'def build():' + chr(10) + '    raise ValueError(42)' + chr(10))}:build"
    with pytest.raises(SpecError, match=r"build\(\) raised ValueError: 42$") as info:
        capture_isolated(spec, PLAN, tmp_path / "out")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert notes.startswith("in the capture process:\nTraceback (most recent call last):") and "in _child" in notes
    assert "\n" not in str(info.value)  # the note is for tracebacks; the error line stays one line


def test_the_child_gets_the_callers_environment_cwd_path_and_threads(tmp_path, monkeypatch):
    """A forkserver child starts with the forkserver's state: the caller's must reach it."""
    pkg = tmp_path / "fl_isolated_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write(pkg, "spec.py", """
        import json, os, torch
        def build():
            seen = {"env": os.environ.get("FL_PROBE_VALUE"), "cwd": os.getcwd(), "threads": torch.get_num_threads()}
            with open(os.environ["FL_PROBE_OUT"], "w") as f:
                json.dump(seen, f)
            return torch.nn.Linear(3, 2), (torch.randn(2, 3),)
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    probe = tmp_path / "seen.json"
    monkeypatch.setenv("FL_PROBE_VALUE", "set after the forkserver started")
    monkeypatch.setenv("FL_PROBE_OUT", str(probe))
    capture_isolated("fl_isolated_probe.spec:build", PLAN, tmp_path / "out")
    seen = json.loads(probe.read_text())
    assert seen == {"env": "set after the forkserver started", "cwd": str(workdir), "threads": torch.get_num_threads()}


def test_a_trace_and_a_capture_result_pickle_with_frozen_meta():
    """What the child sends back: meta's read-only views do not pickle as they are."""
    trace = load_trace(DATA / "hta_a100_rank0of2_nccl_data.json.gz")
    back = pickle.loads(pickle.dumps(CaptureResult(trace, None, {"nvml": "off"}, {"run_s": 1.5})))
    assert back.trace.events.equals(trace.events) and back.trace.meta == trace.meta
    assert dict(back.sources_off) == {"nvml": "off"} and dict(back.timings) == {"run_s": 1.5}
    with pytest.raises(TypeError):  # frozen again, nested mappings included
        back.trace.meta["device_properties"][0]["name"] = "x"
    assert type(back.trace.meta["sources"]) is tuple


class Stopped(BaseException):
    """What Streamlit's Stop button raises in a page's script thread (a BaseException there too)."""


def test_a_heartbeat_that_raises_ends_a_hanging_capture_and_its_process(tmp_path):
    """A build() that never returns sends nothing; the heartbeat still runs (about once a second),
    and when it raises (the page's Stop), the wait ends and the child is killed."""
    pid_file = tmp_path / "pid"
    body = ("import os, time\n"
            "def build():\n"
            f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "    time.sleep(600)\n")
    spec = f"{write(tmp_path, 'hangs.py', body)}:build"
    beats = []

    def heartbeat():
        beats.append(time.monotonic())
        if pid_file.exists():
            raise Stopped

    t0 = time.monotonic()
    with pytest.raises(Stopped):
        capture_isolated(spec, PLAN, tmp_path / "out", heartbeat=heartbeat)
    assert time.monotonic() - t0 < 30 and beats
    assert gone(int(pid_file.read_text()))


class TimedOut(Exception):
    """What a caller's SIGALRM handler raises (benchmarks/hf_sweep.py's per-model timeout)."""


def test_an_exception_raised_by_a_signal_handler_during_the_wait_is_not_an_unreadable_message(tmp_path):
    """It came out as "unreadable message from the capture process: " (the sweep's timeout firing
    while the parent waited for a message), and the child then died of a broken pipe."""
    import signal

    body = "import time\ndef build():\n    time.sleep(60)\n"
    spec = f"{write(tmp_path, 'slow.py', body)}:build"

    def on_alarm(signum, frame):
        raise TimedOut("the sweep's timeout")

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:  # armed at the child's first message: it fires while the parent waits for the next
        with pytest.raises(TimedOut):
            capture_isolated(spec, PLAN, tmp_path / "out", progress=lambda *_: signal.alarm(1))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_message_that_does_not_unpickle_is_one_line(tmp_path, monkeypatch):
    from profiler.capture import isolated
    from profiler.capture.backends import CaptureError

    def broken(raw):
        raise pickle.UnpicklingError("invalid load key, 'x'")

    monkeypatch.setattr(isolated.pickle, "loads", broken)
    with pytest.raises(CaptureError, match=r"^spec 'mlp': unreadable message from the capture process: invalid load key"):
        capture_isolated("mlp", PLAN, tmp_path / "out", size="tiny")

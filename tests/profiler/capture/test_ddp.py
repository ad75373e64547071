"""A DDP capture with 2 ranks on this CPU (gloo): one trace per rank, loaded as ranks 0 and 1."""
import textwrap

import pytest

from profiler.capture.backends import CaptureError, CapturePlan
from profiler.capture.ddp import capture_ddp
from tests.processes import wait_gone


def test_two_rank_gloo_capture(tmp_path):
    res = capture_ddp("mlp", CapturePlan(wait=0, warmup=1, active=1), tmp_path, 2, size="tiny")
    files = sorted(p.name for p in tmp_path.glob("kineto_rank*.pt.trace.json"))
    assert files == ["kineto_rank0.pt.trace.json", "kineto_rank1.pt.trace.json"]
    ev = res.trace.events
    assert res.trace.ranks == (0, 1)
    assert sorted(ev["rank"].unique().tolist()) == [0, 1]
    allreduce = ev[ev["name"].astype(str).str.contains("allreduce")]
    assert set(allreduce["rank"]) == {0, 1}  # DDP's gradient all-reduce ran on both ranks
    per_rank = ev.groupby("rank")["flops"].sum()
    assert per_rank[0] == per_rank[1] > 0  # same program, same FLOPs on each rank
    from profiler.analysis.distributed import collectives, stragglers

    coll = collectives(res.trace)  # the multi-rank analyses see gloo's all-reduces on both ranks
    assert set(coll["rank"]) == {0, 1} and (coll["count"] > 0).all()
    assert stragglers(res.trace)["n_collectives"].gt(0).all()
    # every op of the FLOPs pass found its profiled op on both ranks: DDP's one-off bucket rebuild
    # (2nd iteration, broadcasting bucket indices) happens before the pass, not inside it
    joins = res.trace.meta["capture"]["join_per_rank"]
    assert sorted(joins) == [0, 1] and all(j["match_rate"] == 1.0 for j in joins.values()), joins
    assert list(res.trace.meta["capture"]["ddp_unused_parameters"]) == []  # DDP's default (no detection) kept
    assert res.trace.meta["capture"]["ddp_find_unused_parameters"] is False
    assert list(res.trace.meta["capture"]["warnings"]) == []  # rank 0's numeric check: all finite
    # each rank's ops name the MLP's layers as an unwrapped capture does (Sequential.0, not
    # DistributedDataParallel.module.0)
    for rank in (0, 1):
        names = set(ev.loc[ev["rank"] == rank, "module"].dropna().astype(str))
        assert {"Sequential.0", "Sequential.2"} <= names and not any("Distributed" in n for n in names), names


def _capture_spec(tmp_path, name: str, source: str):
    """A 2-rank DDP training capture of build() in `source` (written to tmp_path/name): (result,
    the progress messages)."""
    spec = tmp_path / name
    spec.write_text(textwrap.dedent(source))
    said: list[str] = []
    res = capture_ddp(f"{spec}:build", CapturePlan(mode="train", wait=0, warmup=1, active=1), tmp_path / "out", 2,
                      progress=lambda done, total, msg: said.append(msg))
    return res, said


def test_parameters_the_loss_does_not_use(tmp_path):
    """A head the loss never reaches: DDP's default fails on the 2nd step ("Expected to have
    finished reduction in the prior iteration"); the capture finds the unused parameters first and
    runs DDP with find_unused_parameters, naming them in the progress and the trace's meta. The
    spare head holds a NaN, which rank 0's numeric check names (the loss stays finite)."""
    res, said = _capture_spec(tmp_path, "unused_head.py", """
        import torch
        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body, self.head, self.spare = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
                with torch.no_grad():
                    self.spare.bias[1] = float("nan")
            def forward(self, x): return self.head(torch.relu(self.body(x))).square().mean()
        def build(): return TwoHeads(), (torch.randn(4, 8),)
    """)
    assert res.trace.ranks == (0, 1)
    assert list(res.trace.meta["capture"]["warnings"]) == [
        "after the profiled steps 1 of 6 parameters hold NaN or inf (first: spare.bias): the steps that ran on them "
        "timed non-finite arithmetic"]
    assert list(res.trace.meta["capture"]["ddp_unused_parameters"]) == ["spare.weight", "spare.bias"]
    assert any("find_unused_parameters=True" in m and "spare.weight" in m for m in said), said


KILL_RANK1_IN = {
    "build": """
        import os, signal, torch
        def build():
            if os.environ.get("RANK") == "1":
                os.kill(os.getpid(), signal.SIGKILL)
            return torch.nn.Linear(4, 2), (torch.randn(3, 4),)
    """,
    # after DDP is set up: rank 0 then fails in its all-reduce ("Connection reset by peer"), and that
    # consequence must not hide the cause
    "forward": """
        import os, signal, torch
        class Dies(torch.nn.Linear):
            def forward(self, x):
                if os.environ.get("RANK") == "1":
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().forward(x)
        def build():
            return Dies(4, 2), (torch.randn(3, 4),)
    """,
}


@pytest.mark.parametrize("where", sorted(KILL_RANK1_IN))
def test_a_rank_killed_by_the_oom_killer_is_one_line(tmp_path, where):
    """A rank that dies without a word (SIGKILL, as the kernel's OOM killer ends it) is named, with
    the likely cause, in the one line the capture fails with, before its peers' errors."""
    spec = tmp_path / "dies_on_rank1.py"
    spec.write_text(textwrap.dedent(KILL_RANK1_IN[where]))
    with pytest.raises(CaptureError) as info:
        capture_ddp(f"{spec}:build", CapturePlan(wait=0, warmup=0, active=1), tmp_path / "out", 2)
    msg = str(info.value)
    assert msg.startswith("distributed capture failed on rank 1: ran out of memory: rank 1's process was killed "
                          "(SIGKILL), most likely by the kernel's out-of-memory killer"), msg
    assert "\n" not in msg


def test_a_killed_ranks_cause_goes_before_its_peers_errors():
    """Under load, rank 0's "Connection reset by peer" can reach the parent before it sees rank 1
    die (CI did so): the SIGKILLed rank is still the one reported. SIGTERM (what torch's join
    sends the other ranks once one failed) is not a cause; with no signal, errors go by rank."""
    from profiler.capture.ddp import errors_in_order

    reset = "RuntimeError: [gloo] Read error: Connection reset by peer"
    first = next(iter(errors_in_order({0: reset}, [2, -9], 3.0).items()))
    assert first == (1, "ran out of memory: rank 1's process was killed (SIGKILL), most likely by the kernel's "
                        "out-of-memory killer; 3.0 GiB were free when it started; try a smaller batch or size")
    assert errors_in_order({-1: "process 1 terminated with signal SIGKILL"}, [-15, -9], None).keys() == {1}
    assert list(errors_in_order({1: "b", 0: "a"}, [-15, 2], None).items()) == [(0, "a"), (1, "b")]
    assert errors_in_order({}, [], None) == {}


def test_a_stopped_wait_kills_the_ranks(tmp_path):
    """The page's Stop (an exception from the heartbeat) during a DDP capture whose ranks hang in
    build(): the wait ends and no rank is left running."""
    pids = tmp_path / "pids"
    pids.mkdir()
    spec = tmp_path / "hangs.py"
    spec.write_text("import os, time\n"
                    "def build():\n"
                    f"    open(os.path.join({str(pids)!r}, os.environ['RANK']), 'w').write(str(os.getpid()))\n"
                    "    time.sleep(600)\n")

    class Stopped(BaseException):
        pass

    def heartbeat():
        if len(list(pids.iterdir())) == 2:
            raise Stopped

    with pytest.raises(Stopped):
        capture_ddp(f"{spec}:build", CapturePlan(wait=0, warmup=0, active=1), tmp_path / "out", 2,
                    heartbeat=heartbeat)
    for f in pids.iterdir():
        assert wait_gone(int(f.read_text()), 0.5), f"rank {f.name} still runs"


def test_parameters_unused_on_one_rank_only(tmp_path):
    """Rank 1's data never reaches expert `b`, rank 0's does (a mixture of experts routing tokens
    differently per rank): the ranks must agree on find_unused_parameters or the first reduction
    hangs until gloo's timeout; the capture takes the union of what the ranks found."""
    res, said = _capture_spec(tmp_path, "rank_experts.py", """
        import torch
        import torch.distributed as dist
        class TwoExperts(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
            def forward(self, x, use_b):
                out = self.a(x)
                return (out + self.b(x) if bool(use_b) else out).square().mean()
        def build():
            torch.manual_seed(0)
            return TwoExperts(), (torch.randn(8, 4), torch.tensor(dist.get_rank() == 0))
    """)
    assert res.trace.ranks == (0, 1)
    assert list(res.trace.meta["capture"]["ddp_unused_parameters"]) == ["b.weight", "b.bias"]
    assert any("no grad on some rank (b.weight, b.bias)" in m for m in said), said


def test_a_parameter_a_later_step_leaves_out_reruns_with_detection(tmp_path):
    """Expert `b` runs in the first forward only (data-dependent routing): the one-step check finds
    nothing, DDP's default then fails ("Expected to have finished reduction"), and the capture runs
    once more with find_unused_parameters, saying so."""
    res, said = _capture_spec(tmp_path, "flaky.py", """
        import torch
        class Flaky(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
                self.calls = 0
            def forward(self, x):
                self.calls += 1
                out = self.a(x)
                return (out + self.b(x) if self.calls == 1 else out).square().mean()
        def build():
            torch.manual_seed(0)
            return Flaky(), (torch.randn(8, 4),)
    """)
    meta = res.trace.meta["capture"]
    assert res.trace.ranks == (0, 1) and meta["ddp_find_unused_parameters"] is True
    assert list(meta["ddp_unused_parameters"]) == []  # the check step used every parameter
    assert any("running again with find_unused_parameters=True" in m for m in said), said


def test_each_rank_picks_its_machines_gpu():
    """torchrun's LOCAL_RANK wins (ranks need not be laid out node by node); our own workers set
    only RANK; the index wraps at the GPUs the process sees; no GPU is one line."""
    from profiler.capture.backends import CaptureError
    from profiler.capture.ddp import local_gpu

    assert local_gpu({"RANK": "13", "LOCAL_RANK": "2"}, 8) == 2
    assert local_gpu({"RANK": "3"}, 2) == 1
    assert local_gpu({"RANK": "5", "LOCAL_RANK": "5"}, 1) == 0  # CUDA_VISIBLE_DEVICES=one GPU a rank
    assert local_gpu({}, 4) == 0
    with pytest.raises(CaptureError, match="sees no GPU"):
        local_gpu({"RANK": "0"}, 0)


def test_the_torchrun_recipe(tmp_path):
    """docs/capture.md's recipe as a user runs it: torchrun starts 2 ranks that each call
    capture_this_rank, for two models in turn (one process group for both: a second group from
    torchrun's store hung in its first collective); `analyze` reads a folder as ranks 0 and 1 with
    their op costs joined."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from profiler.capture.artifacts import load_traces_or_saved

    root = Path(__file__).resolve().parents[3]
    script = tmp_path / "capture_ranks.py"
    script.write_text("from profiler.capture.backends import CapturePlan\n"
                      "from profiler.capture.ddp import capture_this_rank\n"
                      "for spec, out in (('cnn', 'cnn_out'), ('mlp', 'out')):\n"
                      f"    capture_this_rank(spec, CapturePlan(mode='train', wait=0, active=1), {str(tmp_path)!r} + '/' + out,"
                      " size='tiny')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert load_traces_or_saved([str(tmp_path / "cnn_out")]).ranks == (0, 1)
    trace = load_traces_or_saved([str(tmp_path / "out")])
    assert trace.ranks == (0, 1)
    per_rank = trace.events.groupby("rank")["flops"].sum()
    assert per_rank[0] == per_rank[1] > 0
    assert sorted(trace.meta["capture"]["join_per_rank"]) == [0, 1]
    out = tmp_path / "analysis.json"
    cli = subprocess.run([sys.executable, "-m", "profiler", "analyze", str(tmp_path / "out"), "--json", str(out)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=240)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert json.loads(out.read_text())["trace"]["ranks"] == [0, 1]

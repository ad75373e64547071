"""Provider choice by measurement (kernels/tuning.py), tested with throw-away kernels whose
providers have known relative speeds (one does the same work 20 times) and count their calls.

Every test measures into its own data dir (tmp_path) with FUSIONLENS_PROVIDER_CHOICE=measure and
forgets the in-memory decisions before and after, so tests are independent of order and workers.
Real kernels are only checked for the mechanism (times reported), never for which one wins.
The measurement's rounds themselves (dropping, warm-ups as a round, shuffling, the notice, the
reference kept out): test_tuning_rounds.py.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import kernels
from kernels import tuning, tuning_store
from kernels.registry import KERNELS, KernelSpec, dispatch, poison_outputs
from tests.kernels.test_rope import tables
from tests.kernels.tuning_cases import _REAL_CPU, N, _work, isolated, toy  # noqa: F401  (fixtures)

def test_choice_follows_measurement_not_the_order(toy) -> None:
    spec = toy(cpu=20, aten=1, reference=20)
    x = torch.randn(N)
    choice = kernels.provider_choice(spec.name, x)
    assert choice.how == "measured" and choice.provider == "aten"
    assert set(choice.times_us) == {"cpu", "aten", "reference"}
    assert choice.times_us["cpu"] > 5 * choice.times_us["aten"]
    assert choice.rounds >= 1 and choice.clock in ("process_cpu", "wall") and not choice.grad
    assert torch.allclose(dispatch(spec.name, x), _work(x, 1))


def test_measured_outputs_are_dropped_the_real_call_runs_after(toy) -> None:
    spec = toy(cpu=1, aten=20)
    counter = {"n": 0}

    def numbered(x: torch.Tensor) -> torch.Tensor:
        counter["n"] += 1
        return torch.full_like(x, float(counter["n"]))

    KERNELS[spec.name] = KernelSpec(spec.name, spec.reference, {"cpu": numbered, "aten": spec.providers["aten"]},
                                    spec.supports)
    out = dispatch(spec.name, torch.zeros(N))
    assert counter["n"] >= 2  # warm-up + at least one timed call, then the real one
    assert torch.all(out == counter["n"])  # the output is the last (real) call's, not a measured one


def test_ties_go_to_the_earlier_provider(toy, monkeypatch) -> None:
    assert tuning.pick({"cpu": 104.0, "aten": 100.0}, ("cpu", "aten", "reference")) == "cpu"
    assert tuning.pick({"cpu": 106.0, "aten": 100.0}, ("cpu", "aten", "reference")) == "aten"
    assert tuning.pick({"reference": 100.0, "aten": 101.0}, ("cpu", "aten", "reference")) == "aten"
    monkeypatch.setattr(tuning, "TIE_FRACTION", 100.0)  # every time ties: the order decides
    spec = toy(cpu=20, aten=1)
    assert kernels.provider_choice(spec.name, torch.randn(N)).provider == "cpu"


def test_decision_is_reused_per_key(toy) -> None:
    spec = toy(cpu=20, aten=1, reference=20)
    dispatch(spec.name, torch.randn(N))
    assert toy.calls["cpu"] >= 2 and toy.calls["reference"] >= 2
    toy.calls.clear()
    for _ in range(3):
        dispatch(spec.name, torch.randn(N + 7))  # same size bucket: no measuring
    assert toy.calls == Counter(aten=3)
    assert kernels.provider_choice(spec.name, torch.randn(N)).how == "cached"
    toy.calls.clear()
    dispatch(spec.name, torch.randn(4 * N))  # another bucket: measured again
    assert toy.calls["cpu"] >= 1 and toy.calls["reference"] >= 1


def test_decisions_persist_and_are_reused_by_a_fresh_process(toy, isolated) -> None:
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    first = kernels.provider_choice(spec.name, x)
    path = isolated / "tuning" / "provider_choice.json"
    doc = json.loads(path.read_text())
    fp, parts = tuning_store.machine("cpu")
    section = doc["machines"][fp]
    assert doc["format"] == tuning_store.FORMAT and parts["torch"] == torch.__version__
    assert section["decisions"][first.key]["provider"] == "aten"
    assert section["decisions"][first.key]["times_us"] == pytest.approx(dict(first.times_us))
    tuning.forget_decisions()  # as a new process would: only the file is left
    toy.calls.clear()
    again = kernels.provider_choice(spec.name, x)
    assert again.how == "stored" and again.provider == "aten" and toy.calls == Counter()
    assert not list(path.parent.glob("*.tmp"))  # atomic writes leave no temporary behind


def test_a_decisions_file_of_an_older_version_is_measured_anew(toy, isolated) -> None:
    """Version 1 files may hold decisions judged on first calls alone (warm-ups as the only round,
    until 2026-12-02), which stored the unfused reference 8x slower: they are not reused, and the
    next decision rewrites the file at the current version."""
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    first = kernels.provider_choice(spec.name, x)
    path = isolated / "tuning" / "provider_choice.json"
    doc = json.loads(path.read_text())
    doc["version"] = 1
    fp, _ = tuning_store.machine("cpu")
    doc["machines"][fp]["decisions"][first.key]["provider"] = "cpu"  # what a first-call decision stored
    path.write_text(json.dumps(doc))
    tuning.forget_decisions()
    again = kernels.provider_choice(spec.name, x)
    assert again.how == "measured" and again.provider == "aten"
    assert json.loads(path.read_text())["version"] == tuning_store.VERSION == 2


def test_another_machine_fingerprint_measures_again(toy, isolated, monkeypatch) -> None:
    spec = toy(cpu=20, aten=1)
    kernels.provider_choice(spec.name, torch.randn(N))
    tuning.forget_decisions()
    monkeypatch.setattr(tuning_store, "machine", lambda *a: ("another-machine", {"cpu": "other"}))
    assert kernels.provider_choice(spec.name, torch.randn(N)).how == "measured"
    assert set(json.loads((isolated / "tuning" / "provider_choice.json").read_text())["machines"]) >= {
        "another-machine"}


@pytest.mark.parametrize("content", ["{not json", '["a list"]', "\x00\xff"])
def test_damaged_file_is_ignored_with_a_warning(toy, isolated, content) -> None:
    path = isolated / "tuning" / "provider_choice.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    spec = toy(cpu=20, aten=1)
    with pytest.warns(RuntimeWarning, match="ignored"):
        choice = kernels.provider_choice(spec.name, torch.randn(N))
    assert choice.how == "measured" and choice.provider == "aten"
    assert json.loads(path.read_text())["format"] == tuning_store.FORMAT  # rewritten whole


def test_damaged_record_is_ignored_with_a_warning(toy, isolated) -> None:
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    key = kernels.provider_choice(spec.name, x).key
    path = isolated / "tuning" / "provider_choice.json"
    doc = json.loads(path.read_text())
    fp = tuning_store.machine("cpu")[0]
    doc["machines"][fp]["decisions"][key] = {"provider": "aten", "times_us": {"cpu": "fast"}}
    path.write_text(json.dumps(doc))
    tuning.forget_decisions()
    with pytest.warns(RuntimeWarning, match="damaged decision"):
        assert kernels.provider_choice(spec.name, x).how == "measured"


def test_unwritable_data_dir_keeps_decisions_in_memory(toy, isolated, monkeypatch) -> None:
    blocker = isolated / "file_not_dir"
    blocker.write_text("")
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(blocker))
    spec = toy(cpu=20, aten=1)
    with pytest.warns(RuntimeWarning, match="could not write"):
        assert kernels.provider_choice(spec.name, torch.randn(N)).provider == "aten"
    assert kernels.provider_choice(spec.name, torch.randn(N)).how == "cached"


def test_order_mode_measures_nothing(toy, monkeypatch) -> None:
    monkeypatch.setenv(tuning.ENV_MODE, "order")
    spec = toy(cpu=20, aten=1)
    dispatch(spec.name, torch.randn(N))
    assert toy.calls == Counter(cpu=1)
    choice = kernels.provider_choice(spec.name, torch.randn(N))
    assert choice.how == "order" and choice.provider == "cpu" and not choice.times_us
    monkeypatch.setenv(tuning.ENV_MODE, "fastest")
    with pytest.raises(ValueError, match="FUSIONLENS_PROVIDER_CHOICE must be 'measure' or 'order'"):
        dispatch(spec.name, torch.randn(N))


def test_explicit_provider_always_wins(toy) -> None:
    spec = toy(cpu=20, aten=1)
    dispatch(spec.name, torch.randn(N), provider="cpu")
    assert toy.calls == Counter(cpu=1)
    assert kernels.provider_choice(spec.name, torch.randn(N), provider="cpu").how == "explicit"
    with pytest.raises(ValueError, match="has no triton provider"):
        kernels.provider_choice(spec.name, torch.randn(N), provider="triton")


def test_poison_profiler_and_compile_fall_back_to_the_order(toy, monkeypatch) -> None:
    spec = toy(cpu=20, aten=1)
    with poison_outputs():
        dispatch(spec.name, torch.randn(N))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        choice = kernels.provider_choice(spec.name, torch.randn(N))
    assert choice.how == "order" and "profiler" in choice.note
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        dispatch(spec.name, torch.randn(N))
    assert toy.calls == Counter(cpu=2)  # nothing timed, nothing stored
    assert not tuning_store.store_path().exists()


def test_a_dispatch_mode_falls_back_to_the_order(toy) -> None:
    """Under a TorchDispatchMode (the capture's cost recorder, FakeTensorMode) nothing is timed:
    a recorder would log the timing runs as the model's ops, and fake tensors time nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    spec = toy(cpu=20, aten=1)
    with Seen():
        choice = kernels.provider_choice(spec.name, torch.randn(N))
        dispatch(spec.name, torch.randn(N))
    assert choice.how == "order" and "TorchDispatchMode" in choice.note
    with FakeTensorMode():
        dispatch(spec.name, torch.randn(N))
    assert toy.calls == Counter(cpu=2)  # the order's provider, once per call; nothing timed
    assert not tuning_store.store_path().exists()
    dispatch(spec.name, torch.randn(N))  # outside any mode the call is measured as usual
    assert toy.calls["aten"] > 0 and tuning_store.store_path().exists()


class _SlowBackward(torch.autograd.Function):
    """y = 2x; the backward does `work` times the work (forward speed equal to the other's)."""

    @staticmethod
    def forward(ctx, x, work):
        ctx.work = work
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        _SlowBackward.backward_calls += 1
        return _work(g, ctx.work) * 0.0 + g * 2.0, None


def test_grad_calls_measure_forward_and_backward(toy) -> None:
    _SlowBackward.backward_calls = 0
    spec = toy(cpu=1, aten=1, reference=20)
    KERNELS[spec.name] = KernelSpec(spec.name, spec.reference,
                                    {"cpu": lambda x: _SlowBackward.apply(x, 20),
                                     "aten": lambda x: _SlowBackward.apply(x, 1)}, spec.supports)
    x = torch.randn(N, requires_grad=True)
    choice = kernels.provider_choice(spec.name, x)
    assert choice.grad and "|fwd+bwd|" in choice.key and choice.provider == "aten"
    assert _SlowBackward.backward_calls >= 4  # both providers' warm-up and timed backwards
    assert x.grad is None  # measuring left no gradient behind
    y = dispatch(spec.name, x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    with torch.no_grad():  # the same call without grad is another decision, forward only
        assert "|fwd|" in kernels.provider_choice(spec.name, x).key


def test_provider_that_fails_is_skipped_with_its_reason(toy) -> None:
    spec = toy(cpu=1, aten=1)

    def broken(x):
        raise RuntimeError("kernel exploded\nsecond line")

    KERNELS[spec.name] = KernelSpec(spec.name, spec.reference, {"cpu": broken, "aten": spec.providers["aten"]},
                                    spec.supports)
    choice = kernels.provider_choice(spec.name, torch.randn(N))
    assert choice.provider in ("aten", "reference") and "cpu" not in choice.times_us
    assert choice.skipped["cpu"] == "failed while measured: RuntimeError: kernel exploded"


def test_keys_bucket_sizes_and_keep_modes() -> None:
    key = tuning.default_key
    a = torch.empty(4096, 768)
    assert key(a) == "float32[2^12x2^9.5]"
    assert key(torch.empty(4096, 1024)) != key(a) and key(torch.empty(4100, 800)) == key(a)
    assert key(a.t()) != key(a.t().contiguous())  # strided inputs are their own case
    assert key(a, -1, 1.0, None, False) != key(a, -1, 0.5, None, False)  # scale 1 skips a multiply
    assert key(a, -1, 0.5, None, False) == key(a, -1, 0.25, None, False)
    assert key(a, "tanh") != key(a, "none") and key(a, None, 1e-6, 0.0) != key(a, None, 1e-6, 1.0)
    assert key(a, reduction="mean") != key(a, reduction="sum")
    assert key(torch.empty(0, 5)) == "float32[0x2^2]"


def test_spec_key_function_and_threads_are_part_of_the_key(toy) -> None:
    spec = toy(cpu=1, aten=1)
    custom = KernelSpec(spec.name, spec.reference, spec.providers, spec.supports,
                        tune_key=lambda x: f"n={x.numel()}")
    assert tuning.call_key(custom, (torch.randn(3),), {}, False).endswith("|fwd|n=3")
    threads = torch.get_num_threads()
    assert f"|t{threads}|" in tuning.call_key(spec, (torch.randn(3),), {}, False)


def test_real_kernel_reports_times_for_every_runnable_provider() -> None:
    if _REAL_CPU["reason"] is not None:
        pytest.skip(f"cpu provider unavailable: {_REAL_CPU['reason']}")
    x = torch.randn(64, 256)
    choice = kernels.provider_choice("softmax", x)
    assert choice.how == "measured" and set(choice.times_us) == {"cpu", "aten", "reference"}
    masked = kernels.provider_choice("softmax", x, -1, 1.0, torch.zeros(256), False)
    assert "aten" in masked.skipped and "aten" not in masked.times_us
    torch.testing.assert_close(kernels.softmax(x), torch.softmax(x.double(), -1).float())


def test_keys_do_not_depend_on_how_arguments_are_passed() -> None:
    spec = KERNELS["softmax"]
    x = torch.empty(8, 16)
    short = tuning.call_key(spec, (x,), {}, False)
    assert short == tuning.call_key(spec, (x, -1, 1.0, None, False), {}, False)
    assert short == tuning.call_key(spec, (x,), {"causal": False, "dim": -1}, False)
    assert short != tuning.call_key(spec, (x,), {"causal": True}, False)


def _real_cpu_or_skip() -> None:
    if _REAL_CPU["reason"] is not None:
        pytest.skip(f"cpu provider unavailable: {_REAL_CPU['reason']}")


_CHECKPOINTED = {  # kernel -> f(x, w) of a [rows, 24] input and a [24] weight
    "rms_norm": lambda x, w: kernels.rms_norm(x, w, 1e-6),
    "layer_norm": lambda x, w: kernels.layer_norm(x, w, w * 0.5, 1e-5),
    "add_rms_norm": lambda x, w: kernels.add_rms_norm(x, x * 0.5, w, 1e-6)[1],
    "gelu": lambda x, w: kernels.gelu(x * w, approximate="tanh"),
    "swiglu": lambda x, w: kernels.swiglu(x, x * w),
    "softmax": lambda x, w: kernels.softmax(x * w, causal=True),
    "rope": lambda x, w: kernels.rope(x.view(1, 1, -1, 24), (x * w).view(1, 1, -1, 24),
                                      *tables(x.shape[0], 24, torch.float32))[1],
}


@pytest.mark.parametrize("name", sorted(_CHECKPOINTED))
@pytest.mark.parametrize("reentrant", [False, True])
def test_first_call_inside_activation_checkpointing_is_measured_and_recomputes(name, reentrant) -> None:
    """The default (measure) mode inside torch.utils.checkpoint: the timing runs of the first call
    used to be packed by the checkpoint's saved-tensor hooks, so the recomputation (which reuses
    the decision) saved fewer tensors and the backward raised CheckpointError."""
    _real_cpu_or_skip()
    f = _CHECKPOINTED[name]
    x0, w0 = torch.randn(13, 24), torch.randn(24)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out = torch.utils.checkpoint.checkpoint(f, x, w, use_reentrant=reentrant)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    decisions = json.loads(tuning_store.store_path().read_text())["machines"][tuning_store.machine("cpu")[0]]
    assert any(k.startswith(f"{name}|") and "|fwd+bwd|" in k for k in decisions["decisions"])  # measured
    xr, wr = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = f(xr, wr)  # same key, decided above: the same provider, no checkpoint
    (ref * torch.linspace(-1, 1, ref.numel()).view_as(ref)).sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)


def test_measuring_sets_the_callers_saved_tensor_hooks_aside(toy) -> None:
    """Under saved-tensor hooks (checkpoint, save_on_cpu) a measured call packs exactly what a
    reused decision packs: the timing runs' graphs never reach the hooks, which stay in place."""
    _SlowBackward.backward_calls = 0
    spec = toy(cpu=1, aten=1, reference=20)
    KERNELS[spec.name] = KernelSpec(spec.name, spec.reference,
                                    {"cpu": lambda x: _SlowBackward.apply(x, 1) * x,
                                     "aten": lambda x: _SlowBackward.apply(x, 1) * x}, spec.supports)
    packed: list[int] = []

    def pack(t):
        packed.append(t.numel())
        return t

    x = torch.randn(N, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        first = dispatch(spec.name, x)
        n_first = len(packed)
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
        second = dispatch(spec.name, x)
    assert _SlowBackward.backward_calls >= 4  # the first call was measured, with backward
    assert n_first == len(packed) - n_first == 2  # x * y saves both; timing runs saved nothing here
    assert hooks is not None and hooks[0] is pack  # put back
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    (first + second).sum().backward()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU check)")
@pytest.mark.parametrize("name", ["rms_norm", "gelu", "softmax"])
def test_first_call_inside_activation_checkpointing_cuda(name) -> None:
    """The same on a GPU: triton, aten and the reference measured (CUDA events) inside checkpoint."""
    f = _CHECKPOINTED[name]
    x0, w0 = torch.randn(1000, 24, device="cuda"), torch.randn(24, device="cuda")
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out = torch.utils.checkpoint.checkpoint(f, x, w, use_reentrant=False)
    out.square().sum().backward()
    xr, wr = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    f(xr, wr).square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)

"""The exact-call memo of the provider choice (kernels/choice_memo.py): a call identical to one
answered from a stored decision gets the same provider without the key, the store or the checks,
and whatever the choice depends on (sizes, grad, threads, the environment, the decisions
themselves, a provider's availability, poisoning, torch.func) sends the call the full way again.

Throw-away kernels from tuning_cases (isolated data dir, measure mode) count their providers' calls;
`choose` is wrapped to count the calls that took the full way.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import kernels
from kernels import choice_memo, registry, tuning, tuning_store
from kernels.registry import dispatch, poison_outputs
from tests.kernels.tuning_cases import _REAL_CPU, N, _work, isolated, toy  # noqa: F401  (fixtures)


@pytest.fixture
def full_way(monkeypatch) -> list[str]:
    """Kernel names of the calls that went through `tuning.choose` (not answered by the memo)."""
    names: list[str] = []
    real = tuning.choose

    def counted(spec, *args, **kwargs):
        names.append(spec.name)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(tuning, "choose", counted)
    return names


def _settled(name: str, *args, **kwargs) -> torch.Tensor:
    """Two calls: the first measures (or finds) the decision, the second teaches the memo."""
    dispatch(name, *args, **kwargs)
    return dispatch(name, *args, **kwargs)


def test_an_identical_call_skips_the_full_way(toy, full_way) -> None:
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    _settled(spec.name, x)
    assert len(full_way) == 2 and choice_memo.get(choice_memo.signature(spec.name, (x,), {})) == "aten"
    before = toy.calls["aten"]
    for _ in range(3):
        out = dispatch(spec.name, x)
    assert len(full_way) == 2  # answered by the memo
    assert toy.calls["aten"] == before + 3 and torch.allclose(out, _work(x, 1))
    other = torch.randn(N)  # other values, same signature: still the memo
    assert torch.allclose(dispatch(spec.name, other), _work(other, 1)) and len(full_way) == 2


@pytest.mark.parametrize("change", ["shape", "strides", "requires_grad", "no_grad", "threads", "data_dir"])
def test_any_change_of_what_the_choice_reads_takes_the_full_way(toy, full_way, change, monkeypatch,
                                                                tmp_path) -> None:
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    _settled(spec.name, x)
    seen = len(full_way)
    call = {
        "shape": lambda: dispatch(spec.name, torch.randn(N + 1)),  # same size bucket, other shape
        "strides": lambda: dispatch(spec.name, torch.randn(2 * N)[::2]),
        "requires_grad": lambda: dispatch(spec.name, x.clone().requires_grad_()),
        "no_grad": lambda: torch.no_grad()(dispatch)(spec.name, x),
        "threads": None,
        "data_dir": None,
    }[change]
    if change == "threads":
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            dispatch(spec.name, x)
        finally:
            torch.set_num_threads(threads)
    elif change == "data_dir":
        monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path / "elsewhere"))
        dispatch(spec.name, x)
        assert (tmp_path / "elsewhere" / "tuning" / "provider_choice.json").exists()  # measured there
    else:
        call()
    assert len(full_way) == seen + 1


def test_the_signature_reads_every_variable_the_choice_reads() -> None:
    assert tuning.ENV_MODE in choice_memo.ENV_READ  # the choice mode
    assert "FUSIONLENS_DATA_DIR" in choice_memo.ENV_READ and "FUSIONLENS_DATA_DIR" in inspect.getsource(
        tuning_store.store_path)  # where the decisions are kept
    assert "TRITON_INTERPRET" in choice_memo.ENV_READ and "TRITON_INTERPRET" in inspect.getsource(
        registry.triton_interpreted)  # whether triton runs CPU tensors


def test_switching_to_the_order_is_seen_at_once(toy, monkeypatch) -> None:
    spec = toy(cpu=20, aten=1)  # measured: aten; the order: cpu
    x = torch.randn(N)
    _settled(spec.name, x)
    monkeypatch.setenv(tuning.ENV_MODE, "order")
    before = toy.calls["cpu"]
    dispatch(spec.name, x)
    assert toy.calls["cpu"] == before + 1


def test_scalars_are_told_apart_by_type_and_odd_arguments_have_no_signature() -> None:
    x = torch.randn(4, 8)
    sigs = {choice_memo.signature("k", (x, v), {}) for v in (1, 1.0, True, "1", None)}
    assert len(sigs) == 5
    assert choice_memo.signature("k", (x,), {"dim": 1}) != choice_memo.signature("k", (x,), {"dim": 0})
    assert choice_memo.signature("k", (x, [1, 2]), {}) is None  # a list: the full way
    assert choice_memo.signature("k", (x.to_sparse(),), {}) is None
    assert choice_memo.signature("k", (torch.nn.Parameter(x),), {}) != choice_memo.signature("k", (x,), {})


def test_changed_decisions_clear_the_memo(toy, full_way) -> None:
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    _settled(spec.name, x)
    assert choice_memo.size() >= 1
    tuning.forget_decisions()
    assert choice_memo.size() == 0
    dispatch(spec.name, x)
    assert len(full_way) == 3
    tuning.drop_stored_decisions(x.device)
    assert choice_memo.size() == 0


def test_a_choice_made_before_a_clear_is_not_remembered_after_it() -> None:
    sig = choice_memo.signature("k", (torch.randn(3),), {})
    since = choice_memo.generation()
    choice_memo.clear()  # another thread measured or forgot meanwhile
    choice_memo.put(sig, "cpu", since)
    assert choice_memo.get(sig) is None
    choice_memo.put(sig, "cpu", choice_memo.generation())
    assert choice_memo.get(sig) == "cpu"
    choice_memo.clear()


def test_the_memo_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(choice_memo, "MAX_ENTRIES", 3)
    choice_memo.clear()
    for n in range(1, 8):
        choice_memo.put(choice_memo.signature("k", (torch.randn(n),), {}), "cpu", choice_memo.generation())
        assert choice_memo.size() <= 3
    choice_memo.clear()


def test_a_provider_gone_unavailable_is_not_answered(toy, monkeypatch) -> None:
    # aten 5x against the reference's 20x: the choice made once cpu is gone is aten's by a clear
    # margin (at aten=20 it was a tie with the reference, and a clean-clone CI run picked that)
    spec = toy(cpu=1, aten=5)
    x = torch.randn(N)
    _settled(spec.name, x)
    assert choice_memo.get(choice_memo.signature(spec.name, (x,), {})) == "cpu"
    monkeypatch.setitem(registry._PROBE_RESULTS, "cpu", "the compiler went away (test)")
    before, cpu_before = toy.calls["aten"], toy.calls["cpu"]
    dispatch(spec.name, x)
    assert toy.calls["aten"] == before + 1 and toy.calls["cpu"] == cpu_before


def test_poisoning_and_torch_func_take_the_full_way(toy, full_way) -> None:
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    _settled(spec.name, x)
    with poison_outputs():
        dispatch(spec.name, x)
    assert len(full_way) == 3
    torch.func.grad(lambda t: dispatch(spec.name, t).sum())(x)
    assert len(full_way) == 4
    assert registry.memo_allowed()


def test_real_kernels_answer_the_same_through_the_memo(full_way) -> None:
    if _REAL_CPU["reason"] is not None:
        pytest.skip(f"cpu provider unavailable: {_REAL_CPU['reason']}")
    x, w, g = torch.randn(1, 1, 256), torch.randn(256), torch.randn(1, 1, 256)
    def calls() -> list[torch.Tensor]:
        return [kernels.rms_norm(x, w, 1e-6), kernels.softmax(x, scale=0.5), kernels.swiglu(x, g)]

    calls()  # measures
    settled = calls()  # found in the store: the memo learns
    seen = len(full_way)
    again = calls()
    assert len(full_way) == seen == 6
    references = [registry.KERNELS[n].reference(*a) for n, a in
                  (("rms_norm", (x, w, 1e-6)), ("softmax", (x, -1, 0.5)), ("swiglu", (x, g)))]
    for memo_answer, full_answer, reference in zip(again, settled, references):
        assert torch.equal(memo_answer, full_answer)  # the same provider ran
        torch.testing.assert_close(memo_answer, reference)


def test_a_miss_computes_the_signature_once(toy, monkeypatch) -> None:
    """select_provider hands the signature it looked up to `choose`, which remembers under it."""
    spec = toy(cpu=20, aten=1)
    x = torch.randn(N)
    dispatch(spec.name, x)  # measures and stores the decision
    real, seen = choice_memo.signature, []

    def counted(*args, **kwargs):
        seen.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(choice_memo, "signature", counted)
    dispatch(spec.name, x)  # a miss answered from the stored decision: remembered
    assert seen == [spec.name] and choice_memo.get(real(spec.name, (x,), {})) == "aten"
    dispatch(spec.name, x)  # the memo answers
    assert seen == [spec.name, spec.name]

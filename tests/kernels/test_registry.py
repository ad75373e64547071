"""Kernel registry: validation, duplicate registration, provider selection with reasons (the
order, and the measured choice's entry point), probes, output poisoning, the lazy public API, and
the C++ build's cache key. Measurement itself: test_tuning.py."""
from __future__ import annotations

import threading

import pytest
import torch

import kernels
from kernels import _build, registry
from kernels.registry import (KERNELS, Cost, KernelSpec, Supports, new_output, poison_outputs,
                              register_kernel, select_provider)


def _ref(x):
    return x * 2


@pytest.fixture
def toy():
    """A registered toy kernel (aten provider with a check), removed again afterwards."""
    name = "toy_kernel_for_registry_tests"
    spec = KernelSpec(name, _ref, {"aten": lambda x: x + x},
                      Supports(dtypes=(torch.float32,)),
                      provider_checks={"aten": lambda x: "odd sizes unsupported" if x.numel() % 2 else None})
    register_kernel(spec)
    try:
        yield spec
    finally:
        KERNELS.pop(name, None)


def test_spec_validates_itself() -> None:
    with pytest.raises(ValueError, match="identifier"):
        KernelSpec("not a name", _ref, {})
    with pytest.raises(TypeError, match="callable"):
        KernelSpec("x", 3, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown providers"):
        KernelSpec("x", _ref, {"cuda_magic": _ref})


def test_duplicate_registration_raises(toy) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_kernel(toy)


def test_selection_skips_with_reasons_and_explicit_raises(toy) -> None:
    even, odd = torch.ones(4), torch.ones(3)
    assert select_provider(toy, (even,), {}) == ("aten", {})
    chosen, skipped = select_provider(toy, (odd,), {})
    assert chosen == "reference" and skipped == {"aten": "odd sizes unsupported"}
    with pytest.raises(ValueError, match="provider 'aten' unavailable: odd sizes unsupported"):
        registry.dispatch(toy.name, odd, provider="aten")
    assert torch.equal(registry.dispatch(toy.name, odd), odd * 2)  # fell back to the reference
    chosen, skipped = select_provider(toy, (torch.ones(4, dtype=torch.float16),), {})
    assert chosen == "reference" and "does not support dtype torch.float16" in skipped["aten"]
    with pytest.raises(ValueError, match="has no cpu provider"):
        select_provider(toy, (even,), {}, provider="cpu")


def test_runnable_providers_lists_every_runnable_one_in_order(toy) -> None:
    assert registry.runnable_providers(toy, (torch.ones(4),), {}) == (["aten", "reference"], {})
    runnable, skipped = registry.runnable_providers(toy, (torch.ones(3),), {})
    assert runnable == ["reference"] and skipped == {"aten": "odd sizes unsupported"}


def test_select_provider_is_the_order_unless_asked_to_measure(toy, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FUSIONLENS_PROVIDER_CHOICE", "order")
    even = torch.ones(4)
    assert select_provider(toy, (even,), {}, by_measurement=True) == ("aten", {})
    monkeypatch.setenv("FUSIONLENS_PROVIDER_CHOICE", "measure")
    chosen, _ = select_provider(toy, (even,), {}, by_measurement=True)
    assert chosen in ("aten", "reference")  # both ran: which is faster is the machine's answer
    assert select_provider(toy, (even,), {}) == ("aten", {})  # the order, nothing timed


def test_probe_failures_become_reasons(monkeypatch) -> None:
    def broken() -> str | None:
        raise OSError("compiler exploded")

    monkeypatch.setitem(registry._PROVIDER_PROBES, "triton", broken)
    monkeypatch.delitem(registry._PROBE_RESULTS, "triton", raising=False)
    try:
        assert registry.provider_unavailable_reason("triton") == "OSError: compiler exploded"
    finally:
        registry._PROBE_RESULTS.pop("triton", None)


def test_available_providers_reports_every_provider() -> None:
    avail = kernels.available_providers()
    assert set(avail) == {"cpu", "triton", "aten", "reference"}
    assert avail["reference"] is None and avail["aten"] is None
    if not torch.cuda.is_available() and not registry.triton_interpreted():
        assert avail["triton"] in ("no CUDA GPU",) or avail["triton"].startswith("Triton not installed")


def test_poisoned_outputs_are_nan_only_inside_the_block() -> None:
    like = torch.zeros(2)
    with poison_outputs():
        assert new_output((3, 4), like).isnan().all()
        assert new_output((3,), like, torch.int64).dtype == torch.int64
    assert registry.poisoning() is False


def test_poisoning_is_per_thread_and_nests() -> None:
    seen: dict[str, bool] = {}
    inside, done = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(10)
        seen["other thread"] = registry.poisoning()
        done.set()

    worker = threading.Thread(target=other)
    worker.start()
    with poison_outputs():
        with poison_outputs():
            seen["nested"] = registry.poisoning()
        seen["after nested"] = registry.poisoning()
        inside.set()
        done.wait(10)
    worker.join(10)
    assert seen == {"nested": True, "after nested": True, "other thread": False}
    assert registry.poisoning() is False


def test_new_output_like_keeps_the_dimension_order() -> None:
    """Dense, x's shape, laid out in x's dimension order (eager's preserve_format); poisoned too."""
    x = torch.zeros(2, 5, 3, 8)
    assert registry.new_output_like(x).stride() == x.stride()
    t = torch.zeros(2, 5, 3, 8).transpose(1, 2)  # [2, 3, 5, 8] viewed, [2, 5, 3, 8] in memory
    assert registry.new_output_like(t).stride() == t.stride() == (120, 8, 24, 1)
    sl = torch.zeros(2, 5, 3, 4, 8)[:, :, 1].transpose(1, 2)  # a fused-qkv slice: not dense
    out = registry.new_output_like(sl, torch.bfloat16)
    assert out.shape == sl.shape and out.dtype == torch.bfloat16 and out.stride() == (160, 8, 32, 1)
    with poison_outputs():
        assert registry.new_output_like(t).isnan().all()


def test_cost_bytes_saved() -> None:
    assert Cost(1.0, 10.0, 30.0).bytes_saved == 20.0
    assert Cost(1.0, 10.0, 5.0).bytes_saved == 0.0


def test_public_api_is_lazy_and_names_resolve() -> None:
    assert callable(kernels.layer_norm) and callable(kernels.add_rms_norm)
    with pytest.raises(AttributeError):
        kernels.no_such_kernel  # noqa: B018
    for name in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"):
        assert name in KERNELS and KERNELS[name].cost is not None


def test_build_key_changes_with_any_source_or_header(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    a, h = tmp_path / "a.cpp", tmp_path / "common.h"
    a.write_text("int a;")
    h.write_text("// v1")
    first = _build.build_dir_for([a, h])
    assert first.parent == tmp_path.resolve() / "cpp_build"
    h.write_text("// v2")
    assert _build.build_dir_for([a, h]) != first
    assert _build.build_dir_for([a, h]) == _build.build_dir_for([a, h])


def test_stale_build_lock_is_cleared(tmp_path) -> None:
    lock = tmp_path / "lock"
    lock.write_text("")
    _build._clear_stale_lock(tmp_path, max_age_s=3600)
    assert lock.exists()  # fresh: another build may hold it
    _build._clear_stale_lock(tmp_path, max_age_s=-1)
    assert not lock.exists()


def test_failure_summary_names_the_broken_source(tmp_path) -> None:
    text = ("Error building extension 'fusionlens_cpu': [1/3] c++ ...\nFAILED: bad.o\n"
            "/x/kernels/csrc/bad.cpp:3:1: error: expected ';' before '}' token\nninja: build stopped")
    line = _build._failure_summary(RuntimeError(text), tmp_path)
    assert "bad.o" in line and "expected ';'" in line and "\n" not in line


BAD_INPUTS = {
    "layer_norm": (lambda x: kernels.layer_norm(x, torch.ones(7), torch.zeros(7), 1e-5),
                   "parameter of shape \\(7,\\) does not match the last dim 8"),
    "layer_norm dtype": (lambda x: kernels.layer_norm(x.long(), None, None, 1e-5), "int64 input"),
    # the integer input is the cause, not the "mixed dtypes" it makes with a float weight
    "rms_norm dtype": (lambda x: kernels.rms_norm(x.long(), torch.ones(8), 1e-5), "int64 input \\(it takes floating"),
    "swiglu": (lambda x: kernels.swiglu(x, torch.randn(4, 7)), "same shape"),
    "bias_gelu": (lambda x: kernels.bias_gelu(x, torch.ones(5)), "bias \\(5,\\)"),
    "softmax": (lambda x: kernels.softmax(x, mask=torch.zeros(3, 8)), "does not broadcast"),
    "rope": (lambda x: kernels.rope(*(torch.randn(2, 4, 3, 8),) * 2, *(torch.randn(4, 1, 8),) * 2),
             "cos/sin \\(4, 1, 8\\) is not"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_inputs_nothing_runs_name_the_kernel_and_the_reason(case: str) -> None:
    """The reference runs what the providers refuse; when it fails too, the error names the
    kernel and the providers' reason (not only a bare broadcasting error), and stays a
    RuntimeError like the reference's own."""
    call, reason = BAD_INPUTS[case]
    with pytest.raises(registry.KernelInputError, match=f"^{case.split()[0]}: .*{reason}.*the eager reference failed too") as info:
        call(torch.randn(4, 8))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value.__cause__, RuntimeError)
    assert "\n" not in str(info.value)


def test_reference_errors_without_a_refusal_pass_through() -> None:
    """A reference failing on inputs every check accepts raises its own error, unwrapped."""
    def boom(x):
        raise RuntimeError("boom")

    spec = register_kernel(KernelSpec("toy_boom_for_registry_tests", boom, {"aten": boom},
                                      Supports(dtypes=(torch.float32,))))
    try:
        for dtype in (torch.float32, torch.float64):  # float64: the aten provider is skipped for its dtype
            with pytest.raises(RuntimeError, match="^boom$") as info:
                registry.dispatch(spec.name, torch.ones(3, dtype=dtype), provider="reference")
            assert type(info.value) is RuntimeError
    finally:
        KERNELS.pop(spec.name, None)

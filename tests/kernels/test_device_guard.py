"""Triton launches on the tensors' GPU, not the current one (kernels/profiled_ops.on_tensor_device).

Triton launches a kernel on the current CUDA device and its current stream. A model spread over
GPUs in one process (HF's `device_map="auto"`, pipeline stages) calls a kernel with tensors on
cuda:1 while cuda:0 is current: an illegal memory access, or Triton's "cannot be accessed from
Triton". Every Triton entry point now makes its tensors' device current first, and the provider
measurement records its CUDA events on that device.

Here (no GPU) the guard's decisions are checked with fake CUDA tensors and a recording
`torch.cuda.device`; on a machine with two GPUs the kernels run on cuda:1 against the reference.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kernels
from kernels import profiled_ops


def _fake(device: str) -> torch.Tensor:
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(4, device=device)


@pytest.fixture
def entered(monkeypatch) -> list[int]:
    """torch.cuda.current_device() is 0; torch.cuda.device(i) pushes i while it is entered."""
    stack: list[int] = []

    @contextlib.contextmanager
    def device(index):
        stack.append(index)
        yield
        stack.pop()

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", device)
    return stack


@pytest.fixture
def guarded(entered):
    """(a guarded launcher, its calls as (device made current or None, args))."""
    calls: list[tuple[int | None, tuple]] = []

    def launch(*args, **kwargs):
        calls.append((entered[-1] if entered else None, args))

    return profiled_ops.on_tensor_device(launch), calls


def test_a_call_on_another_gpu_runs_with_that_gpu_current(guarded) -> None:
    run, calls = guarded
    x, out = _fake("cuda:1"), _fake("cuda:1")
    run(x, None, out, 1)
    assert calls == [(1, (x, None, out, 1))]


def test_a_list_of_tensors_is_guarded_by_its_first(guarded) -> None:
    """The optimizers' entry points take lists (one device per bucket)."""
    run, calls = guarded
    run([_fake("cuda:2"), _fake("cuda:2")], [], lr=0.1)
    assert calls[0][0] == 2


def test_no_guard_on_the_current_gpu_or_off_cuda(guarded) -> None:
    run, calls = guarded
    run(_fake("cuda:0"))
    run(torch.ones(2))  # the CPU interpreter path
    run([])
    run()
    assert [c[0] for c in calls] == [None, None, None, None]


@pytest.mark.parametrize("name", sorted(profiled_ops.ENTRY_POINTS))
def test_every_triton_entry_point_is_guarded(entered, monkeypatch, name) -> None:
    """What the providers call (`profiled_ops.entry`) runs the Triton function inside the guard."""
    seen: list[int | None] = []
    monkeypatch.setattr(profiled_ops, "_direct",
                        lambda module, function: lambda *a, **k: seen.append(entered[-1] if entered else None))
    profiled_ops.entry(name)(_fake("cuda:1"))
    assert seen == [1]


def test_cpu_calls_never_ask_for_the_current_device(monkeypatch) -> None:
    """The hot path off CUDA: no CUDA call at all (this machine has no driver)."""
    def boom():
        raise AssertionError("current_device read for a CPU call")

    monkeypatch.setattr(torch.cuda, "current_device", boom)
    assert profiled_ops.foreign_cuda_device((torch.ones(1),)) is None
    assert profiled_ops.foreign_cuda_device(([torch.ones(1)],)) is None


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_triton_kernels_on_the_second_gpu_match_the_reference() -> None:
    torch.cuda.set_device(0)
    dev = torch.device("cuda:1")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 768, generator=g).to(dev).requires_grad_()
    w = torch.randn(768, generator=g).to(dev)
    for name, fn in [("rms_norm", lambda p: kernels.rms_norm(x, w, 1e-6, provider=p)),
                     ("softmax", lambda p: kernels.softmax(x, causal=True, provider=p)),
                     ("gelu", lambda p: kernels.gelu(x, provider=p))]:
        ours = fn("triton")
        (gx,) = torch.autograd.grad(ours.sum(), x)
        ref = fn("reference")
        (gr,) = torch.autograd.grad(ref.sum(), x)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4, msg=name)
        torch.testing.assert_close(gx, gr, rtol=1e-4, atol=1e-4, msg=name)
    # an automatic call measures the providers on cuda:1 (CUDA events on that device's stream)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6), kernels.rms_norm(x, w, 1e-6, provider="reference"))
    p = torch.nn.Parameter(torch.randn(1000, generator=g).to(dev))
    q = torch.nn.Parameter(p.detach().clone())
    p.grad = q.grad = torch.randn(1000, generator=g).to(dev)
    kernels.AdamW([p], lr=1e-2, provider="triton").step()
    torch.optim.AdamW([q], lr=1e-2).step()
    torch.testing.assert_close(p, q)
    assert torch.cuda.current_device() == 0

"""torch.compile and the CPU output pool: a compiled graph's large kernel outputs come from the pool.

Eager calls take outputs of 4 MiB and more from the pool (kernels/_alloc.py), whose blocks stay
mapped; traced, such an output is the opaque op `fusionlens::empty_output`, whose run-time impl is
the same allocation. Before, Inductor allocated them itself, a fresh mapping per call: a compiled
SwiGLU module's step at 4096 x 3072 fp32 took 112 ms against eager's 25 (page faults).
"""
from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import kernels
from kernels import _alloc

ROWS, HIDDEN = 1100, 1024  # [ROWS, HIDDEN] fp32 is 4.3 MiB: over the pool's 4 MiB threshold


@pytest.fixture(autouse=True)
def pooled():
    if kernels.available_providers()["cpu"]:
        pytest.skip(f"cpu provider unavailable: {kernels.available_providers()['cpu']}")
    if _alloc.pool_status() is not None:
        pytest.skip(f"output pool off: {_alloc.pool_status()}")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _served() -> int:
    """Outputs the pool has handed out so far (from a held block or a fresh one)."""
    stats = _alloc.output_pool_stats()
    return stats["hits"] + stats["misses"]


def _step(module: torch.nn.Module, h: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = h.detach().clone().requires_grad_()
    y = module(h)
    y.backward(g)
    return y.detach(), h.grad


def test_a_compiled_step_takes_its_large_outputs_from_the_pool() -> None:
    """Inductor, fullgraph: the SwiGLU module's output and its packed gradient (the two large
    outputs of a step) come from the pool, with eager's values."""
    gen = torch.Generator().manual_seed(0)
    h, g = torch.randn(ROWS, 2 * HIDDEN, generator=gen), torch.randn(ROWS, HIDDEN, generator=gen)
    module = kernels.SwiGLU(provider="cpu")
    compiled = torch.compile(module, fullgraph=True)
    (y, dh), codes = run_and_get_code(_step, compiled, h, g)
    assert any("fusionlens.empty_output" in code for code in codes), "no pooled allocation in the compiled code"
    before = _served()
    y, dh = _step(compiled, h, g)
    assert _served() - before >= 2
    want_y, want_dh = _step(module, h, g)
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(dh, want_dh, rtol=0, atol=0)


def test_a_forward_and_its_backward_allocate_apart() -> None:
    """LayerNorm's y and dx have one shape: AOTAutograd's common-subexpression pass merged their
    two allocations into one node, which the forward saved for the backward, so Inductor copied it
    instead of writing in place (7.0 ms against 3.9 at 4096 x 768). Each graph allocates its own."""
    gen = torch.Generator().manual_seed(2)
    h, g = torch.randn(ROWS, HIDDEN, generator=gen), torch.randn(ROWS, HIDDEN, generator=gen)
    module = kernels.LayerNorm(HIDDEN, provider="cpu")
    compiled = torch.compile(module, fullgraph=True)
    (y, dh), codes = run_and_get_code(_step, compiled, h, g)
    calls = ["fusionlens.empty_output.default(" in code for code in codes]
    assert len(calls) == 2 and all(calls), "forward and backward graphs each allocate their large output"
    before = _served()
    y, dh = _step(compiled, h, g)
    assert _served() - before == 2  # y in the forward, dx in the backward
    want_y, want_dh = _step(module, h, g)
    torch.testing.assert_close(y, want_y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dh, want_dh, rtol=1e-6, atol=1e-6)


def test_small_outputs_stay_inductor_allocations() -> None:
    """Under the threshold a Python call per output would cost more than the faults it saves."""
    x = torch.randn(8, 64)
    _, codes = run_and_get_code(torch.compile(lambda t: kernels.gelu(t, provider="cpu"), fullgraph=True), x)
    assert not any("empty_output" in code for code in codes)
    assert any("act_fwd" in code for code in codes)


def test_dynamic_shapes_decide_at_run_time() -> None:
    """With symbolic rows the size is unknown while tracing: the op is traced and its impl decides
    per call (pool for the large batch, a plain allocation for the small one), one compile."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda t: kernels.gelu(t, provider="cpu"), fullgraph=True, backend=counter,
                             dynamic=True)
    gen = torch.Generator().manual_seed(1)
    for rows in (ROWS, 3, ROWS + 7):
        x = torch.randn(rows, HIDDEN, generator=gen)
        before = _served()
        got = compiled(x)
        assert _served() - before == (1 if rows >= ROWS else 0), rows
        torch.testing.assert_close(got, torch.nn.functional.gelu(x), rtol=1e-6, atol=1e-6)
    assert counter.frame_count == 1


@pytest.mark.parametrize("env", [None, "0", " Off "])
def test_the_run_time_op_decides_as_eager_allocation_does(monkeypatch, env) -> None:
    """`fusionlens::empty_output` (C++) serves a large output from the pool and a small one
    plainly, and reads FUSIONLENS_CPU_POOL per call as `_alloc.empty` does."""
    if env is not None:
        monkeypatch.setenv("FUSIONLENS_CPU_POOL", env)
    op = torch.ops.fusionlens.empty_output.default
    for rows, pooled in ((ROWS, env is None), (3, False)):
        before = _served()
        out = op([rows, HIDDEN], torch.float32)
        assert out.shape == (rows, HIDDEN) and out.dtype == torch.float32 and out.is_contiguous()
        assert _served() - before == int(pooled), (rows, env)
        out.fill_(1.0)  # writable over its whole extent
        assert float(out.sum()) == rows * HIDDEN
    assert op([0, HIDDEN], torch.bfloat16).shape == (0, HIDDEN)

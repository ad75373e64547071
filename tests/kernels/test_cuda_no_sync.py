"""On a GPU, no kernel's forward or backward makes a synchronizing call, and both replay in a CUDA
graph (skipped without a GPU; `benchmarks/gpu_check.sh` runs them with `-k cuda`).

A host read (`.item()`, `int(t)`, a pageable host->device copy) stalls the CPU until the GPU has
caught up, so it cannot queue the next kernels ahead of the GPU, and it cannot be captured in a
CUDA graph. torch's sync debug mode set to "error" raises on one. The optimizers have their own
such test (test_optim.py), as does fused_linear_cross_entropy inside a CUDA graph.
"""
from __future__ import annotations

import pytest
import torch

import kernels

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


def _cases():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).cuda()

    x, res, w, b = r(64, 768), r(64, 768), r(768), r(768)
    q, k, cos, sin = r(2, 4, 32, 64), r(2, 4, 32, 64), r(32, 64), r(32, 64)
    logits, target = r(64, 1001), torch.randint(0, 1001, (64,), generator=g).cuda()
    target[3] = -100
    return {
        "layer_norm": ((x, w, b), lambda x, w, b: kernels.layer_norm(x, w, b, 1e-5, provider="triton")),
        "rms_norm": ((x, w), lambda x, w: kernels.rms_norm(x, w, 1e-6, provider="triton")),
        "add_layer_norm": ((x, res, w, b), lambda x, r, w, b: kernels.add_layer_norm(x, r, w, b, 1e-5, provider="triton")),
        "add_rms_norm": ((x, res, w), lambda x, r, w: kernels.add_rms_norm(x, r, w, 1e-6, provider="triton")),
        "gelu": ((x,), lambda x: kernels.gelu(x, approximate="tanh", provider="triton")),
        "bias_gelu": ((x, b), lambda x, b: kernels.bias_gelu(x, b, provider="triton")),
        "swiglu": ((x, res), lambda a, b: kernels.swiglu(a, b, provider="triton")),
        "geglu": ((x, res), lambda a, b: kernels.geglu(a, b, provider="triton")),
        "softmax": ((x,), lambda x: kernels.softmax(x, scale=0.5, causal=True, provider="triton")),
        "rope": ((q, k), lambda q, k: kernels.rope(q, k, cos, sin, provider="triton")),
        "cross_entropy": ((logits,), lambda lg: kernels.cross_entropy(lg, target, provider="triton")),
    }


NAMES = ["add_layer_norm", "add_rms_norm", "bias_gelu", "cross_entropy", "geglu", "gelu", "layer_norm",
         "rms_norm", "rope", "softmax", "swiglu"]


def test_every_case_is_listed() -> None:
    """The names are listed by hand (collection must not touch CUDA); they are every kernel of
    the package but the optimizers and the fused linear + CE, which have their own tests."""
    assert set(NAMES) == set(kernels.KERNELS) - {"adamw_step", "lamb_step", "fused_linear_cross_entropy"}


@needs_gpu
@pytest.mark.parametrize("name", NAMES)
def test_cuda_forward_and_backward_never_synchronize(name: str) -> None:
    inputs, fn = _cases()[name]

    def step():
        leaves = [t.detach().requires_grad_() for t in inputs]
        out = fn(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.float().sum() for o in outs).backward()
        return leaves

    step()  # compiles the Triton kernels (and may synchronize while it does)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        leaves = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


@needs_gpu
@pytest.mark.parametrize("name", NAMES)
def test_cuda_forward_and_backward_replay_in_a_cuda_graph(name: str) -> None:
    """Forward and backward captured in one CUDA graph (what torch.compile's reduce-overhead mode
    and serving stacks do), replayed on new input values: the eager call's outputs and grads."""
    inputs, fn = _cases()[name]
    static = [t.detach().clone().requires_grad_() for t in inputs]

    def run(leaves):
        out = fn(*leaves)
        outs = out if isinstance(out, tuple) else (out,)
        loss = sum((o.float() * o.float()).sum() for o in outs)  # grads depend on the outputs
        return outs, torch.autograd.grad(loss, leaves)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        run(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs, grads = run(static)
    fresh = [torch.randn_like(t) for t in inputs]
    with torch.no_grad():
        for s, f in zip(static, fresh):
            s.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    want_outs, want_grads = run([f.requires_grad_() for f in fresh])
    for got, want in zip((*outs, *grads), (*want_outs, *want_grads)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

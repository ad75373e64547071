"""Second derivatives through the kernels (backward with create_graph=True), kernels/double_backward.py.

Before: the fused backward kernels returned grads without a graph, so a Hessian-vector product
through gelu(x) + x**3 came out as 6x, silently missing gelu''. Now the activations, softmax,
rope and cross_entropy differentiate their backward through eager ops, and are compared here
with the float64 reference; the norms and fused_linear_cross_entropy raise at once, with the
providers that can do it.

The loss is sum(v * f(x)**2): its gradient depends on x through the kernel's backward and
through the upstream grad 2 * v * f(x), so the Hessian-vector product exercises both.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.norm_function import apply_norm
from tests.kernels.test_rope import tables

pytestmark = pytest.mark.usefixtures("cpu_provider")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _hvp(f, x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradient, Hessian-vector product) of sum(v * f(x)**2) at x, for fixed random v and u."""
    x = x.detach().requires_grad_()
    y = f(x)
    v = torch.randn(y.shape, generator=_gen(seed), dtype=torch.float64).to(y.dtype)
    u = torch.randn(x.shape, generator=_gen(seed + 1), dtype=torch.float64).to(x.dtype)
    (g,) = torch.autograd.grad((v * y.float() ** 2).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad((g.float() * u.float()).sum(), x)
    return g.detach(), h


def _awkward(shape: tuple[int, ...], dtype: torch.dtype, layout: str) -> torch.Tensor:
    x = torch.randn(shape, generator=_gen(sum(shape)), dtype=torch.float64)
    if layout == "transposed":  # same logical shape, non-contiguous
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x.to(dtype)


# name -> (ours, reference) as f(x) for an x of shape [..., rows, n]
def _cases(n: int, provider: str = "cpu", device: str = "cpu"):
    w = torch.randn(n, generator=_gen(7), dtype=torch.float64).to(device)
    mask = torch.randn(n, generator=_gen(8), dtype=torch.float64).to(device)

    def ce(reduction, smoothing):
        def run(fn):
            def f(x):
                x2 = x.reshape(-1, n)
                t = torch.arange(x2.shape[0], device=x2.device) * 3 % n
                t[1::4] = -100  # ignored rows
                return fn(x2, t, ignore_index=-100, label_smoothing=smoothing, reduction=reduction)
            return f
        return (run(lambda *a, **k: kernels.cross_entropy(*a, **k, provider=provider)),
                run(kernels.KERNELS["cross_entropy"].reference))

    ref = {name: kernels.KERNELS[name].reference for name in kernels.KERNELS}
    return {
        "gelu": (lambda x: kernels.gelu(x, provider=provider), lambda x: ref["gelu"](x)),
        "gelu_tanh": (lambda x: kernels.gelu(x, approximate="tanh", provider=provider),
                      lambda x: ref["gelu"](x, "tanh")),
        "bias_gelu": (lambda x: kernels.bias_gelu(x, w.to(x.dtype), provider=provider),
                      lambda x: ref["bias_gelu"](x, w.to(x.dtype))),
        "swiglu": (lambda x: kernels.swiglu(x, torch.sin(x), provider=provider),
                   lambda x: ref["swiglu"](x, torch.sin(x))),
        "geglu": (lambda x: kernels.geglu(x, x.flip(-1), approximate="tanh", provider=provider),
                  lambda x: ref["geglu"](x, x.flip(-1), "tanh")),
        "softmax": (lambda x: kernels.softmax(x, scale=0.7, provider=provider), lambda x: ref["softmax"](x, -1, 0.7)),
        "softmax_causal_mask": (lambda x: kernels.softmax(x, scale=0.5, mask=mask.to(x.dtype), causal=True, provider=provider),
                                lambda x: ref["softmax"](x, -1, 0.5, mask.to(x.dtype), True)),
        "cross_entropy_mean_smoothed": ce("mean", 0.1),
        "cross_entropy_sum": ce("sum", 0.0),
        "cross_entropy_none": ce("none", 0.0),
    }


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5), (2, 3, 17), (33, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(_cases(8)))
def test_hessian_vector_product_matches_float64(name, shape, layout) -> None:
    ours, ref = _cases(shape[-1])[name]
    x = _awkward(shape, torch.float32, layout)
    g, h = _hvp(ours, x)
    g64, h64 = _hvp(ref, x.double())
    torch.testing.assert_close(g, g64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h, h64.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gelu", "swiglu", "softmax", "cross_entropy_mean_smoothed"])
def test_hessian_vector_product_bf16_is_as_close_as_eager(name) -> None:
    """bf16: our error against float64 is within 2x eager bf16's (the reference run in bf16)."""
    ours, ref = _cases(48)[name]
    x = _awkward((16, 48), torch.bfloat16, "contiguous")
    _, h = _hvp(ours, x)
    _, h_eager = _hvp(ref, x)
    _, h64 = _hvp(ref, x.double())
    err = (h.double() - h64).abs().max().item()
    err_eager = (h_eager.double() - h64).abs().max().item()
    assert err <= 2 * err_eager + 1e-3, (err, err_eager)


def test_rope_hessian_through_the_upstream_grad() -> None:
    """rope is linear: its second derivative lives in the grad it is given (here 2 * v * rope(q))."""
    b, heads, seq, d = 2, 3, 5, 8
    cos, sin = tables(seq, d, torch.float32)
    q = torch.randn(b, heads, seq, d, generator=_gen(3))
    k = torch.randn(b, heads, seq, d, generator=_gen(4))

    def ours(x):
        return torch.cat(kernels.rope(x, k, cos, sin, provider="cpu"))

    def ref(x):
        return torch.cat(kernels.KERNELS["rope"].reference(x, k.to(x.dtype), cos.to(x.dtype), sin.to(x.dtype)))

    g, h = _hvp(ours, q)
    g64, h64 = _hvp(ref, q.double())
    torch.testing.assert_close(g, g64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h, h64.float(), rtol=1e-4, atol=1e-4)


def test_mixed_second_derivative_keeps_the_kernels_term() -> None:
    """The reported case: d2/dx2 of gelu(x) + x**3 is gelu''(x) + 6x, not 6x."""
    x = torch.randn(64, generator=_gen(1))

    def second(f):
        xr = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(xr).sum(), xr, create_graph=True)
        return torch.autograd.grad(g.sum(), xr)[0]

    got = second(lambda t: kernels.gelu(t, provider="cpu") + t ** 3)
    want = second(lambda t: torch.nn.functional.gelu(t.double()) + t.double() ** 3)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    assert (got - 6 * x).abs().max() > 0.1  # the gelu'' term is there


NORMS = {
    "layer_norm": lambda x, w, p, **kw: kernels.layer_norm(x, w, w * 0.1, provider=p),
    "rms_norm": lambda x, w, p, **kw: kernels.rms_norm(x, w, provider=p),
    "add_layer_norm": lambda x, w, p, **kw: kernels.add_layer_norm(x, x.flip(-1), w, None, provider=p)[1],
    "add_rms_norm": lambda x, w, p, **kw: kernels.add_rms_norm(x, x.flip(-1), w, provider=p)[1],
}


@pytest.mark.parametrize("road", ["cpp", "python"])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norms_refuse_create_graph_at_once(name, road, monkeypatch) -> None:
    """A second derivative through a fused norm raises, even when autograd.grad(inputs=x) would
    have pruned a grad_fn that raised later; the first derivative is unchanged."""
    if road == "python":
        from kernels import norms
        monkeypatch.setattr(norms, "apply_norm", lambda *a, **k: apply_norm(*a, **{**k, "cpp_autograd": False}))
    w = torch.rand(12, generator=_gen(2)) + 0.5
    x = torch.randn(4, 12, generator=_gen(3), requires_grad=True)
    y = NORMS[name](x, w, "cpu") ** 3 + x ** 3
    instead = "reference" if name == "add_rms_norm" else "aten"  # the message names what the kernel has
    with pytest.raises(RuntimeError, match=f"{name}: a backward with create_graph=True .* provider='{instead}'"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    (g,) = torch.autograd.grad((NORMS[name](x, w, "cpu") ** 3).sum(), x)
    (g_other,) = torch.autograd.grad((NORMS[name](x, w, instead) ** 3).sum(), x)
    torch.testing.assert_close(g, g_other, rtol=1e-4, atol=1e-4)


def test_norms_second_derivative_with_the_aten_provider() -> None:
    """The way out the message names gives the float64 answer."""
    w = torch.rand(12, generator=_gen(2)) + 0.5
    x = torch.randn(4, 12, generator=_gen(3))
    _, h = _hvp(lambda t: kernels.layer_norm(t, w, None, provider="aten"), x)
    _, h64 = _hvp(lambda t: kernels.KERNELS["layer_norm"].reference(t, w.double()), x.double())
    torch.testing.assert_close(h, h64.float(), rtol=1e-4, atol=1e-4)


def test_fused_linear_cross_entropy_refuses_create_graph() -> None:
    x = torch.randn(6, 8, generator=_gen(5), requires_grad=True)
    weight = torch.randn(11, 8, generator=_gen(6))
    target = torch.tensor([1, 2, 3, -100, 5, 10])
    loss = kernels.fused_linear_cross_entropy(x, weight, target, provider="cpu")
    with pytest.raises(RuntimeError, match="fused_linear_cross_entropy: a backward with create_graph=True"):
        torch.autograd.grad(loss, x, create_graph=True)
    _, h = _hvp(lambda t: kernels.fused_linear_cross_entropy(t, weight, target, provider="reference").reshape(1), x)
    _, h64 = _hvp(lambda t: kernels.fused_linear_cross_entropy(t, weight.double(), target,
                                                               provider="reference").reshape(1), x.double())
    torch.testing.assert_close(h, h64.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU check)")
@pytest.mark.parametrize("name", sorted(_cases(8)))
def test_hessian_vector_product_cuda_triton(name) -> None:
    """The triton provider's create_graph path (eager ops on the GPU) against float64."""
    ours, ref = _cases(96, "triton", "cuda")[name]
    x = _awkward((65, 96), torch.float32, "transposed").cuda()
    g, h = _hvp(ours, x)
    g64, h64 = _hvp(ref, x.double())
    torch.testing.assert_close(g, g64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h, h64.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU check)")
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norms_refuse_create_graph_cuda_triton(name) -> None:
    w = (torch.rand(96, generator=_gen(2)) + 0.5).cuda()
    x = torch.randn(8, 96, generator=_gen(3)).cuda().requires_grad_()
    with pytest.raises(RuntimeError, match=f"{name}: a backward with create_graph=True"):
        torch.autograd.grad((NORMS[name](x, w, "triton") ** 3).sum(), x, create_graph=True)


@pytest.mark.parametrize("case", ["swiglu", "geglu"])
def test_hessian_vector_product_of_gated_halves(case) -> None:
    """The C++ kernels read h.chunk(2, -1) in place; the double backward still reaches h."""
    fn = {"swiglu": kernels.swiglu, "geglu": kernels.geglu}[case]
    ref = kernels.KERNELS[case].reference
    h = torch.randn(2, 7, 2 * 10, generator=_gen(9))
    g, hv = _hvp(lambda t: fn(*t.chunk(2, -1), provider="cpu"), h)
    g64, hv64 = _hvp(lambda t: ref(*t.chunk(2, -1)), h.double())
    torch.testing.assert_close(g, g64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hv, hv64.float(), rtol=1e-4, atol=1e-4)

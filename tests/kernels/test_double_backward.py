"""Second derivatives through the kernels (backward with create_graph=True), kernels/double_backward.py.

Before: the fused backward kernels returned grads without a graph, so a Hessian-vector product
through gelu(x) + x**3 came out as 6x, silently missing gelu''. Now the activations, softmax,
rope, cross_entropy and the norms differentiate their backward through eager ops, and are
compared here with the float64 reference; fused_linear_cross_entropy raises at once, with the
providers that can do it.

The loss is sum(v * f(x)**2): its gradient depends on x through the kernel's backward and
through the upstream grad 2 * v * f(x), so the Hessian-vector product exercises both.
"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import norms
from tests.kernels.test_rope import tables

pytestmark = pytest.mark.usefixtures("cpu_provider")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _hvp(f, x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradient, Hessian-vector product) of sum(v * f(x)**2) at x, for fixed random v and u."""
    x = x.detach().requires_grad_()
    y = f(x)
    v = torch.randn(y.shape, generator=_gen(seed), dtype=torch.float64).to(y.device, y.dtype)
    u = torch.randn(x.shape, generator=_gen(seed + 1), dtype=torch.float64).to(x.device, x.dtype)
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


# name -> f(x, w, provider): a norm as a function of x and its weight. The fused adds take a
# residual made from x (so d/dx goes both ways) and use both outputs.
NORMS = {
    "layer_norm": lambda x, w, p: kernels.layer_norm(x, w, w * 0.1, provider=p),
    "layer_norm_no_params": lambda x, w, p: kernels.layer_norm(x, provider=p) * w,
    "rms_norm": lambda x, w, p: kernels.rms_norm(x, w, provider=p),
    "rms_norm_gemma": lambda x, w, p: kernels.rms_norm(x, w, offset=1.0, provider=p),
    "add_layer_norm": lambda x, w, p: _times(*kernels.add_layer_norm(x, x.flip(-1) ** 2, w, None, provider=p)),
    "add_rms_norm": lambda x, w, p: _times(*kernels.add_rms_norm(x, x.flip(-1), w, provider=p)),
}


def _times(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return s * y


def _hvp_with_weight(f, x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """[dL/dx, dL/dw, dP/dx, dP/dw] for L = sum(v * f(x, w)**2) and the penalty-like
    P = <dL/dx, u> + |dL/dw|**2: second derivatives through both first-order grads."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = f(x, w)
    v = torch.randn(y.shape, generator=_gen(11), dtype=torch.float64).to(y.device, y.dtype)
    u = torch.randn(x.shape, generator=_gen(12), dtype=torch.float64).to(x.device, x.dtype)
    g, gw = torch.autograd.grad((v * y.float() ** 2).sum(), [x, w], create_graph=True)
    hx, hw = torch.autograd.grad((g.float() * u.float()).sum() + (gw.float() ** 2).sum(), [x, w])
    return [g.detach(), gw.detach(), hx, hw]


def _close_to(got: list[torch.Tensor], want: list[torch.Tensor], rel: float) -> None:
    """Each tensor within rel of the largest magnitude of its float64 counterpart (the norms'
    second derivatives grow with 1/rstd**2: absolute tolerances would not scale)."""
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=rel, atol=rel * b.abs().max().item())


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5), (2, 3, 17), (33, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norms_second_derivatives_match_float64(name, shape, layout, norm_road) -> None:
    """Before, a backward with create_graph=True raised (and before that, silently dropped the
    norm's term); both roads now return the reference's grads with a graph."""
    f = NORMS[name]
    x = _awkward(shape, torch.float32, layout)
    w = torch.rand(shape[-1], generator=_gen(2)) + 0.5
    got = _hvp_with_weight(lambda a, b: f(a, b, "cpu"), x, w)
    want = _hvp_with_weight(lambda a, b: f(a, b, "reference"), x.double(), w.double())
    _close_to(got, want, 1e-5)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_norms_second_derivatives_mixed_precision_as_close_as_eager(name, norm_road) -> None:
    """bf16 x with fp32 weights (master weights, autocast): our error against float64 is within 2x
    eager's (the reference run at the same dtypes)."""
    x = _awkward((16, 48), torch.bfloat16, "contiguous")
    w = torch.rand(48, generator=_gen(2)) + 0.5
    got = _hvp_with_weight(lambda a, b: NORMS[name](a, b, "cpu"), x, w)
    eager = _hvp_with_weight(lambda a, b: NORMS[name](a, b, "reference"), x, w)
    want = _hvp_with_weight(lambda a, b: NORMS[name](a, b, "reference"), x.double(), w.double())
    for a, e, b in zip(got, eager, want):
        assert a.dtype == e.dtype
        err, err_eager = ((t.double() - b).abs().max().item() for t in (a, e))
        assert err <= 2 * err_eager + 1e-3 * b.abs().max().item(), (err, err_eager)


def test_norms_second_derivative_when_only_the_sum_is_used(norm_road) -> None:
    """y unused: the first-order grad is the sum's grad, and its derivative goes on through the add."""
    x = _awkward((5, 12), torch.float32, "contiguous")

    def f(provider):
        return lambda t: kernels.add_rms_norm(t, t.sin(), torch.ones(12), provider=provider)[0]

    g, h = _hvp(f("cpu"), x)
    g64, h64 = _hvp(f("reference"), x.double())
    torch.testing.assert_close(g, g64.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, h64.float(), rtol=1e-5, atol=1e-5)


def test_gradient_penalty_trains_a_critic_like_torch_modules(norm_road) -> None:
    """WGAN-GP: the penalty (|d critic/dx| - 1)**2 reaches the critic's parameters only through
    second derivatives. Our LayerNorm/RMSNorm modules give torch.nn's parameter grads."""
    def critic(ln, rms):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), ln(32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                                   rms(32), torch.nn.Linear(32, 1))

    ours = critic(norms.LayerNorm, lambda n: norms.RMSNorm(n, eps=1e-6))
    theirs = critic(torch.nn.LayerNorm, lambda n: torch.nn.RMSNorm(n, eps=1e-6))
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=_gen(p.numel())))
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(8, 16, generator=_gen(13))
    for model in (ours, theirs):
        xr = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(model(xr).sum(), xr, create_graph=True)
        ((g.norm(dim=1) - 1) ** 2).mean().backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert all(p.grad.abs().sum() > 0 for p in ours[1].parameters())  # the norm's own params trained


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
def test_norms_second_derivatives_cuda_triton(name) -> None:
    """The triton provider's Python road with create_graph=True, on the GPU, against float64."""
    x = _awkward((65, 96), torch.float32, "transposed").cuda()
    w = (torch.rand(96, generator=_gen(2)) + 0.5).cuda()
    got = _hvp_with_weight(lambda a, b: NORMS[name](a, b, "triton"), x, w)
    want = _hvp_with_weight(lambda a, b: NORMS[name](a, b, "reference"), x.double(), w.double())
    _close_to(got, want, 1e-5)


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


class _Pinn(torch.nn.Module):
    """A physics-informed net: LayerNorm, tanh GELU, the fused add + RMSNorm and SwiGLU."""

    def __init__(self, provider: str) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(2, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)
        self.norm = norms.LayerNorm(32, provider=provider)
        self.rms_weight = torch.nn.Parameter(torch.ones(32))
        self.provider = provider

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = kernels.gelu(self.norm(self.l1(x)), approximate="tanh", provider=self.provider)
        s, h2 = kernels.add_rms_norm(self.l2(h), h, self.rms_weight, provider=self.provider)
        return self.l3(kernels.swiglu(h2, s, provider=self.provider))


def _pinn_grads(provider: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Parameter grads of a loss on u_xx + u_y (third derivatives through every kernel)."""
    torch.manual_seed(0)
    net = _Pinn(provider)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=_gen(p.numel())))
    net = net.to(dtype)
    x = torch.rand(16, 2, generator=_gen(14)).to(dtype).requires_grad_()
    (du,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(du[:, 0].sum(), x, create_graph=True)
    ((d2[:, 0] + du[:, 1] - 1) ** 2).mean().backward()
    return [p.grad for p in net.parameters()]


def test_third_order_physics_informed_loss_matches_float64(norm_road) -> None:
    """A loss on second derivatives trains the parameters through third derivatives; the grads the
    fused kernels give are as close to float64 as eager fp32's (the reference composition)."""
    ours, eager = _pinn_grads("cpu", torch.float32), _pinn_grads("reference", torch.float32)
    for a, e, t in zip(ours, eager, _pinn_grads("reference", torch.float64)):
        assert (a is None) == (t is None)
        if t is None:
            continue
        scale = t.abs().max().item()
        err, err_eager = ((g.double() - t).abs().max().item() / scale for g in (a, e))
        assert err <= max(4 * err_eager, 1e-5), (err, err_eager)

"""torch.func transforms (grad, vmap, jacrev, jvp) and forward-mode AD over the public kernels.

The cpu/triton providers are custom autograd.Functions (the norms' in C++) and library ops, which
functorch cannot see through: `torch.func.grad(lambda x: kernels.layer_norm(...).sum())` raised
"cannot use C++ torch::autograd::Function with functorch transforms". Under a transform the
automatic choice now takes a provider made of plain PyTorch ops (the reference, or ATen's op),
and an explicit provider= that cannot compose raises ValueError with that reason. Inside
`torch.autograd.forward_ad.dual_level()` the same holds: our library ops dropped a dual tensor's
tangent without a word. Results are
compared with the eager kernels (our C++ provider) and autograd, which the other kernel tests
compare with float64 references.
"""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, jacrev, vmap

import kernels
from kernels.norms import LayerNorm, RMSNorm
from tests.kernels.test_rope import tables

pytestmark = pytest.mark.usefixtures("cpu_provider")

H = 24


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


W, B = torch.rand(H) + 0.5, torch.randn(H)
TARGET = torch.tensor([3, 0, -100, 7, 11, 2, 5])
VOCAB_W = torch.randn(13, H) * 0.3

# name -> f(x) for x of [7, 24]; every kernel's differentiable path through its first input
CALLS = {
    "layer_norm": lambda x: kernels.layer_norm(x, W, B, 1e-5),
    "rms_norm": lambda x: kernels.rms_norm(x, W, 1e-6),
    "rms_norm_gemma": lambda x: kernels.rms_norm(x, W, 1e-6, offset=1.0),
    "add_layer_norm": lambda x: torch.cat(kernels.add_layer_norm(x, x.flip(0), W, B, 1e-5)),
    "add_rms_norm": lambda x: torch.cat(kernels.add_rms_norm(x, x.flip(0), W, 1e-6)),
    "bias_gelu": lambda x: kernels.bias_gelu(x, B, approximate="tanh"),
    "gelu": lambda x: kernels.gelu(x),
    "swiglu": lambda x: kernels.swiglu(x, x.flip(0)),
    "geglu": lambda x: kernels.geglu(x, x.flip(0), approximate="tanh"),
    "softmax": lambda x: kernels.softmax(x, scale=0.5, causal=True),
    "rope": lambda x: torch.cat(kernels.rope(x.view(1, 1, 7, H), x.flip(0).view(1, 1, 7, H), *tables(7, H, torch.float32))),
    "cross_entropy": lambda x: kernels.cross_entropy(x, TARGET, label_smoothing=0.1),
    "fused_linear_cross_entropy": lambda x: kernels.fused_linear_cross_entropy(x, VOCAB_W, TARGET, chunk_size=3),
}


def _weighted_sum(y: torch.Tensor) -> torch.Tensor:
    return (y * torch.linspace(-1.0, 2.0, y.numel()).view_as(y)).sum()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_func_grad_equals_eager_autograd(name) -> None:
    f = CALLS[name]
    x = _x(7, H)
    got = grad(lambda t: _weighted_sum(f(t)))(x)
    leaf = x.clone().requires_grad_()
    _weighted_sum(f(leaf)).backward()  # eager: our C++ provider
    torch.testing.assert_close(got, leaf.grad)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "softmax", "gelu", "swiglu", "rope"])
def test_vmap_over_a_batch_equals_the_batched_call(name) -> None:
    """vmap over a leading dim gives what one call on the whole batch gives (row-wise kernels)."""
    f = CALLS[name]
    xs = _x(5, 7, H)
    got = vmap(f)(xs)
    want = torch.stack([f(x) for x in xs])
    torch.testing.assert_close(got, want)


def test_jacrev_of_softmax_matches_atens() -> None:
    x = _x(3, 9)
    got = jacrev(lambda t: kernels.softmax(t, scale=0.5))(x)
    want = jacrev(lambda t: torch.softmax(t * 0.5, -1))(x)
    torch.testing.assert_close(got, want)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = LayerNorm(H)
        self.up = torch.nn.Linear(H, 2 * H)
        self.down = torch.nn.Linear(H, H)
        self.out_norm = RMSNorm(H, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.up(self.norm(x)).chunk(2, -1)
        return self.out_norm(x + self.down(kernels.swiglu(a, b)))


def test_per_sample_gradients_with_vmap_of_grad_match_a_loop() -> None:
    """The torch.func recipe for per-sample gradients, on a block built from our modules."""
    torch.manual_seed(0)
    model = _Block()
    params = {k: v.detach() for k, v in model.named_parameters()}
    xs, ys = _x(6, 4, H), _x(6, 4, H)

    def loss(p, x, y):
        return ((functional_call(model, p, (x,)) - y) ** 2).mean()

    got = vmap(grad(loss), in_dims=(None, 0, 0))(params, xs, ys)
    for i in range(xs.shape[0]):
        model.zero_grad()
        ((model(xs[i]) - ys[i]) ** 2).mean().backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(got[k][i], p.grad, msg=f"sample {i}, {k}")


def test_explicit_provider_that_cannot_compose_raises_with_the_reason() -> None:
    x = _x(7, H)
    with pytest.raises(ValueError, match="torch.func transform"):
        grad(lambda t: kernels.layer_norm(t, W, B, provider="cpu").sum())(x)
    aten = grad(lambda t: kernels.layer_norm(t, W, B, provider="aten").sum())(x)  # plain F.layer_norm
    torch.testing.assert_close(aten, grad(lambda t: torch.nn.functional.layer_norm(t, (H,), W, B).sum())(x))


def test_outside_a_transform_the_choice_is_unchanged() -> None:
    x = _x(7, H)
    assert kernels.provider_choice("layer_norm", x, W, B).provider == "cpu"
    seen = []
    grad(lambda t: seen.append(kernels.provider_choice("layer_norm", t, W, B)) or t.sum())(x)
    assert seen[0].provider == "aten" and "torch.func" in seen[0].skipped["cpu"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's own jvp rules
@pytest.mark.parametrize("name", sorted(CALLS))
def test_forward_mode_ad_keeps_the_tangent(name) -> None:
    """Dual tensors: the tangent of every kernel's output equals torch.func.jvp's (reverse-mode
    checked above), where it used to come back as None."""
    import torch.autograd.forward_ad as fwAD

    f = CALLS[name]
    x, t = _x(7, H), _x(H, 7).t().contiguous()
    with fwAD.dual_level():
        y = f(fwAD.make_dual(x, t))
        primal, tangent = fwAD.unpack_dual(y)
    assert tangent is not None
    want_y, want_t = torch.func.jvp(f, (x,), (t,))
    torch.testing.assert_close(primal, want_y)
    torch.testing.assert_close(tangent, want_t)
    torch.testing.assert_close(primal, f(x))  # outside the level: our provider, the same values


# ---- batched grads: the backward under vmap -------------------------------------------------
# `torch.autograd.grad(..., is_grads_batched=True)` and autograd.functional's jacobian/hessian with
# vectorize=True run a plain forward, then the backward under vmap. The kernels' backward library
# ops have no batching rules: every one of these raised "Batching rule not implemented for
# fusionlens::..._bwd". Now a backward given batched grads uses eager ops (double_backward.py).

@pytest.mark.parametrize("name", sorted(CALLS))
def test_vectorized_jacobian_equals_the_loop(name, norm_road) -> None:
    f = CALLS[name]
    x = _x(7, H)
    got = torch.autograd.functional.jacobian(f, x, vectorize=True)
    want = torch.autograd.functional.jacobian(f, x)  # one plain backward per output: the kernels
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_rms_norm", "softmax", "gelu", "cross_entropy"])
def test_vectorized_hessian_equals_the_loop(name, norm_road) -> None:
    """create_graph=True and batched grads together."""
    f = CALLS[name]
    x = _x(3, H) if name != "cross_entropy" else _x(7, H)
    loss = (lambda t: _weighted_sum(f(t) ** 2)) if name != "cross_entropy" else (lambda t: f(t))
    got = torch.autograd.functional.hessian(loss, x, vectorize=True)
    want = torch.autograd.functional.hessian(loss, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_is_grads_batched_equals_one_backward_per_grad(norm_road) -> None:
    x = _x(7, H).requires_grad_()
    ys = [CALLS[n](x) for n in ("layer_norm", "rms_norm", "swiglu", "softmax")]
    for y in ys:
        vs = torch.randn(4, *y.shape, generator=torch.Generator().manual_seed(1))
        (got,) = torch.autograd.grad(y, x, vs, is_grads_batched=True, retain_graph=True)
        want = torch.stack([torch.autograd.grad(y, x, v, retain_graph=True)[0] for v in vs])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

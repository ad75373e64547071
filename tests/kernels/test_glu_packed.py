"""SwiGLU/GeGLU on the two halves of one packed [..., 2n] gate/up tensor (`h.chunk(2, -1)`, the
`SwiGLU`/`GeGLU` modules): the backward writes one [..., 2n] gradient, so autograd has no split to
undo with a concatenation. Against the float64 truth (forward and backward, poisoned outputs),
the graph and the ops the backward runs, the cases that are not packed, a double backward, and
the Triton provider under the interpreter."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import activations as act
from tests.kernels.numerics import DTYPES, OpNames, check_against_reference, make, run_in_triton_interpreter

CASES = {"swiglu": (kernels.swiglu, act.swiglu_reference, {}),
         "geglu": (kernels.geglu, act.geglu_reference, {}),
         "geglu_tanh": (kernels.geglu, act.geglu_reference, {"approximate": "tanh"})}
SHAPES = [(1, 1), (1, 7), (3, 5), (17, 4099), (2, 3, 33), (64, 1024)]  # [..., n]: the packed tensor is [..., 2n]


def packed(shape, dtype, seed: int = 5) -> torch.Tensor:
    return make((*shape[:-1], 2 * shape[-1]), dtype, seed=seed, scale=2.0)


def check(case: str, provider: str, h: torch.Tensor, dtype: torch.dtype) -> None:
    fn, reference, kwargs = CASES[case]
    check_against_reference(lambda h: fn(*h.chunk(2, -1), **kwargs, provider=provider),
                            lambda h: reference(*h.chunk(2, -1), **kwargs), [h], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_halves_match_float64(case: str, shape, dtype) -> None:
    check(case, "cpu", packed(shape, dtype), dtype)


def _graph(fn) -> list[str]:
    names, todo = [], [fn]
    while todo:
        f = todo.pop()
        if f is not None:
            names.append(type(f).__name__)
            todo += [n for n, _ in f.next_functions]
    return names


@pytest.mark.parametrize("module", [kernels.SwiGLU, kernels.GeGLU])
def test_backward_writes_one_gradient_and_concatenates_nothing(module) -> None:
    w = torch.randn(32, 2 * 48, requires_grad=True)
    x = torch.randn(5, 7, 32)
    y = module(provider="cpu")(x @ w)
    assert "_PackedGluFnBackward" in _graph(y.grad_fn) and "SplitBackward0" not in _graph(y.grad_fn)
    with OpNames() as ops:
        y.backward(torch.randn_like(y))
    assert "fusionlens.glu_bwd.default" in ops.seen
    assert not [op for op in ops.seen if "cat" in op or "copy" in op], ops.seen
    h = (x @ w).detach().requires_grad_()
    a, b = h.chunk(2, -1)
    ref = (F.silu(a) if module is kernels.SwiGLU else F.gelu(a)) * b
    ones = torch.ones_like(ref)
    torch.testing.assert_close(torch.autograd.grad(module(provider="cpu")(h), h, ones)[0],
                               torch.autograd.grad(ref, h, ones)[0])


def test_what_is_not_one_packed_tensor_takes_the_pair_path() -> None:
    h = packed((6, 10), torch.float32).requires_grad_()
    a, b = h.chunk(2, -1)
    assert act.packed_source(a, b) is not None
    assert act.packed_source(b, a) is None  # halves swapped: silu of the up half
    q = h.chunk(4, -1)
    assert act.packed_source(q[0], q[1]) is None  # half of the tensor only
    ht = packed((10, 6), torch.float32).t()  # a transposed (non-contiguous) projection
    assert act.packed_source(*ht.chunk(2, -1)) is None
    other = packed((6, 10), torch.float32, seed=7)
    assert act.packed_source(a, other.chunk(2, -1)[1]) is None
    for args in ((b, a), (q[0], q[1]), tuple(ht.chunk(2, -1))):
        ref = act.swiglu_reference(*[t.detach().double() for t in args])
        torch.testing.assert_close(kernels.swiglu(*args, provider="cpu").double(), ref, rtol=1e-5, atol=1e-5)


def test_a_half_used_elsewhere_too_gets_both_gradients() -> None:
    """y = swiglu(a, b) + a * 3: the packed path's gradient and the split's add up in h."""
    h = packed((9, 16), torch.float32).requires_grad_()
    g = torch.randn(9, 16)

    def grads(fn):
        a, b = h.chunk(2, -1)
        return torch.autograd.grad(fn(a, b) + 3 * a, h, g)[0]

    torch.testing.assert_close(grads(lambda a, b: kernels.swiglu(a, b, provider="cpu")),
                               grads(act.swiglu_reference))


def test_double_backward_through_the_packed_path() -> None:
    h = packed((4, 6), torch.float32).requires_grad_()
    g = torch.randn(4, 6)

    def second(fn):
        (gh,) = torch.autograd.grad(fn(*h.chunk(2, -1)), h, g, create_graph=True)
        return torch.autograd.grad(gh.square().sum(), h)[0]

    torch.testing.assert_close(second(lambda a, b: kernels.geglu(a, b, "tanh", provider="cpu")),
                               second(lambda a, b: act.geglu_reference(a, b, "tanh")))


def run_interpreted() -> int:
    count = 0
    for case in sorted(CASES):
        for dtype in DTYPES:
            check(case, "triton", packed((5, 33), dtype), dtype)
            count += 1
        check(case, "triton", packed((2, 3, 9), torch.float32), torch.float32)
        count += 1
    return count


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled Triton is checked at real sizes")
def test_triton_packed_interpreted() -> None:
    out = run_in_triton_interpreter("from tests.kernels.test_glu_packed import run_interpreted\nprint(run_interpreted())")
    assert int(out.strip().splitlines()[-1]) == len(CASES) * (len(DTYPES) + 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_triton_packed_real_sizes(case: str) -> None:
    for dtype in DTYPES:
        check(case, "triton", packed((4096, 3072), dtype).cuda(), dtype)


@pytest.mark.parametrize("module", [kernels.SwiGLU, kernels.GeGLU])
def test_modules_under_torch_compile_write_one_gradient(module) -> None:
    """Tracing has no `_base` to follow, so the modules hand their packed input to the packed
    Function themselves: the compiled backward runs glu_bwd and no concatenation."""
    from torch.profiler import profile

    torch._dynamo.reset()
    h = packed((6, 40), torch.float32).requires_grad_()
    g = torch.randn(6, 40)
    compiled = torch.compile(module(provider="cpu"), fullgraph=True)
    (ours,) = torch.autograd.grad(compiled(h), h, g)
    with profile() as prof:
        compiled(h).backward(g)
    names = [e.name for e in prof.events()]
    assert "fusionlens::glu_bwd" in names and "aten::cat" not in names, sorted(set(names))
    a, b = h.detach().double().requires_grad_().chunk(2, -1)
    ref = (F.silu(a) if module is kernels.SwiGLU else F.gelu(a)) * b
    (truth,) = torch.autograd.grad(ref, a._base, g.double())
    torch.testing.assert_close(ours.double(), truth, rtol=1e-5, atol=1e-5)


def test_modules_on_a_non_contiguous_input_take_the_pair_path() -> None:
    h = packed((12, 6), torch.float32).t().requires_grad_()  # [6, 24] holding a transposed layout
    assert not h.is_contiguous()
    y = kernels.SwiGLU(provider="cpu")(h)
    assert "_PackedGluFnBackward" not in _graph(y.grad_fn)
    a, b = h.chunk(2, -1)
    torch.testing.assert_close(y, F.silu(a) * b)

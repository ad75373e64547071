"""Every provider a call admits gives what the reference gives: the same dtypes, close values.

The measured choice may pick any provider `why_not` lets run, so a provider that admits a call
and then raises, or returns another dtype, makes the result depend on timing. This walks every
combination of fp32/bf16/fp16 over each kernel's tensor arguments (mixed parameters, masks,
tables, residuals) on CPU; where the eager reference raises, the providers must raise too. It found the aten LayerNorm admitting one fp32 and one bf16 parameter,
which F.layer_norm raises on.
"""
from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from kernels.registry import KERNELS, dispatch, why_not
from tests.kernels.numerics import DTYPES, as_tuple, make, run_in_triton_interpreter


def _calls(name: str):
    """(args, kwargs) of `name` for every dtype combination of its tensors (x's dtype first)."""
    for i, (dx, dp, dq) in enumerate(itertools.product(DTYPES, DTYPES, DTYPES)):
        x, r = make((3, 37), dx, i), make((3, 37), dx, i + 1)
        w, b, other = make((37,), dp, i + 2), make((37,), dq, i + 3), make((3, 37), dp, i + 4)
        q, k = make((1, 2, 3, 16), dx, i + 5), make((1, 1, 3, 16), dp, i + 6)
        cos, sin = make((3, 16), dq, i + 7), make((3, 16), dq, i + 8)
        yield from {
            "layer_norm": [((x, w, b, 1e-5), {})],
            "rms_norm": [((x, w, 1e-6), {}), ((x, w, 1e-6, 1.0), {})],
            "add_layer_norm": [((x, r, w, b, 1e-5), {}), ((x, other, w, b, 1e-5), {})],
            "add_rms_norm": [((x, r, w, 1e-6), {}), ((x, other, w, 1e-6), {})],
            "gelu": [((x,), {}), ((x, "tanh"), {})],
            "bias_gelu": [((x, b), {}), ((x, b, "tanh"), {})],
            "swiglu": [((x, other), {})],
            "geglu": [((x, other), {}), ((x, other, "tanh"), {})],
            "softmax": [((x,), {}), ((x,), {"scale": 0.5, "mask": make((1, 37), dp, i), "causal": True})],
            "rope": [((q, k, cos, sin), {})],
            "cross_entropy": [((x, torch.arange(3) * 5), {})],
            "fused_linear_cross_entropy": [((x, make((11, 37), dp, i + 9), torch.arange(3) * 3), {}),
                                           ((x, make((11, 37), dp, i + 9), torch.arange(3), make((11,), dq, i)), {})],
        }.get(name, [])


def _agree(name: str, args: tuple, kwargs: dict, what: tuple) -> None:
    """Every provider `why_not` admits for this call gives the reference's shapes, dtypes and
    values (NaN where it has NaN), or raises where the eager reference raises."""
    spec = KERNELS[name]
    try:
        ref = as_tuple(dispatch(name, *args, provider="reference", **kwargs))
    except (RuntimeError, IndexError):  # eager refuses it (a linear of bf16 on fp32, a class index
        ref = None                      # past an empty vocabulary): so must the providers
    for provider in spec.providers:
        if why_not(spec, provider, args, kwargs):
            continue
        if ref is None:
            with pytest.raises((RuntimeError, IndexError)):
                dispatch(name, *args, provider=provider, **kwargs)
            continue
        out = as_tuple(dispatch(name, *args, provider=provider, **kwargs))
        assert [(t.shape, t.dtype) for t in out] == [(t.shape, t.dtype) for t in ref], (provider, *what)
        for a, e in zip(out, ref):
            torch.testing.assert_close(a.double(), e.double(), rtol=2e-2, atol=2e-2, equal_nan=True,
                                       msg=f"{provider} {what}")


STATEFUL = {"adamw_step", "lamb_step"}  # the optimizers' steps mutate their state: test_optim.py


@pytest.mark.parametrize("name", sorted(set(KERNELS) - STATEFUL))
def test_admitted_providers_agree_with_the_reference(cpu_provider, name: str) -> None:
    calls = list(_calls(name))
    assert calls, f"no cases for {name}: add them here"
    for args, kwargs in calls:
        _agree(name, args, kwargs, ([a.dtype for a in args if isinstance(a, torch.Tensor)], kwargs.keys()))


def _layout_calls(name: str):
    """(args, kwargs) of `name` over memory layouts and degenerate shapes: empty, one element, a
    zero-width last dim, batch dims; a [1, 1] or empty view with stride 2 counts as contiguous to
    torch, and `.contiguous()` returns it as it is (cross_entropy's cpu op refused one)."""
    for layout, shape, dt in itertools.product(("contiguous", "transposed", "strided"),
                                               ((0, 8), (1, 1), (5, 0), (3, 37), (2, 3, 5, 16)),
                                               (torch.float32, torch.bfloat16)):
        x, o = make(shape, dt, 1, layout=layout), make(shape, dt, 2, layout=layout)
        n = shape[-1]
        w, b = make((n,), dt, 3), make((n,), dt, 4)
        calls = {"layer_norm": (x, w, b, 1e-5), "rms_norm": (x, w, 1e-6), "add_layer_norm": (x, o, w, b, 1e-5),
                 "add_rms_norm": (x, o, w, 1e-6), "gelu": (x,), "bias_gelu": (x, b), "swiglu": (x, o),
                 "geglu": (x, o), "softmax": (x,)}
        if len(shape) == 4:
            calls["rope"] = (x, o, make(shape[-2:], dt, 5), make(shape[-2:], dt, 6))
        elif n:  # an empty vocabulary has no class 0 (the public function refuses it first)
            calls["cross_entropy"] = (x, torch.zeros(shape[0], dtype=torch.long))
        if name in calls:
            yield calls[name], {}


@pytest.mark.parametrize("name", sorted(set(KERNELS) - STATEFUL - {"fused_linear_cross_entropy"}))
def test_admitted_providers_agree_on_layouts(cpu_provider, name: str) -> None:
    for args, kwargs in _layout_calls(name):
        _agree(name, args, kwargs, [(tuple(a.shape), a.stride(), a.dtype) for a in args if isinstance(a, torch.Tensor)])


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: test_cuda_* compile the Triton kernels")
def test_admitted_providers_agree_with_triton_interpreted() -> None:
    """The same walk with the triton provider admitted too (its interpreter, on CPU tensors)."""
    names = sorted(set(KERNELS) - STATEFUL)
    out = run_in_triton_interpreter(
        "from tests.kernels import test_provider_agreement as t\n"
        "from kernels.registry import why_not, KERNELS\n"
        f"for name in {names!r}:\n"
        "    calls = list(t._calls(name)) + list(t._layout_calls(name))\n"
        "    for args, kwargs in calls:\n"
        "        t._agree(name, args, kwargs, (name, 'interpreted'))\n"
        "    print(name, sum(why_not(KERNELS[name], 'triton', a, k) is None for a, k in calls))\n")
    ran = dict(line.split() for line in out.strip().splitlines())
    assert sorted(ran) == names
    assert all(int(n) >= 30 for n in ran.values()), ran  # the triton provider ran on each kernel

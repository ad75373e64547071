"""Autocast's fp32 policy (`kernels/autocast.py`): under a GPU autocast region eager's F.layer_norm
and F.softmax return fp32 for bf16/fp16 inputs; every provider of ours must give what eager gives,
whichever one the measured choice picks.

Without a GPU: torch's CUDA autocast is switched on by hand (`torch.set_autocast_enabled("cuda")`
works on a CPU build) and the ATen ops run on fake CUDA tensors, which go through its autocast
kernels, so the policy table is checked against the installed torch and the aten and reference
providers against eager. The up-cast path itself runs for real on CPU tensors with the table
widened to "cpu". On a GPU, `test_cuda_*` runs every provider under `torch.autocast("cuda")`.
"""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import kernels
from kernels import autocast
from kernels.registry import KERNELS
from tests.kernels.numerics import as_tuple

# eager op of each policy entry, as f(x) on a [rows, n] tensor
EAGER_OPS = {"layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)), "softmax": lambda x: F.softmax(x, -1)}
LOW = [torch.bfloat16, torch.float16]


@contextmanager
def cuda_autocast_by_hand(dtype: torch.dtype):
    """torch.autocast("cuda") without a GPU (torch.autocast itself disables itself there)."""
    was, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", was_dtype)


@pytest.mark.parametrize("op", sorted(autocast.FP32_POLICY))
def test_policy_table_is_torchs(op: str) -> None:
    """FP32_POLICY lists a device exactly when the installed torch's autocast there runs the op in fp32."""
    with FakeTensorMode():
        x = torch.empty(3, 8, dtype=torch.bfloat16, device="cuda")
        with cuda_autocast_by_hand(torch.bfloat16):
            on_cuda = EAGER_OPS[op](x).dtype == torch.float32
    x = torch.randn(3, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        on_cpu = EAGER_OPS[op](x).dtype == torch.float32
    assert on_cuda == ("cuda" in autocast.FP32_POLICY[op])
    assert on_cpu == ("cpu" in autocast.FP32_POLICY[op])


def _calls(d: dict):
    """(kernel, args, kwargs, eager chain) for every kernel with an autocast rule; `d` holds the
    device and dtype of the tensors."""
    x, r = torch.empty(4, 64, **d), torch.empty(4, 64, **d)
    w, b = torch.empty(64, **d), torch.empty(64, **d)
    mask = torch.empty(1, 64, **d)
    return [
        ("layer_norm", (x, w, b, 1e-5), {}, lambda: F.layer_norm(x, (64,), w, b, 1e-5)),
        ("add_layer_norm", (x, r, w, b, 1e-5), {}, lambda: (x + r, F.layer_norm(x + r, (64,), w, b, 1e-5))),
        ("softmax", (x,), {}, lambda: F.softmax(x, -1)),
        ("softmax", (x,), {"scale": 0.5, "mask": mask, "causal": True},
         lambda: F.softmax((x * 0.5 + mask).masked_fill(torch.ones(4, 64, dtype=torch.bool, device=x.device).triu(61),
                                                        float("-inf")), -1)),
    ]


def _dtypes(out) -> tuple:
    return tuple(t.dtype for t in as_tuple(out))


def test_every_listed_kernel_has_a_rule() -> None:
    ruled = {name for name, spec in KERNELS.items() if spec.autocast is not None}
    assert ruled == {"layer_norm", "add_layer_norm", "softmax"}
    assert {KERNELS[n].autocast.op for n in ruled} == set(autocast.FP32_POLICY)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("provider", ["aten", "reference"])
def test_providers_give_eagers_dtypes_under_gpu_autocast(provider: str, dtype: torch.dtype) -> None:
    """Before the rule, the aten provider gave fp32 (an ATen op: autocast casts it) and the
    reference and fused providers bf16, so the dtype depended on the measured pick."""
    with FakeTensorMode():
        for name, args, kwargs, eager in _calls({"device": "cuda", "dtype": dtype}):
            if provider == "aten" and kwargs:
                continue  # ATen's softmax has no scale or mask
            with cuda_autocast_by_hand(dtype):
                want = _dtypes(eager())
                got = _dtypes(kernels.registry.dispatch(name, *args, provider=provider, **kwargs))
            assert got == want, (name, kwargs)
            assert _dtypes(kernels.registry.dispatch(name, *args, provider=provider, **kwargs)) == (dtype,) * len(want)


@pytest.fixture
def cpu_listed(monkeypatch):
    """The policy widened to CPU, so the up-cast path runs for real here."""
    for op, devices in autocast.FP32_POLICY.items():
        monkeypatch.setitem(autocast.FP32_POLICY, op, devices | {"cpu"})


def _eager_fp32(name: str, x, r, w, b):
    """What GPU autocast makes of eager's chain: the listed op on fp32 inputs."""
    if name == "layer_norm":
        return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), 1e-5)
    if name == "add_layer_norm":
        s = x + r
        return s, F.layer_norm(s.float(), (x.shape[-1],), w.float(), b.float(), 1e-5)
    return F.softmax(x.float() * 0.5 + r, -1)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name,provider", [(n, p) for n in ("layer_norm", "add_layer_norm", "softmax")
                                           for p in ("cpu", "aten", "reference", None)
                                           if not (n == "softmax" and p == "aten")])  # no scale/mask in ATen's
def test_upcast_path_matches_eager(cpu_listed, cpu_provider, name: str, provider: str | None,
                                   dtype: torch.dtype) -> None:
    """Forward in fp32 as eager's autocast computes it; gradients back in the inputs' dtypes."""
    g = torch.Generator().manual_seed(0)
    shape = (3, 5, 67)
    x = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    r = torch.randn(shape, generator=g).to(dtype)
    if name == "softmax":
        r = r[:1, :1]  # an additive mask in x's dtype, broadcast (fp32 would promote x by itself)
    w = torch.randn(67, generator=g).to(dtype).requires_grad_()
    b = torch.randn(67, generator=g).to(dtype).requires_grad_()
    leaves = [x] if name == "softmax" else [x, w, b]
    with torch.autocast("cpu", dtype=dtype):
        if name == "layer_norm":
            out = kernels.layer_norm(x, w, b, 1e-5, provider=provider)
        elif name == "add_layer_norm":
            out = kernels.add_layer_norm(x, r, w, b, 1e-5, provider=provider)
        else:
            out = kernels.softmax(x, scale=0.5, mask=r, provider=provider)
        want = _eager_fp32(name, x, r, w, b)
    outs, wants = list(as_tuple(out)), list(as_tuple(want))
    assert [o.dtype for o in outs] == [t.dtype for t in wants]
    assert outs[-1].dtype == torch.float32
    for o, t in zip(outs, wants):
        torch.testing.assert_close(o, t, rtol=2e-5, atol=2e-5)
    dy = torch.randn(shape, generator=g)
    got = torch.autograd.grad(outs[-1], leaves, dy)
    ref = torch.autograd.grad(wants[-1], leaves, dy)
    for a, e, leaf in zip(got, ref, leaves):
        assert a.dtype == leaf.dtype
        torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2 * e.abs().max().item())


def test_rule_is_inert_without_autocast_or_low_precision(cpu_listed) -> None:
    x = torch.randn(4, 32).bfloat16()
    assert kernels.layer_norm(x, None, None, 1e-5).dtype == torch.bfloat16  # no autocast region
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kernels.softmax(x.float()).dtype == torch.float32  # already fp32: nothing to up-cast
        assert not autocast.upcast_now("layer_norm", (x.float(),), {})
        assert autocast.upcast_now("layer_norm", (x,), {})
    assert not autocast.upcast_now("layer_norm", (x,), {})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("provider", ["triton", "aten", "reference", None])
def test_cuda_autocast_every_provider_gives_eagers_dtypes(provider: str | None) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        for name, args, kwargs, eager in _calls({"device": "cuda", "dtype": torch.bfloat16}):
            if provider == "aten" and kwargs:
                continue
            args = tuple(a.normal_() if isinstance(a, torch.Tensor) else a for a in args)
            kwargs = {k: v.normal_() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            want = eager()
            got = kernels.registry.dispatch(name, *args, provider=provider, **kwargs)
            assert _dtypes(got) == _dtypes(want), (name, provider)
            for a, e in zip(as_tuple(got), as_tuple(want)):
                torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2)

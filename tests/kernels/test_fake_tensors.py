"""The public kernels on tensors without data: FakeTensorMode (what memory and runtime estimators
and export run a model under) and the meta device (models initialised empty). Shapes, dtypes and
gradients' shapes come out as on real tensors, through the cpu provider's ops (their fake kernels).

Before: cross_entropy's target range check and fused_linear_cross_entropy's count of valid rows
read values on the host, which a fake tensor does not have (DataDependentOutputException), and
LAMB's global grad norm ran a C++ op without a fake kernel.
"""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import kernels
from kernels.cross_entropy_rows import CrossEntropyError

pytestmark = pytest.mark.usefixtures("cpu_provider")


def _inputs(device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {"x": torch.randn(6, 8, generator=g), "w": torch.rand(8, generator=g) + 0.5,
         "q": torch.randn(1, 2, 6, 8, generator=g), "W": torch.randn(11, 8, generator=g),
         "cos": torch.ones(6, 8), "sin": torch.zeros(6, 8), "target": torch.tensor([1, 2, 3, -100, 5, 7])}
    return {k: v.to(device).requires_grad_(v.is_floating_point() and k in ("x", "w", "q", "W")) for k, v in t.items()}


CASES = {
    "layer_norm": lambda t: kernels.layer_norm(t["x"], t["w"], t["w"] * 0.1),
    "rms_norm": lambda t: kernels.rms_norm(t["x"], t["w"]),
    "add_layer_norm": lambda t: kernels.add_layer_norm(t["x"], t["x"] * 2, t["w"], None)[1],
    "add_rms_norm": lambda t: kernels.add_rms_norm(t["x"], t["x"] * 2, t["w"])[1],
    "gelu": lambda t: kernels.gelu(t["x"], approximate="tanh"),
    "bias_gelu": lambda t: kernels.bias_gelu(t["x"], t["w"]),
    "swiglu": lambda t: kernels.swiglu(t["x"], t["x"] * 2),
    "geglu": lambda t: kernels.geglu(t["x"], t["x"] * 2),
    "softmax": lambda t: kernels.softmax(t["x"], scale=0.5, causal=True),
    "rope": lambda t: kernels.rope(t["q"], t["q"] * 2, t["cos"], t["sin"])[0],
    "cross_entropy": lambda t: kernels.cross_entropy(t["x"], t["target"]),
    "fused_linear_cross_entropy": lambda t: kernels.fused_linear_cross_entropy(t["x"], t["W"], t["target"]),
}


def _run(case: str, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    y = CASES[case](t)
    y.float().sum().backward()
    return y, [t[k].grad for k in ("x", "w", "q", "W") if t[k].grad is not None]


@pytest.mark.parametrize("case", sorted(CASES))
def test_fake_tensors_take_shapes_from_the_kernels(case: str) -> None:
    want, want_grads = _run(case, _inputs())
    with FakeTensorMode():
        got, got_grads = _run(case, _inputs())
    assert isinstance(got, FakeTensor)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert [(g.shape, g.dtype) for g in got_grads] == [(g.shape, g.dtype) for g in want_grads]


@pytest.mark.parametrize("case", sorted(CASES))
def test_meta_tensors(case: str) -> None:
    want, want_grads = _run(case, _inputs())
    got, got_grads = _run(case, _inputs("meta"))
    assert got.device.type == "meta" and (got.shape, got.dtype) == (want.shape, want.dtype)
    assert [g.shape for g in got_grads] == [g.shape for g in want_grads]


@pytest.mark.parametrize("name", ["AdamW", "LAMB"])
def test_optimizer_steps_on_fake_tensors(name: str) -> None:
    with FakeTensorMode():
        ps = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
        for p in ps:
            p.grad = torch.randn(p.shape)
        opt = getattr(kernels, name)(ps, lr=1e-3, provider="cpu")
        opt.step()
        assert all(isinstance(opt.state[p]["exp_avg"], FakeTensor) for p in ps)


def test_real_targets_are_still_checked_on_the_host() -> None:
    t = _inputs()
    with pytest.raises(CrossEntropyError, match="target 11 at row 0 is out of range"):
        kernels.cross_entropy(t["x"], torch.tensor([11, 0, 0, 0, 0, 0]))

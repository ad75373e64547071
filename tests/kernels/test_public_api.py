"""The public API of `kernels`, exactly as issue 5 spells it: names, parameter names and order,
the defaults the issue states, and an optional keyword `provider=` on every function and optimizer.

A rename, a reordered parameter or a dropped `provider=` fails here. Each function is also called
with `provider="reference"` (always available) and compared with the automatic choice, so the
keyword is not only declared but honoured.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import kernels

_NO_DEFAULT = inspect.Parameter.empty
_ANY = object()  # the issue names the parameter but states no default

# name -> the issue's leading parameters [(name, default or _ANY)], in order.
SPELLED: dict[str, list[tuple[str, object]]] = {
    "layer_norm": [("x", _NO_DEFAULT), ("weight", _ANY), ("bias", _ANY), ("eps", _ANY)],
    "rms_norm": [("x", _NO_DEFAULT), ("weight", _ANY), ("eps", _ANY), ("offset", 0.0)],
    "add_layer_norm": [("x", _NO_DEFAULT), ("residual", _NO_DEFAULT), ("weight", _ANY),
                       ("bias", _ANY), ("eps", _ANY)],
    "add_rms_norm": [("x", _NO_DEFAULT), ("residual", _NO_DEFAULT), ("weight", _ANY), ("eps", _ANY)],
    "bias_gelu": [("x", _NO_DEFAULT), ("bias", _NO_DEFAULT), ("approximate", "none")],
    "gelu": [("x", _NO_DEFAULT), ("approximate", "none")],
    "swiglu": [("a", _NO_DEFAULT), ("b", _NO_DEFAULT)],
    "geglu": [("a", _NO_DEFAULT), ("b", _NO_DEFAULT), ("approximate", "none")],
    "softmax": [("x", _NO_DEFAULT), ("dim", -1), ("scale", 1.0), ("mask", None), ("causal", False)],
    "rope": [("q", _NO_DEFAULT), ("k", _NO_DEFAULT), ("cos", _NO_DEFAULT), ("sin", _NO_DEFAULT)],
    "cross_entropy": [("logits", _NO_DEFAULT), ("target", _NO_DEFAULT)],
    "fused_linear_cross_entropy": [("x", _NO_DEFAULT), ("weight", _NO_DEFAULT),
                                   ("target", _NO_DEFAULT), ("bias", None), ("chunk_size", _ANY)],
    "AdamW": [("params", _NO_DEFAULT)],
    "LAMB": [("params", _NO_DEFAULT)],
}
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def test_every_spelled_name_is_exported() -> None:
    for name in [*SPELLED, "KERNELS", "available_providers"]:
        assert hasattr(kernels, name), f"kernels.{name} is missing"
        assert name in kernels.__all__, f"{name} not in kernels.__all__"
    assert isinstance(kernels.KERNELS, dict) and kernels.KERNELS
    assert list(inspect.signature(kernels.available_providers).parameters) == []
    assert issubclass(kernels.AdamW, torch.optim.Optimizer)
    assert issubclass(kernels.LAMB, torch.optim.Optimizer)


MODULES = ["LayerNorm", "RMSNorm", "AddLayerNorm", "AddRMSNorm", "GELU", "BiasGELU", "SwiGLU", "GeGLU",
           "Softmax", "RotaryEmbedding", "CrossEntropyLoss", "FusedLinearCrossEntropyLoss"]


def test_module_forms_are_exported() -> None:
    """Every family's nn.Module form is importable from `kernels` itself, as the functions are."""
    for name in MODULES:
        assert name in kernels.__all__ and issubclass(getattr(kernels, name), torch.nn.Module), name


@pytest.mark.parametrize("name", sorted(SPELLED))
def test_signature_matches_the_issue(name: str) -> None:
    params = list(inspect.signature(getattr(kernels, name)).parameters.values())
    leading = params[:len(SPELLED[name])]
    got = [(p.name, p.default) for p in leading]
    want_names = [n for n, _ in SPELLED[name]]
    assert [n for n, _ in got] == want_names, f"{name}{inspect.signature(getattr(kernels, name))}"
    for p, (_, default) in zip(leading, SPELLED[name]):
        assert p.kind in POSITIONAL, f"{name}: {p.name} must be positional-or-keyword, is {p.kind}"
        if default is _NO_DEFAULT:
            assert p.default is _NO_DEFAULT, f"{name}: {p.name} must be required"
        elif default is not _ANY:
            assert p.default == default and type(p.default) is type(default), \
                f"{name}: {p.name} defaults to {p.default!r}, the issue says {default!r}"
    provider = inspect.signature(getattr(kernels, name)).parameters.get("provider")
    assert provider is not None, f"{name} takes no provider="
    assert provider.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert provider.default is None


def _calls() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    x, res, w, b = r(3, 8), r(3, 8), r(8), r(8)
    q, k = r(1, 2, 4, 8), r(1, 1, 4, 8)
    ang = r(4, 4)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    target = torch.tensor([1, 0, 7])
    return {
        "layer_norm": (x, w, b, 1e-5),
        "rms_norm": (x, w, 1e-6, 1.0),
        "add_layer_norm": (x, res, w, b, 1e-5),
        "add_rms_norm": (x, res, w, 1e-6),
        "bias_gelu": (x, b, "tanh"),
        "gelu": (x, "tanh"),
        "swiglu": (x, res),
        "geglu": (x, res, "tanh"),
        "softmax": (x, -1, 0.5, r(3, 8), False),
        "rope": (q, k, cos, sin),
        "cross_entropy": (x, target),
        "fused_linear_cross_entropy": (x, r(11, 8), target, r(11), 2),
    }


@pytest.mark.parametrize("name", sorted(_calls()))
def test_provider_keyword_is_honoured(name: str) -> None:
    args = _calls()[name]
    fn = getattr(kernels, name)
    auto, ref = fn(*args), fn(*args, provider="reference")
    if name in ("add_layer_norm", "add_rms_norm", "rope"):
        assert isinstance(auto, tuple) and len(auto) == 2 and isinstance(ref, tuple) and len(ref) == 2
    else:
        auto, ref = (auto,), (ref,)
    for a, e in zip(auto, ref):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="provider 'no_such_provider' unavailable"):
        fn(*args, provider="no_such_provider")


@pytest.mark.parametrize("opt", ["AdamW", "LAMB"])
def test_optimizers_take_provider(opt: str) -> None:
    g = torch.Generator().manual_seed(1)
    start = torch.randn(5, 3, generator=g)
    grad = torch.randn(5, 3, generator=g)
    results = []
    for provider in (None, "reference"):
        p = torch.nn.Parameter(start.clone())
        o = getattr(kernels, opt)([p], lr=1e-2, provider=provider)
        p.grad = grad.clone()
        o.step()
        results.append(p.detach())
    assert not torch.equal(results[0], start)  # a step happened
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)


def test_import_is_light_and_independent_of_the_product() -> None:
    """`import kernels` pulls in no profiler/fusion_advisor/streamlit/triton and builds nothing."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, kernels, kernels._build as b\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'profiler', 'fusion_advisor', 'streamlit', 'triton'})\n"
            "print(bad, b._loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout.strip()
    assert out == "[] False"

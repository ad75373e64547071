"""Arguments of the wrong kind get one line naming the kernel and the argument (kernels/arguments.py).

Before: `layer_norm([[1.0]])` raised `'list' object has no attribute 'dim'`, a list weight the C++
op's five-line schema dump, a string eps a pybind cast error.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import kernels
from kernels.arguments import typed_arguments, wrong_argument
from kernels.cross_entropy_rows import CrossEntropyError

X = torch.randn(4, 8)
W = torch.ones(8)
LISTED = [[1.0] * 8] * 4
Q = torch.randn(1, 2, 3, 8)
COS = torch.randn(3, 8)

# case -> (call, the line it must raise)
WRONG = {
    "layer_norm x": (lambda: kernels.layer_norm(LISTED, None, None, 1e-5), "layer_norm: x must be a tensor (got list)"),
    "layer_norm weight": (lambda: kernels.layer_norm(X, [1.0] * 8, None, 1e-5),
                          "layer_norm: weight must be a tensor or None (got list)"),
    "layer_norm eps": (lambda: kernels.layer_norm(X, W, None, "1e-5"), "layer_norm: eps must be a number (got str)"),
    "rms_norm x": (lambda: kernels.rms_norm(np.ones((4, 8), np.float32), W), "rms_norm: x must be a tensor (got ndarray)"),
    "add_rms_norm residual": (lambda: kernels.add_rms_norm(X, LISTED, W), "add_rms_norm: residual must be a tensor (got list)"),
    "add_layer_norm bias": (lambda: kernels.add_layer_norm(X, X, W, (0.0,) * 8),
                            "add_layer_norm: bias must be a tensor or None (got tuple)"),
    "gelu x": (lambda: kernels.gelu(1.5), "gelu: x must be a tensor (got float)"),
    "geglu a": (lambda: kernels.geglu(LISTED, X), "geglu: a must be a tensor (got list)"),
    "softmax mask": (lambda: kernels.softmax(X, mask=LISTED), "softmax: mask must be a tensor or None (got list)"),
    "flce x": (lambda: kernels.fused_linear_cross_entropy(LISTED, torch.randn(5, 8), torch.zeros(4, dtype=torch.long)),
               "fused_linear_cross_entropy: x must be a tensor (got list)"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_kind_of_argument_is_named_in_one_line(case: str) -> None:
    call, line = WRONG[case]
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == line
    assert info.value.__cause__ is not None  # the original error stays reachable


def test_the_kernels_own_one_line_errors_pass_through() -> None:
    """Errors that already name the kernel keep their type and words."""
    with pytest.raises(TypeError, match="^softmax: x must be a floating tensor$"):
        kernels.softmax(LISTED)
    with pytest.raises(IndexError, match="^softmax: dim 5 out of range"):
        kernels.softmax(X, dim=5)
    with pytest.raises(ValueError, match=r"^rope: cos/sin \(4, 8\) is not"):
        kernels.rope(Q, Q, torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(CrossEntropyError, match="^cross_entropy: logits and target must be tensors$"):
        kernels.cross_entropy(LISTED, [0, 1, 2, 3])


def test_calls_eager_accepts_still_run() -> None:
    """Only failed calls are examined: a float where a tensor is annotated, as eager takes it, runs."""
    torch.testing.assert_close(kernels.swiglu(X, 2.0), torch.nn.functional.silu(X) * 2.0)
    torch.testing.assert_close(kernels.bias_gelu(X, 0.5), torch.nn.functional.gelu(X + 0.5))
    torch.testing.assert_close(kernels.layer_norm(X, W, None, np.float32(1e-5)),
                               torch.nn.functional.layer_norm(X, (8,), W, None, 1e-5))


def test_unrelated_failures_are_not_blamed_on_an_argument() -> None:
    @typed_arguments
    def toy(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
        raise RuntimeError("out of something")

    with pytest.raises(RuntimeError, match="^out of something$"):
        toy(X)
    with pytest.raises(TypeError, match="^toy: x must be a tensor \\(got str\\)$"):
        toy("x")
    with pytest.raises(TypeError, match="unexpected keyword"):  # a call that does not bind: Python's own error
        toy(X, nope=1)

    @typed_arguments
    def scaled(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:  # eager takes a float scale too
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):  # not blamed on the float scale
        scaled(X, 2.0)


def test_signatures_stay_readable() -> None:
    """help() and the public-API contract read the wrapped function's own signature."""
    assert list(inspect.signature(kernels.layer_norm).parameters)[:4] == ["x", "weight", "bias", "eps"]
    assert kernels.layer_norm.__doc__ and kernels.layer_norm.__name__ == "layer_norm"
    sig = inspect.signature(kernels.rms_norm)
    assert wrong_argument(sig, (X, W), {"offset": "1"}) == "offset must be a number (got str)"
    assert wrong_argument(sig, (X, None), {"eps": None}) is None

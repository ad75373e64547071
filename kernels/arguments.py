"""One-line TypeErrors for public-API arguments of the wrong kind.

`layer_norm([[1.0, 2.0]])` failed with `'list' object has no attribute 'dim'`, a weight given as a
list with the C++ op's five-line schema dump, an `eps` given as a string with a pybind cast error.
`@typed_arguments` wraps a public function so that, when a call fails, the argument whose type
the function's own annotations rule out is named: `layer_norm: x must be a tensor (got list)`.

Only failed calls are looked at, so every call that works today (eager semantics included, such
as `swiglu(a, 2.0)`) runs as before and pays nothing but the wrapper's frame. Errors that already
name the kernel (`softmax: dim 5 out of range ...`) pass through unchanged.
"""
from __future__ import annotations

import functools
import inspect
import numbers
from typing import Any, Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

# annotation (as written, under `from __future__ import annotations`) -> (test, what it asks for)
ARGUMENT_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "torch.Tensor": (lambda v: isinstance(v, torch.Tensor), "a tensor"),
    "torch.Tensor | None": (lambda v: v is None or isinstance(v, torch.Tensor), "a tensor or None"),
    "float": (lambda v: isinstance(v, numbers.Real), "a number"),
    "float | None": (lambda v: v is None or isinstance(v, numbers.Real), "a number or None"),
    "int": (lambda v: isinstance(v, numbers.Integral), "an int"),
    "int | None": (lambda v: v is None or isinstance(v, numbers.Integral), "an int or None"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "str | None": (lambda v: v is None or isinstance(v, str), "a string or None"),
}


def wrong_argument(signature: inspect.Signature, args: tuple, kwargs: dict) -> str | None:
    """'x must be a tensor (got list)' for the first argument its annotation rules out; None when
    every annotated argument fits (or the call does not even bind: Python's own error stands)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
        rule = ARGUMENT_RULES.get(signature.parameters[name].annotation)
        if rule is not None and not rule[0](value):
            return f"{name} must be {rule[1]} (got {type(value).__name__})"
    return None


def typed_arguments(fn: F) -> F:
    """Wrap a public kernel function: a failed call whose arguments break fn's annotations raises
    `TypeError("<fn>: <argument> must be ... (got ...)")` from the original error."""
    signature = inspect.signature(fn)
    prefix = f"{fn.__name__}:"

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if isinstance(error, (torch.OutOfMemoryError, MemoryError)) or str(error).startswith(prefix):
                raise  # out of memory is never an argument's kind; our own lines already name the kernel
            wrong = wrong_argument(signature, args, kwargs)
            if wrong is None:
                raise
            raise TypeError(f"{prefix} {wrong}") from error

    return checked  # type: ignore[return-value]

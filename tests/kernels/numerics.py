"""Shared numerics helpers for kernel tests: float64 truth, judged against eager's own error.

The protocol (after Liger-Kernel's tests, but with a float64 truth):
1. run the kernel under test (`ours`) and the eager `reference` in the test dtype, and the
   reference again on float64 copies of the same inputs (the truth);
2. per output/gradient: err(x) = max |x - truth| over positions where the truth is finite;
3. pass when err(ours) <= factor * err(eager) + atol, with atol = atol_eps * eps(dtype) * scale
   (scale = max(1, max |truth|)), so low precision is judged by what eager itself achieves, and
   an exact eager result (err 0) still leaves room for a few ulps of reordering;
4. NaN and +-Inf must sit where the truth has them (`assert_same_nonfinite`).

Typical use:

    inputs = [make((17, 4099), dtype, seed=1), make((4099,), dtype, seed=2)]
    ours = fwd_bwd(lambda x, w: kernels.rms_norm(x, w, 1e-6, provider="cpu"), inputs)
    eager = fwd_bwd(reference, inputs)
    truth = fwd_bwd(reference, to_f64(inputs))
    assert_matches(ours, eager, truth, dtype)

`fwd_bwd` returns outputs followed by the gradients of every floating input (None where an input
is None or gets no gradient); the upstream gradients are fixed random tensors, identical (up to
rounding) in every dtype. `poisoned()` makes providers fill fresh outputs with NaN.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.registry import poison_outputs

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
LOW_PRECISION: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)

# Awkward 2D (rows, cols) shapes: 1 row, 1x1, odd, wide-odd, a large last dim.
AWKWARD_2D: tuple[tuple[int, int], ...] = ((1, 8), (1, 1), (3, 5), (17, 4099), (2, 16384))
# Shapes with batch dims (the last dim is the normalized/feature dim).
BATCHED: tuple[tuple[int, ...], ...] = ((2, 3, 7, 64), (4, 1, 33))
# Tiny shapes for the Triton interpreter (thousands of times slower than compiled code).
TINY: tuple[tuple[int, ...], ...] = ((1, 1), (3, 5), (2, 3, 33), (4, 130))

poisoned = poison_outputs  # re-export: `with poisoned(): ...`


def eps(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype."""
    return torch.finfo(dtype).eps


def make(shape: Sequence[int], dtype: torch.dtype = torch.float32, seed: int = 0, *,
         scale: float = 1.0, shift: float = 0.0, layout: str = "contiguous") -> torch.Tensor:
    """A random normal tensor (scale * N(0,1) + shift) with `shape`, `dtype` and memory `layout`.

    layout: "contiguous"; "transposed" (a .transpose view of the last two dims of a contiguous
    buffer: the last dim has stride != 1); "strided" (every other element of the last dim).
    Values are drawn in float64 from a seeded generator, so they are identical across dtypes up
    to rounding.
    """
    shape = tuple(shape)
    gen = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        base = torch.randn(shape, generator=gen, dtype=torch.float64)
        return (base * scale + shift).to(dtype)
    if layout == "transposed":
        if len(shape) < 2:
            raise ValueError("transposed layout needs at least 2 dims")
        swapped = shape[:-2] + (shape[-1], shape[-2])
        base = torch.randn(swapped, generator=gen, dtype=torch.float64)
        return (base * scale + shift).to(dtype).transpose(-1, -2)
    if layout == "strided":
        wide = shape[:-1] + (2 * shape[-1],) if shape else shape
        base = torch.randn(wide, generator=gen, dtype=torch.float64)
        return (base * scale + shift).to(dtype)[..., ::2]
    raise ValueError(f"unknown layout {layout!r}")


def to_f64(items: Any) -> Any:
    """Float64 copies of every floating tensor in a (nested) list/tuple; other items unchanged."""
    if isinstance(items, torch.Tensor):
        return items.detach().to(torch.float64) if items.is_floating_point() else items
    if isinstance(items, (list, tuple)):
        return type(items)(to_f64(x) for x in items)
    return items


def as_tuple(out: Any) -> tuple:
    """A kernel's output(s) as a tuple: one tensor, or the tuple/list a kernel returns."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def upstream_grad(out: torch.Tensor, seed: int) -> torch.Tensor:
    """A fixed random upstream gradient for `out` (drawn in float64, cast to out's dtype). On a
    GPU it is drawn there: a CPU draw at the GPU check's real sizes takes most of a second."""
    device = out.device if out.device.type == "cuda" else torch.device("cpu")
    gen = torch.Generator(device=device).manual_seed(10_000 + seed)
    g = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float64, device=device)
    return g.to(device=out.device, dtype=out.dtype)


def fwd_bwd(fn: Callable[..., Any], inputs: Sequence[Any], backward: bool = True,
            **kwargs: Any) -> tuple:
    """Run fn(*inputs, **kwargs) on fresh leaf copies; return (*outputs, *input grads).

    Floating tensors are cloned (keeping their strides, so non-contiguous stays non-contiguous)
    and made leaves with requires_grad. Gradients flow from every floating output with a fixed
    random upstream gradient (`upstream_grad`, seed = output index).
    """
    leaves = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and backward:
            leaf = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
            leaf.copy_(x.detach())
            leaves.append(leaf.requires_grad_(True))
        else:
            leaves.append(x)
    outs = as_tuple(fn(*leaves, **kwargs))
    if not backward:
        return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)
    pairs = [(o, upstream_grad(o, i)) for i, o in enumerate(outs)
             if isinstance(o, torch.Tensor) and o.requires_grad]
    wrt = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                allow_unused=True) if pairs and wrt else ()
    it = iter(grads)
    all_grads = tuple(next(it) if isinstance(x, torch.Tensor) and x.requires_grad else None
                      for x in leaves)
    return tuple(o.detach() for o in outs) + all_grads


def max_err(x: torch.Tensor, truth: torch.Tensor) -> float:
    """max |x - truth| over positions where truth is finite (0.0 for empty tensors)."""
    truth = truth.detach()
    finite = torch.isfinite(truth)
    if x.numel() == 0 or not bool(finite.any()):
        return 0.0
    diff = (x.detach().to(torch.float64) - truth.detach().to(torch.float64)).abs()[finite]
    return float(diff.max()) if not bool(diff.isnan().any()) else float("nan")


def assert_same_nonfinite(x: torch.Tensor, truth: torch.Tensor, what: str = "") -> None:
    """NaN where truth is NaN, +-Inf where truth is +-Inf, finite elsewhere."""
    xf = x.detach().to(torch.float64)
    t = truth.to(torch.float64)
    for name, mask_x, mask_t in (("NaN", xf.isnan(), t.isnan()),
                                 ("+Inf", xf == float("inf"), t == float("inf")),
                                 ("-Inf", xf == float("-inf"), t == float("-inf"))):
        if not torch.equal(mask_x, mask_t):
            bad = int((mask_x != mask_t).sum())
            raise AssertionError(f"{what}: {name} positions differ from the reference at {bad} "
                                 f"elements (ours {int(mask_x.sum())}, reference {int(mask_t.sum())})")


def assert_matches(ours: Sequence[Any], eager: Sequence[Any], truth: Sequence[Any],
                   dtype: torch.dtype, *, factor: float = 2.0, atol_eps: float = 16.0,
                   names: Sequence[str] | None = None) -> None:
    """Every tensor of `ours` is within factor*err(eager)+atol of `truth` (see module doc).

    None entries must be None in all three. Shapes and dtypes of ours must equal eager's.
    Non-finite positions must match the truth's.
    """
    if not (len(ours) == len(eager) == len(truth)):
        raise AssertionError(f"result counts differ: ours {len(ours)}, eager {len(eager)}, truth {len(truth)}")
    for i, (o, e, t) in enumerate(zip(ours, eager, truth)):
        what = names[i] if names and i < len(names) else f"result {i}"
        if o is None or e is None or t is None:
            if not (o is None and e is None and t is None):
                raise AssertionError(f"{what}: None mismatch (ours {o is None}, eager {e is None}, truth {t is None})")
            continue
        if o.shape != e.shape or o.dtype != e.dtype:
            raise AssertionError(f"{what}: ours is {tuple(o.shape)} {o.dtype}, eager {tuple(e.shape)} {e.dtype}")
        assert_same_nonfinite(o, t, what)
        err_o, err_e = max_err(o, t), max_err(e, t)
        finite_t = t[torch.isfinite(t)]
        scale = max(1.0, float(finite_t.detach().abs().max())) if finite_t.numel() else 1.0
        atol = atol_eps * eps(dtype) * scale
        if not err_o <= factor * err_e + atol:
            raise AssertionError(f"{what} ({dtype}, shape {tuple(o.shape)}): max error {err_o:.3g} vs "
                                 f"float64 > {factor} x eager's {err_e:.3g} + atol {atol:.3g}")


def check_against_reference(ours_fn: Callable[..., Any], reference: Callable[..., Any],
                            inputs: Sequence[Any], dtype: torch.dtype, *, backward: bool = True,
                            poison: bool = True, factor: float = 2.0, atol_eps: float = 16.0,
                            names: Sequence[str] | None = None, **kwargs: Any) -> None:
    """The whole protocol in one call: ours (with poisoned outputs) vs eager vs float64 truth."""
    if poison:
        with poison_outputs():
            ours = fwd_bwd(ours_fn, inputs, backward, **kwargs)
    else:
        ours = fwd_bwd(ours_fn, inputs, backward, **kwargs)
    eager = fwd_bwd(reference, inputs, backward, **kwargs)
    truth = fwd_bwd(reference, to_f64(list(inputs)), backward, **kwargs)
    assert_matches(ours, eager, truth, dtype, factor=factor, atol_eps=atol_eps, names=names)


def with_nonfinite(x: torch.Tensor, row: int = 0) -> torch.Tensor:
    """A copy of x with NaN, +Inf and -Inf planted in one row (of the flattened leading dims)."""
    y = x.detach().clone(memory_format=torch.contiguous_format)
    flat = y.view(-1, y.shape[-1]) if y.dim() > 1 else y.view(1, -1)
    n = flat.shape[-1]
    flat[row, 0] = float("nan")
    if n > 1:
        flat[min(row + 1, flat.shape[0] - 1), n // 2] = float("inf")
    if n > 2:
        flat[min(row + 1, flat.shape[0] - 1), n - 1] = float("-inf")
    return y


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bit patterns as integers, every NaN as one value: which NaN payload a product keeps
    depends on the instruction's operand order, which the compiler may pick either way. For
    comparing two builds or instruction-set copies bit for bit."""
    t = t.detach()
    b = t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]).clone()
    b[t.isnan()] = -1
    return b


REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def run_in_triton_interpreter(code: str, timeout_s: float = 300.0) -> str:
    """Run Python `code` in a fresh process with TRITON_INTERPRET=1 (set before triton is imported)
    and the interpreter's fp32 -> bf16 cast rounding to nearest, as the GPU's does
    (tests/kernels/interpreter_rounding.py).

    The interpreter flag must never leak into the test process (it changes provider probing for
    every later test), hence the subprocess. Returns stdout; a non-zero exit raises AssertionError
    with the tail of stderr.
    """
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO_ROOT),
               OMP_NUM_THREADS="1")
    approximate = os.environ.get("FUSIONLENS_INTERPRETER_MATH") == "approximate"
    code = f"from tests.kernels import interpreter_rounding\ninterpreter_rounding.install({approximate})\n{code}"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise AssertionError(f"interpreted run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


class OpNames(TorchDispatchMode):
    """A context that lists the name of every op dispatched inside it (`seen`), e.g. to check that
    a kernel runs its library op and no copy or concatenation."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))

"""Normalization kernels: LayerNorm, RMSNorm and their residual-add fusions.

Public functions (each takes `provider=`): `layer_norm(x, weight, bias, eps)`,
`rms_norm(x, weight, eps, offset=0.0)`, `add_layer_norm(x, residual, weight, bias, eps)` and
`add_rms_norm(x, residual, weight, eps)` (the last two return `(sum, normed)`), plus the modules
`LayerNorm`, `RMSNorm`, `AddLayerNorm`, `AddRMSNorm`.

Semantics follow the models they replace:
- layer_norm: `F.layer_norm` over the last dim (computed in fp32, one cast at the end).
- rms_norm, casting="llama" (HF LlamaRMSNorm; the default when offset == 0):
  `(offset + weight) * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)`.
  casting="gemma" (HF GemmaRMSNorm; the default when offset != 0): all in fp32, cast once:
  `(x.float() * rsqrt(...) * (offset + weight.float())).to(x.dtype)`.
- add_*: `s = x + residual` (rounded to the dtype, as eager does), then the norm of `s`.
- Under `torch.autocast` on a GPU, layer_norm and add_layer_norm follow F.layer_norm's fp32 policy
  there (bf16/fp16 inputs up-cast, fp32 normed output), whichever provider runs
  (`kernels/autocast.py`); RMSNorm's casts are HF's, explicit, and autocast leaves them.
- Mixed precision: weight and bias may be fp32 on a bf16/fp16 x (fused, grads in fp32). The output
  has eager's dtype: x's, except llama casting, where `fp32 weight * normed.to(x.dtype)` is fp32
  (one kernel writes it in fp32; `kernels/norm_function._y_dtype`).

Providers: "cpu" (C++ ops `torch.ops.fusionlens.{layer,rms}_norm_{fwd,bwd}` from
`kernels/csrc/norms.cpp`), "triton" (`kernels/triton_norms.py`, same op signatures), "aten"
(`F.layer_norm`; `F.rms_norm` only for float32, where its rounding matches). One autograd
Function (`kernels/norm_function.py`) serves both fused providers.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels.arguments import typed_arguments
from kernels.autocast import LOW_PRECISION, AutocastRule, up
from kernels.norm_function import apply_norm
from kernels.registry import Cost, KernelSpec, Supports, dispatch, io_bytes, op_only_cost, register_kernel, register_op_cost

_CASTINGS = ("llama", "gemma")


# ---------------------------------------------------------------- references (the truth for tests)
def _up(t: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (what `.float()` does in the models); fp32/fp64 unchanged, so the same
    reference run on float64 inputs is the float64 truth."""
    return t.float() if t.element_size() < 4 else t


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim composed from eager ops (fp32 math, one cast, like F.layer_norm)."""
    xf = _up(x)
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * _up(weight)
    if bias is not None:
        y = y + _up(bias)
    return y.to(x.dtype)


def _casting(offset: float, casting: str | None) -> str:
    casting = casting or ("llama" if offset == 0.0 else "gemma")
    if casting not in _CASTINGS:
        raise ValueError(f"casting must be one of {_CASTINGS}, got {casting!r}")
    return casting


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
                       offset: float = 0.0, casting: str | None = None) -> torch.Tensor:
    """RMSNorm composed from eager ops, in HF Llama (or Gemma) order of casts (see module doc)."""
    xf = _up(x)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if _casting(offset, casting) == "llama":
        normed = normed.to(x.dtype)
        return normed if weight is None else (offset + weight) * normed
    if weight is not None:
        normed = normed * (offset + _up(weight))
    return normed.to(x.dtype)


def add_layer_norm_reference(x, residual, weight=None, bias=None, eps=1e-5):
    """(x + residual, layer_norm(x + residual)) composed from eager ops."""
    s = x + residual
    return s, layer_norm_reference(s, weight, bias, eps)


def add_rms_norm_reference(x, residual, weight=None, eps=1e-6, offset=0.0, casting=None):
    """(x + residual, rms_norm(x + residual)) composed from eager ops."""
    s = x + residual
    return s, rms_norm_reference(s, weight, eps, offset, casting)


def _ln(provider):
    def run(x, weight=None, bias=None, eps=1e-5):
        return apply_norm(provider, "ln", x, None, weight, bias, eps, 0.0, False)
    return run


def _add_ln(provider):
    def run(x, residual, weight=None, bias=None, eps=1e-5):
        return apply_norm(provider, "ln", x, residual, weight, bias, eps, 0.0, False)
    return run


def _rms(provider):
    def run(x, weight=None, eps=1e-6, offset=0.0, casting=None):
        return apply_norm(provider, "rms", x, None, weight, None, eps, offset, _casting(offset, casting) == "llama")
    return run


def _add_rms(provider):
    def run(x, residual, weight=None, eps=1e-6, offset=0.0, casting=None):
        return apply_norm(provider, "rms", x, residual, weight, None, eps, offset,
                          _casting(offset, casting) == "llama")
    return run


# ---------------------------------------------------------------- support checks and costs
def _fit(x: torch.Tensor, residual: Any, params: tuple) -> str | None:
    """Why the fused kernels cannot take these tensors (None: they can). The residual shares x's
    dtype and shape; weight and bias are [N] in x's dtype or, below fp32, float32 (mixed
    precision, as CPU autocast and fp32 master weights leave a norm: the kernels read parameters
    in fp32 anyway)."""
    if x.dim() == 0:
        return "input must have at least one dimension"
    n = x.shape[-1]
    if isinstance(residual, torch.Tensor) and (residual.dtype != x.dtype or residual.shape != x.shape):
        return (f"residual {tuple(residual.shape)} {residual.dtype} does not match input {tuple(x.shape)} "
                f"{x.dtype}: reference handles promotion and broadcasting")
    for t in (residual, *params):
        if isinstance(t, torch.Tensor) and t.device != x.device:
            return f"tensors on different devices ({x.device}, {t.device})"
    for t in params:
        if not isinstance(t, torch.Tensor):
            continue
        if t.dtype != x.dtype and not (t.dtype == torch.float32 and x.dtype in LOW_PRECISION):
            return f"mixed dtypes ({x.dtype} input, {t.dtype} parameter): reference handles promotion"
        if t.dim() != 1 or t.shape[0] != n:
            return f"parameter of shape {tuple(t.shape)} does not match the last dim {n}"
    return None


def _norm_fits(x, weight=None, bias=None, *_: Any, **__: Any) -> str | None:
    return _fit(x, None, (weight, bias))


def _add_norm_fits(x, residual, weight=None, bias=None, *_: Any, **__: Any) -> str | None:
    return _fit(x, residual, (weight, bias))


def _aten_ln_dtypes(x, weight=None, bias=None, *_: Any, **__: Any) -> str | None:
    """F.layer_norm takes parameters in x's dtype or, on CPU only, a bf16/fp16 x with every
    parameter fp32 (one fp32 and one bf16 parameter raises there), and a weight among them: with
    an fp32 bias alone its backward raises (found by tests/kernels/fuzz.py)."""
    params = [t for t in (weight, bias) if isinstance(t, torch.Tensor)]
    if all(t.dtype == x.dtype for t in params):
        return None
    if x.device.type != "cpu":
        return "mixed parameter dtypes: F.layer_norm takes them on CPU only"
    if any(t.dtype != torch.float32 for t in params):
        return "mixed parameter dtypes: F.layer_norm takes them only when every parameter is float32"
    if weight is None:
        return "an fp32 bias without a weight on a low-precision x: F.layer_norm's backward raises"
    return None


def _aten_add_ln_dtypes(x, residual, weight=None, bias=None, *_: Any, **__: Any) -> str | None:
    s = x if residual.dtype == x.dtype else x.new_empty((), dtype=torch.promote_types(x.dtype, residual.dtype))
    return _aten_ln_dtypes(s, weight, bias)  # the norm runs on x + residual, in the promoted dtype


def _triton_fits(x, *args, **kwargs) -> str | None:
    from kernels.triton_norms import MAX_N

    n = x.shape[-1] if x.dim() else 0
    return None if n <= MAX_N else f"last dim {n} > {MAX_N} does not fit one Triton row block"


def _fp32_only(x, *args, **kwargs) -> str | None:
    return None if x.dtype == torch.float32 else "F.rms_norm rounds differently from HF below fp32"


def _norm_cost(x, weight, bias, residual: bool, kind: str, casting: str = "llama") -> Cost:
    """FLOPs and bytes of one forward call on x [..., N] (per-row scalars of the eager chain aside).

    Fused: read x (and the residual) and the parameters once, write y (and the sum) once, plus the
    fp32 stats saved per row (LayerNorm: mean and rstd; RMSNorm: rstd).
    Unfused: the traffic of the eager reference chain above, op by op, at its dtypes: the add
    (read 2, write 1), the up-cast to fp32 below fp32 (read + write), then per full-size op its
    reads and write (LN: mean(x), x - mean, pow, mean, x - mean again, * rstd, * w, + b;
    RMS: pow, mean, * rstd, [cast back], * w), and the final cast back below fp32.
    """
    e = x.numel()
    n = x.shape[-1] if x.dim() else 1
    rows = e // max(n, 1)
    es = x.element_size()
    fs = 4 if es < 4 else es  # the math dtype's size (`_up`)
    has_w, has_b = weight is not None, bias is not None
    # llama casting with an fp32 weight on 16-bit x promotes: y is fp32
    ys = 4 if kind == "rms" and casting == "llama" and has_w and weight.element_size() == 4 else es
    params = sum(t.numel() * t.element_size() for t in (weight, bias) if t is not None)
    n_in = 2 if residual else 1
    fused = n_in * e * es + e * ys + (e * es if residual else 0) + params + (2 if kind == "ln" else 1) * rows * 4
    low = es < fs
    unfused = 3 * e * es if residual else 0  # s = x + residual
    unfused += e * (es + fs) if low else 0  # _up(x)
    if kind == "ln":
        unfused += e * fs * (1 + 2 + 2 + 1 + 2 + 2 + 2 * has_w + 2 * has_b) + params
        unfused += e * (fs + es) if low else 0  # .to(x.dtype)
    else:
        unfused += e * fs * (2 + 1 + 2) + params  # pow, mean, * rstd
        if casting == "llama":
            unfused += e * (fs + es) if low else 0  # normed.to(x.dtype)
            unfused += e * (es + ys) * has_w  # (offset + w) * normed, in x's dtype (fp32 w: promoted)
        else:
            unfused += 2 * e * fs * has_w  # normed * (offset + w.float())
            unfused += e * (fs + es) if low else 0  # .to(x.dtype)
    return Cost(flops=_norm_flops(e, kind, has_w, has_b, residual), bytes_fused=float(fused),
                bytes_unfused=float(unfused))


def _norm_flops(e: int, kind: str, has_w: bool, has_b: bool, residual: bool) -> float:
    """Forward FLOPs over e elements: LN 8 an element (mean, centre, square, variance, scale), RMS 4
    (square, sum, scale), +1 each for the weight, the bias and the residual add."""
    return ((8.0 if kind == "ln" else 4.0) + has_w + has_b + residual) * e


def _norm_bwd_flops(e: int, kind: str, has_w: bool, has_b: bool, dadd: bool) -> float:
    """Backward FLOPs over e elements. LN: xhat 2, the two row sums 3, dx 4 (9), + weight (g = dy * w,
    dw += dy * xhat: 3) + bias (db += dy: 1). RMS: the row sum 2, dx 3 (5), + weight (g, dw: 4).
    +1 for the residual's incoming grad."""
    per = 9.0 + 3 * has_w + has_b if kind == "ln" else 5.0 + 4 * has_w
    return (per + dadd) * e


# The library ops as a profiler sees them (OP_COSTS): the row kernels on the fp32 effective
# parameters they are handed, bytes as they read and write them; norm_train whole (inference).
@register_op_cost("layer_norm_fwd", "triton_layer_norm_fwd")
def _ln_fwd_op(x, residual, weight, bias, eps, y, sum_out, mean, rstd, **_: Any) -> Cost:
    return op_only_cost(_norm_flops(x.numel(), "ln", weight is not None, bias is not None, residual is not None),
                        io_bytes(x, residual, weight, bias, y, sum_out, mean, rstd))


@register_op_cost("rms_norm_fwd", "triton_rms_norm_fwd")
def _rms_fwd_op(x, residual, weight, eps, llama_cast, y, sum_out, rstd, **_: Any) -> Cost:
    return op_only_cost(_norm_flops(x.numel(), "rms", weight is not None, False, residual is not None),
                        io_bytes(x, residual, weight, y, sum_out, rstd))


@register_op_cost("layer_norm_bwd", "triton_layer_norm_bwd")
def _ln_bwd_op(dy, x, weight, mean, rstd, dadd, dx, dw, db, **_: Any) -> Cost:
    return op_only_cost(_norm_bwd_flops(x.numel(), "ln", weight is not None, db.numel() > 0, dadd is not None),
                        io_bytes(dy, x, weight, mean, rstd, dadd, dx, dw, db))


@register_op_cost("rms_norm_bwd", "triton_rms_norm_bwd")
def _rms_bwd_op(dy, x, weight, rstd, dadd, llama_cast, dx, dw, **_: Any) -> Cost:
    return op_only_cost(_norm_bwd_flops(x.numel(), "rms", weight is not None, False, dadd is not None),
                        io_bytes(dy, x, weight, rstd, dadd, dx, dw))


@register_op_cost("norm_train")
def _norm_train_op(x, residual, weight, bias, eps, offset, rms, llama_cast, **_: Any) -> Cost:
    return _norm_cost(x, weight, bias, residual is not None, "rms" if rms else "ln",
                      "llama" if llama_cast else "gemma")


def _ln_cost(x, weight=None, bias=None, eps=1e-5):
    return _norm_cost(x, weight, bias, False, "ln")


def _rms_cost(x, weight=None, eps=1e-6, offset=0.0, casting=None):
    return _norm_cost(x, weight, None, False, "rms", _casting(offset, casting))


def _add_ln_cost(x, residual, weight=None, bias=None, eps=1e-5):
    return _norm_cost(x, weight, bias, True, "ln")


def _add_rms_cost(x, residual, weight=None, eps=1e-6, offset=0.0, casting=None):
    return _norm_cost(x, weight, None, True, "rms", _casting(offset, casting))


def _aten_ln(x, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _aten_add_ln(x, residual, weight=None, bias=None, eps=1e-5):
    s = x + residual
    return s, F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


def _aten_rms(x, weight=None, eps=1e-6, offset=0.0, casting=None):
    return F.rms_norm(x, (x.shape[-1],), None if weight is None else offset + weight, eps)


def _ln_autocast(x, weight=None, bias=None, eps=1e-5, provider=None):
    """Under a GPU autocast region: F.layer_norm's fp32 policy (inputs up-cast, fp32 output)."""
    return dispatch("layer_norm", up(x), up(weight), up(bias), eps, provider=provider)


def _add_ln_autocast(x, residual, weight=None, bias=None, eps=1e-5, provider=None):
    """Eager's chain under a GPU autocast region: the add in the inputs' dtype (autocast leaves
    it), then F.layer_norm in fp32."""
    s = x + residual
    return s, _ln_autocast(s, weight, bias, eps, provider)


_SUPPORTS = Supports(check=_norm_fits)
_ADD_SUPPORTS = Supports(check=_add_norm_fits)

LAYER_NORM = register_kernel(KernelSpec(
    "layer_norm", layer_norm_reference,
    {"cpu": _ln("cpu"), "triton": _ln("triton"), "aten": _aten_ln},
    _SUPPORTS, _ln_cost, "LayerNorm over the last dim, optional weight and bias",
    provider_checks={"triton": _triton_fits, "aten": _aten_ln_dtypes},
    autocast=AutocastRule("layer_norm", _ln_autocast)))
RMS_NORM = register_kernel(KernelSpec(
    "rms_norm", rms_norm_reference,
    {"cpu": _rms("cpu"), "triton": _rms("triton"), "aten": _aten_rms},
    _SUPPORTS, _rms_cost, "RMSNorm, HF Llama/Gemma casting, (offset + weight)",
    provider_checks={"aten": _fp32_only, "triton": _triton_fits}))
ADD_LAYER_NORM = register_kernel(KernelSpec(
    "add_layer_norm", add_layer_norm_reference,
    {"cpu": _add_ln("cpu"), "triton": _add_ln("triton"), "aten": _aten_add_ln},
    _ADD_SUPPORTS, _add_ln_cost, "residual add + LayerNorm, returns (sum, normed)",
    provider_checks={"triton": _triton_fits, "aten": _aten_add_ln_dtypes},
    autocast=AutocastRule("layer_norm", _add_ln_autocast)))
ADD_RMS_NORM = register_kernel(KernelSpec(
    "add_rms_norm", add_rms_norm_reference,
    {"cpu": _add_rms("cpu"), "triton": _add_rms("triton")},
    _ADD_SUPPORTS, _add_rms_cost, "residual add + RMSNorm, returns (sum, normed)",
    provider_checks={"triton": _triton_fits}))


# ---------------------------------------------------------------- public functional API
@typed_arguments
def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5, *, provider: str | None = None):
    """LayerNorm over the last dim of x; weight/bias optional ([N] or None)."""
    return dispatch("layer_norm", x, weight, bias, eps, provider=provider)


def _eps(x: torch.Tensor, eps: float | None) -> float:
    """eps=None is torch.nn.RMSNorm's (and F.rms_norm's) default: fp32's machine epsilon for
    fp16/bf16/fp32 inputs (the precision the norm is computed in), fp64's for fp64."""
    if eps is not None:
        return eps
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


@typed_arguments
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float | None = 1e-6, offset: float = 0.0,
             *, casting: str | None = None, provider: str | None = None):
    """RMSNorm over the last dim; offset=1.0 for Gemma's (1 + w). casting: "llama" | "gemma".
    eps=None: as torch.nn.RMSNorm (fp32's machine epsilon; fp64's for fp64 x)."""
    return dispatch("rms_norm", x, weight, _eps(x, eps), offset, casting, provider=provider)


@typed_arguments
def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, eps: float = 1e-5, *, provider: str | None = None):
    """(x + residual, layer_norm(x + residual)) in one pass."""
    return dispatch("add_layer_norm", x, residual, weight, bias, eps, provider=provider)


@typed_arguments
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float | None = 1e-6, offset: float = 0.0, *, casting: str | None = None,
                 provider: str | None = None):
    """(x + residual, rms_norm(x + residual)) in one pass."""
    return dispatch("add_rms_norm", x, residual, weight, _eps(x, eps), offset, casting, provider=provider)


# ---------------------------------------------------------------- modules
def _shape(normalized_shape: int | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """torch's normalized_shape as a tuple: an int or the trailing dims normalized together."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(int(n) for n in normalized_shape)
    if not shape:
        raise ValueError("normalized_shape must name at least one dim")
    return shape


def _over(shape: tuple[int, ...], fn, *tensors: torch.Tensor, weight=None, bias=None):
    """fn(*tensors, weight, bias) over the last len(shape) dims taken as one: those dims are flattened
    (a view when they are contiguous) and the outputs unflattened, weight and bias likewise, so a
    multi-dim normalized_shape runs the same one-dim kernels."""
    if len(shape) == 1:
        return fn(*tensors, weight, bias)
    for t in tensors:
        if tuple(t.shape[-len(shape):]) != shape:
            raise ValueError(f"normalized_shape {list(shape)} does not match the input's trailing dims "
                             f"{list(t.shape)}")
    flat = [t.flatten(-len(shape)) for t in tensors]
    weight, bias = (p.flatten() if p is not None else None for p in (weight, bias))
    out = fn(*flat, weight, bias)
    if isinstance(out, tuple):
        return tuple(o.unflatten(-1, shape) for o in out)
    return out.unflatten(-1, shape)


class LayerNorm(nn.Module):
    """Drop-in for nn.LayerNorm (same arguments and parameter names; several trailing dims of
    normalized_shape are normalized as one)."""

    def __init__(self, normalized_shape: int | tuple[int], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, provider: str | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        shape = _shape(normalized_shape)
        self.normalized_shape, self.eps, self.provider = shape, eps, provider
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(shape, **kw)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(shape, **kw)) if elementwise_affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _over(self.normalized_shape, lambda x, w, b: layer_norm(x, w, b, self.eps, provider=self.provider),
                     x, weight=self.weight, bias=self.bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, provider={self.provider}"


class RMSNorm(nn.Module):
    """Drop-in for HF LlamaRMSNorm (offset=0) and GemmaRMSNorm (offset=1.0, weight init 0), and
    for torch.nn.RMSNorm's arguments (`normalized_shape`, several trailing dims normalized as one;
    `eps=None` for its default epsilon; `elementwise_affine=False` for no weight)."""

    def __init__(self, hidden_size: int | tuple[int], eps: float | None = 1e-6, offset: float = 0.0,
                 casting: str | None = None, provider: str | None = None, device=None, dtype=None,
                 *, elementwise_affine: bool = True) -> None:
        super().__init__()
        shape = _shape(hidden_size)
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(init(shape, device=device, dtype=dtype)) if elementwise_affine else None
        self.normalized_shape = shape
        self.eps, self.offset, self.casting, self.provider = eps, offset, _casting(offset, casting), provider

    @property
    def hidden_size(self) -> int:
        """Elements normalized together (HF's hidden size; the product of a multi-dim shape)."""
        return math.prod(self.normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _over(self.normalized_shape, lambda x, w, _: rms_norm(x, w, self.eps, self.offset, casting=self.casting,
                                                                     provider=self.provider), x, weight=self.weight)

    def extra_repr(self) -> str:
        size = self.normalized_shape[0] if len(self.normalized_shape) == 1 else self.normalized_shape
        return f"{size}, eps={self.eps}, offset={self.offset}, casting={self.casting}"


class AddLayerNorm(LayerNorm):
    """forward(x, residual) -> (x + residual, LayerNorm(x + residual))."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor):  # type: ignore[override]
        return _over(self.normalized_shape,
                     lambda x, r, w, b: add_layer_norm(x, r, w, b, self.eps, provider=self.provider),
                     x, residual, weight=self.weight, bias=self.bias)


class AddRMSNorm(RMSNorm):
    """forward(x, residual) -> (x + residual, RMSNorm(x + residual))."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor):  # type: ignore[override]
        return _over(self.normalized_shape,
                     lambda x, r, w, _: add_rms_norm(x, r, w, self.eps, self.offset, casting=self.casting,
                                                     provider=self.provider), x, residual, weight=self.weight)

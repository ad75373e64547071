"""FLOP and byte formulas per aten op: one registry each, filled by decorator (duplicate = error).

FLOPs start from `torch.utils.flop_counter.flop_registry` (matmul, conv, GPU attention: torch's own
formulas, unchanged) and add what it counts as 0. Conventions (per element of the named tensor;
N = numel, R = rows, i.e. N / normalized size):
- pointwise ops (aten tag `pointwise`, or named in the table): `POINTWISE_FLOPS[name]` (an
  in-place form: its op's) per output element, default 1
  (a transcendental counts 1; data movement such as clone/copy/where/masked_fill counts 0);
  the fused forms count what their textbook decomposition counts (tanh-GELU 8, erf-GELU 5,
  sigmoid 4, SiLU 5), so a fused op and its naive chain carry the same FLOPs; backward
  pointwise ops count about twice their forward;
- reductions (tag `reduction`): 1 per input element (var/std 3, norm 2);
- softmax / log_softmax: 5 per element (max, sub, exp, sum, div); their backward 4;
- layer norm: 7N + 2R with weight and bias (mean, center, square, var-sum, scale, +w, +b; eps and
  rsqrt per row), 5N + 2R without; backward 13N; RMS norm 4N + 2R, backward 9N; batch norm as
  layer norm (inference 4N);
- CPU fused attention: as torch counts fused attention, the two matmuls (4·B·H·L·S·D), backward
  five matmuls (with the recompute); the softmax's ~5 FLOPs per score are left out, as torch does;
- embedding 0 (a gather), its backward 1 per gradient element; nll_loss 1 per target, mse 3N;
  dropout 2 per element (mask, scale), its backward 2.

Bytes are an algorithmic lower bound: inputs + outputs at their dtypes, each tensor counted once
per op over its distinct elements (stride-0 broadcast dims count once), views and aliases 0.
`BYTE_RULES` overrides this where the default is not a lower bound (a gather reads only the
rows it returns; copy_/fill_ do not read the tensor they overwrite).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch
from torch.utils import flop_counter
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

FlopFn = Callable[..., int]  # fn(*args, out_val=out, **kwargs) -> FLOPs (torch's convention)
BytesFn = Callable[..., int]  # fn(args, kwargs, out) -> bytes

FLOP_FORMULAS: dict[Any, FlopFn] = dict(flop_counter.flop_registry)
BYTE_RULES: dict[Any, BytesFn] = {}


def register_flops(*packets: Any):
    """Decorator: FLOP formula for aten OpOverloadPackets, called as fn(*args, out_val=out, **kwargs)."""

    def wrap(fn: FlopFn) -> FlopFn:
        for p in packets:
            if p in FLOP_FORMULAS:
                raise ValueError(f"duplicate FLOP formula for {p}")
            FLOP_FORMULAS[p] = fn
        return fn

    return wrap


def register_bytes(*packets: Any):
    """Decorator: byte rule fn(args, kwargs, out) -> bytes for aten OpOverloadPackets."""

    def wrap(fn: BytesFn) -> BytesFn:
        for p in packets:
            if p in BYTE_RULES:
                raise ValueError(f"duplicate byte rule for {p}")
            BYTE_RULES[p] = fn
        return fn

    return wrap


def _packets(*names: str) -> list[Any]:
    """The aten packets among `names` that this torch build has."""
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


def numel(x: Any) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else 0


def tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of t's distinct elements: broadcast (stride-0) dims count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    if t.numel() == 0:
        n = 0
    return n * t.element_size()


def _first_out(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) and out else out


def per_input(per: float) -> FlopFn:
    """A formula of `per` FLOPs per element of the op's first argument."""
    def flops(x, *args, out_val=None, **kwargs) -> int:
        return int(per * numel(x))
    return flops


def per_output(per: float) -> FlopFn:
    """A formula of `per` FLOPs per element of the op's (first) output."""
    def flops(*args, out_val=None, **kwargs) -> int:
        return int(per * numel(_first_out(out_val)))
    return flops


# --- pointwise and reductions (generic by aten tag) -------------------------------------------

POINTWISE_FLOPS: dict[str, float] = {
    # data movement / selection: no arithmetic
    "clone": 0, "copy": 0, "copy_": 0, "_to_copy": 0, "fill": 0, "fill_": 0, "zero_": 0,
    "where": 0, "masked_fill": 0, "masked_fill_": 0, "lift_fresh_copy": 0, "bitwise_not": 0,
    "logical_not": 0, "alias_copy": 0, "detach_copy": 0,
    # multi-FLOP forms: their textbook decomposition
    "sigmoid": 4, "silu": 5, "addcmul": 2, "addcmul_": 2, "addcdiv": 2, "addcdiv_": 2, "lerp": 3,
    "lerp_": 3, "hardswish": 4, "mish": 7, "softplus": 3, "elu": 3, "leaky_relu": 2,
    # backward pointwise: about twice the forward
    "sigmoid_backward": 3, "tanh_backward": 3, "silu_backward": 10, "threshold_backward": 1,
    "hardswish_backward": 8, "elu_backward": 6, "leaky_relu_backward": 2,
    # untagged elementwise ops (no `pointwise` tag; this table is their rule): a select by a
    # comparison counts 1, as threshold_backward; rrelu as leaky_relu (its slope drawn or fixed)
    "hardtanh_backward": 1, "softshrink_backward": 1, "hardshrink_backward": 1,
    "rrelu_with_noise": 2, "rrelu_with_noise_": 2, "rrelu_with_noise_backward": 2,
}
GELU_FLOPS = {"tanh": 8, "none": 5}  # per element, forward; backward counts twice that
REDUCTION_FLOPS: dict[str, float] = {"var": 3, "std": 3, "var_mean": 3, "std_mean": 3,
                                     "norm": 2, "linalg_vector_norm": 2}


def pointwise_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of a tag-`pointwise` op: per output element, by POINTWISE_FLOPS (default 1)."""
    name = func._schema.name.split("::")[-1]
    if name in ("gelu", "gelu_", "gelu_backward"):
        per = GELU_FLOPS.get(str(kwargs.get("approximate", args[-1] if isinstance(args[-1], str) else "none")), 5)
        per *= 2 if name == "gelu_backward" else 1
    else:
        tabled = tabled_pointwise(name)
        per = 1 if tabled is None else tabled  # 0 for data movement: not "or 1"
    return int(per * sum(numel(t) for t in tensors(out)))


def tabled_pointwise(name: str) -> float | None:
    """POINTWISE_FLOPS's count for op `name`; an in-place form (sigmoid_, silu_ of
    nn.SiLU(inplace=True)) counts as its out-of-place op. None when the table does not name it."""
    if name in POINTWISE_FLOPS:
        return POINTWISE_FLOPS[name]
    return POINTWISE_FLOPS.get(name[:-1]) if name.endswith("_") and not name.endswith("__") else None


def reduction_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of a tag-`reduction` op: per input element of its first tensor argument."""
    name = func._schema.name.split("::")[-1]
    first = next(iter(tensors(args)), None)
    return int(REDUCTION_FLOPS.get(name, 1) * numel(first))


# --- registered formulas ------------------------------------------------------------------------

@register_flops(*_packets("_softmax", "_log_softmax", "_safe_softmax"))
def softmax_flops(x, *args, out_val=None, **kwargs) -> int:
    """max, subtract, exp, sum, divide (or log and subtract): 5 per element."""
    return 5 * numel(x)


@register_flops(*_packets("_softmax_backward_data", "_log_softmax_backward_data"))
def softmax_backward_flops(grad, *args, out_val=None, **kwargs) -> int:
    """y*(g - sum(g*y)) or g - exp(y)*sum(g): 4 per element."""
    return 4 * numel(grad)


def _norm_rows(x: torch.Tensor, normalized_shape: Iterable[int]) -> int:
    inner = math.prod(int(s) for s in normalized_shape) or 1
    return numel(x) // inner


@register_flops(*_packets("native_layer_norm"))
def layer_norm_flops(x, normalized_shape, weight=None, bias=None, *args, out_val=None, **kwargs) -> int:
    """7N + 2R with weight and bias; 5N + 2R plain (see module docstring)."""
    per = 5 + (weight is not None) + (bias is not None)
    return per * numel(x) + 2 * _norm_rows(x, normalized_shape)


@register_flops(*_packets("native_layer_norm_backward"))
def layer_norm_backward_flops(grad, x, *args, out_val=None, **kwargs) -> int:
    """dx (10N) + dweight (2N) + dbias (1N) = 13N."""
    return 13 * numel(x)


@register_flops(*_packets("_fused_rms_norm"))
def rms_norm_flops(x, normalized_shape, weight=None, *args, out_val=None, **kwargs) -> int:
    """square, sum, scale, weight: 4N + 2R (3N + 2R without weight)."""
    return (3 + (weight is not None)) * numel(x) + 2 * _norm_rows(x, normalized_shape)


@register_flops(*_packets("_fused_rms_norm_backward"))
def rms_norm_backward_flops(grad, x, *args, out_val=None, **kwargs) -> int:
    """dx (7N) + dweight (2N) = 9N."""
    return 9 * numel(x)


@register_flops(*_packets("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                          "cudnn_batch_norm", "miopen_batch_norm"))
def batch_norm_flops(x, weight=None, bias=None, running_mean=None, running_var=None, training=True,
                     *args, out_val=None, **kwargs) -> int:
    """Training: statistics plus normalise and affine, as layer norm (7N); inference 4N."""
    if isinstance(running_mean, bool):  # _native_batch_norm_legit without running stats
        training = running_mean
    per = 5 + (weight is not None) + (bias is not None) if training else 2 + (weight is not None) + (bias is not None)
    return per * numel(x)


@register_flops(*_packets("_native_batch_norm_legit_no_training"))
def batch_norm_inference_flops(x, weight=None, bias=None, *args, out_val=None, **kwargs) -> int:
    """Normalise with running stats and affine: 4N."""
    return (2 + (weight is not None) + (bias is not None)) * numel(x)


@register_flops(*_packets("native_batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward"))
def batch_norm_backward_flops(grad, x, *args, out_val=None, **kwargs) -> int:
    """As layer norm backward: 13N."""
    return 13 * numel(x)


@register_flops(*_packets("_scaled_dot_product_flash_attention_for_cpu"))
def cpu_attention_flops(q, k, v, *args, out_val=None, **kwargs) -> int:
    """The two matmuls, as torch counts fused attention: 4·B·H·L·S·D."""
    return flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape)


@register_flops(*_packets("_scaled_dot_product_flash_attention_for_cpu_backward"))
def cpu_attention_backward_flops(grad, q, k, v, *args, out_val=None, **kwargs) -> int:
    """Five matmuls (scores recomputed), as torch counts fused attention backward."""
    return flop_counter.sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape)


@register_flops(*_packets("native_dropout"))
def dropout_flops(x, *args, out_val=None, **kwargs) -> int:
    """Draw and compare the mask, scale the kept values: 2 per element."""
    return 2 * numel(x)


@register_flops(*_packets("native_dropout_backward"))
def dropout_backward_flops(grad, *args, out_val=None, **kwargs) -> int:
    """Mask times scale times gradient: 2 per element."""
    return 2 * numel(grad)


@register_flops(*_packets("embedding"))
def embedding_flops(*args, out_val=None, **kwargs) -> int:
    """A gather: no arithmetic."""
    return 0


@register_flops(*_packets("embedding_dense_backward"))
def embedding_backward_flops(grad, *args, out_val=None, **kwargs) -> int:
    """Scatter-add of every gradient element: 1 per element."""
    return numel(grad)


@register_flops(*_packets("nll_loss_forward", "nll_loss2d_forward"))
def nll_loss_flops(x, target, *args, out_val=None, **kwargs) -> int:
    """Gather, accumulate (and average): 1 per target."""
    return numel(target)


@register_flops(*_packets("nll_loss_backward", "nll_loss2d_backward"))
def nll_loss_backward_flops(grad, x, target, *args, out_val=None, **kwargs) -> int:
    """Scatter of the (scaled) gradient: 1 per target."""
    return numel(target)


@register_flops(*_packets("mse_loss"))
def mse_loss_flops(x, y, *args, out_val=None, **kwargs) -> int:
    """Subtract, square, sum: 3N."""
    return 3 * numel(x)


@register_flops(*_packets("mse_loss_backward"))
def mse_loss_backward_flops(grad, x, y, *args, out_val=None, **kwargs) -> int:
    """2 (x - y) g / N: 3N."""
    return 3 * numel(x)


# --- byte rules ---------------------------------------------------------------------------------

@register_bytes(*_packets("embedding"))
def embedding_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Indices + the rows gathered (= output) + the output written."""
    weight, indices = args[0], args[1]
    return tensor_bytes(indices) + 2 * tensor_bytes(out)


@register_bytes(*_packets("copy_"))
def copy_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Read the source, write the destination (its old contents are not read)."""
    return tensor_bytes(args[1]) + tensor_bytes(args[0])


@register_bytes(*_packets("fill_", "zero_", "uniform_", "normal_", "bernoulli_", "random_", "exponential_",
                          "geometric_", "cauchy_", "log_normal_"))
def fill_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Write the destination, plus any tensor fill value read."""
    return tensor_bytes(args[0]) + sum(tensor_bytes(t) for t in tensors(args[1:]))


@register_bytes(*_packets("resize_", "set_", "_unsafe_view"))
def no_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Metadata only: no data moved (empty* allocations: flops.is_allocation)."""
    return 0


from profiler.capture import formulas_ext, formulas_layers  # noqa: E402,F401  (register the rest of the formulas)

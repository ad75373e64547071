"""The autograd Function behind every fused norm provider (see `kernels.norms`).

`_FusedNorm` flattens [..., N] to contiguous [M, N] rows, allocates outputs with
`registry.new_output` (poisonable in tests) and calls a provider's four ops, which share the C++
signatures of `kernels/csrc/norms.cpp`: `torch.ops.fusionlens.{layer,rms}_norm_{fwd,bwd}` for
"cpu", `kernels.triton_norms` for "triton". `apply_norm` skips autograd when no gradient is needed.

A backward with create_graph=True (a second derivative) returns the reference composition's
gradients on the saved input (x, or the sum when fused with the add) instead, built with a graph
(`eager_grads`); the C++ node calls it through `torch.ops.fusionlens.norm_eager_grads`.

The "cpu" provider (outside torch.compile tracing) takes a shorter road: one call of
`torch.ops.fusionlens.norm_train`, whose autograd node is C++ (`NormTrain` in norm_train.cpp) and calls
the same kernels; without grad it runs the forward alone. The Python Function cost ~75 us a step
more than ATen's node, most of a step at small shapes, and the Python forward ~12 us more than the
op (benchmarks/results/kernels_norms_cpu.md). `_FusedNorm` stays for the "triton"
provider and for torch.compile, which traces it (the ops' fake kernels are registered below).
"""
from __future__ import annotations

from typing import Any

import torch

from kernels import _alloc
from kernels.double_backward import eager_backward, vjp_of
from kernels.providers import provider_ops
from kernels.registry import KERNELS, new_output, poisoning


def _w_eff(kind: str, weight: torch.Tensor | None, offset: float, llama_cast: bool) -> torch.Tensor | None:
    """(offset + weight) as contiguous fp32: rounded to weight's dtype first in llama casting, as
    eager does; LayerNorm (and offset 0) uses weight itself."""
    if weight is None:
        return None
    if kind == "ln" or offset == 0.0:
        return weight.float().contiguous()
    w = (offset + weight) if llama_cast else (offset + weight.float())
    return w.float().contiguous()


def _y_dtype(kind: str, x: torch.Tensor, weight: torch.Tensor | None, llama_cast: bool) -> torch.dtype:
    """Eager's output dtype: x's, except RMSNorm's llama casting with an fp32 weight on 16-bit x,
    where `weight * normed.to(x.dtype)` promotes to fp32 (norm_train.cpp decides the same)."""
    promoted = (kind == "rms" and llama_cast and weight is not None and weight.dtype == torch.float32
                and x.dtype != torch.float32)
    return torch.float32 if promoted else x.dtype


def _rows(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """[..., N] -> contiguous [M, N] (a view when already contiguous)."""
    if t is None:
        return None
    rows = 1
    for d in t.shape[:-1]:
        rows *= d
    return t.reshape(rows, n).contiguous()


def _reference(kind: str, eps: float, offset: float, llama_cast: bool):
    """The registered eager composition of the norm alone, as f(inp, weight, bias)."""
    if kind == "ln":
        ln = KERNELS["layer_norm"].reference
        return lambda s, w, b: ln(s, w, b, eps)
    rms, casting = KERNELS["rms_norm"].reference, "llama" if llama_cast else "gemma"
    return lambda s, w, b: rms(s, w, eps, offset, casting)


def eager_grads(kind: str, inp: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                dy: torch.Tensor | None, dsum: torch.Tensor | None, eps: float, offset: float, llama_cast: bool,
                need_inp: bool, need_w: bool, need_b: bool) -> list[torch.Tensor | None]:
    """[d inp, d weight, d bias] of the reference norm at the saved input `inp` (x, or the sum
    output when fused with the add, whose grad_fn leads on to x and the residual), against dy,
    plus dsum: what a backward with create_graph=True returns, differentiable again. None: no grad.

    The fused backward kernels read the mean and rstd the forward saved and write through library
    ops, which autograd cannot differentiate; the reference's own graph can be."""
    grads: list[torch.Tensor | None] = [None, None, None]
    if dy is not None:
        grads = vjp_of(_reference(kind, eps, offset, llama_cast), [inp, weight, bias], [need_inp, need_w, need_b], [dy])
    if dsum is not None and need_inp:
        grads[0] = dsum if grads[0] is None else grads[0] + dsum
    return grads


def _eager_grads_op(inp, weight, bias, dy, dsum, eps, offset, rms, llama_cast, need_inp, need_w, need_b):
    return eager_grads("rms" if rms else "ln", inp, weight, bias, dy, dsum, eps, offset, llama_cast,
                       need_inp, need_w, need_b)


# The C++ node (NormTrain in norm_train.cpp) reaches eager_grads through the dispatcher: a
# composite op runs its Python body with autograd recording, as a backward with create_graph needs.
_LIBRARY = torch.library.Library("fusionlens", "FRAGMENT")
_LIBRARY.define("norm_eager_grads(Tensor inp, Tensor? weight, Tensor? bias, Tensor? dy, Tensor? dsum, float eps, "
                "float offset, bool rms, bool llama_cast, bool need_inp, bool need_w, bool need_b) -> Tensor?[]")
for _key in ("CompositeImplicitAutograd", "Batched", "FuncTorchBatched"):  # vmap: eager ops batch themselves
    _LIBRARY.impl("norm_eager_grads", _eager_grads_op, _key)


class _FusedNorm(torch.autograd.Function):
    """y = norm(x [+ residual]) by a provider's ops (`ops.*_fwd/_bwd`, the C++ op signatures).

    kind: "ln" or "rms". Returns y, or (sum, y) when a residual is given. Saves what ATen's
    LayerNorm saves: the input (x, or the sum output when fused with the add), weight, bias and
    fp32 mean/rstd per row. The backward rebuilds the [M, N] rows and the fp32 effective weight
    for the kernels; with create_graph=True it differentiates the reference instead (`eager_grads`).
    """

    @staticmethod
    def run_forward(ops, kind, x, residual, weight, bias, eps, offset, llama_cast):
        """The forward pass alone: (outputs, mean or None, rstd)."""
        shape, n = x.shape, x.shape[-1]
        w_eff = _w_eff(kind, weight, offset, llama_cast)
        x2, r2 = _rows(x, n), _rows(residual, n)
        m = x2.shape[0]
        y = new_output((m, n), x2, _y_dtype(kind, x, weight, llama_cast))
        s = new_output((m, n), x2) if r2 is not None else x2.new_empty(0)
        rstd = new_output((m,), x2, torch.float32)
        mean = new_output((m,), x2, torch.float32) if kind == "ln" else None
        b32 = None if bias is None else bias.float().contiguous()
        if x2.numel():
            if kind == "ln":
                ops.layer_norm_fwd(x2, r2, w_eff, b32, eps, y, s, mean, rstd)
            else:
                ops.rms_norm_fwd(x2, r2, w_eff, eps, llama_cast, y, s, rstd)
        y = y.view(shape)
        outs = (s.view(shape), y) if r2 is not None else y
        return outs, mean, rstd

    @staticmethod
    def forward(ctx, ops, kind, x, residual, weight, bias, eps, offset, llama_cast):
        outs, mean, rstd = _FusedNorm.run_forward(ops, kind, x, residual, weight, bias, eps, offset, llama_cast)
        fused_add = residual is not None
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(outs[0] if fused_add else x, weight, bias, mean, rstd)
        ctx.meta = (ops, kind, llama_cast, fused_add, eps, offset)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        ops, kind, llama_cast, fused_add, eps, offset = ctx.meta
        inp, weight, bias, mean, rstd = ctx.saved_tensors
        dsum, dy = grads if fused_add else (None, grads[0])
        need_x, need_r, need_w, need_b = (ctx.needs_input_grad[i] for i in (2, 3, 4, 5))
        if eager_backward(*grads):
            d_in, grad_w, grad_b = eager_grads(kind, inp, weight, bias, dy, dsum, eps, offset, llama_cast,
                                               need_x or need_r, need_w, need_b)
            return (None, None, d_in if need_x else None, d_in if need_r else None, grad_w, grad_b,
                    None, None, None)
        shape, n = inp.shape, inp.shape[-1]
        src, w_eff = _rows(inp, n), _w_eff(kind, weight, offset, llama_cast)
        m = src.shape[0]
        dw = new_output((n,), src, torch.float32) if need_w else src.new_empty(0, dtype=torch.float32)
        db = new_output((n,), src, torch.float32) if need_b else src.new_empty(0, dtype=torch.float32)
        if dy is None:  # only the sum was used downstream
            dx = dsum.reshape(shape) if dsum is not None else None
            dw, db = dw.zero_(), db.zero_()
        else:
            dy2, da2 = _rows(dy, n), _rows(dsum, n)
            dx = new_output((m, n), src)
            if src.numel() == 0:
                dw, db = dw.zero_(), db.zero_()
            elif kind == "ln":
                ops.layer_norm_bwd(dy2, src, w_eff, mean, rstd, da2, dx, dw, db)
            else:
                ops.rms_norm_bwd(dy2, src, w_eff, rstd, da2, llama_cast, dx, dw)
            dx = dx.view(shape)
        grad_w = dw.to(weight.dtype) if need_w else None
        grad_b = db.to(bias.dtype) if need_b else None
        return (None, None, dx if need_x else None, dx if need_r else None, grad_w, grad_b,
                None, None, None)


_NORM_TRAIN: Any = None  # torch.ops.fusionlens.norm_train.default, looked up on the first eager call


def _alloc_policy(x: torch.Tensor) -> tuple[int, int, int]:
    """(huge-page min bytes, huge page bytes, pool min bytes) of kernels/_alloc's policy for
    norm_train's outputs; zeros: plain allocation.

    No output is larger than x in fp32 (a 16-bit x's promoted llama output) but the per-column
    grads ([N] fp32), so below the threshold the environment and the probe are not read."""
    if x.numel() * max(x.element_size(), 4) < _alloc.HUGEPAGE_MIN_BYTES and x.shape[-1] * 4 < _alloc.HUGEPAGE_MIN_BYTES:
        return 0, 0, 0
    pool_min = _alloc.pool_min_bytes()
    if _alloc.hugepage_status() is not None:
        return 0, 0, pool_min
    return _alloc.HUGEPAGE_MIN_BYTES, _alloc.hugepage_bytes(), pool_min


def _norm_train(kind, x, residual, weight, bias, eps, offset, llama_cast):
    """Forward with the C++ autograd node (`fusionlens::norm_train`); same outputs as `_FusedNorm`.
    Never traced by torch.compile (apply_norm takes `_FusedNorm` there)."""
    global _NORM_TRAIN
    if _NORM_TRAIN is None:
        _NORM_TRAIN = torch.ops.fusionlens.norm_train.default
    s, y = _NORM_TRAIN(x, residual, weight, bias, eps, offset, kind == "rms", llama_cast, poisoning(),
                       *_alloc_policy(x))
    return y if residual is None else (s, y)


def apply_norm(provider, kind, x, residual, weight, bias, eps, offset, llama_cast, *, cpp_autograd=True):
    """Run the fused norm; skip autograd bookkeeping when no gradient is needed (inference).

    offset: RMSNorm's weight offset (Gemma's 1 + w; 0.0 for LayerNorm). The "cpu" provider runs
    `fusionlens::norm_train` (C++ node; forward alone without grad) unless tracing for
    torch.compile; cpp_autograd=False keeps it on the Python road (`run_forward` / `_FusedNorm`),
    which benchmarks and tests compare against.
    """
    ops = provider_ops(provider, "kernels.triton_norms")
    if provider == "cpu" and cpp_autograd and not torch.compiler.is_compiling():
        return _norm_train(kind, x, residual, weight, bias, eps, offset, llama_cast)  # no node without grad
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight, bias)):
        return _FusedNorm.apply(ops, kind, x, residual, weight, bias, eps, offset, llama_cast)
    return _FusedNorm.run_forward(ops, kind, x, residual, weight, bias, eps, offset, llama_cast)[0]

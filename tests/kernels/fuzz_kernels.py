"""The kernel fuzzer's cases, one generator per public kernel (registered into fuzz.GENERATORS).

Each draws from one `Draw` (one seed) the shapes, layouts, dtypes, value ranges, planted NaN/Inf
and options a call of that kernel takes, and returns the `Case` that `fuzz.check_case` judges:
norms (with residual, offset, Llama/Gemma casting), GELU and bias-GELU, SwiGLU/GeGLU, softmax with
masks and causal, RoPE (GQA, seq-first), cross-entropy and the fused linear cross-entropy.
"""
from __future__ import annotations

import math

import torch

from tests.kernels.fuzz import MAX_NUMEL, Case, Draw, generator
from tests.kernels.numerics import make, upstream_grad


def _param(d: Draw, n: int, dtype, label: str, *, shift: float = 0.0, p_none: float = 0.15):
    return None if d.chance(p_none) else d.tensor((n,), dtype, shift=shift, label=label)


def _norm_case(d: Draw, name: str) -> Case:
    dt, n = d.dtype(), d.last()
    pdt = d.pick((dt, dt, torch.float32), "param_dtype")
    shape = [*d.lead(n), n]
    scale, shift = d.values()
    x = d.maybe_nonfinite(d.tensor(shape, dt, scale=scale, shift=shift, label="x"))
    inputs = [x]
    if name.startswith("add_"):
        inputs.append(d.tensor(shape, d.pick((dt, dt, pdt)), label="residual"))
    inputs.append(_param(d, n, pdt, "w", shift=d.pick((0.0, 1.0))))
    kwargs: dict = {}
    if name.endswith("layer_norm"):
        inputs += [_param(d, n, pdt, "b"), d.pick((1e-5, 1e-6, 1e-12), "eps")]
    else:
        inputs.append(d.pick((1e-6, 1e-5, 1e-8), "eps"))
        kwargs["offset"] = d.pick((0.0, 0.0, 1.0), "offset")
        casting = d.pick((None, None, "llama", "gemma"), "casting")
        if casting:
            kwargs["casting"] = casting
    # Rows of 1-2 elements normalise to +-1 whatever x is: the input gradient is a cancellation of
    # terms ~rstd, and any two orders of summing them differ by several times eager's error there.
    if n > 2:
        return Case(name, inputs, kwargs)
    scale = _norm_grad_scale(inputs, name, kwargs.get("offset", 0.0))
    grads_of = (0, 1) if name.startswith("add_") else (0,)  # x's and the residual's
    return Case(name, inputs, kwargs, factor=8.0, grad_scale={i: scale for i in grads_of})


def _norm_grad_scale(inputs: list, name: str, offset: float) -> float:
    """max rstd x |w| x |dy| over the rows: the size of the terms a 1-2 element row's input gradient
    cancels down from (rstd (dy w - x_hat mean(dy w x_hat)) with x_hat = +-1), float64."""
    x = inputs[0].double() + (inputs[1].double() if name.startswith("add_") else 0.0)
    w, eps = inputs[-2 if name.endswith("rms_norm") else -3], inputs[-1]
    stat = x.var(-1, unbiased=False) if name.endswith("layer_norm") else x.square().mean(-1)
    rstd = (stat + eps).rsqrt()
    wmax = float((w.double() + offset).abs().max()) if w is not None else 1.0
    g = upstream_grad(x, 0).abs().amax(-1)
    big = (rstd * g)[(rstd * g).isfinite()]
    return float(big.max()) * wmax if big.numel() else 1.0


for _name in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"):
    generator(_name)(lambda d, _n=_name: _norm_case(d, _n))


@generator("gelu")
def _gelu(d: Draw) -> Case:
    n, dt = d.last(), d.dtype()
    scale, shift = d.values()
    x = d.maybe_nonfinite(d.tensor([*d.lead(n), n], dt, scale=scale, shift=shift, label="x"))
    return Case("gelu", [x, d.pick(("none", "tanh"), "approximate")])


@generator("bias_gelu")
def _bias_gelu(d: Draw) -> Case:
    n, dt = d.last(), d.dtype()
    scale, shift = d.values()
    x = d.maybe_nonfinite(d.tensor([*d.lead(n), n], dt, scale=scale, shift=shift, label="x"))
    bias = d.tensor((n,), d.pick((dt, dt, torch.float32), "bias_dtype"), label="bias")
    return Case("bias_gelu", [x, bias, d.pick(("none", "tanh"), "approximate")])


def _glu(d: Draw, name: str) -> Case:
    n, dt = d.last(), d.dtype()
    shape = [*d.lead(n), n]
    scale, shift = d.values()
    a = d.maybe_nonfinite(d.tensor(shape, dt, scale=scale, shift=shift, label="a"))
    b = d.tensor(shape, d.pick((dt, dt, dt, torch.float32), "b_dtype"), label="b")
    extra = [d.pick(("none", "tanh"), "approximate")] if name == "geglu" else []
    return Case(name, [a, b, *extra])


generator("swiglu")(lambda d: _glu(d, "swiglu"))
generator("geglu")(lambda d: _glu(d, "geglu"))


@generator("softmax")
def _softmax(d: Draw) -> Case:
    n, dt = d.last(), d.dtype()
    shape = [*d.lead(n), n]
    scale, shift = d.values()
    x = d.maybe_nonfinite(d.tensor(shape, dt, scale=scale, shift=shift, label="x"))
    kwargs: dict = {"scale": d.pick((1.0, 1.0, 0.125, 1 / math.sqrt(n)), "scale")}
    if len(shape) > 1 and d.chance(0.15):
        kwargs["dim"] = d.pick(range(-len(shape), len(shape) - 1), "dim")
    elif d.chance(0.3):
        kwargs["causal"] = True
        d.notes.append("causal")
    if d.chance(0.5):  # an additive mask broadcast over some dims, with -inf entries and rows
        mshape = [s if d.chance(0.5) else 1 for s in shape[:-1]][d.pick(range(len(shape))):] + [n]
        mask = make(mshape, d.pick((dt, torch.float32)), d.rng.randrange(1 << 30))
        mask = torch.where(torch.rand(mshape, generator=torch.Generator().manual_seed(d.rng.randrange(1 << 30)))
                           < d.pick((0.0, 0.2, 0.9)), float("-inf"), mask).to(mask.dtype)
        if mask.dim() > 1 and mask.shape[0] and d.chance(0.3):
            mask[0] = float("-inf")  # a fully masked row: NaN, as eager
            d.notes.append("masked row")
        d.notes.append(f"mask{tuple(mshape)}:{str(mask.dtype)[6:]}")
        kwargs["mask"] = mask
    return Case("softmax", [x], kwargs)


@generator("rope")
def _rope(d: Draw) -> Case:
    dt = d.dtype()
    hd = d.pick((2, 4, 6, 8, 10, 16, 64, 128), "head_dim")
    b, hk = d.pick((1, 2, 3), "batch"), d.pick((1, 2, 3), "heads_k")
    hq = hk * d.pick((1, 1, 2, 4), "group")
    s = d.pick((1, 2, 5, 17, 64), "seq")
    tdt = d.pick((dt, dt, torch.float32), "table_dtype")
    seq_first = d.chance(0.2)

    def head(h: int, label: str) -> torch.Tensor:
        layout = d.pick(("bhsd", "bshd->bhsd", "bhsd-strided"), f"{label}_layout") if not seq_first else "bshd"
        if layout == "bhsd-strided":
            return d.tensor((b, h, s, hd), dt, layout="strided")
        if layout == "bshd->bhsd":  # HF's proj(x).view(B, S, H, D).transpose(1, 2)
            return d.tensor((b, s, h, hd), dt, layout="contiguous").transpose(1, 2)
        return d.tensor((b, s, h, hd) if seq_first else (b, h, s, hd), dt, layout="contiguous")

    q, k = head(hq, "q"), head(hk, "k")
    if seq_first:
        d.notes.append("seq-first")
        tshape = (d.pick((1, b)), s, 1, hd)
    else:
        tshape = d.pick(((s, hd), (b, s, hd), (1, 1, s, hd), (b, 1, s, hd)), "table_shape")
    cos = d.tensor(tshape, tdt, layout="contiguous")
    sin = d.tensor(tshape, tdt, layout="contiguous")
    return Case("rope", [q, k], {"cos": cos, "sin": sin})


def _targets(d: Draw, n: int, vocab: int, ignore_index: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(d.rng.randrange(1 << 30))
    t = torch.randint(0, max(vocab, 1), (n,), generator=gen)
    share = d.pick((0.0, 0.0, 0.3, 1.0), "ignored_share")
    return torch.where(torch.rand(n, generator=gen) < share, torch.full_like(t, ignore_index), t)


def _ce_kwargs(d: Draw) -> dict:
    kwargs = {"reduction": d.pick(("mean", "mean", "sum", "none"), "reduction"),
              "label_smoothing": d.pick((0.0, 0.0, 0.1), "smoothing")}
    if d.chance(0.2):
        kwargs["ignore_index"] = d.pick((0, 3), "ignore_index")
    return kwargs


@generator("cross_entropy")
def _cross_entropy(d: Draw) -> Case:
    dt, vocab = d.dtype(), d.pick((1, 2, 3, 5, 100, 1000, 4099, 32000), "vocab")
    n = d.pick((0, 1, 2, 3, 7, 64), "rows")
    n = min(n, max(1, MAX_NUMEL * 2 // vocab)) if n else 0
    kwargs = _ce_kwargs(d)
    logits = d.maybe_nonfinite(d.tensor((n, vocab), dt, scale=d.pick((1.0, 10.0, 30.0), "logit_scale"),
                                        label="logits"), p=0.05)
    return Case("cross_entropy", [logits, _targets(d, n, vocab, kwargs.get("ignore_index", -100))], kwargs)


@generator("fused_linear_cross_entropy")
def _flce(d: Draw) -> Case:
    dt, vocab, hidden = d.dtype(), d.pick((1, 3, 100, 1000, 4099), "vocab"), d.pick((1, 8, 33, 64), "hidden")
    n = d.pick((0, 1, 2, 7, 64), "rows")
    wdt = d.pick((dt, dt, torch.float32), "weight_dtype")
    kwargs = _ce_kwargs(d)
    kwargs["chunk_size"] = d.pick((None, 1, 3, 7, 64), "chunk")
    x = d.maybe_nonfinite(d.tensor((n, hidden), dt, label="x"), p=0.05)
    w = d.tensor((vocab, hidden), wdt, scale=1 / math.sqrt(hidden), label="w")
    inputs = [x, w, _targets(d, n, vocab, kwargs.get("ignore_index", -100))]
    if d.chance(0.3):
        inputs.append(d.tensor((vocab,), wdt, label="bias"))
    return Case("fused_linear_cross_entropy", inputs, kwargs)

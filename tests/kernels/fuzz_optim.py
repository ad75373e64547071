"""Fuzz cases for the multi-tensor optimizers (AdamW, LAMB), registered into tests.kernels.fuzz.

A case is a short training run: 1-3 param groups, each with its own hyperparameters, over 1-7
parameters (scalars, zero-size, odd, 2-D and 3-D shapes; fp32, bf16, fp16, fp64 and complex64
mixed in one group; contiguous, transposed or non-dense memory), stepped 1-8 times with
gradients that come in their own layouts, are now and then missing (the parameter is skipped
that step, as torch skips it), now and then hold a planted NaN/Inf, and are scaled tiny or large
per step; the lr changes between steps as a scheduler changes it. Every provider of ours runs the
same steps; its parameters and every state tensor after the last step are judged by fuzz.judge
against the same steps in float64, within 2x the error of eager (torch.optim.AdamW(foreach=False);
for LAMB its per-parameter `reference` provider, apex FusedLAMB's semantics written with eager ops)
and of torch.optim.AdamW(fused=True), the alternative a user would pick, where it runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

import kernels
from kernels import optim_common as oc
from kernels.optim_lamb import _reference as lamb_reference
from kernels.optim_lamb import device_grad_divisor
from kernels.registry import KERNELS
from tests.kernels import fuzz
from tests.kernels.fuzz import EAGER_REFUSES, Draw, generator, judge

SHAPES = ((), (1,), (0,), (2,), (7,), (3, 5), (17, 33), (64, 65), (2, 3, 4), (1000,), (4099,), (1, 129))
PARAM_DTYPES = (torch.float32, torch.float32, torch.float32, torch.bfloat16, torch.float16, torch.float64,
                torch.complex64)
GRAD_SCALES = (1.0, 1.0, 1.0, 1e-3, 1e-6, 30.0)
TRUTH_DTYPE = {torch.complex64: torch.complex128}


@dataclass
class OptCase:
    """A run: params (initial values in their dtypes) with layouts, groups of param indices with
    their hyperparameters, and per step the grads (None = no grad that step) with layouts and the
    factor the lr is multiplied by before that step."""
    kernel: str  # "AdamW" or "LAMB"
    params: list[torch.Tensor]
    layouts: list[str]
    groups: list[tuple[list[int], dict]]
    steps: list[list[Optional[tuple[torch.Tensor, str]]]]
    lr_factors: list[float]
    options: dict = field(default_factory=dict)  # constructor arguments for every variant (LAMB's)
    what: str = ""
    factor: float = 2.0

    def check(self) -> list[str]:
        return check_optimizer_case(self)

    def describe(self) -> list[str]:  # the draw's notes name the params
        return []


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A copy of t's values in `layout`: contiguous, transposed (dense, last two dims swapped in
    memory) or strided (every other element of the last dim: not dense). Always a copy: for a
    (1, n) tensor `transpose().contiguous()` is t itself, so the eager run stepped the case's own
    params and every later run started from where it ended (fuzz seed 58013560)."""
    if layout == "transposed":
        return t.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)
    if layout == "strided":
        base = t.new_zeros(*t.shape[:-1], 2 * t.shape[-1])
        base[..., ::2] = t
        return base[..., ::2]
    return t.clone()


def _layout(d: Draw, shape: tuple, options=("contiguous", "contiguous", "transposed", "strided")) -> str:
    layout = d.pick(options)
    if layout == "transposed" and len(shape) < 2 or layout == "strided" and (not shape or 0 in shape):
        return "contiguous"
    return layout


def _values(d: Draw, shape: tuple, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(d.rng.randrange(1 << 30))
    real = torch.float64 if not dtype.is_complex else torch.complex128
    return (scale * torch.randn(shape, generator=gen, dtype=real)).to(dtype)


def _planted(g: torch.Tensor, d: Draw) -> torch.Tensor:
    """g with one element NaN, +Inf or -Inf."""
    g = g.clone()
    g.view(-1)[d.rng.randrange(g.numel())] = d.pick((math.nan, math.inf, -math.inf))
    return g


def _draw_run(d: Draw, kernel: str, group_hparams: Callable[[Draw], dict]) -> OptCase:
    n = d.pick((1, 2, 3, 4, 7))
    shapes = [d.pick(SHAPES) for _ in range(n)]
    dtypes = [d.pick(PARAM_DTYPES) for _ in range(n)]
    if d.chance(0.5):  # one dtype for all, the common case
        dtypes = [dtypes[0]] * n
    params = [_values(d, s, dt) for s, dt in zip(shapes, dtypes)]
    layouts = [_layout(d, s) for s in shapes]
    order = list(range(n))
    d.rng.shuffle(order)
    cuts = sorted(d.rng.sample(range(1, n), min(d.pick((0, 0, 1, 2)), n - 1))) if n > 1 else []
    groups = [(order[a:b], group_hparams(d)) for a, b in zip([0, *cuts], [*cuts, n])]
    steps, lr_factors = [], []
    for _ in range(d.pick((1, 2, 3, 5, 8))):
        scale = d.pick(GRAD_SCALES)
        grads = []
        for p, layout in zip(params, layouts):
            if d.chance(0.1):
                grads.append(None)
                continue
            g = _values(d, tuple(p.shape), p.dtype, scale)
            if g.numel() and d.chance(0.03):
                g = _planted(g, d)
                d.notes.append("nan/inf planted")
            grads.append((g, _layout(d, tuple(p.shape), ("contiguous", "transposed", "same"))))
        steps.append(grads)
        lr_factors.append(d.pick((1.0, 1.0, 1.0, 0.5, 0.0, 2.0)))
    d.notes[:0] = [f"{tuple(s)}:{str(dt)[6:]}:{lay}" for s, dt, lay in zip(shapes, dtypes, layouts)]
    d.notes.append(f"steps={len(steps)}")
    d.notes += [f"group{i}({','.join(map(str, ix))}):{hp}" for i, (ix, hp) in enumerate(groups)]
    return OptCase(kernel, params, layouts, groups, steps, lr_factors)


def _adamw_hparams(d: Draw) -> dict:
    return {"lr": d.pick((1e-3, 1e-2, 0.1, 0.0)),
            "betas": d.pick(((0.9, 0.999), (0.9, 0.99), (0.0, 0.999), (0.5, 0.5), (0.9, 0.0))),
            "eps": d.pick((1e-8, 1e-8, 1e-6, 0.0)),
            "weight_decay": d.pick((1e-2, 0.0, 0.1)),
            "amsgrad": d.chance(0.3), "maximize": d.chance(0.2)}


def _lamb_hparams(d: Draw) -> dict:
    return {"lr": d.pick((1e-3, 1e-2, 0.1)),
            "betas": d.pick(((0.9, 0.999), (0.9, 0.99), (0.0, 0.999), (0.5, 0.5))),
            "eps": d.pick((1e-6, 1e-8, 1e-6)),
            "weight_decay": d.pick((0.01, 0.0, 0.1)),
            "bias_correction": d.chance(0.8), "grad_averaging": d.chance(0.8)}


@generator("AdamW")
def _adamw(d: Draw) -> OptCase:
    return _draw_run(d, "AdamW", _adamw_hparams)


@generator("LAMB")
def _lamb(d: Draw) -> OptCase:
    case = _draw_run(d, "LAMB", _lamb_hparams)
    case.options = {"max_grad_norm": d.pick((1.0, 1.0, None, 1e-3, 1e3), "max_grad_norm"),
                    "adam_w_mode": d.chance(0.8), "use_nvlamb": d.chance(0.2)}
    d.notes.append(f"adam_w_mode={case.options['adam_w_mode']} use_nvlamb={case.options['use_nvlamb']}")
    return case


# ---- running and judging ----------------------------------------------------------------------

def simulate(case: OptCase, make_opt: Callable[..., torch.optim.Optimizer], truth: bool = False,
             contiguous: bool = False):
    """Step make_opt(param_groups) through the case. Returns per parameter the state keys and
    (param, *state tensors in sorted key order), all detached. `truth` runs float64/complex128
    copies of the same (rounded) values; `truth` and `contiguous` ignore the case's layouts."""
    def lift(t: torch.Tensor) -> torch.Tensor:  # a copy: never the case's own tensor
        return t.to(TRUTH_DTYPE.get(t.dtype, torch.float64) if truth else t.dtype, copy=True)

    contiguous = contiguous or truth
    params = [nn.Parameter(lift(p) if contiguous else _laid_out(p, lay)) for p, lay in zip(case.params, case.layouts)]
    groups = [dict(hp, params=[params[i] for i in ix]) for ix, hp in case.groups]
    opt = make_opt(groups, **case.options)
    for grads, lr_factor in zip(case.steps, case.lr_factors):
        for group in opt.param_groups:
            group["lr"] *= lr_factor
        for p, g in zip(params, grads):
            if g is None:
                p.grad = None
            elif contiguous:
                p.grad = lift(g[0])
            else:  # the grad in its own layout ("same": the param's strides)
                p.grad = torch.empty_like(p).copy_(g[0]) if g[1] == "same" else _laid_out(g[0], g[1])
        opt.step()
    out = []
    for p in params:
        st = opt.state.get(p, {})
        out.append((tuple(sorted(st)), (p.detach(), *(st[k].detach() for k in sorted(st)))))
    return out


def _real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its [..., 2] real view, a number with a non-finite part NaN as a whole:
    torch's eager weight decay multiplies the complex param by a real scalar as complex x complex,
    (a + bi)(c + 0i), so a NaN real part turns the imaginary part NaN too, where the fused AdamW
    and ours, stepping the real view, leave it finite (torch.optim says complex params step as
    their real views: we follow that, and judge the spread as one non-finite number)."""
    if not t.is_complex():
        return t
    r = torch.view_as_real(t).clone()
    r[~r.isfinite().all(-1)] = math.nan
    return r


class FusedAdamWWhereItRuns:
    """torch.optim.AdamW(fused=True) over the real params, foreach=False over the complex ones,
    which the fused op refuses. Run on contiguous params and grads only (simulate(contiguous=True)):
    torch 2.13's fused CPU AdamW walks a non-dense param's memory span as if it were contiguous
    (updating the wrong elements, writing between the view's elements) and reads a grad whose
    strides differ from its param's as flat memory (tests/kernels/test_optim_edge_cases.py shows both)."""

    def __init__(self, groups: list[dict], **kw) -> None:
        def split(fused: bool) -> list[dict]:
            return [dict(g, params=[p for p in g["params"] if p.is_complex() != fused]) for g in groups]

        self.parts = [torch.optim.AdamW([g for g in split(f) if g["params"]], fused=f or None,
                                        foreach=False if not f else None, **kw)
                      for f in (True, False) if any(g["params"] for g in split(f))]
        self.param_groups = [g for o in self.parts for g in o.param_groups]

    @property
    def state(self) -> dict:
        return {p: st for o in self.parts for p, st in o.state.items()}

    def step(self) -> None:
        for o in self.parts:
            o.step()


class ReferenceLambRoundedAsOurs(torch.optim.Optimizer):
    """LAMB's reference step (`kernels.optim_lamb._reference`, eager fp32) with two roundings made
    as our providers make them, each as correct as the reference's own, so that this second fp32
    run puts their spread into the error bar where a cancellation amplifies it:
    - the clipping norm summed in fp64 (the reference takes fp32 per-tensor norms). Where clipped
      grads nearly cancel the L2 term, g / clip + wd * p ~ 0, the divisor's last bit moves a step
      by up to 1e-3 relative (seed 644928: 3.6e-4 for ours, 1e-4 for the reference, by luck);
    - in L2 mode, the decay added to the clipped grad exactly and rounded once (ours: wd as hi + lo
      in two fused multiply-adds), where eager rounds wd * p first. In such a cancellation g / clip
      is itself rounded (every fp32 run's error), and eager's second rounding can undo that error
      or double it: seed 39109730, g' = -1.7e-6 out of two 0.025 terms, eager 8e-7 off the truth
      by luck, ours and this run 1.8e-5.
    Params step in their groups as kernels.LAMB steps them (contiguous ones: simulate(contiguous=True))."""

    def __init__(self, params, *, max_grad_norm: Optional[float] = 1.0, adam_w_mode: bool = True,
                 use_nvlamb: bool = False) -> None:
        super().__init__(params, {})
        self.max_grad_norm, self.adam_w_mode, self.use_nvlamb = max_grad_norm, adam_w_mode, use_nvlamb

    @torch.no_grad()
    def step(self) -> None:
        all_buckets = [oc.gather(g, self.state, kernels.LAMB._init_state, "LAMB") for g in self.param_groups]
        grads = [g for buckets in all_buckets for b in buckets.values() for g in b.grads]  # real views
        divisor = device_grad_divisor(grads, self.max_grad_norm) if self.max_grad_norm and grads else 1.0
        for group, buckets in zip(self.param_groups, all_buckets):
            beta1, beta2 = group["betas"]
            for b in buckets.values():
                wd, gs, div, nvlamb = group["weight_decay"], b.grads, divisor, self.use_nvlamb
                if not self.adam_w_mode:  # the L2 term folded into the grads, exactly; the step adds none
                    acc = torch.float64 if b.params[0].dtype == torch.float64 else torch.float32
                    gs = [((g.to(acc) / divisor).double() + wd * p.double()).to(acc) for g, p in zip(gs, b.params)]
                    div, nvlamb, wd = 1.0, nvlamb or wd != 0, 0.0  # trust ratio as the group's own wd asks
                lamb_reference(b.params, gs, [st["exp_avg"] for st in b.states],
                               [st["exp_avg_sq"] for st in b.states], [st["step"] for st in b.states],
                               lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=wd,
                               grad_divisor=div, bias_correction=group["bias_correction"],
                               adam_w_mode=self.adam_w_mode, grad_averaging=group["grad_averaging"],
                               use_nvlamb=nvlamb)
                b.write_back()


def _variants(case: OptCase) -> tuple[Callable, Optional[Callable], dict[str, Callable]]:
    """(eager, baseline or None, {provider: ours}) optimizer factories for the case's kernel."""
    cls = getattr(kernels, case.kernel)
    spec = KERNELS["adamw_step" if case.kernel == "AdamW" else "lamb_step"]
    # AdamW's reference provider is ours, not torch's loop; LAMB's is the eager run
    providers = fuzz.providers_to_judge(spec.providers, ("reference",) if case.kernel == "AdamW" else ())
    ours = {p: (lambda groups, _p=p, **kw: cls(groups, provider=_p, **kw)) for p in providers}
    if case.kernel == "AdamW":
        return ((lambda groups, **kw: torch.optim.AdamW(groups, foreach=False, **kw)), FusedAdamWWhereItRuns, ours)
    return ((lambda groups, **kw: cls(groups, provider="reference", **kw)), ReferenceLambRoundedAsOurs, ours)


def check_optimizer_case(case: OptCase) -> list[str]:
    """Judge every provider of ours on one run: [] when all agree with float64, else one line each.
    For fp16 params torch's fused AdamW stands in for eager: torch's loop computes in fp16, where
    eps=1e-8 is 0 (0/0 once a moment underflows), while fused AdamW and ours compute in fp32 and
    store fp16 (bit for bit the same: test_optim)."""
    make_eager, make_baseline, ours = _variants(case)
    try:
        eager = simulate(case, make_eager)
        truth = simulate(case, make_eager, truth=True)
    except EAGER_REFUSES:
        eager = truth = None
    baseline = (simulate(case, make_baseline, contiguous=True) if make_baseline is not None and eager is not None
                else None)
    eager_of = {"reference": eager}  # our reference provider is torch's loop, fp16 math included
    if baseline is not None and case.kernel == "AdamW":
        eager = [b if p.dtype == torch.float16 else e for p, e, b in zip(case.params, eager, baseline)]
    problems = []
    for provider, make in ours.items():
        try:
            got = simulate(case, make)
        except ValueError as exc:
            if "unavailable" not in str(exc):
                problems.append(f"{provider}: raised ValueError: {str(exc).splitlines()[0][:200]}")
            continue
        except Exception as exc:  # noqa: BLE001 - any raise where eager runs is a finding
            if eager is not None:
                problems.append(f"{provider}: raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        if eager is None:
            problems.append(f"{provider}: ran where eager raises")
            continue
        if provider == "aten":  # torch's own fused op, the baseline: held only to running (as in fuzz.py)
            continue
        fuzz.JUDGED[provider] += 1
        for i, ((keys, o), (ekeys, e), (_, t)) in enumerate(zip(got, eager_of.get(provider, eager), truth)):
            if keys != ekeys:
                problems.append(f"{provider}: param {i}: state keys {keys}, eager's {ekeys}")
                continue
            b = baseline[i][1] if baseline is not None and baseline[i][0] == keys else None
            dtype = _real(case.params[i]).dtype
            # An fp64 param's eager run is the truth's own computation (error 0 by construction), so
            # only atol bounds ours: 4096 ulps (~1e-12), as a LAMB step whose tiny ||update|| makes
            # a large trust ratio carries ours' other summation order to ~20 ulps (seed 701157 with
            # --kernel LAMB); a wrong step is off by 1e-6 or more.
            for p in judge(tuple(map(_real, o)), tuple(map(_real, e)), tuple(map(_real, t)), dtype,
                           tuple(map(_real, b)) if b is not None else None, factor=case.factor,
                           atol_eps=4096.0 if dtype == torch.float64 else 16.0):
                problems.append(f"{provider}: param {i} [{', '.join(('param', *keys))}]: {p}")
    return problems

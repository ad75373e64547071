"""Multi-tensor AdamW vs torch.optim.AdamW and LAMB vs a plain float64 LAMB written here, over
100 steps on awkward shapes (scalar, 1-element, odd, non-contiguous grads, a non-dense param),
with and without weight decay; per-group lr; state_dict round trips; refusals; Triton
interpreted."""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from torch import nn

import kernels
from kernels.optim import LAMB, AdamW, OptimizerError
from tests.kernels.numerics import assert_matches, run_in_triton_interpreter
from tests.kernels.test_optim_edge_cases import NONFINITE_STATE_RUNS

SHAPES = ((), (1,), (7, 3), (1001,), (64, 65), (3, 1, 5))
STEPS = 100


pytestmark = pytest.mark.usefixtures("cpu_provider")


def initial(shapes=SHAPES, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def grad_sequence(shapes=SHAPES, steps: int = STEPS, seed: int = 1, scale: float = 1.0):
    """Per step, float64 grads; the (64, 65) one is produced transposed (non-contiguous)."""
    g = torch.Generator().manual_seed(seed)
    seq = []
    for _ in range(steps):
        grads = []
        for s in shapes:
            if s == (64, 65):
                grads.append(scale * torch.randn((65, 64), generator=g, dtype=torch.float64).t())
            else:
                grads.append(scale * torch.randn(s, generator=g, dtype=torch.float64))
        seq.append(grads)
    return seq


def run(make_opt, params0, seq, dtype, param_layout=None) -> list[torch.Tensor]:
    """Params (as dtype) after stepping `make_opt(params)` through the grad sequence."""
    params = [nn.Parameter(p.to(dtype)) for p in params0]
    if param_layout is not None:
        params = [param_layout(p) for p in params]
    opt = make_opt(params)
    for grads in seq:
        for p, g in zip(params, grads):
            p.grad = g.to(dtype)  # keeps the transposed grad's strides
        opt.step()
    return [p.detach() for p in params]


# ---- AdamW -----------------------------------------------------------------------------------

@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("dtype, provider", [(torch.float32, "cpu"), (torch.float64, "cpu"),
                                             (torch.bfloat16, "cpu"), (torch.float32, "aten")], ids=str)
def test_adamw_matches_torch_over_100_steps(dtype, provider, weight_decay, amsgrad) -> None:
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=weight_decay, amsgrad=amsgrad)
    p0, seq = initial(), grad_sequence()
    ours = run(lambda ps: AdamW(ps, provider=provider, **hp), p0, seq, dtype)
    eager = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq, dtype)
    truth = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq, torch.float64)
    assert_matches(ours, eager, truth, dtype, names=[str(s) for s in SHAPES])
    if dtype != torch.bfloat16:  # same dtype as torch: equal up to a few ulps of its values
        for o, e in zip(ours, eager):
            assert torch.allclose(o, e, rtol=0, atol=64 * torch.finfo(dtype).eps * max(1.0, float(e.abs().max())))


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adamw_fp16_matches_torchs_fused_adamw_bit_for_bit(amsgrad) -> None:
    """fp16 parameters: the update in fp32, the states stored in fp16, as torch.optim.AdamW(fused=
    True) does; torch's per-tensor path computes in fp16, where eps=1e-8 is 0, and small grads
    (exp_avg_sq underflowing to 0) then divide 0 by 0."""
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, amsgrad=amsgrad)
    p0 = initial()
    # contiguous grads: torch 2.13's fused CPU step reads a transposed grad as if laid out as its
    # parameter (0.02 off after one fp32 step, where ours and the for-loop are 2.5e-7 off float64)
    seq = [[g.contiguous() for g in grads] for grads in grad_sequence()]
    ours = run(lambda ps: AdamW(ps, **hp), p0, seq, torch.float16)
    fused = run(lambda ps: torch.optim.AdamW(ps, fused=True, **hp), p0, seq, torch.float16)
    assert all(torch.equal(o, f) for o, f in zip(ours, fused))
    small = grad_sequence(steps=5, scale=1e-4)
    ours = run(lambda ps: AdamW(ps, **hp), p0, small, torch.float16)
    per_tensor = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, small, torch.float16)
    assert all(torch.isfinite(o).all() for o in ours)
    assert not all(torch.isfinite(e).all() for e in per_tensor)


def test_adamw_per_group_lr_maximize_and_mixed_dtypes() -> None:
    p0, seq = initial(), grad_sequence(steps=30)

    def groups(ps):
        return [{"params": ps[:3], "lr": 3e-2, "weight_decay": 0.0},
                {"params": ps[3:], "lr": 1e-3, "weight_decay": 0.2}]

    ours = run(lambda ps: AdamW(groups(ps), maximize=True), p0, seq, torch.float32)
    eager = run(lambda ps: torch.optim.AdamW(groups(ps), maximize=True, foreach=False), p0, seq,
                torch.float32)
    for o, e in zip(ours, eager):
        assert torch.allclose(o, e, rtol=0, atol=1e-5)
    # a group holding fp32 and fp64 params: two buckets, each matches torch
    ps = [nn.Parameter(torch.ones(5)), nn.Parameter(torch.ones(4, dtype=torch.float64))]
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    a, b = AdamW(ps, lr=0.1), torch.optim.AdamW(qs, lr=0.1, foreach=False)
    for _ in range(3):
        for p, q in zip(ps, qs):
            p.grad = torch.full_like(p, 0.5)
            q.grad = torch.full_like(q, 0.5)
        a.step()
        b.step()
    assert all(torch.allclose(p, q) for p, q in zip(ps, qs))
    assert set(a.providers_used().values()) == {"cpu"}


def test_adamw_non_dense_param_uses_reference_and_matches() -> None:
    base = torch.randn(6, 10, dtype=torch.float64)
    p0, seq = [base], [[torch.randn(6, 5, dtype=torch.float64)] for _ in range(20)]

    def holes(p):  # a parameter viewing every other column of a buffer
        return nn.Parameter(torch.empty(6, 10).copy_(p.detach())[:, ::2])

    ours = run(lambda ps: AdamW(ps, lr=1e-2), p0, seq, torch.float32, holes)
    eager = run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), p0, seq, torch.float32, holes)
    assert torch.allclose(ours[0], eager[0], atol=1e-6)


def _round_trip(make_opt, make_other=None):
    """Params after 10 uninterrupted steps vs 5 steps, state_dict -> fresh optimizer, 5 more."""
    p0, seq = initial(), grad_sequence(steps=10)
    straight = run(make_opt, p0, seq, torch.float32)
    params = [nn.Parameter(p.float()) for p in p0]
    opt = make_opt(params)
    for grads in seq[:5]:
        for p, g in zip(params, grads):
            p.grad = g.float()
        opt.step()
    saved = opt.state_dict()
    opt2 = (make_other or make_opt)(params)
    opt2.load_state_dict(saved)
    for grads in seq[5:]:
        for p, g in zip(params, grads):
            p.grad = g.float()
        opt2.step()
    return straight, [p.detach() for p in params]


def test_adamw_state_dict_round_trip_and_torch_interop() -> None:
    straight, resumed = _round_trip(lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.05))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    # our state dict continues in torch.optim.AdamW (same state keys)
    _, in_torch = _round_trip(lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.05),
                              lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05, foreach=False))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(straight, in_torch))


@pytest.mark.parametrize("kwargs", [{"fused": True}, {"foreach": True}, {"foreach": False, "fused": None}])
def test_adamw_takes_a_torch_call_line_unchanged(kwargs) -> None:
    """torch.optim.AdamW's foreach= / fused= are accepted and change nothing (one fused call)."""
    g = torch.Generator().manual_seed(2)
    ps = [nn.Parameter(torch.randn(5, 3, generator=g)), nn.Parameter(torch.randn(4, generator=g))]
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    ours, plain = AdamW(ps, lr=1e-2, **kwargs), AdamW(qs, lr=1e-2)
    for _ in range(3):
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        ours.step()
        plain.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))


@pytest.mark.parametrize("kwargs, message", [
    ({"capturable": True}, "capturable"), ({"differentiable": True}, "differentiable"),
    ({"lr": -1.0}, "learning rate"),
    ({"betas": (0.9, 1.0)}, "betas"), ({"weight_decay": -0.1}, "weight_decay"),
])
def test_adamw_refuses_clearly(kwargs, message) -> None:
    with pytest.raises(OptimizerError, match=message):
        AdamW([nn.Parameter(torch.ones(2))], **kwargs)


def test_optimizers_refuse_sparse_grads_and_lamb_amsgrad() -> None:
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3).to_sparse()
    with pytest.raises(OptimizerError, match="sparse"):
        AdamW([p]).step()
    with pytest.raises(OptimizerError, match="amsgrad"):
        LAMB([nn.Parameter(torch.ones(2))], amsgrad=True)


def _nonfinite_steps(make_opt, steps: int = 3) -> list[torch.Tensor]:
    """A few steps where one tensor's grad holds NaN, +inf and -inf and another's is finite."""
    ps = [nn.Parameter(torch.linspace(-1, 1, 6)), nn.Parameter(torch.ones(4)),
          nn.Parameter(torch.zeros(0))]
    opt = make_opt(ps)
    for step in range(steps):
        ps[0].grad = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.5, -2.0])
        ps[1].grad = torch.full((4,), 0.1 * (step + 1))
        ps[2].grad = torch.zeros(0)
        opt.step()
    return [p.detach() for p in ps]


@pytest.mark.parametrize("opt", ["adamw", "lamb"])
def test_nan_inf_grads_and_empty_params_match_the_reference(opt: str) -> None:
    if opt == "adamw":
        ours = _nonfinite_steps(lambda ps: AdamW(ps, lr=0.1, provider="cpu"))
        theirs = _nonfinite_steps(lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=False))
    else:
        ours = _nonfinite_steps(lambda ps: LAMB(ps, lr=0.1, provider="cpu"))
        theirs = _nonfinite_steps(lambda ps: LAMB(ps, lr=0.1, provider="reference"))
    assert ours[0].isnan().any()  # the non-finite grads did reach the parameter
    for o, t in zip(ours, theirs):
        assert torch.equal(o.isnan(), t.isnan()) and torch.equal(o.isinf(), t.isinf())
        fin = o.isfinite() & t.isfinite()
        torch.testing.assert_close(o[fin], t[fin], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opt", ["adamw", "lamb"])
def test_one_provider_call_per_dtype_bucket(monkeypatch, opt: str) -> None:
    """All parameters of one (device, dtype) are stepped by one multi-tensor call, not a loop."""
    spec = kernels.KERNELS["adamw_step" if opt == "adamw" else "lamb_step"]
    calls: list[int] = []
    real = spec.providers["cpu"]

    def counting(params, *args, **kwargs):
        calls.append(len(params))
        return real(params, *args, **kwargs)

    monkeypatch.setitem(spec.providers, "cpu", counting)
    ps = [nn.Parameter(torch.randn(s)) for s in SHAPES] + [nn.Parameter(torch.randn(3, dtype=torch.float64))]
    o = (AdamW if opt == "adamw" else LAMB)([{"params": ps[:3]}, {"params": ps[3:], "lr": 0.1}],
                                            provider="cpu")
    for _ in range(2):
        for p in ps:
            p.grad = torch.ones_like(p)
        o.step()
    # per step and group: one call for its fp32 tensors (+ one for the fp64 tensor in group 2)
    assert sorted(calls) == sorted([3, len(SHAPES) - 3, 1] * 2)


# ---- LAMB ------------------------------------------------------------------------------------

def lamb_float64(params0, seq, lr, betas, eps, weight_decay, max_grad_norm, use_nvlamb):
    """Plain LAMB (apex FusedLAMB, adam_w_mode, grad averaging, bias correction) in float64."""
    b1, b2 = betas
    ps = [p.clone() for p in params0]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    for step, grads in enumerate(seq, start=1):
        gnorm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
        div = gnorm / max_grad_norm if max_grad_norm and gnorm > max_grad_norm else 1.0
        for i, p in enumerate(ps):
            g = grads[i].double() / div
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            u = (ms[i] / (1 - b1 ** step)) / ((vs[i] / (1 - b2 ** step)).sqrt() + eps) + weight_decay * p
            pn, un = float(p.norm()), float(u.norm())
            ratio = pn / un if (use_nvlamb or weight_decay != 0) and pn > 0 and un > 0 else 1.0
            ps[i] = p - lr * ratio * u
    return ps


@pytest.mark.parametrize("provider", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("weight_decay, max_grad_norm, use_nvlamb",
                         [(0.01, 1.0, False), (0.0, 1.0, False), (0.0, None, True), (0.1, 50.0, True)])
def test_lamb_matches_float64_over_100_steps(weight_decay, max_grad_norm, use_nvlamb, dtype, provider) -> None:
    hp = dict(lr=2e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=weight_decay,
              max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb)
    p0, seq = initial(), grad_sequence(scale=3.0)
    truth = lamb_float64([p.clone() for p in p0], seq, **hp)
    ours = run(lambda ps: LAMB(ps, provider=provider, **hp), p0, seq, dtype)
    # "eager": the same float64 algorithm's inputs rounded to dtype, stepped by plain torch ops in fp32
    eager = run(lambda ps: LAMB(ps, provider="reference", **hp), p0, seq, dtype)
    assert_matches(ours, eager, truth, dtype, factor=2.0, names=[str(s) for s in SHAPES])
    if dtype == torch.float32:  # and close in absolute terms
        for o, t in zip(ours, truth):
            assert torch.allclose(o.double(), t, rtol=1e-4, atol=1e-5)


def test_lamb_clipping_is_global_and_active() -> None:
    p0, seq = initial(), grad_sequence(steps=3, scale=10.0)
    hp = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, use_nvlamb=False)
    clipped = run(lambda ps: LAMB(ps, max_grad_norm=1.0, **hp), p0, seq, torch.float32)
    unclipped = run(lambda ps: LAMB(ps, max_grad_norm=None, **hp), p0, seq, torch.float32)
    assert any(not torch.allclose(a, b) for a, b in zip(clipped, unclipped))
    truth = lamb_float64([p.clone() for p in p0], seq, max_grad_norm=1.0, **hp)
    assert all(torch.allclose(a.double(), t, atol=1e-5) for a, t in zip(clipped, truth))


def test_lamb_zero_norm_cases_have_ratio_one_and_no_nan() -> None:
    zero_p = nn.Parameter(torch.zeros(4))  # ||p|| = 0
    still = nn.Parameter(torch.ones(3))  # zero grad and zero state: ||update|| = wd * ||p|| > 0
    frozen = nn.Parameter(torch.ones(2))
    opt = LAMB([{"params": [zero_p, still]}, {"params": [frozen], "weight_decay": 0.0}], lr=0.1,
               max_grad_norm=None)
    zero_p.grad, still.grad, frozen.grad = torch.ones(4), torch.zeros(3), torch.zeros(2)
    opt.step()
    # zero param: ratio 1, update = 1 / (1 + eps): p = -0.1 / (1 + 1e-6)
    assert torch.allclose(zero_p, torch.full((4,), -0.1 / (1 + 1e-6)))
    # ||p|| = ||wd * p|| / wd: ratio = 1 / wd, step = lr * (1 / wd) * wd * p = lr * p
    assert torch.allclose(still, torch.full((3,), 0.9))
    # no decay, zero grad: update 0, ratio 1, param unchanged, nothing NaN
    assert torch.equal(frozen.detach(), torch.ones(2))


def test_lamb_state_dict_round_trip() -> None:
    straight, resumed = _round_trip(lambda ps: LAMB(ps, lr=1e-2))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


# ---- Triton, interpreted ---------------------------------------------------------------------

_TRITON_SCRIPT = """
import torch
from torch import nn
from kernels.optim import AdamW, LAMB
from tests.kernels.test_optim import initial, grad_sequence, run
shapes = ((), (1,), (7, 3), (1500,), (64, 65))
p0, seq = initial(shapes), grad_sequence(shapes, steps=4)
n = 0
for dtype in (torch.float32, torch.bfloat16):
    for Opt, hp in ((AdamW, dict(lr=1e-2, weight_decay=0.1)), (AdamW, dict(lr=1e-2, amsgrad=True)),
                    (LAMB, dict(lr=1e-2)), (LAMB, dict(lr=1e-2, weight_decay=0.0, use_nvlamb=True))):
        a = run(lambda ps: Opt(ps, provider="triton", **hp), p0, seq, dtype)
        b = run(lambda ps: Opt(ps, provider="cpu", **hp), p0, seq, dtype)  # fp32 math, like triton
        err = max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))
        tol = 4 * torch.finfo(dtype).eps * max(1.0, max(float(y.abs().max()) for y in b))  # 4 ulps
        assert err <= tol, (Opt.__name__, hp, dtype, err)
        n += 1
from tests.kernels.test_optim_edge_cases import NONFINITE_STATE_RUNS, nonfinite_state_run, assert_same_nonfinite_and_close
for ours_fn, ref_fn in NONFINITE_STATE_RUNS.values():  # NaN/Inf in the states as the reference's
    assert_same_nonfinite_and_close(nonfinite_state_run(lambda ps: ours_fn(ps, "triton")), nonfinite_state_run(ref_fn))
    n += 1
print(n)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled Triton is checked at real sizes by test_cuda_*")
def test_triton_optimizers_interpreted() -> None:
    assert int(run_in_triton_interpreter(_TRITON_SCRIPT).strip().splitlines()[-1]) == 8 + len(NONFINITE_STATE_RUNS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_cuda_triton_optimizers_match() -> None:
    from benchmarks.kernels.optim import gpu_checks

    for _, check in gpu_checks("cuda"):
        check()


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_device_grad_divisor_matches_the_host_one(scale: float) -> None:
    """LAMB's clipping divisor computed as a tensor (the GPU path, no host read) equals the host
    one, below, near and above the threshold, over mixed dtypes."""
    from kernels.optim_lamb import device_grad_divisor, global_grad_norm

    g = torch.Generator().manual_seed(9)
    grads = [torch.randn(s, generator=g).mul(scale).to(dt) for s, dt in
             (((7, 3), torch.float32), ((130,), torch.bfloat16), ((), torch.float64), ((5, 5, 2), torch.float16))]
    norm = global_grad_norm(grads)
    for max_norm in (0.5 * norm, norm, 2.0 * norm, 1.0):
        want = norm / max_norm if norm > max_norm else 1.0
        got = device_grad_divisor(grads, max_norm)
        assert got.dim() == 0 and got.dtype == torch.float64
        assert float(got) == pytest.approx(want, rel=1e-6, abs=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
@pytest.mark.parametrize("name", ["LAMB", "AdamW"])
def test_cuda_optimizer_steps_never_synchronize(name: str) -> None:
    """On a GPU a step makes no synchronizing call (torch's sync debug mode raises on one): LAMB
    computes its clipping divisor there; both match the reference provider's parameters."""
    make = {"LAMB": lambda ps, **kw: LAMB(ps, lr=1e-2, max_grad_norm=0.5, **kw),
            "AdamW": lambda ps, **kw: AdamW(ps, lr=1e-2, weight_decay=0.1, **kw)}[name]
    shapes = ((7, 3), (1500,), (64, 65))
    p0, seq = initial(shapes), grad_sequence(shapes, steps=3)
    params = [nn.Parameter(p.float().cuda()) for p in p0]  # fp32: the triton provider's step
    opt = make(params)
    for i, grads in enumerate(seq):
        for p, g in zip(params, grads):
            p.grad = g.float().cuda()
        if i == 0:
            opt.step()  # the first step builds state and tables
            continue
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the reference on the GPU too: on CPU grads LAMB's norm would build the C++ extension here
    want = run(lambda ps: make(ps, provider="reference"), [p.cuda() for p in p0],
               [[g.cuda() for g in grads] for grads in seq], torch.float32)
    for p, w in zip(params, want):
        torch.testing.assert_close(p.detach(), w, rtol=1e-5, atol=1e-6)


_DEFAULT_DEVICE_SCRIPT = """
import torch, kernels
ps = [torch.nn.Parameter(torch.randn(33, 7)), torch.nn.Parameter(torch.randn(5))]
for p in ps:
    p.grad = torch.randn(p.shape)
qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
for q, p in zip(qs, ps):
    q.grad = p.grad.clone()
want = [[t.detach().clone() for t in group] for group in (ps, qs)]
opts = [kernels.AdamW(ps, lr=1e-2, provider="{provider}"), kernels.LAMB(qs, lr=1e-2, provider="{provider}")]
ref = [kernels.AdamW([torch.nn.Parameter(t) for t in want[0]], lr=1e-2, provider="reference"),
       kernels.LAMB([torch.nn.Parameter(t) for t in want[1]], lr=1e-2, provider="reference")]
for o, r in zip(ref, (ps, qs)):
    for p, q in zip(o.param_groups[0]["params"], r):
        p.grad = q.grad.clone()
    o.step()
with torch.device("meta"):  # a default device (as model-building code sets) must not reach the steps
    for o in opts:
        o.step()
for o, group in zip(ref, (ps, qs)):
    for p, q in zip(o.param_groups[0]["params"], group):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
print("ok")
"""


@pytest.mark.parametrize("provider", ["cpu", "triton"])
def test_first_step_under_a_default_device(cpu_provider, provider: str) -> None:
    """Step state and host tables are made on the CPU, not on torch's default device: a first
    step inside `with torch.device(...)` raised before (steps on that device; for triton, its
    host chunk tables too)."""
    code = _DEFAULT_DEVICE_SCRIPT.replace("{provider}", provider)
    if provider == "triton":
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton not installed")
        assert run_in_triton_interpreter(code).strip().splitlines()[-1] == "ok"
    else:
        exec(compile(code, "<default-device>", "exec"), {})


def test_reference_lamb_never_reaches_the_cpp_extension(monkeypatch) -> None:
    """provider="reference" asks for plain PyTorch: its clipping norm no longer probes (and so
    builds) the C++ extension; the divisor agrees with the C++ one within fp32 rounding."""
    from kernels import optim_lamb

    def no_cpp(*_args):
        raise AssertionError("the reference LAMB reached the C++ extension")

    ps = [nn.Parameter(torch.randn(40, 9)), nn.Parameter(torch.randn(13))]
    for p in ps:
        p.grad = torch.randn(p.shape) * 3
    want = float(optim_lamb.device_grad_divisor([p.grad for p in ps], 1.0))
    monkeypatch.setattr(optim_lamb, "provider_unavailable_reason", no_cpp)
    monkeypatch.setattr(optim_lamb, "cpu_ops", no_cpp)
    LAMB(ps, lr=1e-2, provider="reference").step()
    got = float(optim_lamb.device_grad_divisor([p.grad for p in ps], 1.0, cpp=False))
    assert got == pytest.approx(want, rel=1e-6)

"""FLOPs and bytes of the library ops (`torch.ops.fusionlens.*`) as a profiler sees them.

Each op is caught as it runs, under a TorchDispatchMode written here (as the capture's cost pass
sees it), and `kernels.op_cost` of its arguments is checked against a hand count; forward ops
against their KernelSpec's cost too, so the roofline and the advisor count the same numbers.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from kernels.registry import KERNELS, NO_COMPUTE_OPS, OP_COSTS
from tests.kernels.numerics import run_in_triton_interpreter


class Catch(TorchDispatchMode):
    """Every fusionlens:: op run under it: (short name, {argument name: value})."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "fusionlens":
            bound = dict(zip((a.name for a in func._schema.arguments), args))
            bound.update(kwargs)
            self.calls.append((func._schema.name.split("::")[-1], bound))
        return func(*args, **kwargs)


def caught(fn) -> dict[str, list[kernels.registry.Cost]]:
    """op name -> the Cost of each of its calls while fn() runs (allocations left out)."""
    with Catch() as mode:
        fn()
    out: dict[str, list] = {}
    for name, bound in mode.calls:
        if name not in NO_COMPUTE_OPS:
            out.setdefault(name, []).append(kernels.op_cost(name, **bound))
    return out


def test_every_library_op_has_a_cost(cpu_provider) -> None:
    from kernels._build import load_cpu_ops

    load_cpu_ops()
    if importlib.util.find_spec("triton") is not None:
        from kernels import profiled_ops

        profiled_ops.define_ops()
    ops = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("fusionlens::")}
    assert ops, "the extension registered no ops"
    assert ops - set(OP_COSTS) - NO_COMPUTE_OPS == set()
    missing = set(OP_COSTS) - ops
    assert missing <= ({n for n in OP_COSTS if n.startswith("triton_")}
                       if importlib.util.find_spec("triton") is None else set()), missing
    assert kernels.op_cost("fusionlens::no_such_op") is None


def test_activation_ops(cpu_provider) -> None:
    x = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    costs = caught(lambda: kernels.bias_gelu(x, b, approximate="tanh", provider="cpu").sum().backward())
    (fwd,), (bwd,) = costs["act_fwd"], costs["act_bwd"]
    assert fwd.flops == (9 + 1) * 15  # tanh GELU 9 an element, + bias
    assert fwd.bytes_fused == 4 * (15 + 5 + 15)  # x, bias, y
    assert fwd == KERNELS["bias_gelu"].cost(x, b, "tanh")
    assert bwd.flops == (2 * 9 + 1 + 1 + 1) * 15  # derivative, * grad, + bias, grad-bias sum
    assert bwd.bytes_fused == 4 * (15 + 15 + 5 + 15 + 5)  # grad, x, bias; grad_x, grad_bias

    a, g = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    costs = caught(lambda: kernels.swiglu(a, g, provider="cpu").sum().backward())
    (fwd,), (bwd,) = costs["glu_fwd"], costs["glu_bwd"]
    assert fwd == KERNELS["swiglu"].cost(a, g)
    assert (fwd.flops, fwd.bytes_fused) == ((4 + 1) * 24, 4 * 3 * 24)
    assert (bwd.flops, bwd.bytes_fused) == ((3 * 4 + 3) * 24, 4 * 5 * 24)


def test_softmax_ops(cpu_provider) -> None:
    x = torch.randn(2, 3, 7, requires_grad=True)
    costs = caught(lambda: kernels.softmax(x, scale=0.5, causal=True, provider="cpu").sum().backward())
    (fwd,), (bwd,) = costs["softmax_fwd"], costs["softmax_bwd"]
    assert fwd == KERNELS["softmax"].cost(x, -1, 0.5, None, True)
    assert (fwd.flops, fwd.bytes_fused) == (5 * 42, 4 * 2 * 42)
    assert (bwd.flops, bwd.bytes_fused) == ((4 + 1) * 42, 4 * 3 * 42)
    # a padding mask [2, 1, 7] reaches the op as a broadcast view of x: read once, 14 elements
    mask = torch.zeros(2, 1, 7)
    (fwd,) = caught(lambda: kernels.softmax(x.detach(), mask=mask, provider="cpu"))["softmax_fwd"]
    assert (fwd.flops, fwd.bytes_fused) == ((5 + 2) * 42, 4 * (42 + 14 + 42))


def test_cross_entropy_ops(cpu_provider) -> None:
    logits = torch.randn(6, 11, requires_grad=True)
    target = torch.randint(0, 11, (6,))
    costs = caught(lambda: kernels.cross_entropy(logits, target, provider="cpu").backward())
    assert costs["ce_forward"] == [KERNELS["cross_entropy"].cost(logits, target)]
    (fwd,), (bwd,) = costs["ce_forward"], costs["ce_backward"]
    assert (fwd.flops, fwd.bytes_fused) == (4 * 66, 4 * 66 + 6 * (8 + 4 + 8))  # logits; target, loss, lse pair
    assert bwd.flops == 3 * 66
    assert bwd.bytes_fused == 4 * 66 * 2 + 6 * (8 + 8 + 4)  # logits, grad; target, lse pair, grad_rows


def test_rope_op(cpu_provider) -> None:
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    costs = caught(lambda: kernels.rope(q, k, cos, sin, provider="cpu"))
    assert len(costs["rope_apply"]) == 2  # q, then k
    for c in costs["rope_apply"]:
        assert (c.flops, c.bytes_fused) == (3 * 80, 4 * (80 + 40 + 40 + 80))


@pytest.mark.parametrize("rms", [False, True])
def test_norm_training_runs_its_row_ops_where_a_profiler_sees_them(rms, cpu_provider) -> None:
    # norm_train's C++ autograd node calls its row kernels through the dispatcher, so a dispatch
    # mode (the capture's cost pass) sees the forward and the backward with their arguments
    x = torch.randn(4, 10, requires_grad=True)
    r = torch.randn(4, 10, requires_grad=True)
    w = torch.randn(10, requires_grad=True)
    b = torch.randn(10, requires_grad=True)

    def run() -> None:  # both outputs used: the sum's grad reaches the backward as dadd
        s, y = kernels.add_rms_norm(x, r, w, 1e-6, provider="cpu") if rms else \
            kernels.add_layer_norm(x, r, w, b, 1e-5, provider="cpu")
        (s.sum() + y.sum()).backward()

    costs = caught(run)
    kind = "rms" if rms else "layer"
    (fwd,), (bwd,) = costs[f"{kind}_norm_fwd"], costs[f"{kind}_norm_bwd"]
    e = 40
    if rms:  # square, sum, scale; weight; residual add. Bytes: x, r, w, y, sum, rstd
        assert fwd.flops == (4 + 1 + 1) * e
        assert fwd.bytes_fused == 4 * (e + e + 10 + e + e + 4)
        assert bwd.flops == (5 + 4 + 1) * e  # + weight, + the sum's incoming grad
        assert bwd.bytes_fused == 4 * (e + e + 10 + 4 + e + e + 10)  # dy, x, w, rstd, dadd; dx, dw
    else:
        assert fwd.flops == (8 + 1 + 1 + 1) * e
        assert fwd.bytes_fused == 4 * (e + e + 10 + 10 + e + e + 4 + 4)  # + bias, mean
        assert bwd.flops == (9 + 3 + 1 + 1) * e
        assert bwd.bytes_fused == 4 * (e + e + 10 + 4 + 4 + e + e + 10 + 10)
    # forward FLOPs are the KernelSpec's
    spec = KERNELS["add_rms_norm" if rms else "add_layer_norm"]
    assert fwd.flops == (spec.cost(x, r, w) if rms else spec.cost(x, r, w, b)).flops


def test_norm_in_inference_is_one_op(cpu_provider) -> None:
    x, w = torch.randn(3, 16), torch.randn(16)
    with torch.inference_mode():
        costs = caught(lambda: kernels.rms_norm(x, w, 1e-6, provider="cpu"))
    assert list(costs) == ["norm_train"]
    assert costs["norm_train"] == [KERNELS["rms_norm"].cost(x, w)]


def test_optimizer_ops(cpu_provider) -> None:
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = kernels.AdamW(params, lr=1e-3, provider="cpu")
    (step,) = caught(opt.step)["adamw_step_"]
    assert (step.flops, step.bytes_fused) == (16 * 22, 4 * 7 * 22)  # 7 streams an element

    lamb = kernels.LAMB(params, lr=1e-3, max_grad_norm=1.0, provider="cpu")
    costs = caught(lamb.step)
    (step,) = costs["lamb_step_"]
    assert (step.flops, step.bytes_fused) == (24 * 22, 4 * 10 * 22)
    (sumsq,) = costs["multi_sumsq"]
    assert (sumsq.flops, sumsq.bytes_fused) == (2 * 22, 4 * 22 + 8 * 2)


def run_triton_watched(device: str = "cpu") -> str:
    """The Triton provider's entry points become library ops while a dispatch mode or the profiler
    watches, with the same costs as the C++ ops of the same job (on the CPU: TRITON_INTERPRET=1)."""
    from torch.profiler import ProfilerActivity, profile

    from kernels import profiled_ops

    assert not profiled_ops.watched()

    def t(*shape: int, grad: bool = True) -> torch.Tensor:
        return torch.randn(*shape, device=device).requires_grad_(grad)

    x, b, w = t(3, 5), t(5), t(5)
    a, g = t(4, 6), t(4, 6)
    q, k, cos, sin = (t(1, 2, 5, 8, grad=False), t(1, 2, 5, 8, grad=False), t(5, 8, grad=False),
                      t(5, 8, grad=False))
    logits, target = t(6, 11), torch.randint(0, 11, (6,), device=device)

    def run() -> None:
        kernels.bias_gelu(x, b, approximate="tanh", provider="triton").sum().backward()
        kernels.swiglu(a, g, provider="triton").sum().backward()
        kernels.softmax(x, scale=0.5, causal=True, provider="triton").sum().backward()
        kernels.rope(q, k, cos, sin, provider="triton")
        kernels.cross_entropy(logits, target, provider="triton").backward()
        kernels.add_rms_norm(x, x, w, 1e-6, provider="triton")[1].sum().backward()
        kernels.layer_norm(x, w, b, 1e-5, provider="triton").sum().backward()
        kernels.fused_linear_cross_entropy(a, g, target[:4] % 4, chunk_size=2, provider="triton").backward()

    costs = caught(run)
    expected = {"triton_" + n for n in ("act_fwd", "act_bwd", "glu_fwd", "glu_bwd", "softmax_fwd", "softmax_bwd",
                                        "rope_apply", "ce_forward", "ce_backward", "rms_norm_fwd", "rms_norm_bwd",
                                        "layer_norm_fwd", "layer_norm_bwd", "ce_fused_")}
    assert set(costs) == expected, sorted(costs)
    assert costs["triton_act_fwd"] == [KERNELS["bias_gelu"].cost(x, b, "tanh")]
    assert costs["triton_glu_fwd"] == [KERNELS["swiglu"].cost(a, g)]
    assert costs["triton_ce_forward"] == [KERNELS["cross_entropy"].cost(logits, target)]
    assert [(c.flops, c.bytes_fused) for c in costs["triton_rope_apply"]] == [(3 * 80, 4 * 240)] * 2
    assert costs["triton_rms_norm_fwd"][0].flops == (4 + 1 + 1) * 15
    # the linear cross-entropy's chunks: [2, 4] logits each (a [4, 6] @ g [4 classes, 6]^T), fwd+bwd in place
    assert [c.flops for c in costs["triton_ce_fused_"]] == [7 * 2 * 4] * 2
    params = [torch.nn.Parameter(t(5, 3, grad=False)), torch.nn.Parameter(t(7, grad=False))]
    for p in params:
        p.grad = torch.randn_like(p)
    adamw = kernels.AdamW(params, lr=1e-3, provider="triton")
    (step,) = caught(adamw.step)["triton_adamw_step_"]
    assert (step.flops, step.bytes_fused) == (16 * 22, 4 * 7 * 22)
    lamb = kernels.LAMB(params, lr=1e-3, provider="triton")
    (step,) = caught(lamb.step)["triton_lamb_step_"]
    assert (step.flops, step.bytes_fused) == (24 * 22, 4 * 10 * 22)
    adamw.step()  # unwatched: keywords straight to triton_optim
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    names = {e.name for e in prof.events()}
    assert {"fusionlens::" + n for n in expected} <= names, sorted(n for n in names if "fusionlens" in n)
    if device == "cuda":  # each op's Triton kernels are linked to it: what the capture's join reads
        gpu_us = {n: sum(e.device_time_total for e in prof.events() if e.name == "fusionlens::" + n)
                  for n in expected}
        assert all(us > 0 for us in gpu_us.values()), gpu_us
    run()  # and unwatched, straight to the module functions
    return "ok"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_triton_entry_points_are_library_ops_while_watched() -> None:
    assert run_triton_watched("cuda") == "ok"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: the interpreter is not used")
def test_triton_entry_points_are_library_ops_while_watched() -> None:
    out = run_in_triton_interpreter(
        "from tests.kernels.test_op_costs import run_triton_watched\nprint(run_triton_watched())")
    assert out.strip().endswith("ok")

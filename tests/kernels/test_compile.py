"""torch.compile over the public kernels: one graph, our ops in it, eager's numbers.

The first call of a fresh process is the hard case (provider probes, the C++ extension's loading
and every cache run inside tracing), so the main test runs `tests/kernels/compile_first.py` in a
subprocess; the float64-referenced numerics of each kernel are tested elsewhere, here the compiled
result is compared to the eager reference composition.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from tests.kernels.numerics import assert_matches

ROOT = Path(__file__).resolve().parents[2]

# case -> (fusionlens ops its forward graph must call, ops its backward graph must call)
EXPECTED_OPS = {
    "layer_norm": ({"layer_norm_fwd"}, {"layer_norm_bwd"}),
    "rms_norm": ({"rms_norm_fwd"}, {"rms_norm_bwd"}),
    "add_layer_norm": ({"layer_norm_fwd"}, {"layer_norm_bwd"}),
    "add_rms_norm": ({"rms_norm_fwd"}, {"rms_norm_bwd"}),
    "gelu": ({"act_fwd"}, {"act_bwd"}),
    "bias_gelu": ({"act_fwd"}, {"act_bwd"}),
    "swiglu": ({"glu_fwd"}, {"glu_bwd"}),
    "geglu": ({"glu_fwd"}, {"glu_bwd"}),
    "softmax": ({"softmax_fwd"}, {"softmax_bwd"}),
    "rope": ({"rope_apply"}, {"rope_apply"}),
    "cross_entropy": ({"ce_forward"}, {"ce_backward"}),
    "fused_linear_cross_entropy": ({"ce_fused_"}, set()),  # its grads are made in the forward
}


def _first_calls(*args: str, **env: str) -> dict:
    """compile_first's JSON. The provider choice is the users' default, "measure" (the suite runs
    "order"): tracing must take the order without timing anything."""
    run = subprocess.run([sys.executable, "-m", "tests.kernels.compile_first", *args], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), FUSIONLENS_PROVIDER_CHOICE="measure", **env),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def first_calls_compiled() -> dict:
    if kernels.available_providers()["cpu"]:
        pytest.skip(f"cpu provider unavailable: {kernels.available_providers()['cpu']}")
    return _first_calls()


@pytest.fixture(scope="module")
def first_calls_compiled_triton() -> dict:
    """The triton provider on CPU tensors through Triton's interpreter (what the ops do is
    checked elsewhere; here: what the compiler sees)."""
    pytest.importorskip("triton")
    return _first_calls("--provider", "triton", TRITON_INTERPRET="1")


def check_case(got: dict, case: str, prefix: str = "", tol: float = 1e-5) -> None:
    """fullgraph=True: any graph break fails. Our ops are in the forward and backward graphs
    (not a fallback to the reference), and loss and grads (x and the parameters) match eager's
    reference composition."""
    assert got["ok"], got.get("error")
    assert got["compiles"] == {"forward": 1, "backward": 1}, got["compiles"]  # three calls, one compile
    fwd, bwd = EXPECTED_OPS[case]
    assert {prefix + op for op in fwd} <= set(got["ops"]["forward"]), got["ops"]
    assert {prefix + op for op in bwd} <= set(got["ops"]["backward"]), got["ops"]
    assert got["loss_diff"] <= tol * max(1.0, abs(got["loss"]))
    assert got["grad_diff"] <= tol
    assert got["grads"] >= 1


def test_every_case_is_run(first_calls_compiled: dict) -> None:
    assert set(first_calls_compiled) == set(EXPECTED_OPS)


@pytest.mark.parametrize("case", sorted(EXPECTED_OPS))
def test_first_call_compiles_to_one_graph_with_our_ops(first_calls_compiled: dict, case: str) -> None:
    check_case(first_calls_compiled[case], case)


@pytest.mark.parametrize("case", sorted(EXPECTED_OPS))
def test_triton_provider_compiles_to_one_graph_with_its_library_ops(first_calls_compiled_triton: dict,
                                                                     case: str) -> None:
    """Under torch.compile the Triton entry points are the `fusionlens::triton_*` library ops
    (fake kernels, opaque to Dynamo), never traced Python launchers."""
    check_case(first_calls_compiled_triton[case], case, prefix="triton_")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_compiled_linear_cross_entropy_ignored_rows(cpu_provider, reduction: str) -> None:
    """Under compile the mean's count of valid targets stays a tensor (no host sync, no graph
    break): with some and with every target ignored, loss and grads equal eager's (NaN / zeros)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 16, generator=g, requires_grad=True)
    w = torch.randn(40, 16, generator=g, requires_grad=True)
    b = torch.randn(40, generator=g, requires_grad=True)
    fn = torch.compile(lambda x, w, b, t: kernels.fused_linear_cross_entropy(
        x, w, t, bias=b, reduction=reduction, chunk_size=4, provider="cpu") * 3.0,
        fullgraph=True, backend="aot_eager")
    for target in (torch.tensor([1, -100, 5, 39, 0, -100, 7, 7, 2]), torch.full((9,), -100)):
        got = fn(x, w, b, target)
        got_grads = torch.autograd.grad(got, [x, w, b])
        want = kernels.fused_linear_cross_entropy(x, w, target, bias=b, reduction=reduction,
                                                  provider="reference") * 3.0
        want_grads = torch.autograd.grad(want, [x, w, b])
        if math.isnan(want.item()):
            assert math.isnan(got.item())
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        # Grads against float64, within 2x eager's error (a w entry of ~7e-4 is a difference of
        # terms ~1: the baseline copy's order landed 1.06e-6 from eager's there, over an atol of 1e-6).
        leaves64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
        truth = torch.autograd.grad(kernels.fused_linear_cross_entropy(
            leaves64[0], leaves64[1], target, bias=leaves64[2], reduction=reduction, provider="reference") * 3.0,
            leaves64)
        assert_matches(got_grads, [torch.nan_to_num(e) for e in want_grads], [torch.nan_to_num(t) for t in truth],
                       torch.float32)


def test_probe_mark_is_what_torch_sets() -> None:
    """registry marks provider_unavailable_reason by hand (torch.compiler's helper would import
    torch._dynamo with `import kernels`): the mark must be the attribute torch's helper sets."""
    from kernels import registry

    def probe() -> None:
        return None

    torch.compiler.assume_constant_result(probe)
    assert vars(probe) and set(vars(probe)) <= set(vars(registry.provider_unavailable_reason))


def test_compiled_cross_entropy_still_rejects_an_out_of_range_target(cpu_provider) -> None:
    """Under compile the Python range check is skipped (it would break the graph); the C++ op's
    own row check still raises, naming the target."""
    torch._dynamo.reset()
    fn = torch.compile(lambda x, t: kernels.cross_entropy(x, t, provider="cpu"), fullgraph=True,
                       backend="aot_eager")
    x = torch.randn(4, 10)
    assert torch.isfinite(fn(x, torch.tensor([1, 2, -100, 9])))
    with pytest.raises(RuntimeError, match="target 10 at row 3 is out of range"):
        fn(x, torch.tensor([1, 2, -100, 10]))


@pytest.mark.parametrize("name", ["AdamW", "LAMB"])
def test_compiled_optimizer_step_matches_eager(cpu_provider, name: str) -> None:
    """torch.compile(opt.step) gives the parameters the eager step gives, over 5 steps."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    ps = [torch.nn.Parameter(torch.randn(10, 10, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    start = [p.detach().clone() for p in ps]
    compiled, eager = getattr(kernels, name)(ps, lr=1e-2), getattr(kernels, name)(qs, lr=1e-2)
    # one graph each: LAMB's clipping divisor stays a tensor (it read the norm on the host until
    # 2026-12-01, a graph break)
    step = torch.compile(compiled.step, backend="aot_eager", fullgraph=True)
    for i in range(5):
        for p, q in zip(ps, qs):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        step()
        eager.step()
    for p, q, p0 in zip(ps, qs, start):
        assert not torch.equal(p, p0)  # the compiled steps moved the parameters
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_cross_entropy_reductions(cpu_provider, reduction: str, dtype: torch.dtype) -> None:
    """Every reduction and a 16-bit dtype, compiled: loss and logits grad equal eager's (the
    output casts are where torch 2.11's Dynamo once dropped the gradient)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 33, generator=g).to(dtype).requires_grad_()
    target = torch.tensor([0, 32, -100, 5, 5, 17])
    up = torch.rand(6 if reduction == "none" else (), generator=g)
    fn = torch.compile(lambda x, t: kernels.cross_entropy(x, t, reduction=reduction, provider="cpu"),
                       fullgraph=True, backend="aot_eager")
    got = fn(x, target)
    got_grad, = torch.autograd.grad(got, x, up.to(got.dtype))
    want = kernels.cross_entropy(x, target, reduction=reduction, provider="cpu")
    want_grad, = torch.autograd.grad(want, x, up.to(want.dtype))
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
    assert got_grad.abs().sum() > 0


@pytest.mark.parametrize("case", sorted(EXPECTED_OPS))
def test_cuda_triton_provider_under_torch_compile(case: str) -> None:
    """On a GPU (the GPU check): each family with provider="triton" compiles to one graph with
    its library ops and matches the eager reference in loss and grads."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tests.kernels.compile_first import _cases, run_case

    cases, params = _cases("cuda")
    check_case(run_case(cases[case], params, provider="triton", device="cuda"), case, prefix="triton_",
               tol=1e-4)


class _Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> scaled softmax, all but the Linear ours."""

    def __init__(self) -> None:
        super().__init__()
        from kernels.norms import LayerNorm

        self.norm, self.proj = LayerNorm(64), torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.softmax(kernels.gelu(self.proj(self.norm(x))), scale=0.5)


def test_torch_export_keeps_our_ops(cpu_provider) -> None:
    """torch.export: the exported graph calls the C++ ops and its module gives eager's output."""
    torch.manual_seed(0)
    block = _Block()
    exported = torch.export.export(block, (torch.randn(4, 64),))
    called = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"fusionlens.layer_norm_fwd.default", "fusionlens.act_fwd.default",
            "fusionlens.softmax_fwd.default"} <= called, called
    x = torch.randn(4, 64)
    torch.testing.assert_close(exported.module()(x), block(x), rtol=0, atol=0)


_EXPORT_FIRST = """
import json, torch, kernels
from tests.kernels.test_compile import _Block
torch.manual_seed(0)
block = _Block()
exported = torch.export.export(block, (torch.randn(4, 64),))
print(json.dumps(sorted(str(n.target) for n in exported.graph.nodes if "fusionlens" in str(n.target))))
"""


def test_torch_export_as_the_first_call_records_only_compute_ops(cpu_provider) -> None:
    """In a fresh process the export's trace loads the extension: the pool's configuration ran
    under the tracing mode and was recorded as one of the model's ops (until 2026-12-01)."""
    run = subprocess.run([sys.executable, "-c", _EXPORT_FIRST], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stderr[-3000:]
    called = json.loads(run.stdout.strip().splitlines()[-1])
    assert called == ["fusionlens.act_fwd.default", "fusionlens.layer_norm_fwd.default",
                      "fusionlens.softmax_fwd.default"], called


def test_jit_trace_runs_the_order_and_replays(cpu_provider, monkeypatch, tmp_path) -> None:
    """torch.jit.trace: sizes are traced values there, so the provider choice takes the order
    without computing a shape key (it raised AttributeError before). check_trace is off: the
    trace records the autograd path and the check reruns without grad, which takes the no-grad
    path; the traced module replays eager's numbers at another batch size."""
    from kernels import tuning

    monkeypatch.setenv(tuning.ENV_MODE, "measure")  # what users get (the suite runs the order)
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    tuning.forget_decisions()
    try:
        torch.manual_seed(0)
        block = _Block()
        traced = torch.jit.trace(block, (torch.randn(4, 64),), check_trace=False)
        x = torch.randn(7, 64)
        torch.testing.assert_close(traced(x), block(x), rtol=1e-6, atol=1e-7)
    finally:
        tuning.forget_decisions()  # the eager call measured into tmp_path: keep no decision


@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "gelu", "swiglu", "softmax", "cross_entropy"])
def test_dynamic_shapes_compile_once(cpu_provider, case: str) -> None:
    """dynamic=True: four batch sizes, one compile, eager's numbers. (fused_linear_cross_entropy
    is left out: its chunk loop is unrolled, so it specializes on the token count.)"""
    import torch._dynamo.testing

    g = torch.Generator().manual_seed(6)
    w, b = torch.rand(64, generator=g) + 0.5, torch.randn(64, generator=g)
    fns = {
        "layer_norm": lambda x: kernels.layer_norm(x, w, b, 1e-5, provider="cpu"),
        "rms_norm": lambda x: kernels.rms_norm(x, w, 1e-6, provider="cpu"),
        "gelu": lambda x: kernels.gelu(x, provider="cpu"),
        "swiglu": lambda x: kernels.swiglu(x, x.cos(), provider="cpu"),
        "softmax": lambda x: kernels.softmax(x, scale=0.3, provider="cpu"),
        "cross_entropy": lambda x: kernels.cross_entropy(
            x.reshape(-1, 64), torch.zeros(x.shape[0] * x.shape[1], dtype=torch.long), provider="cpu"),
    }
    fn = fns[case]
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda t: fn(t).sin().sum(), fullgraph=True, backend=counter, dynamic=True)
    for batch in (3, 5, 9, 2):
        x = torch.randn(batch, 7, 64, generator=g, requires_grad=True)
        got = compiled(x)
        got_grad, = torch.autograd.grad(got, x)
        x_eager = x.detach().clone().requires_grad_()
        want = fn(x_eager).sin().sum()
        want_grad, = torch.autograd.grad(want, x_eager)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-7)
    assert counter.frame_count == 1


_LARGE = {  # each output is over 4 MiB (the pool's and the huge-page advice's threshold) at [1100, 1024]
    "layer_norm": lambda x, w: kernels.layer_norm(x, w, w * 0.1, 1e-5, provider="cpu"),
    "rms_norm": lambda x, w: kernels.rms_norm(x, w, 1e-6, provider="cpu"),
    "add_rms_norm": lambda x, w: kernels.add_rms_norm(x, x * 0.5, w, 1e-6, provider="cpu")[1],
    "gelu": lambda x, w: kernels.gelu(x, provider="cpu"),
    "bias_gelu": lambda x, w: kernels.bias_gelu(x, w, provider="cpu"),
    "swiglu": lambda x, w: kernels.swiglu(x, x * 0.5, provider="cpu"),
    "softmax": lambda x, w: kernels.softmax(x, scale=0.5, mask=w, provider="cpu"),
    "rope": lambda x, w: kernels.rope(x.view(1, 1, 1100, 1024), (x * 0.5).view(1, 1, 1100, 1024),
                                      torch.ones(1100, 1024), torch.zeros(1100, 1024), provider="cpu")[0],
    "cross_entropy": lambda x, w: kernels.cross_entropy(x, torch.arange(1100) % 1024, reduction="none",
                                                        provider="cpu"),
}


@pytest.mark.parametrize("grad", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("case", sorted(_LARGE))
def test_large_outputs_compile_to_one_graph(cpu_provider, case: str, grad: bool) -> None:
    """Outputs of 4 MiB and more: eager takes them from the pool or advises huge pages, which
    Dynamo cannot trace (`UntypedStorage.nbytes`): fullgraph=True failed at such sizes. Compiled,
    they are plain allocations; eager's numbers either way."""
    g = torch.Generator().manual_seed(8)
    x0, w = torch.randn(1100, 1024, generator=g), torch.rand(1024, generator=g) + 0.5
    fn = _LARGE[case]
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t, w), fullgraph=True, backend="aot_eager")
    x = x0.clone().requires_grad_(grad)
    got = compiled(x)
    want = fn(x0.clone().requires_grad_(grad), w)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if grad:
        got.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


_TWICE = {  # the same tensor passed to two inputs of one kernel
    "swiglu": lambda x: kernels.swiglu(x, x, provider="cpu"),
    "geglu": lambda x: kernels.geglu(x, x, provider="cpu"),
    "add_rms_norm": lambda x: kernels.add_rms_norm(x, x, None, provider="cpu")[1],
    "add_layer_norm": lambda x: kernels.add_layer_norm(x, x, provider="cpu")[1],
    "rope": lambda x: _rope_twice(x.view(1, 1, 6, 8)),
}


def _rope_twice(q: torch.Tensor) -> torch.Tensor:
    return torch.cat(kernels.rope(q, q, torch.ones(6, 8) * 0.6, torch.ones(6, 8) * 0.8, provider="cpu"))


@pytest.mark.parametrize("case", sorted(_TWICE))
def test_same_tensor_twice_compiles_to_one_graph(cpu_provider, case: str) -> None:
    """Dynamo cannot trace an autograd.Function given one tensor twice: swiglu(h, h) broke the
    graph (fullgraph=True raised). The second use is an alias under compile; grads add up."""
    x0 = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    fn = _TWICE[case]
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fn(t), fullgraph=True, backend="aot_eager")
    x, xe = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    got, want = compiled(x), fn(xe)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    (got ** 2).sum().backward()
    (want ** 2).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-5, atol=1e-6)


def _all_families_loss(params: list, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """One loss through every family (the norms on whichever road the fixture picks)."""
    lin_w, lin_b, w, b, vocab = params
    h = torch.nn.functional.linear(x, lin_w, lin_b)
    s, y = kernels.add_rms_norm(h, h.sin(), w)
    z = kernels.layer_norm(y, w, b) + kernels.add_layer_norm(s, y, w, b)[1] + kernels.rms_norm(s, w, offset=1.0)
    z = kernels.swiglu(z, kernels.bias_gelu(z, b, approximate="tanh"))
    angles = torch.arange(8.0)[:, None] * torch.ones(32)  # [seq, head_dim]
    cos, sin = angles.cos(), angles.sin()
    q, k = kernels.rope(z.view(1, 1, 8, 32), z.view(1, 1, 8, 32) * 2, cos, sin)
    z = kernels.softmax((q + k).view(8, 32), scale=0.5, causal=True)
    return kernels.cross_entropy(z * 3, target) + kernels.fused_linear_cross_entropy(z, vocab, target, chunk_size=3)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_autograd_over_an_eager_forward(cpu_provider, norm_road, backend: str) -> None:
    """Compiled autograd traces the backward graph of an eager forward, our nodes in it. The norms'
    C++ node marked its placeholder output non-differentiable, which compiled autograd refuses
    (an internal assert) until 2026-12-01."""
    from torch._dynamo import compiled_autograd

    g = torch.Generator().manual_seed(4)
    params = [torch.randn(32, 16, generator=g) * 0.3, torch.randn(32, generator=g), torch.rand(32, generator=g) + 0.5,
              torch.randn(32, generator=g), torch.randn(11, 32, generator=g) * 0.1]
    params = [p.requires_grad_() for p in params]
    x, target = torch.randn(8, 16, generator=g), torch.tensor([1, 2, 3, -100, 5, 10, 0, 4])
    want = torch.autograd.grad(_all_families_loss(params, x, target), params)
    torch._dynamo.reset()
    with compiled_autograd._enable(torch.compile(backend=backend)):
        got = torch.autograd.grad(_all_families_loss(params, x, target), params)
    torch._dynamo.reset()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

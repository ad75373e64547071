"""The differential fuzzer (tests/kernels/fuzz.py) in `make test`: a few hundred fixed cases, and
proof that its judge fails a wrong result. Long runs: `make fuzz`."""
from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import kernels
from tests.kernels import fuzz
from tests.kernels.numerics import REPO_ROOT, run_in_triton_interpreter


def test_a_fixed_stretch_of_fuzz_cases_passes(cpu_provider) -> None:
    out = fuzz.run(seed=7, cases=400, seconds=600, log=lambda s: None)
    assert out["cases"] == 400 and set(out["per_kernel"]) == set(fuzz.GENERATORS)
    assert not out["failures"], "\n".join(f"--seed {s}: {what}: {p}" for s, what, p in out["failures"])


def test_cases_are_reproducible_from_their_seed() -> None:
    a, b = fuzz.draw_case(12345), fuzz.draw_case(12345)
    assert a.what == b.what
    for x, y in zip(a.inputs, b.inputs):
        assert (x is None and y is None) or not isinstance(x, torch.Tensor) or torch.equal(x, y)
    a, b = fuzz.draw_case(12345, "LAMB"), fuzz.draw_case(12345, "LAMB")
    assert a.what == b.what and all(torch.equal(x, y) for x, y in zip(a.params, b.params))
    assert all((g is None and h is None) or torch.equal(g[0], h[0]) for s, t in zip(a.steps, b.steps)
               for g, h in zip(s, t))


def test_the_judge_measures_bars_only_where_the_other_result_is_finite() -> None:
    """An eager overflow at one position is no error bar for the others (it used to admit
    anything: max error inf); a truth beyond the dtype's range admits +-inf there."""
    truth = (torch.linspace(-3, 3, 50, dtype=torch.float64),)
    eager = truth[0].float().clone()
    eager[7] = float("inf")
    assert fuzz.judge((truth[0].float() + 1e-3,), (eager,), truth, torch.float32)
    assert fuzz.judge((truth[0].float() + 1e-3,), (truth[0].float(),), truth, torch.float32,
                      baseline=(eager,))
    big = (torch.tensor([1.0, 7e4, -1e5], dtype=torch.float64),)  # beyond fp16's 65504
    ours = (torch.tensor([1.0, float("inf"), -65504.0], dtype=torch.float16),)
    assert fuzz.judge(ours, ours, big, torch.float16) == []
    assert fuzz.judge((torch.tensor([float("inf"), 6e4, -6e4], dtype=torch.float16),), ours, big, torch.float16)


def test_the_optimizer_cases_fail_a_wrong_step(monkeypatch) -> None:
    """A cpu AdamW step that drops weight decay is caught; so is one that raises."""
    case = fuzz.draw_case(3, "AdamW")
    case.groups = [(ix, dict(hp, weight_decay=0.1, lr=0.01)) for ix, hp in case.groups]
    assert case.check() == []
    spec = kernels.KERNELS["adamw_step"]
    real = spec.providers["cpu"]
    monkeypatch.setitem(spec.providers, "cpu", lambda *a, **hp: real(*a, **dict(hp, weight_decay=0.0)))
    assert any(p.startswith("cpu: param") for p in case.check())

    def boom(*a, **hp):
        raise RuntimeError("boom")

    monkeypatch.setitem(spec.providers, "cpu", boom)
    assert any("cpu: raised RuntimeError: boom" in p for p in case.check())


def test_lambs_second_reference_run_differs_from_eager_only_where_it_says(cpu_provider) -> None:
    """ReferenceLambRoundedAsOurs is kernels.LAMB(provider="reference") bit for bit without clipping
    in AdamW mode (neither of its two roundings is in play), and in seed 39109730's cancellation
    (L2 mode, g / clip + wd * p = -1.7e-6 out of two 0.025 terms) it lands where the cpu provider
    does, 1.8e-5 off the truth, while eager's two roundings happened to cancel (8e-7): the case
    the bar failed on before that run was added."""
    from tests.kernels import fuzz_optim as fo

    case = fuzz.draw_case(12, "LAMB")
    case.options = dict(case.options, max_grad_norm=None, adam_w_mode=True)
    ref = fo.simulate(case, lambda groups, **kw: kernels.LAMB(groups, provider="reference", **kw), contiguous=True)
    second = fo.simulate(case, fo.ReferenceLambRoundedAsOurs, contiguous=True)
    for (keys, a), (keys2, b) in zip(ref, second):
        assert keys == keys2
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)

    case = fuzz.draw_case(39109730)
    assert case.kernel == "LAMB" and case.check() == []
    make_eager, _, ours = fo._variants(case)
    truth = fo.simulate(case, make_eager, truth=True)[3][1][0]
    err = {name: float((r[3][1][0].double() - truth).abs()[991])
           for name, r in (("eager", fo.simulate(case, make_eager)), ("cpu", fo.simulate(case, ours["cpu"])),
                           ("second", fo.simulate(case, fo.ReferenceLambRoundedAsOurs, contiguous=True)))}
    assert err["eager"] < 1e-6 and err["cpu"] > 1e-5 and err["second"] == pytest.approx(err["cpu"], rel=1e-3)


def test_optimizer_cases_never_step_the_cases_own_tensors() -> None:
    """Every layout is a copy (a (1, n) tensor's transpose().contiguous() is the tensor itself:
    the eager run stepped the case's params, so the truth and ours started from where it ended and
    seed 58013560 failed on exp_avg_sq infs that eager, from the true start, did not have)."""
    from tests.kernels import fuzz_optim as fo

    for shape in ((1, 129), (129, 1), (3, 5)):
        t = torch.randn(shape)
        for layout in ("contiguous", "transposed", "strided"):
            out = fo._laid_out(t, layout)
            assert torch.equal(out, t) and out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    case = fuzz.draw_case(58013560, "LAMB")
    before = [p.clone() for p in case.params]
    assert case.check() == []
    for a, b in zip(before, case.params):
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)


def test_the_judge_fails_wrong_results() -> None:
    """A few ulps off passes; 1e-3 off, a NaN where the truth is finite, or a lost None fails."""
    truth = (torch.linspace(-3, 3, 50, dtype=torch.float64),)
    eager = (truth[0].float(),)
    assert fuzz.judge(eager, eager, truth, torch.float32) == []
    assert fuzz.judge((eager[0] * (1 + 4e-7),), eager, truth, torch.float32) == []
    assert fuzz.judge((eager[0] + 1e-3,), eager, truth, torch.float32)
    bad = eager[0].clone()
    bad[3] = float("nan")
    assert "non-finite" in fuzz.judge((bad,), eager, truth, torch.float32)[0]
    assert "None" in fuzz.judge((None,), eager, truth, torch.float32)[0]


def test_a_provider_that_raises_where_eager_runs_is_reported(monkeypatch) -> None:
    case = fuzz.Case("gelu", [torch.randn(3, 5), "none"])
    import kernels

    real = kernels.gelu

    def broken(*args, provider=None, **kw):
        if provider == "cpu":
            raise RuntimeError("boom")
        return real(*args, provider=provider, **kw)

    monkeypatch.setattr(kernels, "gelu", broken)
    assert any("cpu: raised RuntimeError: boom" in p for p in fuzz.check_case(case))


TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None or torch.cuda.is_available(),
                            reason="needs triton and no GPU (on a GPU the compiled kernels are fuzzed)")


@TRITON
@pytest.mark.parametrize("math", ["rounded", "approximate"])
def test_a_fixed_stretch_of_triton_cases_passes_in_the_interpreter(math: str) -> None:
    """`--provider triton` off a GPU: the Triton kernels judged through the CPU interpreter (with
    its fp32 -> bf16 cast rounding as the GPU's), 100 fixed cases of every kernel; then with the
    fp32 divide, sqrt, exp and log as inexact as sm_90's approximate instructions may be."""
    extra = ["--approximate-math"] if math == "approximate" else []
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.fuzz", "--provider", "triton", "--seed", "50000000",
                           "--cases", "100", *extra], cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                          text=True, capture_output=True, timeout=600)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0 and "100 cases" in last and last.endswith("0 failed"), proc.stdout[-3000:] + proc.stderr[-3000:]
    judged = re.search(r"judged results of (.*) \(", proc.stdout).group(1)
    counts = dict(item.split() for item in judged.split(", "))
    assert set(counts) == {"triton"} and int(counts["triton"]) >= 80, judged  # it ran, interpreted


def test_the_approximate_math_model_moves_only_inexact_normal_results() -> None:
    """What install_approximate_math does to a result: k ulps away from zero unless the hardware
    returns it exactly (2^0 = 1, x / 4); zeros, subnormals, Inf and NaN stay."""
    from tests.kernels.interpreter_rounding import _off_by_ulps

    y = np.array([1.0, 1 / 3, -2 / 3, 0.25, 0.0, 1e-40, np.inf, -np.inf, np.nan, -1e30], dtype=np.float32)
    exact = np.array([True, False, False, True] + [False] * 6)  # zeros ... NaN stay whatever it says
    out = _off_by_ulps(y, exact, 2)
    steps = out.view(np.int32).astype(np.int64) - y.view(np.int32).astype(np.int64)
    assert steps.tolist() == [0, 2, 2, 0, 0, 0, 0, 0, 0, 2]  # the magnitude bits, either sign
    assert abs(out[1]) > abs(y[1]) and abs(out[2]) > abs(y[2]) and abs(out[9]) > abs(y[9])
    assert np.isnan(out[8]) and np.array_equal(_off_by_ulps(y, exact, 0), y, equal_nan=True)


@TRITON
def test_the_interpreter_rounds_fp32_to_bf16_to_nearest_even_once_installed() -> None:
    """Triton's interpreter truncates fp32 -> bf16 (up to 1 ulp off); a GPU rounds to nearest
    even. After install(), a kernel's cast and its bf16 store match torch's conversion bit for bit,
    ties, NaN, infinities and 0-d values included; before it they do not (so the patch is needed)."""
    out = run_in_triton_interpreter(
        "import torch, triton, triton.language as tl\n"
        "from triton.runtime import interpreter\n"
        "@triton.jit\n"
        "def k(X, Y, Z, S, N, BLOCK: tl.constexpr):\n"
        "    c = tl.arange(0, BLOCK)\n"
        "    m = c < N\n"
        "    x = tl.load(X + c, mask=m)\n"
        "    tl.store(Y + c, x, mask=m)\n"  # an implicit cast in the store
        "    tl.store(Z + c, x.to(tl.bfloat16).to(tl.float32), mask=m)\n"
        "    tl.store(S, tl.load(X).to(tl.bfloat16))\n"  # a scalar
        "ties = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 3.0e38, 1e-40])\n"
        "x = torch.cat([torch.randn(2000) * 7, ties, torch.tensor([float('nan'), float('inf'), -float('inf')])])\n"
        "n = x.numel()\n"
        "def run():\n"
        "    y, z, s = torch.empty(n, dtype=torch.bfloat16), torch.empty(n), torch.empty(1, dtype=torch.bfloat16)\n"
        "    k[(1,)](x, y, z, s, n, BLOCK=triton.next_power_of_2(n))\n"
        "    ref = x.to(torch.bfloat16)\n"
        "    return [int((a.view(torch.int16) != ref[:a.numel()].view(torch.int16)).sum()) for a in (y, z.to(torch.bfloat16), s)]\n"
        "print(run())\n"
        "interpreter.InterpreterBuilder.cast_impl = interpreter.InterpreterBuilder.cast_impl.__wrapped__\n"
        "print(run())\n")
    patched, truncating = (ast.literal_eval(line) for line in out.strip().splitlines())
    assert patched == [0, 0, 0]
    assert truncating[0] > 500 and truncating[1] > 500


def test_cases_move_to_a_device_with_their_layouts() -> None:
    """`--device`: a case's tensors keep sizes, strides and storage offsets on the other device (a
    transposed or every-other-element view stays one: Tensor.to would make it contiguous), values
    too; an optimizer run's params and grads move as well."""
    x = torch.arange(24.0).reshape(4, 6)[:, ::2]  # not dense
    t = torch.arange(12.0).reshape(3, 4).t()[1:]  # transposed, offset
    for src in (x, t):
        meta = fuzz.on_device(src, torch.device("meta"))
        assert (meta.device.type, meta.shape, meta.stride(), meta.storage_offset()) == \
            ("meta", src.shape, src.stride(), src.storage_offset())
        same = fuzz.on_device(src, torch.device("cpu", 0))  # another device object: the same path
        assert same.stride() == src.stride() and torch.equal(same, src)
    moved = fuzz.on_device({"a": [x, (t, None)], "b": 3}, torch.device("meta"))
    assert moved["a"][0].is_meta and moved["a"][1][0].is_meta and moved["a"][1][1] is None and moved["b"] == 3
    for seed, kernel in ((5, "layer_norm"), (3, "AdamW")):
        case = fuzz.case_on(fuzz.draw_case(seed, kernel), torch.device("meta"))
        tensors = [v for v in (*getattr(case, "inputs", ()), *getattr(case, "params", ()))
                   if isinstance(v, torch.Tensor)]
        assert tensors and all(v.is_meta for v in tensors)
        if kernel == "AdamW":
            assert all(g is None or g[0].is_meta for step in case.steps for g in step)

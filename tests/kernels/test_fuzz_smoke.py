"""The differential fuzzer (tests/kernels/fuzz.py) in `make test`: a few hundred fixed cases, and
proof that its judge fails a wrong result. Long runs: `make fuzz`."""
from __future__ import annotations

import torch

import kernels
from tests.kernels import fuzz


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

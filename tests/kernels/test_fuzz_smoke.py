"""The differential fuzzer (tests/kernels/fuzz.py) in `make test`: a few hundred fixed cases, and
proof that its judge fails a wrong result. Long runs: `make fuzz`."""
from __future__ import annotations

import torch

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

"""Provider choice by measurement, the rounds of one decision (kernels/tuning.py `measure`): a
far slower provider drops out after round one, a warm-up is never a sample however long, a slow
decision says so on stderr, the order is shuffled every round, and a reference that is no
candidate is never timed. Same set-up as test_tuning.py (tests/kernels/tuning_cases.py)."""
from __future__ import annotations

import json
from collections import Counter

import torch

import kernels
from kernels import tuning
from kernels.registry import KernelSpec, Supports
from tests.kernels.tuning_cases import N, _work, isolated, toy  # noqa: F401  (fixtures)


def test_far_slower_provider_skips_the_later_rounds(toy, monkeypatch) -> None:
    # the reference's calls (400x work, ~8 ms here) are "costly", cpu's and aten's (~20 us) far from
    # it: at 1e-4 a stall inside cpu's round-one sample on this shared 2-core machine (under CI's two
    # workers) made it "far slower" too and dropped it after one round
    monkeypatch.setattr(tuning, "DROP_MIN_S", 1e-3)
    monkeypatch.setattr(tuning, "MAX_ROUNDS", 3)
    monkeypatch.setattr(tuning, "BUDGET_S", 30.0)  # three rounds even if this shared machine stalls
    spec = toy(cpu=1, aten=1, reference=400)
    choice = kernels.provider_choice(spec.name, torch.randn(N))
    assert choice.rounds == 3 and toy.calls["cpu"] >= 4
    assert toy.calls["reference"] == 2  # warm-up and the first round only
    assert "reference" in choice.times_us and "reference" in choice.note
    assert choice.provider in ("cpu", "aten")


def test_a_reference_that_is_no_candidate_is_never_measured_in(toy, isolated) -> None:
    """A fused linear + CE's unfused reference can be faster, but holds the [N, V] logits the
    kernel exists to avoid: with reference_measured=False the measured choice keeps to the
    providers (also over a decision stored before), and the reference runs only when none can."""
    spec = toy(reference_measured=False, cpu=10, aten=20, reference=1)
    choice = kernels.provider_choice(spec.name, torch.randn(N))
    assert choice.provider == "cpu" and set(choice.times_us) == {"cpu", "aten"} and toy.calls["reference"] == 0
    assert "materialises" in choice.skipped["reference"]
    # a stored "reference" decision (from before the flag) is measured again
    tuning.forget_decisions()
    store = isolated / "tuning" / "provider_choice.json"
    data = json.loads(store.read_text())
    for section in data["machines"].values():
        for record in section["decisions"].values():  # a valid record whose winner was the reference
            record["provider"], record["times_us"]["reference"] = "reference", 1.0
    store.write_text(json.dumps(data))
    assert kernels.provider_choice(spec.name, torch.randn(N)).provider == "cpu"
    assert tuning.choose(spec, (torch.randn(N, dtype=torch.float64),), {}).provider == "reference"  # none runs


def test_a_warm_up_is_never_a_sample(monkeypatch) -> None:
    """A first call can be far slower than the next ones (a 4096 x 3072 SwiGLU forward + backward
    on CPU: 765 ms, then 22 ms: fresh pages for its outputs and grads). When every warm-up is long
    the decision still times each candidate once more: judged on the warm-ups alone (as until
    2026-12-02), the unfused reference won and was stored, 8x slower than the kernel."""
    calls: Counter = Counter()

    def provider(name: str, first: int, then: int):
        def run(x: torch.Tensor) -> torch.Tensor:
            calls[name] += 1
            return _work(x, first if calls[name] == 1 else then)
        return run

    # reference 40x cpu's timed work (one sample each: a ~0.2 ms stall under CI's load flipped 4x),
    # and still below cpu's 60x warm-up, so judging the warm-ups alone would pick the reference
    spec = KernelSpec("toy_tuning_first_call", provider("reference", 40, 40), {"cpu": provider("cpu", 60, 1)},
                      Supports(dtypes=(torch.float32,)))
    monkeypatch.setattr(tuning, "SAMPLE_TARGET_S", 1e-9)  # one call per sample, as for long calls
    m = tuning.measure(spec, ["cpu", "reference"], (torch.randn(N),), {}, False, budget_s=0.0)
    assert dict(calls) == {"cpu": 2, "reference": 2} and m.rounds == 1  # warm-up + one timed call each
    assert m.times_us["cpu"] < m.times_us["reference"]
    assert tuning.pick(m.times_us, ("cpu", "reference")) == "cpu"


def test_a_slow_first_measurement_says_what_the_pause_is(toy, monkeypatch, capsys) -> None:
    """Warm-ups over NOTICE_S in all (a big fused linear + CE: seconds per call) print one line on
    stderr naming the kernel; quick decisions print nothing."""
    spec = toy(cpu=1, aten=1, reference=2)
    kernels.provider_choice(spec.name, torch.randn(N))
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(tuning, "NOTICE_S", 0.0)
    kernels.provider_choice(spec.name, torch.randn(4 * N))  # another size class: measured again
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"timing 3 providers of {spec.name} once for this shape class" in err
    assert "s so far" in err
    assert "FUSIONLENS_PROVIDER_CHOICE=order skips measuring" in err
    assert "`python -m kernels decisions` lists them" in err


def test_rounds_shuffle_the_order_so_no_provider_always_follows_the_same_one(monkeypatch) -> None:
    """On CPU whatever runs right after the unfused reference pays the page faults of the memory it
    freed; a fixed rotation would hand that cost to the same provider every round."""
    seq: list[str] = []

    def provider(name: str):
        def run(x: torch.Tensor) -> torch.Tensor:
            seq.append(name)
            return x + 1
        return run

    spec = KernelSpec("toy_tuning_order", provider("reference"), {"cpu": provider("cpu"), "aten": provider("aten")},
                      Supports(dtypes=(torch.float32,)))
    samples: list[int] = []
    real = tuning._sample_s
    monkeypatch.setattr(tuning, "_sample_s", lambda run, *a: (samples.append(len(seq)), real(run, *a))[1])
    monkeypatch.setattr(tuning, "MAX_ROUNDS", 9)
    m = tuning.measure(spec, ["cpu", "aten", "reference"], (torch.randn(8),), {}, False, budget_s=30.0)
    assert m.rounds == 9
    order = [seq[i] for i in samples[3:]]  # the first name of each timed sample (after 3 warm-ups)
    rounds = [order[i:i + 3] for i in range(0, len(order), 3)]
    assert all(sorted(r) == ["aten", "cpu", "reference"] for r in rounds)
    for name in ("cpu", "aten", "reference"):  # its predecessor in the round ("" when first) varies:
        before = Counter(r[r.index(name) - 1] if r.index(name) else "" for r in rounds)
        assert max(before.values()) <= 5, (name, before)  # a fixed rotation gives 6 of 9 (or 9 of 9)
    assert len({r[0] for r in rounds}) == 3


def test_a_fused_linear_ce_decision_times_a_few_of_its_chunks(monkeypatch) -> None:
    """Every token chunk does the same work, so the providers are timed on the first
    MEASURE_CHUNKS chunks at the call's own chunk size (a whole 2048 x 768 -> 32000 call is 5 s on
    one CPU thread, and a decision times each provider twice); the note says so, the decision is
    kept under the full call's key, and the real call still runs on every token."""
    from kernels import linear_cross_entropy as lce

    spec = kernels.KERNELS["fused_linear_cross_entropy"]
    seen: list[tuple[int, int]] = []
    for name in ("cpu", "aten"):
        real = spec.providers[name]

        def spy(x, weight, target, *args, _real=real, **kw):
            seen.append((x.numel() // x.shape[-1], kw.get("chunk_size")))
            return _real(x, weight, target, *args, **kw)
        monkeypatch.setitem(spec.providers, name, spy)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 100, 16, generator=g, requires_grad=True)  # 300 tokens, chunks of 8: 37.5 chunks
    w = torch.randn(40, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 40, (3, 100), generator=g)
    choice = kernels.provider_choice("fused_linear_cross_entropy", x, w, t, chunk_size=8)
    keep = lce.MEASURE_CHUNKS * 8
    assert choice.how == "measured" and set(choice.times_us) == {"cpu", "aten"}
    assert seen and set(seen) == {(keep, 8)}, seen
    assert f"timed on the first {keep} of 300 tokens" in choice.note
    assert kernels.provider_choice("fused_linear_cross_entropy", x, w, t, chunk_size=8).how == "cached"
    seen.clear()
    loss = kernels.fused_linear_cross_entropy(x, w, t, chunk_size=8)
    assert seen == [(300, 8)]
    want = torch.nn.functional.cross_entropy((x.double() @ w.double().T).reshape(-1, 40), t.reshape(-1))
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    # under two chunks' worth of slack the call itself is timed
    seen.clear()
    kernels.provider_choice("fused_linear_cross_entropy", x[:1, :100], w, t[:1, :100], chunk_size=8)
    assert {n for n, _ in seen} == {100}

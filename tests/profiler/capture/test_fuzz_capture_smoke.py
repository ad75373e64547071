"""The capture fuzzer (tests/profiler/capture/fuzz_capture.py) in `make test`: a fixed stretch of
seeds, and proof that its check fails a capture that loses an op. Long runs: `make fuzz-capture`."""
from __future__ import annotations

from profiler.capture import formulas
from tests.profiler.capture import fuzz_capture


def test_a_fixed_stretch_of_seeds_passes():
    out = fuzz_capture.run(seed=1000, cases=24, seconds=600, log=lambda s: None)
    assert out["cases"] == 24
    assert not out["failures"], "\n".join(f"{c.describe()}: {p}" for c, p in out["failures"])


def test_cases_are_reproducible_from_their_seed():
    a, b = fuzz_capture.Case(4242), fuzz_capture.Case(4242)
    assert a.describe() == b.describe()
    (ma, xa), (mb, xb) = a.build(), b.build()
    assert str(ma) == str(mb) and all((p == q).all() for p, q in zip(ma.parameters(), mb.parameters()))


def test_the_check_fails_when_an_op_loses_its_rule(monkeypatch):
    """A model whose loss is BCE (the first such seed from 1000): without its rule the check names the op."""
    case = next(fuzz_capture.Case(s) for s in range(1000, 1200) if fuzz_capture.Case(s).loss == "bce")
    monkeypatch.delitem(formulas.FLOP_FORMULAS, formulas.aten.binary_cross_entropy)
    assert "no FLOP rule for {'aten::binary_cross_entropy'" in fuzz_capture.check(case)

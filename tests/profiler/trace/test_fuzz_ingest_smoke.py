"""The ingestion fuzzer (tests/profiler/trace/fuzz_ingest.py) in `make test`: a fixed stretch of
seeds, and proof that its check fails a loader or an analysis that breaks. Long runs:
`make fuzz-trace`."""
from __future__ import annotations

import warnings

import pytest

from profiler.analysis import load_all
from profiler.analysis.registry import ANALYSES
from tests.profiler.trace import fuzz_ingest


@pytest.fixture(scope="module")
def docs():
    return fuzz_ingest.corpus()


def test_a_fixed_stretch_of_seeds_passes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pandas warns on the absurd numbers the cases plant
        out = fuzz_ingest.run(seed=1000, cases=60, seconds=600, log=lambda s: None)
    assert out["cases"] == 60
    assert not out["failures"], "\n".join(f"{c.describe()}: {p}" for c, p in out["failures"])
    assert out["outcomes"].get("loaded", 0) >= 30  # most cases get past the loader to the analyses


def test_cases_are_reproducible_from_their_seed(docs):
    a, b = fuzz_ingest.draw(4242, docs), fuzz_ingest.draw(4242, docs)
    assert a.describe() == b.describe() and a.payloads == b.payloads


def test_every_mutator_changes_the_document(docs):
    import copy
    import random

    doc = docs["hta_a100_alexnet_benchmark_trace.json.gz"]
    for name, mutate in fuzz_ingest.MUTATORS.items():
        changed = False
        for seed in range(20):
            d = copy.deepcopy(doc)
            mutate(random.Random(seed), d)
            changed |= d != doc
        assert changed, name


def test_the_check_fails_a_loader_that_raises_something_else(docs, monkeypatch):
    import profiler.trace as trace_pkg

    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(trace_pkg, "load_trace", broken)
    outcome, problem = fuzz_ingest.check(fuzz_ingest.draw(1, docs))
    assert outcome == "raised" and problem.startswith("load_trace raised ValueError: boom")


def test_the_check_fails_an_analysis_that_raises(docs, monkeypatch):
    import dataclasses

    load_all()

    def broken(trace, **params):
        raise KeyError("planted")

    monkeypatch.setitem(ANALYSES, "kernel_breakdown", dataclasses.replace(ANALYSES["kernel_breakdown"], fn=broken))
    seed = next(s for s in range(100) if "bytes" not in fuzz_ingest.draw(s, docs).mutations)
    case = fuzz_ingest.draw(seed, docs)
    outcome, problem = fuzz_ingest.check(case)
    if outcome == "refused":  # the mutations made it unreadable: take the unmutated trace
        case.payloads = [fuzz_ingest.json.dumps(docs[case.source]).encode()]
        outcome, problem = fuzz_ingest.check(case)
    assert outcome == "loaded" and problem is not None and "kernel_breakdown" in problem and "planted" in problem


def test_the_saved_folder_check_fails_a_reader_that_raises_something_else(monkeypatch):
    import profiler.capture.artifacts as artifacts
    from profiler.trace import load_trace
    from tests.profiler.trace.conftest import trace_named

    trace = load_trace(trace_named("tracelens_h100_bert_small"))
    assert fuzz_ingest.check_saved_damage(trace, 225) is None  # a seed whose flips pyarrow rejects

    def broken(paths, **kwargs):
        raise KeyError("pandas_type")

    monkeypatch.setattr(artifacts, "load_traces_or_saved", broken)
    problem = fuzz_ingest.check_saved_damage(trace, 225)
    assert problem is not None and problem.startswith("the damaged saved folder raised KeyError")


def test_other_tool_categories_reach_both_outcomes(docs):
    """The other-tool draw (events without a Kineto category) gives refused and loaded cases, both
    within the contract; seed 1042 is one whose refusal quoted a category with a line break (the
    unread labels' printable rule; before it, the message broke over two lines)."""
    outcomes = {}
    for seed in (1042, 1045, 1075, 1125):
        case = fuzz_ingest.draw(seed, docs)
        assert "other_tool_categories" in case.mutations, case.describe()
        outcome, problem = fuzz_ingest.check(case)
        assert problem is None, f"{case.describe()}: {problem}"
        outcomes[seed] = outcome
    assert set(outcomes.values()) == {"loaded", "refused"}, outcomes

"""The benchmark protocol's interleaving: every variant timed every round, in a shuffled order."""
from __future__ import annotations

from collections import Counter

from benchmarks.harness import interleave, round_orders


def test_round_orders_vary_each_variants_neighbour() -> None:
    names = ["naive", "aten", "ours", "ours_prealloc", "compile"]
    orders = round_orders(names, 40)
    assert all(sorted(o) == sorted(names) for o in orders)
    assert orders == round_orders(names, 40)  # seeded: the same in every run
    follows = Counter((o[i - 1], o[i]) for o in orders for i in range(1, len(o)))
    for name in names:  # no variant always comes right after the same one
        before = Counter({a: c for (a, b), c in follows.items() if b == name})
        assert len(before) == len(names) - 1, (name, before)
        assert max(before.values()) < 0.5 * sum(before.values()), (name, before)
    firsts = Counter(o[0] for o in orders)
    assert len(firsts) == len(names)


def test_interleave_runs_each_variant_once_per_round_in_the_shuffled_order() -> None:
    calls: list[str] = []
    variants = {n: (lambda n=n: calls.append(n)) for n in ("a", "b", "c")}
    t = interleave(variants, rounds=6, inner=2, warmup=1)
    assert calls[:3] == ["a", "b", "c"]  # warm-up, in the given order
    timed = calls[3:]
    expected = [n for o in round_orders(["a", "b", "c"], 6) for n in o for _ in range(2)]
    assert timed == expected
    assert all(len(v) == 6 for v in t.wall_s.values()) and all(len(v) == 6 for v in t.cpu_s.values())


def test_settle_opens_each_turn_with_untimed_calls() -> None:
    calls: list[str] = []
    stamps: list[float] = []
    variants = {n: (lambda n=n: calls.append(n)) for n in ("a", "b")}
    interleave(variants, rounds=3, inner=2, warmup=0, settle=1, sync=lambda: stamps.append(len(calls)))
    expected = [n for o in round_orders(["a", "b"], 3) for n in o for _ in range(3)]  # 1 settle + 2 timed
    assert calls == expected
    assert stamps[2:4] == [1, 3]  # (after 2 warm-up syncs) synced after the settle call, then the timed block

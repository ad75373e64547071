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


def test_a_large_results_file_moves_into_its_gzip_archive_and_reads_back_whole(tmp_path) -> None:
    import gzip

    from benchmarks.harness import CSV_COLUMNS, append_rows, archive_path, read_results, rotate

    path = tmp_path / "k.csv"
    row = {"benchmark": "b", "variant": "v", "shape": "s", "metric": "m", "p20": 1.0, "p50": 2.0, "p80": 3.0}
    append_rows(str(path), [dict(row, variant=f"a{i}") for i in range(3)])
    assert not rotate(path, limit=10**6)  # small: stays
    assert rotate(path, limit=10) and not path.exists()
    append_rows(str(path), [dict(row, variant="b0")])
    assert rotate(path, limit=10)  # the second rotation appends rows only, no second header
    append_rows(str(path), [dict(row, variant="c0")])
    text = gzip.open(archive_path(path), "rt").read().splitlines()
    assert text[0] == ",".join(CSV_COLUMNS) and sum(line.startswith("date,") for line in text) == 1
    df = read_results(path)
    assert list(df["variant"]) == ["a0", "a1", "a2", "b0", "c0"]
    assert list(df.columns) == list(CSV_COLUMNS)


def test_read_results_of_a_missing_file_is_one_clear_error(tmp_path) -> None:
    import pytest

    from benchmarks.harness import read_results

    with pytest.raises(FileNotFoundError, match="no k.csv"):
        read_results(tmp_path / "k.csv")

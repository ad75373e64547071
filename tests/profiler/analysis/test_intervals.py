"""Interval algebra against a brute-force truth: integer intervals painted onto a µs grid."""
from __future__ import annotations

import time

import numpy as np
import pytest

from profiler.analysis import intervals as iv

HI = 200


def paint(starts, ends) -> np.ndarray:
    """Bool per integer µs in [0, HI): covered by any [s, e)? (plain Python, the truth)."""
    grid = [False] * HI
    for s, e in zip(starts, ends):
        for t in range(int(s), int(e)):
            grid[t] = True
    return np.array(grid)


def random_set(rng, n):
    s = rng.integers(0, HI - 20, n)
    e = s + rng.integers(-3, 25, n)  # some empty / inverted ones, which must be ignored
    return s.astype(float), np.minimum(e, HI).astype(float)


@pytest.mark.parametrize("seed", range(25))
def test_union_intersection_difference_match_painting(seed):
    rng = np.random.default_rng(seed)
    a_s, a_e = random_set(rng, int(rng.integers(0, 30)))
    b_s, b_e = random_set(rng, int(rng.integers(0, 30)))
    pa, pb = paint(a_s, a_e), paint(b_s, b_e)
    ua, ub = iv.union(a_s, a_e), iv.union(b_s, b_e)
    assert ua.total_us == pa.sum()
    assert np.all(ua.starts[1:] > ua.ends[:-1])  # disjoint, sorted, touching merged
    assert iv.intersection_length(ua, ub) == (pa & pb).sum()
    assert iv.difference(ua, ub).total_us == (pa & ~pb).sum()
    g = iv.gaps(a_s, a_e)
    if len(ua):
        lo, hi = int(ua.starts[0]), int(ua.ends[-1])
        assert g.total_us == (~pa[lo:hi]).sum()
    comp = iv.complement(ua, 10.0, 150.0)
    assert comp.total_us == (~pa[10:150]).sum()


@pytest.mark.parametrize("seed", range(25))
def test_grouped_union_windows_and_containment(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 40))
    s, e = random_set(rng, n)
    g = rng.integers(0, 4, n)
    gu = iv.union_by_group(g, s, e)
    totals = gu.total_by_group()
    for grp in range(4):
        truth = paint(s[g == grp], e[g == grp])
        assert totals.get(grp, 0.0) == truth.sum()
    # Windows per group (including a group with no intervals).
    wg = rng.integers(0, 5, 8)
    ws = rng.integers(0, HI - 1, 8).astype(float)
    we = np.minimum(ws + rng.integers(0, 80, 8), HI).astype(float)
    got = iv.covered_in_windows_by_group(gu, wg, ws, we)
    for k in range(8):
        truth = paint(s[g == wg[k]], e[g == wg[k]])[int(ws[k]):int(we[k])].sum()
        assert got[k] == truth, (k, wg[k], ws[k], we[k])
    # Point containment, at integer and half-integer times.
    qt = rng.integers(0, HI, 20) + rng.choice([0.0, 0.5], 20)
    qg = rng.integers(0, 5, 20)
    inside = iv.contains_by_group(gu, qg, qt)
    for k in range(20):
        truth = paint(s[g == qg[k]], e[g == qg[k]])[int(qt[k])]
        assert inside[k] == truth


def test_gaps_by_group_and_ungrouped_windows():
    gg = iv.gaps_by_group([0, 0, 1, 1, 1], [0, 5, 0, 1, 10], [2, 8, 3, 2, 11])
    assert list(gg.groups) == [0, 1] and list(gg.starts) == [2, 3] and list(gg.ends) == [5, 10]
    u = iv.union([0, 10], [5, 20])
    assert list(iv.covered_in_windows(u, [0, 3, 12, 30], [100, 12, 15, 40])) == [15, 4, 3, 0]


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="differ in shape"):
        iv.union([0, 1], [2])


def test_million_intervals_are_vectorised():
    """A per-interval Python loop would take tens of seconds here; numpy takes well under one."""
    rng = np.random.default_rng(0)
    n = 1_000_000
    s = np.sort(rng.uniform(0, 1e7, n))
    e = s + rng.uniform(0, 20, n)
    g = rng.integers(0, 8, n)
    t0 = time.process_time()
    gu = iv.union_by_group(g, s, e)
    iv.covered_in_windows_by_group(gu, np.arange(8), np.zeros(8), np.full(8, 5e6))
    iv.intersection(iv.union(s[::2], e[::2]), iv.union(s[1::2], e[1::2]))
    assert time.process_time() - t0 < 15.0

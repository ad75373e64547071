"""Vectorised nesting against a plain-Python stack walk and brute-force point lookups."""
from __future__ import annotations

import numpy as np
import pytest

from profiler.analysis import nesting


def laminar(rng: np.random.Generator, t0: float, t1: float, depth: int = 0) -> list[tuple[float, float]]:
    """Random properly nested intervals inside [t0, t1], with zero-length and touching ones."""
    out: list[tuple[float, float]] = []
    if depth > 6 or t1 - t0 < 1:
        return out
    k = int(rng.integers(0, 4))
    pts = np.sort(rng.uniform(t0, t1, 2 * k))
    for a, b in zip(pts[::2], pts[1::2]):
        if rng.random() < 0.15:
            b = a  # zero length
        out.append((a, b))
        out += laminar(rng, a, b, depth + 1)
    if out and rng.random() < 0.3:
        out.append(out[0])  # an exact duplicate (same start and end)
    if len(out) >= 2 and rng.random() < 0.3:
        out.append((out[-1][1], out[-1][1] + 0.5))  # touching the previous end
    return out


def stack_parents(nest: nesting.Nest) -> np.ndarray:
    """Reference: walk scopes in sorted order with a stack (the loop the module avoids)."""
    parent = np.full(len(nest.order), -1)
    stack: list[int] = []
    last_group = None
    for p in range(len(nest.order)):
        if nest.group[p] != last_group:
            stack, last_group = [], nest.group[p]
        while stack and nest.end[stack[-1]] < nest.end[p]:
            stack.pop()
        parent[p] = stack[-1] if stack else -1
        stack.append(p)
    return parent


@pytest.mark.parametrize("seed", range(12))
def test_parents_and_innermost_match_reference(seed):
    rng = np.random.default_rng(seed)
    a = laminar(rng, 0, 1000)
    b = laminar(rng, 0, 1000)
    starts = np.array([x for x, _ in a + b], float)
    ends = np.array([y for _, y in a + b], float)
    group = np.array([3] * len(a) + [1] * len(b))
    nest = nesting.build_nest(group, starts, ends)
    assert np.array_equal(nest.parent, stack_parents(nest))
    # depth = number of ancestors
    for p in range(len(nest.order)):
        d, q = 0, nest.parent[p]
        while q >= 0:
            d, q = d + 1, nest.parent[q]
        assert nest.depth[p] == d
    # innermost scope containing random times (closed intervals), brute force
    t = rng.uniform(-5, 1005, 300)
    g = rng.choice([1, 3, 7], 300)
    got = nesting.innermost(nest, g, t)
    for i in range(len(t)):
        hits = [p for p in range(len(nest.order)) if nest.group[p] == g[i] and nest.start[p] <= t[i] <= nest.end[p]]
        assert got[i] == (hits[-1] if hits else -1)


def test_ancestors_sum_and_propagate():
    # [0,100] > [10,50] > [20,30]; [60,90] sibling of [10,50]
    nest = nesting.build_nest(np.zeros(4), np.array([0, 10, 20, 60.0]), np.array([100, 50, 30, 90.0]))
    pos = nest.position
    leaf = np.array([pos[2], pos[3], pos[1]])  # items at the innermost, the sibling and the middle
    total = nesting.ancestors_sum(nest, leaf, np.array([1.0, 10.0, 100.0]))
    assert total[pos[0]] == 111 and total[pos[1]] == 101 and total[pos[2]] == 1 and total[pos[3]] == 10
    own = np.where(np.isin(np.arange(4), [pos[1]]), np.arange(4), -1)
    near = nesting.propagate_down(nest, own)
    assert near[pos[2]] == pos[1] and near[pos[1]] == pos[1] and near[pos[0]] == -1 and near[pos[3]] == -1


def test_non_laminar_input_still_gives_containing_parents():
    # [0,10] and [5,15] overlap partially (clock rounding); [6,7] lies in both.
    nest = nesting.build_nest(np.zeros(3), np.array([0, 5, 6.0]), np.array([10, 15, 7.0]))
    for p in range(3):
        q = nest.parent[p]
        if q >= 0:
            assert nest.start[q] <= nest.start[p] and nest.end[q] >= nest.end[p]


def test_empty():
    nest = nesting.build_nest(np.zeros(0), np.zeros(0), np.zeros(0))
    assert nest.max_depth == -1
    assert nesting.innermost(nest, np.array([0]), np.array([1.0])).tolist() == [-1]

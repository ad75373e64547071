"""Vectorised interval algebra on half-open [start, end) intervals in µs.

Every time analysis (step breakdown, temporal breakdown, idle time, overlap of communication and
compute) reduces to a few set operations on intervals: union, intersection, covered length, gaps,
and "how much of this union lies inside each window". They are written here once, with numpy
sorts and cumulative reductions only (no Python loop per interval), so a 500 MB trace with
millions of kernels costs a few sorts.

Conventions: intervals are two float64 arrays `(starts, ends)`; zero-length and inverted intervals
are dropped; a union is returned sorted and disjoint (touching intervals are merged). Grouped
variants take an integer array of group codes (e.g. `rank * n_streams + stream`, or pandas
`groupby(...).ngroup()`) and return the group of every output interval.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd


class Intervals(NamedTuple):
    """Sorted, disjoint intervals: `starts[i] < ends[i] <= starts[i+1]`."""

    starts: np.ndarray
    ends: np.ndarray

    @property
    def total_us(self) -> float:
        return float(np.sum(self.ends - self.starts)) if len(self.starts) else 0.0

    def __len__(self) -> int:  # number of intervals
        return len(self.starts)


class GroupedIntervals(NamedTuple):
    """Disjoint intervals per group, sorted by (group, start)."""

    groups: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def total_by_group(self) -> pd.Series:
        """Covered length per group (index: group code)."""
        return pd.Series(self.ends - self.starts, dtype="float64").groupby(self.groups).sum()


def _as_arrays(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in shape: {s.shape} vs {e.shape}")
    keep = e > s  # drops NaN, zero-length and inverted intervals
    return s[keep], e[keep]


def union(starts, ends) -> Intervals:
    """Union of intervals: sorted, disjoint, touching ones merged."""
    s, e = _as_arrays(starts, ends)
    if len(s) == 0:
        return Intervals(s, e)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # furthest end seen so far
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]  # a gap before this interval starts a new run
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return Intervals(s[first], reach[last])


def union_by_group(groups, starts, ends) -> GroupedIntervals:
    """Union of intervals within each group (groups are integer codes)."""
    g = np.asarray(groups, dtype=np.int64)
    s0 = np.asarray(starts, dtype=np.float64)
    e0 = np.asarray(ends, dtype=np.float64)
    keep = e0 > s0
    g, s, e = g[keep], s0[keep], e0[keep]
    if len(s) == 0:
        return GroupedIntervals(g, s, e)
    order = np.lexsort((s, g))
    g, s, e = g[order], s[order], e[order]
    # Running max of ends restarted at each group: groupby-cummax runs in C.
    reach = pd.Series(e).groupby(g, sort=False).cummax().to_numpy()
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return GroupedIntervals(g[first], s[first], reach[last])


def total_length(starts, ends) -> float:
    """Length covered by the union of the intervals (overlaps counted once)."""
    return union(starts, ends).total_us


def intersection(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two unions (each sorted and disjoint, as `union` returns)."""
    if len(a) == 0 or len(b) == 0:
        empty = np.empty(0, dtype=np.float64)
        return Intervals(empty, empty.copy())
    # Depth sweep: +1 at each start, -1 at each end; where depth == 2 both sets cover.
    times = np.concatenate([a.starts, b.starts, a.ends, b.ends])
    delta = np.concatenate([np.ones(len(a) + len(b)), -np.ones(len(a) + len(b))])
    order = np.lexsort((delta, times))  # at equal times, ends (-1) before starts (+1)
    times, delta = times[order], delta[order]
    depth = np.cumsum(delta)
    enter = np.flatnonzero(depth == 2)  # depth reaches 2 only at a start
    s, e = times[enter], times[enter + 1]
    keep = e > s
    return Intervals(s[keep], e[keep])


def intersection_length(a: Intervals, b: Intervals) -> float:
    """Length covered by both unions."""
    return intersection(a, b).total_us


def difference(a: Intervals, b: Intervals) -> Intervals:
    """Parts of union `a` not covered by union `b`."""
    if len(a) == 0 or len(b) == 0:
        return a
    gaps_b = complement(b, float(min(a.starts[0], b.starts[0])), float(max(a.ends[-1], b.ends[-1])))
    return intersection(a, gaps_b)


def complement(u: Intervals, lo: float, hi: float) -> Intervals:
    """Gaps of union `u` inside the window [lo, hi) (the whole window when `u` is empty)."""
    s = np.concatenate([[lo], u.ends])
    e = np.concatenate([u.starts, [hi]])
    s = np.maximum(s, lo)
    e = np.minimum(e, hi)
    keep = e > s
    return Intervals(s[keep], e[keep])


def gaps(starts, ends) -> Intervals:
    """Gaps between the union's intervals, from its first start to its last end."""
    u = union(starts, ends)
    if len(u) < 2:
        empty = np.empty(0, dtype=np.float64)
        return Intervals(empty, empty.copy())
    return Intervals(u.ends[:-1], u.starts[1:])


def gaps_by_group(groups, starts, ends) -> GroupedIntervals:
    """Gaps between consecutive union intervals within each group."""
    u = union_by_group(groups, starts, ends)
    same = u.groups[1:] == u.groups[:-1]
    return GroupedIntervals(u.groups[1:][same], u.ends[:-1][same], u.starts[1:][same])


def covered_upto(u: Intervals, t) -> np.ndarray:
    """For each time in `t`, the length of union `u` that lies before it."""
    t = np.asarray(t, dtype=np.float64)
    if len(u) == 0:
        return np.zeros(t.shape, dtype=np.float64)
    lengths = u.ends - u.starts
    cum = np.concatenate([[0.0], np.cumsum(lengths)])  # covered before interval i
    idx = np.searchsorted(u.starts, t, side="right") - 1  # last interval starting at or before t
    inside = np.clip(t - u.starts[np.maximum(idx, 0)], 0.0, lengths[np.maximum(idx, 0)])
    return np.where(idx >= 0, cum[np.maximum(idx, 0)] + inside, 0.0)


def covered_in_windows(u: Intervals, win_starts, win_ends) -> np.ndarray:
    """Length of union `u` inside each window [win_starts[i], win_ends[i])."""
    ws = np.asarray(win_starts, dtype=np.float64)
    we = np.asarray(win_ends, dtype=np.float64)
    return np.maximum(covered_upto(u, we) - covered_upto(u, ws), 0.0)


def locate_by_group(u: GroupedIntervals, g, t) -> np.ndarray:
    """Per (g, t) query: index of group g's last interval starting at or before t, else -1."""
    g = np.asarray(g, dtype=np.int64)
    t = np.asarray(t, dtype=np.float64)
    n = len(u.starts)
    if n == 0 or len(g) == 0:
        return np.full(len(g), -1, dtype=np.int64)
    # Merge-sort queries among the intervals ordered by (group, start), intervals first at equal
    # (group, time); the number of intervals ahead of a query is its insertion position.
    keys_g = np.concatenate([u.groups, g])
    keys_t = np.concatenate([u.starts, t])
    is_query = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(len(g), dtype=np.int8)])
    order = np.lexsort((is_query, keys_t, keys_g))
    q_sorted = is_query[order] == 1
    intervals_before = np.cumsum(~q_sorted)[q_sorted]
    pos = np.empty(len(g), dtype=np.int64)
    pos[order[q_sorted] - n] = intervals_before
    idx = pos - 1
    same = (idx >= 0) & (u.groups[np.maximum(idx, 0)] == g)
    return np.where(same, idx, -1)


def contains_by_group(u: GroupedIntervals, g, t) -> np.ndarray:
    """Per (g, t) query: does group g's union cover time t?"""
    idx = locate_by_group(u, g, t)
    safe = np.maximum(idx, 0)
    t = np.asarray(t, dtype=np.float64)
    return (idx >= 0) & (t < (u.ends[safe] if len(u.ends) else t))


def _covered_upto_by_group(u: GroupedIntervals, g: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of group g's union before time t, for each (g, t) query."""
    idx = locate_by_group(u, g, t)
    safe = np.maximum(idx, 0)
    lengths = u.ends - u.starts
    cum = np.concatenate([[0.0], np.cumsum(lengths)])  # covered before interval i, all groups
    first_of_group = np.searchsorted(u.groups, g, side="left")
    within = cum[safe] - cum[first_of_group] + np.clip(t - u.starts[safe], 0.0, lengths[safe])
    return np.where(idx >= 0, within, 0.0)


def covered_in_windows_by_group(u: GroupedIntervals, win_groups, win_starts, win_ends) -> np.ndarray:
    """Length of each group's union inside that group's windows (one value per window)."""
    wg = np.asarray(win_groups, dtype=np.int64)
    ws = np.asarray(win_starts, dtype=np.float64)
    we = np.asarray(win_ends, dtype=np.float64)
    if len(u.starts) == 0 or len(wg) == 0:
        return np.zeros(len(wg), dtype=np.float64)
    covered = _covered_upto_by_group(u, wg, we) - _covered_upto_by_group(u, wg, ws)
    return np.maximum(covered, 0.0)

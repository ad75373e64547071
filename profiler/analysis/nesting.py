"""Vectorised nesting of scopes on one thread: parent links, depths and point lookups, no stack.

Scopes recorded on one thread (cpu_op, user_annotation, `nn.Module` python_function) come from
RAII blocks, so per thread they form a laminar family: two scopes are either disjoint or one
contains the other. Sorted by (thread, start asc, end desc), the parent of a scope is the nearest
earlier scope whose end is >= its end. A stack walk finds that in one Python loop per event; here
the depth comes from counting (scopes opened before it minus scopes closed before it, two
`searchsorted`), the parent is the last earlier scope one level up (one `searchsorted` per depth
level), and a vectorised walk up the parent links repairs the rare non-laminar case (clock
rounding). Python loops run per thread or per depth level, never per event.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Nest:
    """Scopes sorted by (group, start, -end); every array is indexed by sorted position.

    order: sorted position -> input row position. parent: sorted position of the innermost
    enclosing scope on the same group, -1 at top level. depth: 0 at top level.
    """

    order: np.ndarray
    group: np.ndarray
    start: np.ndarray
    end: np.ndarray
    parent: np.ndarray
    depth: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.order)
        for name in ("group", "start", "end", "parent", "depth"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Nest.{name} has {len(getattr(self, name))} rows, expected {n}")

    @property
    def position(self) -> np.ndarray:
        """Input row position -> sorted position (the inverse of `order`)."""
        inv = np.empty_like(self.order)
        inv[self.order] = np.arange(len(self.order))
        return inv

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if len(self.depth) else -1


def _group_bounds(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) position of each run of equal values in a sorted array."""
    if len(group) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(np.diff(group)) + 1
    return np.r_[0, cut], np.r_[cut, len(group)]


def _depths(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Depth of each sorted scope = scopes opened before it - scopes that closed before it."""
    depth = np.zeros(len(start), np.int64)
    lo, hi = _group_bounds(group)
    for a, b in zip(lo, hi):  # one iteration per thread
        s, e = start[a:b], end[a:b]
        ends = np.sort(e)
        zero_starts = np.sort(s[e == s])
        positive = e > s
        # A scope of positive length: everything that ended at or before its start is closed,
        # except zero-length scopes sitting exactly at its start (they sort after it).
        closed = np.where(
            positive,
            np.searchsorted(ends, s, "right")
            - (np.searchsorted(zero_starts, s, "right") - np.searchsorted(zero_starts, s, "left")),
            np.searchsorted(ends, s, "left"),
        )
        depth[a:b] = np.maximum(np.arange(b - a) - closed, 0)
    return depth


def _parents(group: np.ndarray, end: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Parent = last earlier scope of the same group one level up; then walk up until it contains."""
    n = len(depth)
    parent = np.full(n, -1, np.int64)
    pos = np.arange(n)
    for d in range(1, int(depth.max()) + 1 if n else 0):  # one iteration per depth level
        here = pos[depth == d]
        above = pos[depth == d - 1]
        if len(here) == 0 or len(above) == 0:
            continue
        k = np.searchsorted(above, here) - 1
        ok = k >= 0
        cand = np.where(ok, above[np.maximum(k, 0)], -1)
        ok &= group[np.maximum(cand, 0)] == group[here]
        parent[here] = np.where(ok, cand, -1)
    # Repair: a candidate that does not contain the scope (non-laminar input) -> its parent.
    bad = np.flatnonzero((parent >= 0) & (end[np.maximum(parent, 0)] < end))
    while len(bad):
        parent[bad] = parent[parent[bad]]
        keep = parent[bad] >= 0
        bad = bad[keep]
        bad = bad[end[parent[bad]] < end[bad]]
    return parent


def build_nest(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> Nest:
    """Nest scopes given per-row group codes (e.g. thread), start and end (µs)."""
    group = np.asarray(group, np.int64)
    start = np.asarray(start, np.float64)
    end = np.asarray(end, np.float64)
    order = np.lexsort((np.arange(len(start)), -end, start, group))
    g, s, e = group[order], start[order], end[order]
    depth = _depths(g, s, e)
    parent = _parents(g, e, depth)
    # Depth after repair: recount along the (now valid) parent links, level by level.
    fixed = np.zeros(len(order), np.int64)
    cur = parent.copy()
    while True:
        live = cur >= 0
        if not live.any():
            break
        fixed[live] += 1
        cur[live] = parent[cur[live]]
    return Nest(order=order, group=g, start=s, end=e, parent=parent, depth=fixed)


def innermost(nest: Nest, group: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Sorted position of the innermost scope of `group` containing time `t` (closed), else -1."""
    group = np.asarray(group, np.int64)
    t = np.asarray(t, np.float64)
    out = np.full(len(t), -1, np.int64)
    if len(nest.order) == 0 or len(t) == 0:
        return out
    glo, ghi = _group_bounds(nest.group)
    gval = nest.group[glo]
    gi = np.searchsorted(gval, group)
    known = (gi < len(gval)) & (gval[np.minimum(gi, len(gval) - 1)] == group)
    qs = np.flatnonzero(known)
    qs = qs[np.argsort(gi[qs], kind="stable")]  # queries grouped by thread
    cuts = np.searchsorted(gi[qs], np.arange(len(gval) + 1))
    for k in range(len(gval)):  # one iteration per thread
        q = qs[cuts[k]:cuts[k + 1]]
        if len(q) == 0:
            continue
        a, b = glo[k], ghi[k]
        idx = np.searchsorted(nest.start[a:b], t[q], "right") - 1
        out[q] = np.where(idx >= 0, idx + a, -1)
    # Walk up until the scope contains t (bounded by the depth).
    walk = np.flatnonzero(out >= 0)
    walk = walk[nest.end[out[walk]] < t[walk]]
    while len(walk):
        out[walk] = nest.parent[out[walk]]
        walk = walk[out[walk] >= 0]
        walk = walk[nest.end[out[walk]] < t[walk]]
    return out


def propagate_down(nest: Nest, own: np.ndarray) -> np.ndarray:
    """For each scope, `own` of itself when >= 0, else the value of its nearest ancestor (-1 if none).

    `own` is indexed by sorted position. Used for "nearest enclosing op / module" links.
    """
    out = np.asarray(own, np.int64).copy()
    for d in range(1, nest.max_depth + 1):  # parents are resolved before children
        here = np.flatnonzero((nest.depth == d) & (out < 0))
        out[here] = out[nest.parent[here]]
    return out


def ancestors_sum(nest: Nest, leaf: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per scope: sum of `weight` over items whose leaf scope is it or one of its descendants."""
    total = np.zeros(len(nest.order), np.float64)
    cur = np.asarray(leaf, np.int64).copy()
    w = np.asarray(weight, np.float64)
    live = cur >= 0
    cur, w = cur[live], w[live]
    while len(cur):  # one round per depth level
        total += np.bincount(cur, weights=w, minlength=len(total))
        cur = nest.parent[cur]
        keep = cur >= 0
        cur, w = cur[keep], w[keep]
    return total

"""Join the untimed op-cost pass to the profiled trace: FLOPs and bytes onto cpu_op and GPU rows.

The recorder (flops.py) sees each aten op below autograd, in execution order; the profiler shows
those same ops as cpu_op rows, plus composites above them (aten::linear) and ops nested inside
them (aten::addmm -> aten::copy_). Per rank and profiled step, the recorded sequence (one
recorded step, the same program every step) is matched greedily in order:

- candidates are the profiled cpu_ops (by start time, parents first) whose name the recorder
  saw, skipping those nested inside an earlier candidate on the same thread (an inner
  aten::copy_ of aten::_to_copy is part of it, never a recorded copy_ of its own) and composites
  that wrap another overload of their own op beside other recorded ops (aten::where with a
  scalar: its scalar_tensor and where are the candidates, as the recorder sees them);
- candidates and recorded ops are aligned in order by name (`align`: walk together, resynchronise
  after a mismatch at the smallest skip that agrees for a few names), so an op present on one
  side only is one miss, never a shift of everything after it; an in-place and an out-of-place
  form align (`canonical`), and so do new_zeros and zeros, index_put and _index_put_impl_,
  max_pool1d and the max_pool2d_with_indices it runs as under the recorder;
- a recorded op left unmatched whose neighbour matched an op that nests one of its name (the
  clone an in-place op's autograd kernel makes, which the recorder sees beside it) is matched to
  that nested row (`nested_matches`);
- views and aliases (aten::t, view, detach, ...) cost 0 by definition: they are not matched (the
  recorder sees detaches autograd makes for saved tensors that the profiler does not show) and
  every profiled op of a recorded view name gets 0 FLOPs and 0 bytes.

Matched ops without recorded shapes (record_shapes off, the default) get `input_dims` and
`input_types` from the cost pass, in Kineto's format, and every matched op its `module`: the
innermost nn.Module (qualified name) whose forward or backward ran it in the cost pass.

GPU rows (kernel, gpu_memcpy, gpu_memset) get the cost and module of the matched op that launched
them: their External id names the innermost launching cpu_op, and the matched op containing it on
the same thread is found by interval. One op with several GPU rows splits its FLOPs and bytes over
them in proportion to their duration. Bytes are an algorithmic lower bound (inputs + outputs,
views 0).

Mismatches are never guessed at: `JoinStats` counts matched and unmatched ops (with the most
common unmatched names) and goes into `Trace.meta["capture"]["join"]`.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

GPU_COST_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
WINDOW = 64  # how far (ops, each side) a resynchronisation after a mismatch may skip
RUN = 3  # names that must agree after a resynchronisation
_STEP_RE = re.compile(r"ProfilerStep#(\d+)")


@dataclass(frozen=True)
class JoinStats:
    """How well the cost pass matched the profile (per Trace; summed over ranks and steps)."""

    steps: int = 0
    recorded_ops: int = 0
    matched_ops: int = 0
    unmatched_recorded: int = 0
    unmatched_names: dict = field(default_factory=dict)  # name -> count (top 10)
    gpu_rows_with_cost: int = 0
    gpu_rows_without_cost: int = 0

    @property
    def match_rate(self) -> float:
        return self.matched_ops / self.recorded_ops if self.recorded_ops else float("nan")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["match_rate"] = self.match_rate
        d["note"] = "bytes_moved is an algorithmic lower bound (inputs + outputs, views excluded)"
        return d


def _steps_of(events: pd.DataFrame, ops: pd.DataFrame) -> pd.Series:
    """The step of each op row: the `step` column, else containment in a ProfilerStep#N row."""
    step = ops["step"].astype("Int64")
    if step.notna().all():
        return step
    marks = events[events["name"].astype(str).str.startswith("ProfilerStep#")]
    for _, m in marks.iterrows():
        n = int(_STEP_RE.match(str(m["name"])).group(1))
        inside = (ops["rank"] == m["rank"]) & (ops["ts_us"] >= m["ts_us"]) & (ops["ts_us"] < m["ts_us"] + m["dur_us"])
        step = step.mask(step.isna() & inside, n)
    return step


# Ops that do the same work under two names: a composite picks the other one under a dispatch mode
# (which makes every tensor "subclass-like": topk's backward zeros its gradient with new_zeros
# there, indexing's backward calls index_put where the real run's _unsafe_index_put shows as
# _index_put_impl_, max_pool1d in inference takes its with-indices 2-D path). Keys and values as
# `canonical` leaves them (in-place underscore dropped).
SAME_WORK = {"aten::new_zeros": "aten::zeros", "aten::new_ones": "aten::ones", "aten::new_full": "aten::full",
             "aten::_index_put_impl": "aten::index_put", "aten::_unsafe_index_put": "aten::index_put",
             "aten::max_pool1d": "aten::max_pool2d_with_indices"}  # 1-D pooling on an unsqueezed input


def canonical(name: str) -> str:
    """In-place and out-of-place forms align (aten::add_ ~ aten::add): autograd accumulates
    gradients in place in a real run but out of place under a dispatch mode; both move the same
    bytes and do the same FLOPs. So do the pairs in SAME_WORK."""
    name = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    return SAME_WORK.get(name, name)


def _allocates(name: str) -> bool:
    """An allocation: what a functional op wrapping its own out= overload makes first
    (aten::soft_margin_loss -> aten::empty, aten::soft_margin_loss.out)."""
    return name.split("::")[-1].startswith(("empty", "new_empty", "resize"))


def same_name_wrappers(names: list[str], ts: np.ndarray, end: np.ndarray, tid: np.ndarray,
                       wanted: set[str]) -> set[int]:
    """Rows that run another overload of their own op beside other recorded ops, as direct
    children on the same thread: a composite the recorder sees decomposed (aten::where with a
    scalar makes an aten::scalar_tensor and calls aten::where.self). A row whose only recorded
    children are its own name and allocations (aten::arange calling arange.start_out, a
    functional op allocating its output for its out= overload) is an op the recorder sees whole.
    Rows sorted by start."""
    stacks: dict[int, list[int]] = {}
    same: set[int] = set()
    other: set[int] = set()
    for j, name in enumerate(names):
        stack = stacks.setdefault(tid[j], [])
        while stack and end[stack[-1]] <= ts[j]:
            stack.pop()
        if stack and end[j] <= end[stack[-1]]:
            parent = stack[-1]
            if names[parent] == name:
                same.add(parent)
            elif name in wanted and not _allocates(name):
                other.add(parent)
        stack.append(j)
    return same & other


def candidates(names: list[str], ts: np.ndarray, end: np.ndarray, tid: np.ndarray, wanted: set[str]) -> list[int]:
    """Positions of profiled ops the recorder can have seen: a recorded name, not nested in another.

    Rows are sorted by start (parents first). A row nested inside an earlier candidate on the same
    thread is an implementation detail of it (aten::copy_ inside aten::_to_copy) and is skipped.
    A same-name wrapper is no candidate itself: the recorder sees what it runs (below autograd, a
    composite arrives decomposed), so its children are (aten::where's scalar_tensor and where).
    """
    wrappers = same_name_wrappers(names, ts, end, tid, wanted)
    open_until: dict[int, float] = {}
    out: list[int] = []
    for j, name in enumerate(names):
        if name not in wanted or j in wrappers or ts[j] < open_until.get(tid[j], -np.inf):
            continue
        out.append(j)
        open_until[tid[j]] = end[j]
    return out


def _agrees(a: list[str], b: list[str], i: int, j: int, run: int) -> bool:
    n = min(run, len(a) - i, len(b) - j)
    return n > 0 and all(a[i + t] == b[j + t] for t in range(n))


def align(a: list[str], b: list[str], window: int = WINDOW, run: int = RUN) -> list[tuple[int, int]]:
    """In-order matching pairs (i, j) with a[i] == b[j]: walk both lists together; at a mismatch,
    resynchronise at the smallest skip (di + dj, each <= `window`) after which `run` names agree.
    Linear in the common case (the same program on both sides), robust to periodic sequences
    (repeated layers), where a longest-common-block diff aligns whole layers one period off."""
    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        skip = next(((di, total - di) for total in range(1, 2 * window + 1)
                     for di in range(max(0, total - window), min(total, window) + 1)
                     if _agrees(a, b, i + di, j + total - di, run)), None)
        if skip is None:  # nothing agrees nearby: this recorded op has no counterpart
            j += 1
        else:
            i, j = i + skip[0], j + skip[1]
    return pairs


def match_sequence(names: list[str], ts: np.ndarray, end: np.ndarray, tid: np.ndarray,
                   recorded: list[str]) -> tuple[list[int], list[int], Counter]:
    """Align `recorded` names with the candidate profiled ops (sorted by start) in order.

    Returns (profiled positions, recorded positions) of the matches and a Counter of unmatched
    recorded names. An op present on one side only costs one miss and never shifts the rest.
    """
    names = [canonical(n) for n in names]
    wanted = [canonical(n) for n in recorded]
    cand = candidates(names, ts, end, tid, set(wanted))
    pairs = align([names[k] for k in cand], wanted)
    matched = {r: cand[p] for p, r in pairs}
    matched.update(nested_matches(names, ts, end, tid, wanted, matched))
    rec_idx = sorted(matched)
    prof_idx = [matched[r] for r in rec_idx]
    missing = Counter(n for r, n in enumerate(recorded) if r not in matched)
    return prof_idx, rec_idx, missing


def nested_matches(names: list[str], ts: np.ndarray, end: np.ndarray, tid: np.ndarray, wanted: list[str],
                   matched: dict[int, int]) -> dict[int, int]:
    """{recorded position: profiled row} for recorded ops left unmatched whose counterpart the
    profile nests inside the op matched to a recorded neighbour: an in-place op's autograd kernel
    clones a tensor saved for backward before it runs (GRU cells: `aten::mul_` holds the
    `aten::clone` the recorder sees just before it). Same name, inside that op's span, unused."""
    used = set(matched.values())
    found: dict[int, int] = {}
    for r, name in enumerate(wanted):
        if r in matched:
            continue
        for neighbour in (r + 1, r - 1):
            host = matched.get(neighbour)
            if host is None:
                continue
            inside = next((j for j in range(host + 1, len(names))
                           if ts[j] >= end[host] or (tid[j] == tid[host] and names[j] == name and j not in used)), None)
            if inside is not None and ts[inside] < end[host]:
                found[r] = inside
                used.add(inside)
                break
    return found


def _gpu_costs(events: pd.DataFrame, flops: np.ndarray, bytes_: np.ndarray, matched: np.ndarray,
               modules: np.ndarray) -> tuple[int, int]:
    """Give GPU rows the cost of their launching matched op, split by duration, and its module.
    Mutates the arrays."""
    gpu = np.flatnonzero(events["kind"].isin(GPU_COST_KINDS).to_numpy() & events["external_id"].notna().to_numpy())
    if not len(gpu):
        return 0, 0
    cpu = events[(events["kind"] == "cpu_op") & events["external_id"].notna()]
    launcher = dict(zip(zip(cpu["rank"], cpu["external_id"].astype("int64")), zip(cpu["tid"], cpu["ts_us"])))
    m = events.iloc[np.flatnonzero(matched)]
    spans: dict = {}
    for (rank, tid), grp in m.groupby(["rank", "tid"], observed=True):
        grp = grp.sort_values("ts_us")
        spans[(rank, tid)] = (grp["ts_us"].to_numpy(), (grp["ts_us"] + grp["dur_us"]).to_numpy(), grp.index.to_numpy())
    owner = np.full(len(gpu), -1, dtype=np.int64)
    ranks, ext = events["rank"].to_numpy(), events["external_id"].to_numpy()
    for k, row in enumerate(gpu):
        hit = launcher.get((ranks[row], int(ext[row])))
        span = spans.get((ranks[row], hit[0])) if hit else None
        if span is None:
            continue
        pos = np.searchsorted(span[0], hit[1], side="right") - 1
        if pos >= 0 and hit[1] <= span[1][pos]:
            owner[k] = span[2][pos]  # events has a RangeIndex: labels are positions
    valid = owner >= 0
    rows, own = gpu[valid], owner[valid]
    dur = events["dur_us"].to_numpy(dtype="float64")[rows]
    groups = pd.DataFrame({"own": own, "dur": dur}).groupby("own")["dur"]
    total, count = groups.transform("sum").to_numpy(), groups.transform("size").to_numpy()
    share = np.where(total > 0, dur / np.where(total > 0, total, 1.0), 1.0 / count)
    flops[rows] = flops[own] * share
    bytes_[rows] = bytes_[own] * share
    modules[rows] = modules[own]
    return int(valid.sum()), int((~valid).sum())


def join_costs(events: pd.DataFrame, costs: pd.DataFrame) -> tuple[pd.DataFrame, JoinStats]:
    """events with `flops`/`bytes_moved` filled from `costs` (one recorded step, flops.COST_COLUMNS).

    Every profiled step of every rank is matched against the same recorded sequence.
    """
    events = events.reset_index(drop=True)
    flops = events["flops"].to_numpy(dtype="float64", copy=True)
    bytes_ = events["bytes_moved"].to_numpy(dtype="float64", copy=True)
    matched = np.zeros(len(events), dtype=bool)
    views = costs["rule"] == "view"
    view_names = set(costs.loc[views, "name"].astype(str))
    costs = costs[~views]
    recorded = costs["name"].astype(str).tolist()
    rec_flops, rec_bytes = costs["flops"].to_numpy(), costs["bytes_moved"].to_numpy()
    has_sig = "input_dims" in costs.columns
    rec_dims = costs["input_dims"].to_numpy(dtype=object) if has_sig else None
    rec_types = costs["input_types"].to_numpy(dtype=object) if has_sig else None
    dims = events["input_dims"].to_numpy(dtype=object, copy=True)
    types = events["input_types"].to_numpy(dtype=object, copy=True)
    rec_mod = costs["module"].to_numpy(dtype=object) if "module" in costs.columns else np.full(len(costs), None, object)
    modules = events["module"].to_numpy(dtype=object, copy=True)
    ops = events[events["kind"] == "cpu_op"]
    ops = ops.assign(_step=_steps_of(events, ops)).dropna(subset=["_step"])
    steps = recorded_total = matched_total = 0
    missing: Counter = Counter()
    for _, grp in ops.groupby(["rank", "_step"], observed=True, sort=True):
        grp = grp.sort_values(["ts_us", "dur_us"], ascending=[True, False], kind="stable")
        tid = grp["tid"].fillna(-1).astype("int64").to_numpy()
        ts = grp["ts_us"].to_numpy()
        prof, rec, miss = match_sequence(grp["name"].astype(str).tolist(), ts, ts + grp["dur_us"].to_numpy(), tid, recorded)
        rows = grp.index.to_numpy()[prof]
        flops[rows], bytes_[rows] = rec_flops[rec], rec_bytes[rec]
        if has_sig:  # shapes from the cost pass where the profiler did not record them
            empty = pd.isna(dims[rows])
            dims[rows[empty]] = rec_dims[rec][empty]
            types[rows[empty]] = rec_types[rec][empty]
        modules[rows] = rec_mod[rec]
        matched[rows] = True
        steps += 1
        recorded_total += len(recorded)
        matched_total += len(prof)
        missing.update(miss)
    with_cost, without = _gpu_costs(events, flops, bytes_, matched, modules)
    is_view = (events["kind"] == "cpu_op").to_numpy() & events["name"].astype(str).isin(view_names).to_numpy()
    flops[is_view & ~matched], bytes_[is_view & ~matched] = 0.0, 0.0
    out = events.assign(flops=flops, bytes_moved=bytes_,
                        input_dims=pd.array(dims, dtype="string"), input_types=pd.array(types, dtype="string"),
                        module=pd.Categorical(modules))
    stats = JoinStats(steps, recorded_total, matched_total, recorded_total - matched_total,
                      dict(missing.most_common(10)), with_cost, without)
    return out, stats

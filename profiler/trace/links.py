"""Links between rows: ac2g flows -> `flow_id`, ProfilerStep#N spans -> `step`.

Flows (`ac2g`; `async_cpu_to_gpu` and the 2021 `async`/"launch" in older traces) bind to the
complete event that starts at the same (pid, tid, ts), as the Chrome trace format binds a flow
to its enclosing slice. Steps: CPU rows by time containment in the rank's ProfilerStep#N
user annotations; GPU rows through their launch (same correlation id as a runtime/driver row
that has a step), falling back to containment in `gpu_user_annotation` ProfilerStep spans.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler.trace._structs import MISSING
from profiler.trace.schema import KINDS

_K = {k: i for i, k in enumerate(KINDS)}
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
LAUNCH_KINDS = (_K["cuda_runtime"], _K["cuda_driver"])
DEVICE_SIDE = (_K["kernel"], _K["gpu_memcpy"], _K["gpu_memset"], _K["gpu_user_annotation"], _K["cuda_sync"])
FLOW_TARGETS = LAUNCH_KINDS + (_K["kernel"], _K["gpu_memcpy"], _K["gpu_memset"], _K["cuda_sync"])


def _contained(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Label of the span (sorted by start) that contains each ts, MISSING where none does."""
    out = np.full(len(ts), MISSING, np.int64)
    if len(starts) == 0:
        return out
    order = np.argsort(starts, kind="stable")
    starts, ends, labels = starts[order], ends[order], labels[order]
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = i >= 0
    j = np.where(ok, i, 0)
    ok &= ts < ends[j]
    out[ok] = labels[j[ok]]
    return out


def step_number(label: str) -> int | None:
    """N of a `ProfilerStep#N` marker's name, else None. At most 9 digits, so that N fits the
    Int32 `step` column; the analyses read markers by this same rule (breakdown.step_windows)."""
    m = STEP_NAME.match(label)
    return int(m.group(1)) if m and len(m.group(1)) < 10 else None


def assign_steps(kind: np.ndarray, name_codes: np.ndarray, names: list[str], ts: np.ndarray,
                 dur: np.ndarray, correlation: np.ndarray) -> np.ndarray:
    """int64 step per row (MISSING when outside every ProfilerStep); names[code] is the name."""
    step_of_code = np.full(len(names) + 1, MISSING, np.int64)
    for code, label in enumerate(names):
        n = step_number(label)
        if n is not None:
            step_of_code[code] = n
    step_of_row = step_of_code[name_codes]  # code -1 (missing) maps to the trailing MISSING
    is_step = step_of_row != MISSING
    device_side = np.isin(kind, DEVICE_SIDE)
    cpu_span = is_step & ~device_side
    gpu_span = is_step & (kind == _K["gpu_user_annotation"])
    steps = _contained(ts, ts[cpu_span], ts[cpu_span] + dur[cpu_span], step_of_row[cpu_span])
    steps[device_side] = MISSING
    dev = np.flatnonzero(device_side)
    if len(dev):
        launch = np.flatnonzero(np.isin(kind, LAUNCH_KINDS) & (correlation != MISSING) & (steps != MISSING))
        by_corr = pd.Series(steps[launch], index=correlation[launch])
        by_corr = by_corr[~by_corr.index.duplicated()]
        pos = by_corr.index.get_indexer(correlation[dev])
        lookup = np.append(by_corr.to_numpy(), MISSING)  # pos -1 (no launch) -> MISSING
        via_launch = np.where(correlation[dev] != MISSING, lookup[pos], MISSING)
        via_span = _contained(ts[dev], ts[gpu_span], ts[gpu_span] + dur[gpu_span], step_of_row[gpu_span])
        steps[dev] = np.where(via_launch != MISSING, via_launch, via_span)
    return steps


def bind_flows(kind: np.ndarray, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray,
               flows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """(rows that got a flow, their flow ids, number of flow events that bound to no row).

    A flow binds to the first candidate row (file order) with its (pid, tid, ts); a row keeps the
    first flow (file order) that bound to it; output in flow order. One lexsort of rows and flows
    together groups equal keys (rows first, ascending), so no hash join is needed."""
    n_flows = len(flows.get("id", ()))
    if n_flows == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), 0
    cand = np.flatnonzero(np.isin(kind, FLOW_TARGETS))
    n_cand = len(cand)
    k_pid = np.concatenate([pid[cand], flows["pid"]])
    k_tid = np.concatenate([tid[cand], flows["tid"]])
    k_ts = np.concatenate([ts[cand], flows["ts"]]) + 0.0  # -0.0 == 0.0
    order = np.lexsort((np.arange(n_cand + n_flows), k_ts, k_tid, k_pid))
    k_pid, k_tid, k_ts = k_pid[order], k_tid[order], k_ts[order]
    new = np.ones(len(order), bool)
    new[1:] = (k_pid[1:] != k_pid[:-1]) | (k_tid[1:] != k_tid[:-1]) | (k_ts[1:] != k_ts[:-1])
    head = order[np.flatnonzero(new)][np.cumsum(new) - 1]  # each element's group head: a row if any
    is_flow = order >= n_cand
    flow, head = order[is_flow] - n_cand, head[is_flow]
    hit = head < n_cand
    flow, row = flow[hit], cand[head[hit]]
    by_flow = np.argsort(flow, kind="stable")
    flow, row = flow[by_flow], row[by_flow]
    first = np.sort(np.unique(row, return_index=True)[1])  # each row's first flow
    flow, row = flow[first], row[first]
    return row.astype(np.int64), np.asarray(flows["id"])[flow].astype(np.int64), n_flows - len(flow)

"""Communication of CPU process groups (DDP over gloo, MPI, UCC), where no GPU kernel times it.

A rank with no GPU communication kernels records each collective its CPU process group runs as a
user annotation `<backend>:<collective>` on the group's worker thread (ProcessGroupGloo:
`gloo:all_reduce`). On such a rank:
- the spans are its communication (`collective_span_mask`);
- CPU ops on those worker threads, and `c10d::` ops on any thread (issuing a collective, or
  blocking on one: DDP's gradient hooks wait inside them), are communication work, not
  computation (`communication_op_mask`); every other CPU op is computation.
On ranks that do have GPU communication kernels, the kernels are the communication and these
spans are not counted (they would count the same collective twice).

Used by the distributed analyses (overlap, collectives, stragglers) and the step breakdown, so
both call the same µs communication.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analysis import kernel_types as kt

CPU_COLLECTIVE_PREFIXES: tuple[str, ...] = ("gloo:", "mpi:", "ucc:")
C10D_PREFIX = "c10d::"


def collective_span_mask(ev: pd.DataFrame) -> np.ndarray:
    """Bool per event: a CPU process group's collective span on a rank without GPU communication
    kernels."""
    span = (ev["kind"] == "user_annotation").to_numpy().copy()  # few rows: test only their names
    span[span] = ev.loc[span, "name"].astype("string").str.startswith(CPU_COLLECTIVE_PREFIXES).fillna(False).to_numpy()
    if not span.any():
        return span
    kernels = ev.loc[(ev["kind"] == "kernel").to_numpy()]
    gpu_comm_ranks = kernels.loc[kt.is_communication(kernels), "rank"].unique()
    return span & ~ev["rank"].isin(gpu_comm_ranks).to_numpy()


def c10d_op_mask(ev: pd.DataFrame) -> np.ndarray:
    """Bool per event: a `c10d::` CPU op (issues or waits for a collective)."""
    ops = (ev["kind"] == "cpu_op").to_numpy().copy()
    ops[ops] = ev.loc[ops, "name"].astype("string").str.startswith(C10D_PREFIX).fillna(False).to_numpy()
    return ops


def communication_op_mask(ev: pd.DataFrame, spans: np.ndarray | None = None) -> np.ndarray:
    """Bool per event: a CPU op that is communication work on a CPU-communicating rank (a `c10d::`
    op, or any op on a thread that runs the rank's collective spans). `spans`: the
    `collective_span_mask(ev)` when the caller already has it."""
    spans = collective_span_mask(ev) if spans is None else spans
    out = np.zeros(len(ev), dtype=bool)
    if not spans.any():
        return out
    comm_ranks = ev.loc[spans, "rank"].unique()
    threads = ev.loc[spans, ["rank", "tid"]].drop_duplicates()
    cpu = (ev["kind"] == "cpu_op").to_numpy() & ev["rank"].isin(comm_ranks).to_numpy()
    on_comm_thread = (pd.MultiIndex.from_frame(ev[["rank", "tid"]])
                      .isin(pd.MultiIndex.from_frame(threads)))
    return cpu & (c10d_op_mask(ev) | on_comm_thread)

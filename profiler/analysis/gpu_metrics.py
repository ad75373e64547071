"""GPU utilization, est. SM efficiency, est. achieved occupancy and tensor-core share.

Definitions are the TensorBoard profiler's (its "GPU Summary"), per rank and device, over "all
steps time" (the union of the ProfilerStep windows of `breakdown.step_windows`; the whole trace
of the rank when it has no steps); kernels are clipped to those windows:
- GPU utilization = time with at least one kernel running / all steps time;
- est. SM efficiency = sum over kernels of dur * min(blocks / numSMs, 1) / all steps time, with
  blocks = grid_x * grid_y * grid_z and numSMs from the trace's device properties (`numSms`).
  When numSMs is unknown, Kineto's own `blocks per SM` arg is used (`sm_efficiency_source`);
  when neither is there (some AMD traces) the value is NaN. A device missing from the
  properties takes its rank's SM count when all listed devices agree (ROCm traces list device 0
  but run on device 2). On ROCm, kernels launched with `hipExtModuleLaunchKernel` (hipBLASLt /
  Tensile) record their grid in work-items (a global work size), so blocks = ceil(grid / block)
  per dimension for them (`WORK_ITEM_GRID_APIS`); other launches record blocks;
- est. achieved occupancy = mean of the kernels' `est. achieved occupancy %`, weighted by
  duration, over the kernels that carry it (NaN when none does, e.g. AMD traces);
- tensor-core share = time of kernels recognised by name as tensor-core kernels
  (`kernel_types.TENSOR_CORE_PATTERNS`) / time of all kernels.
Only `kind == "kernel"` rows count (not memcpy/memset), as in TensorBoard.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from profiler.analysis import intervals as iv
from profiler.analysis import kernel_types as kt
from profiler.analysis.breakdown import gpu_activity, step_windows
from profiler.analysis.kernel_types import NamePattern, names_match
from profiler.analysis.registry import register_analysis


# Launch APIs whose recorded grid is a global work size in work-items, not a block count.
WORK_ITEM_GRID_APIS: tuple[NamePattern, ...] = (
    NamePattern("hip_ext_module_launch", r"^hip(Ext|Hcc)ModuleLaunchKernel", "globalWorkSize{X,Y,Z} arguments"),
)


def num_sms(meta: Mapping[str, Any]) -> dict[tuple[int, int], int]:
    """{(rank, device id): numSms} from `meta["per_rank"]` (else the first rank's properties)."""
    out: dict[tuple[int, int], int] = {}
    per_rank = meta.get("per_rank") or {}
    sources = [(int(r), (info or {}).get("device_properties") or ()) for r, info in per_rank.items()]
    if not sources:
        sources = [(int(r), meta.get("device_properties") or ()) for r in (meta.get("ranks") or (0,))]
    for rank, props in sources:
        for p in props:
            sms, dev = p.get("numSms"), p.get("id")
            if isinstance(sms, (int, float)) and sms > 0 and isinstance(dev, (int, float)):
                out[(rank, int(dev))] = int(sms)
    return out


def sm_count(sms_map: Mapping[tuple[int, int], int], rank: int, device: int) -> int:
    """SMs of (rank, device); else the rank's count when all its listed devices agree; else 0."""
    if (rank, device) in sms_map:
        return sms_map[(rank, device)]
    same_rank = {v for (r, _), v in sms_map.items() if r == rank}
    return same_rank.pop() if len(same_rank) == 1 else 0


def kernel_blocks(k: pd.DataFrame) -> np.ndarray:
    """Thread blocks per kernel row (NaN without grid); work-item grids divided by the block."""
    dims = [k[c].astype("float64").to_numpy() for c in ("grid_x", "grid_y", "grid_z")]
    block = [k[c].astype("float64").to_numpy() for c in ("block_x", "block_y", "block_z")]
    work_items = names_match(k["launch_name"].astype("category"), WORK_ITEM_GRID_APIS) if "launch_name" in k else False
    per_dim = [np.where(work_items & (b > 0), np.ceil(g / np.where(b > 0, b, 1.0)), g) for g, b in zip(dims, block)]
    return per_dim[0] * per_dim[1] * per_dim[2]


def _weighted(values: np.ndarray, weights: np.ndarray, groups: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Sum of values*weights per group, reindexed to `keys`."""
    s = pd.Series(values * weights).groupby(groups).sum()
    return s.reindex(keys, fill_value=0.0).to_numpy()


def _busy_in_windows(win: pd.DataFrame, pairs: pd.DataFrame, key: np.ndarray, ts: np.ndarray,
                     end: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Union of kernels per (rank, device) inside its rank's step windows."""
    ku = iv.union_by_group(key, ts, end)
    kw = pairs.merge(win, on="rank")
    kw_key = kw["rank"].to_numpy(np.int64) * 65536 + kw["device"].to_numpy(np.int64)
    per_window = iv.covered_in_windows_by_group(ku, kw_key, kw["start_us"].to_numpy(float), kw["end_us"].to_numpy(float))
    return pd.Series(per_window).groupby(kw_key).sum().reindex(keys, fill_value=0.0).to_numpy()


@register_analysis("gpu_metrics", "GPU utilization, SM efficiency, occupancy",
                   "TensorBoard-profiler GPU summary: utilization, est. SM efficiency, est. achieved occupancy, "
                   "tensor-core share")
def gpu_metrics(trace) -> pd.DataFrame:
    """Per (rank, device): `window_us, kernel_us, busy_us, gpu_utilization, sm_efficiency,
    achieved_occupancy_pct, tensor_core_us, tensor_core_share, num_sms, sm_efficiency_source`."""
    g = gpu_activity(trace, with_launch=True)
    k = g[(g["kind"] == "kernel").to_numpy()]
    win = step_windows(trace)
    wu = iv.union_by_group(win["rank"].to_numpy(np.int64), win["start_us"].to_numpy(float), win["end_us"].to_numpy(float))
    rank = k["rank"].to_numpy(np.int64)
    dev = k["device"].astype("Int64").fillna(-1).to_numpy(np.int64)
    ts = k["ts_us"].to_numpy(float)
    end = ts + k["dur_us"].to_numpy(float)
    inside = iv.covered_in_windows_by_group(wu, rank, ts, end)  # each kernel's µs inside the steps
    pairs = pd.DataFrame({"rank": rank, "device": dev}).drop_duplicates().sort_values(["rank", "device"])
    key = rank * 65536 + dev
    keys = pairs["rank"].to_numpy(np.int64) * 65536 + pairs["device"].to_numpy(np.int64)
    busy = _busy_in_windows(win, pairs, key, ts, end, keys)

    # SM efficiency per kernel: min(blocks / numSMs, 1), else Kineto's blocks-per-SM.
    sms_map = num_sms(trace.meta)
    sms = np.array([sm_count(sms_map, int(r), int(d)) for r, d in zip(pairs["rank"], pairs["device"])], dtype=float)
    sms_row = pd.Series(sms, index=keys).reindex(key).to_numpy()
    from_grid = np.where(sms_row > 0, kernel_blocks(k) / np.where(sms_row > 0, sms_row, 1.0), np.nan)
    per_sm = np.where(np.isnan(from_grid), k["blocks_per_sm"].astype("float64").to_numpy(), from_grid)
    eff = np.minimum(per_sm, 1.0)
    ones = np.ones_like(inside)
    eff_sum = _weighted(np.nan_to_num(eff), inside, key, keys)
    eff_known = _weighted((~np.isnan(eff)).astype(float), ones, key, keys) > 0
    src_grid = _weighted((~np.isnan(from_grid)).astype(float), ones, key, keys) > 0

    occ = k["occupancy_pct"].astype("float64").to_numpy()
    occ = np.where((occ >= 0) & (occ <= 100), occ, np.nan)  # a percentage; another value is unknown, not a weight
    has_occ = ~np.isnan(occ)
    occ_num = _weighted(np.nan_to_num(occ), inside * has_occ, key, keys)
    occ_den = _weighted(has_occ.astype(float), inside, key, keys)
    kernel_us = _weighted(ones, inside, key, keys)
    tc_us = _weighted(kt.is_tensor_core(k).astype(float), inside, key, keys)

    w = wu.total_by_group().reindex(pairs["rank"].to_numpy(np.int64), fill_value=0.0).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        out = pd.DataFrame({
            "rank": pairs["rank"].to_numpy().astype("int32"), "device": pairs["device"].to_numpy(),
            "window_us": w, "kernel_us": kernel_us, "busy_us": busy,
            "gpu_utilization": np.where(w > 0, busy / w, np.nan),
            "sm_efficiency": np.where((w > 0) & eff_known, eff_sum / w, np.nan),
            "achieved_occupancy_pct": np.where(occ_den > 0, occ_num / occ_den, np.nan),
            "tensor_core_us": tc_us,
            "tensor_core_share": np.where(kernel_us > 0, tc_us / kernel_us, np.nan),
            "num_sms": pd.array(np.where(sms > 0, sms, np.nan), dtype="Float64").astype("Int64"),
            "sm_efficiency_source": np.where(src_grid, "grid/numSms",
                                             np.where(eff_known, "blocks per SM", "unavailable")),
        })
    return out.reset_index(drop=True)

"""Kernel -> launch -> CPU op -> parent ops -> `nn.Module` attribution, with self and total device time.

Links, in order of trust (the same chain HTA and the TensorBoard profiler follow):
1. GPU activity (kernel, memcpy, memset) -> its runtime/driver launch call by (rank, correlation).
   Under a CUDA/HIP graph many kernels share the `cudaGraphLaunch` correlation, so they all land
   on it; `cuLaunchKernel` (Triton) and `hipExtModuleLaunchKernel` are launches like any other.
2. Launch -> CPU op by External id (kernel's, else the launch's), when it names a `cpu_op` on the
   launching thread whose interval contains the launch call (some exporters number External ids
   from an unrelated counter; docs/analysis.md shows two real traces where that happens).
3. Else time containment: the innermost scope on the launching thread whose interval contains
   the launch call. Scopes are cpu_op, user_annotation (not `ProfilerStep#`) and
   `nn.Module: X` python_function events; they nest per thread (see `nesting.py`).
Parent ops and modules then come from the nest, so one vectorised pass serves every kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler.analysis import nesting
from profiler.analysis.kernel_types import GPU_ACTIVITY_KINDS, kernel_type
from profiler.analysis.registry import register_analysis

MODULE_PREFIX = "nn.Module: "
STEP_PREFIX = "ProfilerStep#"
LAUNCH_KINDS = ("cuda_runtime", "cuda_driver")
SCOPE_KINDS = ("op", "annotation", "module")  # codes 0, 1, 2
PATH_SEP = " > "
LINKS = ("external_id", "containment", "none")
MODULE_VIA = ("scope", "backward_sequence")
THREAD_KEYS = ["rank", "pid", "tid"]
SCOPE_COLUMNS = THREAD_KEYS + ["ts_us", "dur_us", "name", "external_id", "input_dims", "sequence_number"]
GPU_COLUMNS = ["rank", "kind", "name", "stream", "ts_us", "dur_us", "step", "correlation", "external_id",
               "collective_name"]


@dataclass(frozen=True)
class Attribution:
    """kernels: one row per GPU activity with its launch, op, op chain and module.
    tree: module/annotation/op/kernel call tree aggregated by path, self and total device µs.
    ops / ops_by_dims: cpu_op table by name (and by name + input dims)."""

    kernels: pd.DataFrame
    tree: pd.DataFrame
    ops: pd.DataFrame
    ops_by_dims: pd.DataFrame

    def __post_init__(self) -> None:
        for name in ("kernels", "tree", "ops", "ops_by_dims"):
            if not isinstance(getattr(self, name), pd.DataFrame):
                raise TypeError(f"Attribution.{name} must be a DataFrame")


def name_startswith(names: pd.Series, prefix: str) -> np.ndarray:
    """Bool per row, computed once per category (names are categorical)."""
    cat = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    hit = np.asarray(cat.cat.categories.astype(str).str.startswith(prefix), dtype=bool)
    codes = cat.cat.codes.to_numpy()
    return np.where(codes >= 0, hit[np.maximum(codes, 0)] if len(hit) else False, False)


def _scope_rows(ev: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Scope rows (ops, annotations, modules) and their scope-kind code."""
    kind = ev["kind"]
    is_op = (kind == "cpu_op").to_numpy()
    is_ann = (kind == "user_annotation").to_numpy()
    is_mod = (kind == "python_function").to_numpy() & name_startswith(ev["name"], MODULE_PREFIX)
    keep = (is_op | is_ann | is_mod) & ~name_startswith(ev["name"], STEP_PREFIX)
    code = np.where(is_op, 0, np.where(is_ann, 1, 2))[keep]
    return ev.loc[keep, SCOPE_COLUMNS], code


def _thread_codes(*frames: pd.DataFrame) -> list[np.ndarray]:
    """One integer code per (rank, pid, tid), consistent across the given frames."""
    keys = pd.concat([f[THREAD_KEYS] for f in frames], ignore_index=True)
    codes = keys.groupby(THREAD_KEYS, dropna=False, sort=True).ngroup().to_numpy(np.int64)
    out, at = [], 0
    for f in frames:
        out.append(codes[at:at + len(f)])
        at += len(f)
    return out


def _path_ids(nest: nesting.Nest, label: np.ndarray, n_labels: int):
    """Intern the root-to-scope label path of every scope, level by level.

    Returns (path id per sorted scope, parent path per path id, label per path id, depth per path id).
    Paths made at a level get ids after every path of the levels above, so parent id < child id.
    """
    path = np.full(len(nest.order), -1, np.int64)
    parents, labels, depths, next_id = [], [], [], 0
    for d in range(nest.max_depth + 1):
        here = np.flatnonzero(nest.depth == d)
        par = nest.parent[here]
        ppath = np.where(par >= 0, path[np.maximum(par, 0)], -1)
        key = (ppath + 1) * n_labels + label[here]
        uniq, inv = np.unique(key, return_inverse=True)
        path[here] = next_id + inv
        parents.append(uniq // n_labels - 1)
        labels.append(uniq % n_labels)
        depths.append(np.full(len(uniq), d))
        next_id += len(uniq)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return path, cat(parents), cat(labels), cat(depths)


def _path_strings(parent: np.ndarray, text: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """' > '-joined label path per path id (vectorised per level)."""
    out = np.empty(len(parent), dtype=object)
    for d in range(int(depth.max()) + 1 if len(depth) else 0):
        here = np.flatnonzero(depth == d)
        if d == 0:
            out[here] = text[here]
        else:
            out[here] = out[parent[here]] + PATH_SEP + text[here]
    return out


def _launch_links(ev: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Per GPU row: its launch call (name, kind, ts, thread, External id) by (rank, correlation)."""
    launch = ev.loc[ev["kind"].isin(LAUNCH_KINDS) & ev["correlation"].notna(),
                    THREAD_KEYS + ["correlation", "name", "kind", "ts_us", "external_id"]]
    launch = launch.drop_duplicates(["rank", "correlation"])  # one launch per correlation
    launch = launch.rename(columns={"name": "launch_name", "kind": "launch_kind", "ts_us": "launch_ts_us",
                                    "external_id": "launch_external_id", "pid": "launch_pid", "tid": "launch_tid"})
    left = gpu[["rank", "correlation"]].reset_index(drop=True)
    return left.merge(launch, on=["rank", "correlation"], how="left")


def _leaf_by_external_id(scopes: pd.DataFrame, code_sorted_pos: np.ndarray, is_op: np.ndarray,
                         rank: np.ndarray, ext: pd.Series) -> np.ndarray:
    """Sorted scope position of the cpu_op with this (rank, External id), else -1."""
    # Int64 arrays throughout (.array, not .to_numpy(): an id column with NA would become float64
    # and ids past 2^53 would stop comparing equal, or fail the cast back).
    ops = pd.DataFrame({"rank": scopes["rank"].to_numpy()[is_op],
                        "external_id": pd.array(scopes["external_id"].array[is_op], dtype="Int64"),
                        "pos": code_sorted_pos[is_op]}).dropna(subset=["external_id"])
    ops = ops.drop_duplicates(["rank", "external_id"])
    q = pd.DataFrame({"rank": rank, "external_id": pd.array(ext.array, dtype="Int64")})
    got = q.merge(ops, on=["rank", "external_id"], how="left")["pos"]
    return got.fillna(-1).to_numpy(np.int64)


@register_analysis("attribution", "Kernel → operator → module attribution",
                   "Each GPU activity linked to its launch, CPU op, parent ops and nn.Module scope")
def attribution(trace) -> Attribution:
    """Attribute every kernel/memcpy/memset to its launch, op chain and module; aggregate trees."""
    ev = trace.events
    scopes, scope_kind = _scope_rows(ev)
    gpu = ev.loc[ev["kind"].isin(GPU_ACTIVITY_KINDS).to_numpy(), GPU_COLUMNS]
    links = _launch_links(ev, gpu)
    launch_rows = links.rename(columns={"launch_pid": "pid", "launch_tid": "tid"})
    scope_group, launch_group = _thread_codes(scopes, launch_rows)
    start = scopes["ts_us"].to_numpy(np.float64)
    nest = nesting.build_nest(scope_group, start, start + scopes["dur_us"].to_numpy(np.float64))
    pos = nest.position  # scope row -> sorted position
    kind_sorted = scope_kind[nest.order]

    # Leaf scope of each GPU row: External id first, then containment of the launch call.
    ext = gpu["external_id"].reset_index(drop=True).fillna(links["launch_external_id"])
    leaf_ext = _leaf_by_external_id(scopes, pos, scope_kind == 0, gpu["rank"].to_numpy(), ext)
    has_launch = links["launch_ts_us"].notna().to_numpy()
    leaf_cont = np.full(len(gpu), -1, np.int64)
    leaf_cont[has_launch] = nesting.innermost(nest, launch_group[has_launch],
                                              links["launch_ts_us"].to_numpy(np.float64)[has_launch])
    # Some exporters number External ids from an unrelated counter (two of the real test traces):
    # an External-id op that is not on the launching thread around the launch call is rejected.
    if len(nest.order):
        e = np.maximum(leaf_ext, 0)
        lts = links["launch_ts_us"].to_numpy(np.float64, na_value=np.nan)
        lgrp = np.full(len(gpu), -1, np.int64)
        lgrp[has_launch] = launch_group[has_launch]
        wrong = ((leaf_ext >= 0) & has_launch
                 & ((nest.group[e] != lgrp) | (nest.start[e] > lts) | (nest.end[e] < lts)))
        leaf_ext = np.where(wrong, -1, leaf_ext)
    leaf = np.where(leaf_ext >= 0, leaf_ext, leaf_cont)
    link = np.where(leaf_ext >= 0, "external_id", np.where(leaf_cont >= 0, "containment", "none"))

    n = len(nest.order)
    nearest_op = nesting.propagate_down(nest, np.where(kind_sorted == 0, np.arange(n), -1))
    nearest_mod = nesting.propagate_down(nest, np.where(kind_sorted == 2, np.arange(n), -1))
    top_op = _outermost(nest, kind_sorted == 0)

    # Everything below works on integer codes; strings exist once per distinct name or path.
    name_cat = scopes["name"] if isinstance(scopes["name"].dtype, pd.CategoricalDtype) else scopes["name"].astype("category")
    cats = np.asarray(name_cat.cat.categories.astype(str), dtype=object)
    cat_text = np.asarray(pd.Index(cats, dtype=object).str.removeprefix(MODULE_PREFIX), dtype=object)
    codes_sorted = name_cat.cat.codes.to_numpy(np.int64)[nest.order]
    n_cats = max(len(cats), 1)
    label_codes = kind_sorted.astype(np.int64) * n_cats + np.maximum(codes_sorted, 0)
    path, p_parent, p_label, p_depth = _path_ids(nest, label_codes, 3 * n_cats)
    p_text = _pick(cat_text, p_label % n_cats)
    p_kind = np.asarray(SCOPE_KINDS, dtype=object)[p_label // n_cats]
    p_str = _path_strings(p_parent, p_text, p_depth)
    mod_code, mod_strings = _module_paths(nest, kind_sorted == 2, _pick(cat_text, codes_sorted), nearest_mod)

    op = _at(nearest_op, leaf)
    mod = _at(nearest_mod, leaf)
    mod, via_backward = _backward_modules(nest, scopes, kind_sorted, nearest_mod, _at(top_op, leaf), mod)
    kernels = pd.DataFrame({
        "event_index": gpu.index.to_numpy(),
        "rank": gpu["rank"].to_numpy(),
        "kind": gpu["kind"].array,
        "name": gpu["name"].array,
        "kernel_type": kernel_type(gpu).array,
        "stream": gpu["stream"].array,
        "ts_us": gpu["ts_us"].to_numpy(),
        "dur_us": gpu["dur_us"].to_numpy(),
        "step": gpu["step"].array,
        "correlation": gpu["correlation"].array,
        "launch_name": links["launch_name"].astype("category").array,
        "launch_ts_us": links["launch_ts_us"].to_numpy(np.float64, na_value=np.nan),
        "link": pd.Categorical.from_codes(np.where(leaf_ext >= 0, 0, np.where(leaf_cont >= 0, 1, 2)), LINKS),
        "op": _categorical(_at(codes_sorted, op), cats),
        "op_index": _at(scopes.index.to_numpy()[nest.order], op),
        "op_input_dims": scopes["input_dims"].array.take(_at(nest.order, op), allow_fill=True),
        "top_op": _categorical(_at(codes_sorted, _at(top_op, leaf)), cats),
        "module": _categorical(_at(codes_sorted, mod), cat_text),
        "module_path": _categorical(_at(mod_code, mod), mod_strings),
        "module_via": pd.Categorical.from_codes(np.where(mod < 0, -1, via_backward.astype(np.int64)), MODULE_VIA),
        "scope_path": _categorical(_at(path, leaf), p_str),
    })
    dur = kernels["dur_us"].to_numpy(np.float64)
    ops, ops_by_dims = _op_tables(nest, scopes, kind_sorted, codes_sorted, cats, op, dur)
    kname = gpu["name"] if isinstance(gpu["name"].dtype, pd.CategoricalDtype) else gpu["name"].astype("category")
    tree = _tree(path, p_parent, p_kind, p_text, p_depth, p_str, _at(path, leaf), dur,
                 kname.cat.codes.to_numpy(np.int64), np.asarray(kname.cat.categories.astype(str), dtype=object))
    return Attribution(kernels=kernels, tree=tree, ops=ops, ops_by_dims=ops_by_dims)


def _backward_modules(nest, scopes, kind_sorted, nearest_mod, top, mod) -> tuple[np.ndarray, np.ndarray]:
    """Backward kernels (outside any module scope) take the module of their forward op: the
    op with the same (rank, autograd sequence number) that runs inside a module, as the
    TensorBoard profiler did. Returns (module scope per GPU row, bool: found this way)."""
    seq = scopes["sequence_number"].to_numpy(np.float64, na_value=np.nan)[nest.order]
    rank = scopes["rank"].to_numpy(np.int64)[nest.order]
    fwd = (kind_sorted == 0) & ~np.isnan(seq) & (nearest_mod >= 0)
    need = (mod < 0) & (top >= 0)
    need[need] = ~np.isnan(seq[top[need]])
    if not fwd.any() or not need.any():
        return mod, np.zeros(len(mod), bool)
    table = pd.DataFrame({"rank": rank[fwd], "seq": seq[fwd], "fwd_mod": nearest_mod[fwd]})
    table = table.drop_duplicates(["rank", "seq"])
    q = pd.DataFrame({"rank": rank[top[need]], "seq": seq[top[need]]})
    got = q.merge(table, on=["rank", "seq"], how="left")["fwd_mod"].fillna(-1).to_numpy(np.int64)
    out = mod.copy()
    out[np.flatnonzero(need)] = got
    return out, (out >= 0) & (mod < 0)


def _at(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """values[idx] for integer arrays, -1 where idx < 0 (or where values is empty)."""
    if len(values) == 0:
        return np.full(len(idx), -1, np.int64)
    return np.where(idx >= 0, np.asarray(values, np.int64)[np.maximum(idx, 0)], -1)


def _categorical(codes: np.ndarray, labels: np.ndarray) -> pd.Categorical:
    """Categorical from codes into `labels` (labels may repeat; -1 = missing)."""
    remap, uniq = pd.factorize(pd.Index(np.asarray(labels, dtype=object), dtype=object))
    c = np.where(codes >= 0, remap[np.maximum(codes, 0)], -1) if len(labels) else np.full(len(codes), -1)
    return pd.Categorical.from_codes(c, categories=pd.Index(uniq, dtype=object))


def _outermost(nest: nesting.Nest, is_op: np.ndarray) -> np.ndarray:
    """Sorted position of the outermost cpu_op on each scope's chain (itself included), else -1."""
    out = np.where(is_op, np.arange(len(is_op)), -1)
    for d in range(1, nest.max_depth + 1):
        here = np.flatnonzero(nest.depth == d)
        up = out[nest.parent[here]]
        out[here] = np.where(up >= 0, up, out[here])
    return out


def _module_paths(nest: nesting.Nest, is_mod: np.ndarray, text: np.ndarray,
                  nearest_mod: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Module path ('A > B > C') per module scope as (code per sorted scope, -1 elsewhere; strings)."""
    out = np.full(len(is_mod), "", dtype=object)
    for d in range(nest.max_depth + 1):  # one iteration per depth level
        here = np.flatnonzero((nest.depth == d) & is_mod)
        par = nest.parent[here]
        up = np.where(par >= 0, nearest_mod[np.maximum(par, 0)], -1)
        prefix = np.where(up >= 0, out[np.maximum(up, 0)], "")
        out[here] = np.where(up >= 0, prefix + PATH_SEP, "") + text[here]
    codes, uniq = pd.factorize(pd.Index(out[is_mod], dtype=object))
    code = np.full(len(is_mod), -1, np.int64)
    code[is_mod] = codes
    return code, np.asarray(uniq, dtype=object)


def _pick(values: np.ndarray, idx: np.ndarray, missing=None) -> np.ndarray:
    """values[idx] (object) with `missing` where idx < 0."""
    if len(values) == 0:
        return np.full(len(idx), missing, dtype=object)
    got = np.asarray(values, dtype=object)[np.maximum(idx, 0)]
    got[idx < 0] = missing
    return got


def _op_tables(nest, scopes, kind_sorted, codes_sorted, cats, op_leaf, dur) -> tuple[pd.DataFrame, pd.DataFrame]:
    """cpu_op table per name and per (name, input dims): calls, CPU and device self/total µs."""
    n = len(nest.order)
    span = nest.end - nest.start
    child = np.zeros(n)
    has_par = nest.parent >= 0
    np.add.at(child, nest.parent[has_par], span[has_par])
    direct = op_leaf >= 0
    dev_self = np.bincount(op_leaf[direct], weights=dur[direct], minlength=n)
    kcount = np.bincount(op_leaf[direct], minlength=n)
    dev_total = nesting.ancestors_sum(nest, op_leaf, dur)
    is_op = kind_sorted == 0
    dims = scopes["input_dims"].array.take(nest.order[is_op]).fillna("")
    per = pd.DataFrame({
        "name_code": codes_sorted[is_op], "input_dims": dims,
        "cpu_total_us": span[is_op], "cpu_self_us": np.maximum(span - child, 0)[is_op],
        "device_self_us": dev_self[is_op], "device_total_us": dev_total[is_op], "kernel_count": kcount[is_op],
    })

    def table(keys: list[str]) -> pd.DataFrame:
        g = per.groupby(keys, sort=False)
        t = g.agg(calls=("cpu_total_us", "size"), cpu_total_us=("cpu_total_us", "sum"),
                  cpu_self_us=("cpu_self_us", "sum"), device_self_us=("device_self_us", "sum"),
                  device_total_us=("device_total_us", "sum"), kernel_count=("kernel_count", "sum")).reset_index()
        t.insert(0, "name", _pick(cats, t.pop("name_code").to_numpy()))
        t["device_self_mean_us"] = t["device_self_us"] / t["calls"]
        return t.sort_values(["device_total_us", "cpu_total_us"], ascending=False, ignore_index=True)

    return table(["name_code"]), table(["name_code", "input_dims"])


def _tree(path, p_parent, p_kind, p_text, p_depth, p_str, leaf_path, dur, kcode, kcats) -> pd.DataFrame:
    """Call tree by path: scope nodes then kernel leaves; nodes without device time are dropped."""
    n_paths = len(p_parent)
    nk = max(len(kcats), 1)
    kkey = (leaf_path + 1) * nk + np.maximum(kcode, 0)
    kuniq, kinv = np.unique(kkey, return_inverse=True)
    k_parent = kuniq // nk - 1
    k_name = _pick(kcats, kuniq % nk)
    k_total = np.bincount(kinv, weights=dur, minlength=len(kuniq))
    k_count = np.bincount(kinv, minlength=len(kuniq))
    attributed = leaf_path >= 0
    calls = np.bincount(path[path >= 0], minlength=n_paths)
    self_us = np.bincount(leaf_path[attributed], weights=dur[attributed], minlength=n_paths)
    kc_self = np.bincount(leaf_path[attributed], minlength=n_paths)
    total, kc_total = self_us.copy(), kc_self.copy()
    for d in range(int(p_depth.max()) if n_paths else 0, 0, -1):  # deepest level first
        here = np.flatnonzero(p_depth == d)
        np.add.at(total, p_parent[here], total[here])
        np.add.at(kc_total, p_parent[here], kc_total[here])
    k_depth = np.where(k_parent >= 0, _at(p_depth, k_parent) + 1, 0)
    k_path = np.where(k_parent >= 0, _pick(p_str, k_parent, "") + PATH_SEP, "") + k_name
    scope_nodes = pd.DataFrame({
        "node_id": np.arange(n_paths), "parent_id": p_parent, "depth": p_depth, "node_kind": p_kind,
        "name": p_text, "path": p_str, "calls": calls, "kernel_count": kc_total,
        "self_device_us": self_us, "total_device_us": total})
    kernel_nodes = pd.DataFrame({
        "node_id": n_paths + np.arange(len(kuniq)), "parent_id": k_parent, "depth": k_depth,
        "node_kind": "kernel", "name": k_name, "path": k_path, "calls": k_count, "kernel_count": k_count,
        "self_device_us": k_total, "total_device_us": k_total})
    tree = pd.concat([scope_nodes[scope_nodes["total_device_us"] > 0], kernel_nodes], ignore_index=True)
    return tree.sort_values("path", kind="stable", ignore_index=True)

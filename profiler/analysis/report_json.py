"""Every registered analysis of a Trace as one strict, versioned JSON document (see docs/analysis.md).

`build_report(trace)` runs every registered analysis through one `Results` cache, runs every
rule, and returns a plain dict: the headline keys (`kernel_type_breakdown`, `kernel_breakdown`,
`temporal`, `comm_comp_overlap_pct`, `idle`, `findings`, and `diff` with a comparison trace) in
the shapes the schema documents, plus `analyses` with every analysis serialised generically
(DataFrames as records, frozen results as objects). Missing numbers are null, never NaN, so
`json.dumps(report, allow_nan=False)` always succeeds. Pure: no I/O here; the CLI writes it.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from profiler.analysis import load_all
from profiler.analysis.findings import Results
from profiler.analysis.registry import ANALYSES
from profiler.trace.summary import most_first

REPORT_SCHEMA = "fusionlens.analysis"
REPORT_SCHEMA_VERSION = 1
DEFAULT_MAX_ROWS = 200  # rows per table under `analyses` (the headline tables are complete)


def jsonable(value: Any, max_rows: int | None = DEFAULT_MAX_ROWS) -> Any:
    """A JSON-safe copy: NaN/NA/inf -> None, numpy scalars -> Python, DataFrames -> records."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, pd.DataFrame):
        return table(value, max_rows)
    if isinstance(value, pd.Series):
        return jsonable(value.to_dict(), max_rows)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name), max_rows) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, max_rows) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray)):
        return [jsonable(v, max_rows) for v in value]
    if value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (pd.Timestamp, _dt.datetime)):
        return value.isoformat()
    return str(value)


def records(df: pd.DataFrame, max_rows: int | None = None) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-safe dicts (column order kept)."""
    if max_rows is not None:
        df = df.head(max_rows)
    cols = [str(c) for c in df.columns]
    # Column-wise conversion (one pass per column, not per cell through pandas).
    converted = [[jsonable(v, None) for v in df[c].astype(object).tolist()] for c in df.columns]
    return [dict(zip(cols, row)) for row in zip(*converted)] if cols else [{} for _ in range(len(df))]


def table(df: pd.DataFrame, max_rows: int | None = DEFAULT_MAX_ROWS) -> dict[str, Any]:
    """{columns, total_rows, truncated, records}: a generic table block under `analyses`."""
    n = len(df)
    return {"columns": [str(c) for c in df.columns], "total_rows": n,
            "truncated": max_rows is not None and n > max_rows, "records": records(df, max_rows)}


def _needs_only_trace(fn) -> bool:
    params = list(inspect.signature(fn).parameters.values())[1:]
    return all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _headline(results: Results, errors: dict[str, str]) -> dict[str, Any]:
    """The documented top-level keys, each from its analysis (null when that analysis failed)."""
    out: dict[str, Any] = {}

    def take(name: str, fn) -> Any:
        if name in errors:
            return None
        return fn(results[name])

    out["kernel_type_breakdown"] = take("kernel_type_breakdown", lambda r: jsonable(dict(r.total_us)))
    out["kernel_breakdown"] = take("kernel_breakdown", lambda r: records(r))
    out["temporal"] = take("temporal", lambda r: {
        str(int(x["rank"])): {k: jsonable(x[k]) for k in ("idle_us", "compute_us", "non_compute_us", "span_us")}
        for x in records(r)})
    out["comm_comp_overlap_pct"] = take("comm_comp_overlap", lambda r: {
        str(int(x["rank"])): x["overlap_pct"] for x in records(r)})
    out["idle"] = take("idle_time", _idle_by_rank_stream)
    out["step_breakdown"] = take("step_breakdown", lambda r: records(r))
    return out


def _idle_by_rank_stream(idle: pd.DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """{rank: {stream: {idle_us, host_wait_us, kernel_wait_us, other_us, span_us, device}}};
    a stream seen on two devices of one rank is keyed "device:stream"."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    dup = idle.duplicated(["rank", "stream"], keep=False).to_numpy()
    for row, clash in zip(records(idle), dup):
        key = f"{row['device']}:{row['stream']}" if clash else str(row["stream"])
        out.setdefault(str(row["rank"]), {})[key] = {
            k: row[k] for k in ("idle_us", "host_wait_us", "kernel_wait_us", "other_us", "span_us", "device")}
    return out


def build_report(trace, compare=None, thresholds: Mapping[str, Mapping[str, Any]] | None = None,
                 max_rows: int | None = DEFAULT_MAX_ROWS, results: Results | None = None) -> dict[str, Any]:
    """Run every registered analysis and rule on `trace` (and the diff against `compare`)."""
    from profiler.analysis.rules import run_rules

    load_all()
    results = results if results is not None else Results(trace, params={"diff": {"other": compare}})
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    analyses: dict[str, Any] = {}
    n_ranks = max(len(trace.ranks), int(trace.events["rank"].nunique()))
    for name, spec in sorted(ANALYSES.items()):
        if name == "diff":
            continue
        if not _needs_only_trace(spec.fn):
            skipped[name] = "needs parameters the report does not have"
            continue
        if n_ranks < spec.needs_ranks:
            skipped[name] = f"needs at least {spec.needs_ranks} ranks"
            continue
        try:
            analyses[name] = jsonable(results[name], max_rows)
        except Exception as exc:  # one failing analysis must not hide the others; reported below
            errors[name] = f"{type(exc).__name__}: {exc}"
    try:
        findings = [f.as_dict() for f in run_rules(trace, results, thresholds)]
    except Exception as exc:  # same: keep the report, name the failure
        findings, errors["rules"] = [], f"{type(exc).__name__}: {exc}"
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "trace": _trace_info(trace),
        **_headline(results, errors),
        "findings": jsonable(findings),
    }
    if compare is not None:
        report["compare_trace"] = _trace_info(compare)
        d = results["diff"]
        report["diff"] = {"totals": jsonable(d.totals), "kernels": records(d.kernels), "ops": records(d.ops),
                          "new_kernels": d.new, "vanished_kernels": d.vanished}
    report["analyses"] = analyses
    report["analyses_skipped"] = skipped
    report["errors"] = errors
    return report


def _trace_info(trace) -> dict[str, Any]:
    meta = trace.meta
    return {"sources": jsonable(list(meta.get("sources", ()))), "ranks": jsonable(list(trace.ranks)),
            "events": int(len(trace.events)), "trace_schema_version": jsonable(meta.get("schema_version")),
            "skipped_events": jsonable(meta.get("skipped_events", 0)),
            "unread_events": most_first(meta.get("unread_events", {}))}

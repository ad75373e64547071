"""What `python -m profiler capture` writes next to the Kineto JSON: Parquet trace, roofline, summary.

Pure of printing: `write_outputs(result, out_dir, ...)` returns the paths and the summary dict;
the CLI prints them. The roofline tables come from `profiler.analysis.roofline.roofline_tables`
against the machine's ceilings (measured and cached, or the device table): per op type
(roofline.csv) and per nn.Module (roofline_modules.csv, when the cost pass named modules); when
they cannot be made, `roofline_missing.txt` says why. All bytes are algorithmic lower bounds.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import pandas as pd

from profiler.capture.artifacts import REPORT_OUTPUTS, clear_outputs, plain, save_trace, write_json
from profiler.capture.backends import CapturePlan, CaptureResult
from profiler.trace.model import Trace

ROOF_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
CEILING_CHOICES = ("measured", "quick", "table", "none")


def default_out_dir(spec: str, root: str | Path | None = None) -> Path:
    """`<root>/<spec>-<UTC time>` with the spec made filename-safe, and -2, -3, ... when a run in
    the same second took the name (a second capture there would clear the first's outputs).
    `root` defaults to the data dir's `captures/` (`$FUSIONLENS_DATA_DIR` or `./.fusionlens`),
    where the Load page lists earlier captures."""
    from profiler.capture.ceilings import data_dir

    stamp = pd.Timestamp.now(tz="UTC").strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec).strip("_.")[-60:] or "model"
    base = (data_dir() / "captures" if root is None else Path(root)) / f"{safe}-{stamp}"
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


@contextlib.contextmanager
def removed_if_failed(out: Path) -> Iterator[Path]:
    """A capture folder this run made (a default one): removed again when the run fails before
    anything was written into it. Each failed attempt (a typo in the spec, a model out of memory)
    left an empty `<spec>-<time>` folder in the data dir's captures."""
    try:
        yield out
    except BaseException:
        with contextlib.suppress(OSError):  # not empty (a rank wrote its trace), or gone: keep it
            out.rmdir()
        raise


MODULES_CSV = "roofline_modules.csv"


def ceilings_for(plan: CapturePlan, choice: str) -> tuple[Optional[Any], Optional[str]]:
    """(Ceilings, None) or (None, reason) for the roofline, per --ceilings."""
    if choice == "none":
        return None, "roofline turned off (--ceilings none)"
    if choice == "table":
        return None, None  # roofline() picks the device table from the trace's meta
    try:
        from profiler.capture.ceilings import measured_ceilings
    except ImportError as exc:
        return None, f"ceiling measurement unavailable ({exc})"
    try:
        device = plan.device if plan.is_cuda else "cpu"
        return measured_ceilings(device, "quick" if choice == "quick" else "full"), None
    except Exception as exc:  # measuring must not lose the capture: keep the reason
        return None, f"measuring ceilings failed: {type(exc).__name__}: {exc}"


REMEASURE_MIN_US = 1000.0  # op types with less time than this are too few timer ticks to judge a roof by
REMEASURE_MARGIN = 1.1
REMEASURE_MAX_RUNS = 3  # merged measurements after which a roof stands, whatever an op seems to beat


def above_compute_roof(table: pd.DataFrame) -> pd.DataFrame:
    """Op types (>= 1 ms in all) that ran over 10% faster than their dtype's measured peak FLOP/s:
    evidence that the roof was measured low (a busy moment), since no op beats a real roof."""
    if table.empty:
        return table
    over = (table["dur_us"] >= REMEASURE_MIN_US) & (table["achieved_flops_per_s"] > REMEASURE_MARGIN * table["peak_flops_per_s"])
    return table[over]


def remeasured(ceilings: Any, choice: str, over: pd.DataFrame) -> Any:
    """CPU ceilings measured again (the cache keeps the best per figure) when ops beat the cached
    roof, at most REMEASURE_MAX_RUNS merged runs per machine (a FLOPs formula counting high
    must not cost a measurement every capture); the details name the op that triggered it."""
    if int(ceilings.details.get("runs_merged", 1)) >= REMEASURE_MAX_RUNS:
        return ceilings
    from profiler.capture.ceilings import measured_ceilings

    top = over.sort_values("achieved_flops_per_s", ascending=False).iloc[0]
    why = (f"{top['name']} ran at {top['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s, above the cached "
           f"{top['dtype']} roof {top['peak_flops_per_s'] / 1e9:.1f} GFLOP/s")
    try:
        fresh = measured_ceilings("cpu", "quick" if choice == "quick" else "full", refresh=True)
    except Exception as exc:  # keep the roofline made with the cached roofs
        return ceilings.with_details(remeasure_failed=f"{why}; {type(exc).__name__}: {exc}")
    return fresh.with_details(remeasured_because=why)


def write_roofline(trace: Any, plan: CapturePlan, choice: str, out_dir: Path) -> tuple[Optional[Path], Optional[str]]:
    """roofline.csv, or (None, reason) with roofline_missing.txt written."""
    path, reason, _, _ = write_roofline_with_ceilings(trace, plan, choice, out_dir)
    return path, reason


def write_roofline_with_ceilings(trace: Any, plan: CapturePlan, choice: str, out_dir: Path
                                 ) -> tuple[Optional[Path], Optional[str], Optional[Any], Optional[Path]]:
    """As `write_roofline`, plus the Ceilings the table was made against (None when it was not),
    so the summary can say which roofs (measured or datasheet, with their values) were used, and
    roofline_modules.csv's path (None when no op named its module)."""
    ceilings, reason = ceilings_for(plan, choice)
    table = modules = None
    if reason is None:
        try:
            from profiler.analysis import roofline as rl
        except ImportError as exc:
            reason = f"roofline analysis unavailable ({exc})"
        else:
            if ceilings is None:
                ceilings, reason = rl.resolve_ceilings(
                    trace, None, hint="choose measured (or quick) ceilings for this machine, e.g. --ceilings measured")
            if ceilings is not None:
                table, modules = rl.roofline_tables(trace, ceilings, ROOF_DTYPES.get(plan.autocast or plan.dtype, "fp32"))
                over = above_compute_roof(table) if not plan.is_cuda and choice in ("measured", "quick") else None
                if over is not None and len(over) and (again := remeasured(ceilings, choice, over)) is not ceilings:
                    ceilings = again
                    table, modules = rl.roofline_tables(trace, ceilings, ROOF_DTYPES.get(plan.autocast or plan.dtype, "fp32"))
                if table.empty:
                    reason = empty_roofline_reason(trace, plan)
    if table is None or table.empty:
        (out_dir / "roofline_missing.txt").write_text(f"{reason}\n")
        return None, reason, None, None
    path = out_dir / "roofline.csv"
    table.to_csv(path, index=False)
    if modules.empty:
        return path, None, ceilings, None
    modules.to_csv(out_dir / MODULES_CSV, index=False)  # per nn.Module (forward and backward ops together)
    return path, None, ceilings, out_dir / MODULES_CSV


def empty_roofline_reason(trace: Any, plan: CapturePlan) -> str:
    """Why no op made it into the roofline table: the pass was off, the profiled steps ran no op
    (a forward that returns without touching a tensor), none was joined to the pass, or those
    joined did no work (views only) in measurable time (`roofline_points` drops such rows)."""
    if not plan.flops:
        return "no op carries FLOPs and bytes: the FLOPs pass was off"
    ops = trace.events[trace.events["kind"] == "cpu_op"]
    if ops.empty:
        return "the profiled steps ran no tensor op (nothing to place on the roofline)"
    if ops["flops"].isna().all():
        return "no op carries FLOPs and bytes (none of the profiled ops was joined to the FLOPs pass)"
    return "the profiled ops did no FLOPs and moved no bytes (views only), or took no measurable time"


def summarise(result: CaptureResult) -> dict[str, Any]:
    """Small JSON-ready summary: counts, step time, FLOPs and bytes (lower bound), top ops."""
    ev = result.trace.events
    steps = ev[ev["name"].astype(str).str.startswith("ProfilerStep#")]
    ops = ev[ev["kind"] == "cpu_op"]
    costed = ops[ops["flops"].notna()]
    def top_by(key: str) -> list:
        rows = costed[costed[key].notna()]
        table = (rows.groupby(key, observed=True)
                 .agg(calls=("dur_us", "size"), total_us=("dur_us", "sum"), flops=("flops", "sum"),
                      bytes_moved=("bytes_moved", "sum"))
                 .sort_values("total_us", ascending=False).head(10).reset_index())
        return plain(table.to_dict(orient="records"))

    return {
        "events": int(len(ev)), "events_by_kind": {str(k): int(v) for k, v in ev["kind"].value_counts().items() if v},
        "ranks": list(result.trace.ranks), "profiled_steps": int(steps["name"].nunique()),
        "step_time_us_median": float(steps["dur_us"].median()) if len(steps) else None,
        "flops_total": float(costed["flops"].sum()),
        "bytes_moved_total": float(costed["bytes_moved"].sum()),
        "bytes_note": "bytes_moved: algorithmic lower bound (inputs + outputs of each op, views excluded)",
        "top_ops_by_time": top_by("name"),
        "top_modules_by_time": top_by("module"),  # each module's own ops, forward and backward
    }


def with_ceilings(trace: Trace, ceilings_json: Optional[Mapping[str, Any]]) -> Trace:
    """`trace` whose meta["capture"] records the roofs its roofline was made against (as
    summary.json's roofline_ceilings), so later analyses of the Trace (`analyze DIR`, the
    dashboard's pages) reuse them; `trace` itself when there were none."""
    if not ceilings_json:
        return trace
    meta = dict(trace.meta)
    meta["capture"] = {**dict(meta.get("capture") or {}), "roofline_ceilings": dict(ceilings_json)}
    return Trace(trace.events, meta, trace.memory, trace.counters)


def write_outputs(result: CaptureResult, plan: CapturePlan, out_dir: Path, ceilings: str = "measured",
                  extra: Optional[dict] = None) -> dict[str, Any]:
    """Write trace/ (Parquet + meta.json), roofline.csv (or why not) and summary.json."""
    out_dir = Path(out_dir)
    clear_outputs(out_dir, REPORT_OUTPUTS)  # an earlier run's roofline must not sit beside this one's
    roof, roof_reason, used, modules = write_roofline_with_ceilings(result.trace, plan, ceilings, out_dir)
    trace = with_ceilings(result.trace, plain(used.to_json()) if used is not None else None)
    files = {f"trace_{k}": str(p) for k, p in save_trace(trace, out_dir / "trace").items()}
    files["kineto_json"] = sorted(str(p) for p in out_dir.glob("kineto_rank*.pt.trace.json"))
    files["roofline"] = str(roof) if roof else str(out_dir / "roofline_missing.txt")
    if modules:
        files["roofline_modules"] = str(modules)
    summary = {**(extra or {}), "plan": plain(plan.__dict__), "files": files,
               "sources_off": dict(result.sources_off), "roofline_missing": roof_reason,
               "warnings": list((result.trace.meta.get("capture") or {}).get("warnings") or []),
               "roofline_ceilings": plain(used.to_json()) if used is not None else None,
               "timings_s": dict(result.timings), "capture": plain(result.trace.meta.get("capture", {})),
               **summarise(result)}
    summary_path = write_json(out_dir / "summary.json", summary)
    summary["files"]["summary"] = str(summary_path)
    return summary

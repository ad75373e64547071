"""`python -m profiler analyze TRACE [TRACE...] [--json OUT] [--compare OTHER...]`.

Loads the trace(s) as one Trace (several files = several ranks), runs every registered analysis
and rule, prints a readable summary (top kernels, breakdowns, findings) and, with `--json`, writes
the versioned report of `profiler.analysis.report_json` (schema in docs/analysis.md). With
`--compare` the OTHER file(s) load as a second Trace and the diff joins the summary and the JSON.
Exit 0 on success, 2 on bad input (one line on stderr, from the CLI's error handling).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from profiler.cli import register_command
from profiler.cli._args import add_max_decompressed, count, max_decompressed_bytes

TOP_KERNELS = 10
NAME_WIDTH = 70


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help=".json/.json.gz trace, a directory, .zip or .tar(.gz) of them (several files = several ranks), "
                        "or a saved Trace folder / capture --out folder")
    p.add_argument("--json", metavar="OUT", type=Path, help="write every analysis as versioned JSON to OUT")
    p.add_argument("--compare", nargs="+", metavar="OTHER", help="trace file(s) to diff against (B vs A=TRACE)")
    p.add_argument("--top", type=count, default=TOP_KERNELS, help=f"kernels to list (default {TOP_KERNELS})")
    p.add_argument("--max-rows", type=count, default=200,
                   help="rows per table under 'analyses' in the JSON (headline tables are complete)")
    add_max_decompressed(p)


def _short(name: Any, width: int = NAME_WIDTH) -> str:
    s = " ".join(str(name).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _fmt(x: Any, spec: str = ",.1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _pct(x: Any) -> str:
    return "n/a (no communication)" if x is None else f"{x:.0f}%"


def _top_cpu_ops(report: dict[str, Any], top: int) -> list[str]:
    """The ops with the most CPU self time (from the attribution op table), for traces without GPU work."""
    table = ((report.get("analyses") or {}).get("attribution") or {}).get("ops") or {}
    rows = sorted(table.get("records") or [], key=lambda r: -(r.get("cpu_self_us") or 0.0))
    rows = [r for r in rows if (r.get("cpu_self_us") or 0.0) > 0][:top]
    if not rows:
        return []
    out = ["", f"top CPU ops by self time (of {table.get('total_rows', len(rows)):,} ops):",
           f"  {'self µs':>12} {'total µs':>12} {'calls':>8}  name"]
    for r in rows:
        out.append(f"  {r['cpu_self_us']:>12,.1f} {r.get('cpu_total_us') or 0.0:>12,.1f} {r.get('calls') or 0:>8,}  "
                   f"{_short(r['name'])}")
    return out


def _roofline_lines(report: dict[str, Any], top: int) -> list[str]:
    """Where the time above the roof is: the op types and modules with the most headroom, when the
    trace carries FLOPs and bytes and has roofs (a capture folder; nothing for a plain upload)."""
    roof = (report.get("analyses") or {}).get("roofline") or {}
    ceilings = roof.get("ceilings") or {}
    out: list[str] = []
    for key, label, name_of in (("by_op_type", "op types", lambda r: r["name"]),
                                ("by_module", "modules (own ops, forward + backward)", lambda r: r["module"])):
        rows = sorted(((roof.get(key) or {}).get("records") or []), key=lambda r: -(r.get("headroom_us") or 0.0))[:top]
        if not rows:
            continue
        if not out:
            out += ["", f"roofline against {ceilings.get('source', '?')} roofs "
                        f"(bytes: algorithmic lower bound; headroom = time - time at the roof):"]
        out += [f"top {label} by headroom:", f"  {'headroom µs':>12} {'time µs':>12} {'% of roof':>9} {'bound':<7}  name"]
        out += [f"  {r['headroom_us'] or 0.0:>12,.1f} {r['dur_us'] or 0.0:>12,.1f} {r['pct_of_roof'] or 0.0:>8.3g}% "
                f"{str(r['bound']):<7}  {_short(name_of(r))}" for r in rows]
    return out


def summary_lines(report: dict[str, Any], top: int = TOP_KERNELS) -> list[str]:
    """The terminal summary, built from the report dict only (so it shows what the JSON holds)."""
    t = report["trace"]
    lines = [f"trace: {', '.join(t['sources'])}  ranks: {t['ranks']}  events: {t['events']:,}"]
    unread = t.get("unread_events") or {}
    if unread:  # kept out of every analysis: say so before the numbers
        from profiler.trace.summary import unread_line

        lines.append(f"not read: {unread_line(unread)}")
    kb = report.get("kernel_breakdown") or []
    total = sum(r["total_us"] for r in kb) or 0.0
    if kb:
        lines += ["", f"top kernels (of {len(kb):,} names, {total:,.0f} µs of GPU time):",
                  f"  {'total µs':>12} {'share':>6} {'count':>8}  {'type':<13} name"]
        for r in kb[:top]:
            share = r["total_us"] / total if total else 0.0
            lines.append(f"  {r['total_us']:>12,.1f} {share:>6.1%} {r['count']:>8,}  "
                         f"{str(r['kernel_type']):<13} {_short(r['name'])}")
    else:
        lines += ["", "no GPU activity (kernels, memcpy, memset) in this trace: a CPU-only run; GPU views are empty"]
        lines += _top_cpu_ops(report, top)
    ktb = report.get("kernel_type_breakdown") or {}
    overlap = report.get("comm_comp_overlap_pct") or {}
    if kb:  # the GPU views
        if ktb:
            lines += ["", "kernel types: " + ", ".join(f"{k} {v:,.0f} µs" for k, v in ktb.items())]
        for rank, v in (report.get("temporal") or {}).items():
            span = v["span_us"] or 0.0
            pct = (lambda x: f"{100 * x / span:.0f}%" if span and x is not None else "n/a")
            lines.append(f"rank {rank} GPU span {_fmt(span, ',.0f')} µs: compute {pct(v['compute_us'])}, "
                         f"non-compute {pct(v['non_compute_us'])}, idle {pct(v['idle_us'])}; "
                         f"comm/compute overlap {_pct(overlap.get(rank))}")
    else:  # a CPU run: only a CPU process group's collectives (gloo) have an overlap to show
        cpu_overlap = [f"rank {rank} (CPU collectives): comm/compute overlap {_pct(v)}"
                       for rank, v in overlap.items() if v is not None]
        lines += ([""] + cpu_overlap) if cpu_overlap else []
    steps = report.get("step_breakdown") or []
    if steps:
        cats = [k for k in steps[0] if k.endswith("_us") and k not in ("start_us", "end_us", "duration_us")]
        dur = sum(s["duration_us"] or 0.0 for s in steps)
        if dur > 0:
            parts = ", ".join(f"{c.removesuffix('_us')} {100 * sum(s[c] or 0.0 for s in steps) / dur:.0f}%" for c in cats)
            lines.append(f"step time ({len(steps)} step window(s), {dur:,.0f} µs): {parts}")
    lines += _roofline_lines(report, top)
    findings = report.get("findings") or []
    lines += ["", f"findings ({len(findings)}; each saving is for that fix alone, they overlap):"
              if findings else "findings: none"]
    for f in findings:
        pct = f["est_saving_pct"]
        lines.append(f"  [{f['severity']}] {f['rule']}: {f['message']} "
                     f"(est. saving {f['est_saving_us']:,.0f} µs{'' if pct is None else f', {pct:.1f}% of step'})")
    if "diff" in report:
        lines += _diff_lines(report, top)
    if report.get("errors"):
        lines += ["", "analyses that failed: " + "; ".join(f"{k}: {v}" for k, v in report["errors"].items())]
    return lines


def _diff_lines(report: dict[str, Any], top: int) -> list[str]:
    """B vs A: median step time, then the kernels by |Δ time|; for CPU-only traces (no kernel on
    either side) the ops by |Δ CPU time| instead, which is where their change is."""
    d = report["diff"]
    tot = d["totals"]
    lines = ["", f"diff vs {', '.join(report['compare_trace']['sources'])} (B; A = this trace):"]
    if tot.get("step_us_a") is not None and tot.get("step_us_b") is not None:
        pct = "" if tot.get("delta_step_pct") is None else f" ({tot['delta_step_pct']:+.1f}%)"
        lines.append(f"  median step {tot['step_us_a']:,.0f} -> {tot['step_us_b']:,.0f} µs{pct}")
    if tot["kernel_count_a"] or tot["kernel_count_b"]:
        lines.append(f"  kernel time {tot['kernel_us_a']:,.0f} -> {tot['kernel_us_b']:,.0f} µs "
                     f"({tot['delta_kernel_us']:+,.0f}); {len(d['new_kernels'])} new, "
                     f"{len(d['vanished_kernels'])} vanished kernel names")
        rows, key, base = d["kernels"], "delta_us", "total_us_a"
    else:
        lines.append("  no GPU kernels in either trace: ops by change of CPU time (inclusive, all calls):")
        rows = sorted(d["ops"], key=lambda r: -abs(r["delta_cpu_us"]))
        key, base = "delta_cpu_us", "cpu_us_a"
    for r in rows[:top]:
        pct = f" ({100.0 * r[key] / r[base]:+.0f}%)" if r.get(base) else ""
        lines.append(f"  {r[key]:>+12,.1f} µs{pct} {r['status']:<8} {_short(r['name'])}")
    return lines


def check_json_target(out: Path) -> None:
    """Refuse an --json OUT that cannot be a file before any work is done (a folder, an empty name)."""
    from profiler.errors import FusionLensError

    if out.is_dir() or not out.name or out.name in (".", ".."):
        raise FusionLensError(f"--json {out}: is a directory; give a file path such as {out / 'report.json'}")


def write_json(report: dict[str, Any], out: Path) -> None:
    """Strict JSON (no NaN), written atomically (a temporary sibling, then a rename)."""
    from profiler.errors import FusionLensError

    check_json_target(out)
    text = json.dumps(report, allow_nan=False, ensure_ascii=False, indent=1)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        raise FusionLensError(f"--json {out}: cannot write it: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):  # a parent that is a file: nothing was written
            tmp.unlink(missing_ok=True)


@register_command("analyze", "Run every analysis and rule on trace(s); print a summary, optionally write JSON",
                  _add_arguments)
def run(args: argparse.Namespace) -> int:
    from profiler.analysis.report_json import build_report
    from profiler.capture.artifacts import load_traces_or_saved  # trace files, or a capture's saved Trace

    if args.json:
        check_json_target(args.json)
    limit = max_decompressed_bytes(args)
    trace = load_traces_or_saved(args.traces, max_decompressed_bytes=limit)
    other = load_traces_or_saved(args.compare, max_decompressed_bytes=limit) if args.compare else None
    report = build_report(trace, compare=other, max_rows=args.max_rows)
    print("\n".join(summary_lines(report, args.top)))
    if args.json:
        write_json(report, args.json)
        print(f"\nwrote {args.json}")
    return 0

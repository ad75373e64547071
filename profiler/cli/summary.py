"""`python -m profiler summary TRACE [TRACE...] [--json OUT]`: load traces, print a short summary."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from profiler.cli import register_command
from profiler.cli._args import add_max_decompressed, max_decompressed_bytes


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help=".json/.json.gz trace, a directory, .zip or .tar(.gz) of them (several files = several ranks), "
                        "or a capture's output folder")
    p.add_argument("--json", metavar="OUT", type=Path, help="also write the summary as a JSON object")
    add_max_decompressed(p)


@register_command("summary", "Load trace(s) as one Trace and print a short summary", _add_arguments)
def run(args: argparse.Namespace) -> int:
    from profiler.capture.artifacts import load_traces_or_saved
    from profiler.trace.summary import summarize, unread_line

    # as `analyze`: a capture's folder (or its trace/ folder) opens its saved Parquet Trace
    trace = load_traces_or_saved(list(args.traces), max_decompressed_bytes=max_decompressed_bytes(args))
    s = summarize(trace)
    print(f"trace: {', '.join(s['sources'])}")
    if s["devices"]:
        print(f"device: {' '.join(s['devices'])}")
    print(f"ranks: {s['ranks']}   events: {s['events']:,}   span: {s['span_us'] / 1e3:,.3f} ms")
    print(f"kernels: {s['kernel_count']:,} ({s['unique_kernels']:,} unique), "
          f"total {s['kernel_total_us'] / 1e3:,.3f} ms on {s['streams']} stream(s)")
    print("by kind: " + ", ".join(f"{k}={v:,}" for k, v in s["events_by_kind"].items()))
    if s["steps"]:
        print(f"steps: {s['steps'][0]}..{s['steps'][-1]} ({len(s['steps'])})")
    if s["skipped_events"]:
        why = "; ".join(f"{k} x{v}" for k, v in s["skipped_reasons"].items())
        print(f"skipped events: {s['skipped_events']:,} ({why})")
    if s["unread_events"]:  # events of kinds FusionLens does not model: kept out of every view
        print(f"not read: {unread_line(s['unread_events'])}")
    for line in s["passed_over_files"]:  # JSON found beside the traces that is not one
        print(f"passed over: {line}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(s, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0

#!/usr/bin/env python3
"""Make a large, realistic Kineto trace by repeating a real one in time (for ingestion benchmarks).

Copy k of every timed event is shifted by k * (span + gap) µs and its ids (correlation, External
id, flow id, ...) are offset by k * (max id + 1), so flows and correlations stay unique and still
link. Metadata (`ph: M`) and the top-level keys are written once. Copies are added until the output
reaches `--target-mb` of uncompressed JSON (or exactly `--copies`). One event per line, as Kineto
writes them.

    python benchmarks/make_big_trace.py SRC.json[.gz] OUT.json --target-mb 500
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import orjson

ID_KEYS = ("correlation", "External id", "external id", "Ev Idx", "Python id", "Python parent id")


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = orjson.loads(raw)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    return doc


def _shift(ev: dict, k: int, period_us: float, stride: int) -> dict:
    out = dict(ev)
    out["ts"] = ev["ts"] + k * period_us
    if isinstance(ev.get("id"), int):
        out["id"] = ev["id"] + k * stride
    args = ev.get("args")
    if isinstance(args, dict) and any(isinstance(args.get(key), int) for key in ID_KEYS):
        args = dict(args)
        for key in ID_KEYS:
            if isinstance(args.get(key), int) and args[key] >= 0:
                args[key] += k * stride
        out["args"] = args
    return out


def make_big_trace(src: Path, out: Path, target_bytes: int | None = None, copies: int | None = None,
                   gap_us: float = 1000.0) -> tuple[int, int]:
    """Write the tiled trace; returns (copies written, bytes written)."""
    doc = _read(src)
    events = doc.get("traceEvents", [])
    def is_timed(e: dict) -> bool:
        return isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"

    timed = [e for e in events if isinstance(e, dict) and is_timed(e)]
    static = [e for e in events if isinstance(e, dict) and not is_timed(e)]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + float(e.get("dur", 0) or 0) for e in timed)
    period = (t1 - t0) + gap_us
    max_id = 0
    for e in timed:
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
        args = e.get("args")
        if isinstance(args, dict):
            for key in ID_KEYS:
                if isinstance(args.get(key), int):
                    max_id = max(max_id, args[key])
    stride = max_id + 1
    body = {k: v for k, v in doc.items() if k != "traceEvents"}
    head = json.dumps(body, indent=1)[:-1].rstrip()
    head = (head + ",\n" if body else "{\n") + '  "traceEvents": [\n'
    written, k = 0, 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(head.encode())
        first = True
        for e in static:
            fh.write((b"" if first else b",\n") + b"  " + orjson.dumps(e))
            first = False
        written = fh.tell()
        while (copies is not None and k < copies) or (copies is None and written < (target_bytes or 0)):
            for e in timed:
                fh.write((b"" if first else b",\n") + b"  " + orjson.dumps(_shift(e, k, period, stride)))
                first = False
            k += 1
            written = fh.tell()
        fh.write(b"\n  ]\n}\n")
        written = fh.tell()
    tmp.replace(out)
    return k, written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--target-mb", type=float, default=500.0)
    ap.add_argument("--copies", type=int, default=None, help="exact number of copies (overrides --target-mb)")
    ap.add_argument("--gap-us", type=float, default=1000.0)
    a = ap.parse_args(argv)
    k, n = make_big_trace(a.src, a.out, int(a.target_mb * 1e6), a.copies, a.gap_us)
    print(f"wrote {a.out}: {k} copies, {n / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which `hf:MODEL_TYPE` specs build and train: every text LM type transformers knows, at a preset.

Not a timed benchmark: a compatibility sweep behind the count in docs/capture.md. Each type is
built with `profiler.capture.hf.build_hf` (its default config shrunk to the preset), then one
forward with labels and one backward run; a type gets --timeout-s seconds (SIGALRM). Rows
(model_type, head, status, parameters, seconds, error) go to benchmarks/results/hf_sweep.csv,
replacing the file, with transformers' version and the date in every row.

    .venv/bin/python benchmarks/hf_sweep.py [--size tiny] [--timeout-s 20] [TYPE ...]
"""
from __future__ import annotations

import argparse
import csv
import signal
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler.capture.hf import auto_model_types, build_hf  # noqa: E402


class _TimedOut(Exception):
    pass


def _alarm(*_):
    raise _TimedOut()


def sweep_one(model_type: str, size: str, timeout_s: int) -> dict:
    t0 = time.perf_counter()
    row = {"model_type": model_type, "head": auto_model_types().get(model_type, ""), "status": "ok",
           "parameters": "", "error": ""}
    signal.alarm(timeout_s)
    try:
        model, inputs = build_hf(f"hf:{model_type}", model_type, size=size)
        row["parameters"] = sum(p.numel() for p in model.parameters())
        model(**inputs).loss.backward()
    except _TimedOut:
        row.update(status="timeout", error=f"over {timeout_s} s")
    except Exception as exc:  # a sweep: every failure is a row
        row.update(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    finally:
        signal.alarm(0)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("types", nargs="*", help="model types (default: all text LM types transformers knows)")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--timeout-s", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hf_sweep.csv"))
    args = ap.parse_args(argv)
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    signal.signal(signal.SIGALRM, _alarm)
    types = args.types or list(auto_model_types())
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    rows = []
    for t in types:
        row = {"date": stamp, "transformers": transformers.__version__, "size": args.size, **sweep_one(t, args.size, args.timeout_s)}
        rows.append(row)
        print(f"{t:32s} {row['status']:8s} {row['parameters']!s:>11s} {row['seconds']:6.2f}s {row['error'][:90]}", flush=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok} of {len(rows)} build and train at {args.size} (transformers {transformers.__version__}) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

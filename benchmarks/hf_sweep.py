"""Which `hf:MODEL_TYPE` specs build and train: every text LM type transformers knows, at a preset.

Not a timed benchmark: a compatibility sweep behind the count in docs/capture.md. Each type is built
as a capture builds it (`load_spec` and the runner's `prepare`: its default config shrunk to the
preset, in --dtype), then one forward with labels and one backward run; a type gets --timeout-s
seconds (SIGALRM). With --capture, each type that trains is also captured as a user would (`python
-m profiler capture hf:TYPE --size SIZE --mode MODE --dtype DTYPE --steps 1 --ceilings quick`, in
this process; --mode infer takes the no-grad forward path, other code in some models; --dtype
bfloat16 or float16 builds the model in that precision) and the row keeps the share of its recorded
ops the join matched to profiled ones. Rows (model_type, head, dtype, status, parameters, seconds,
error, captured, joined, warnings: the capture's numeric warnings) go to --out (default
benchmarks/results/hf_sweep.csv), replacing the file, with transformers' version and the date in
every row.

    .venv/bin/python benchmarks/hf_sweep.py [--size tiny] [--timeout-s 20] [--capture [--mode infer]] [--dtype bfloat16] [TYPE ...]
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler.capture.backends import CapturePlan  # noqa: E402
from profiler.capture.hf import auto_model_types  # noqa: E402
from profiler.capture.runner import prepare  # noqa: E402
from profiler.capture.spec import load_spec  # noqa: E402


class _TimedOut(Exception):
    pass


def _alarm(*_):
    raise _TimedOut()


def sweep_one(model_type: str, size: str, timeout_s: int, dtype: str = "float32") -> dict:
    t0 = time.perf_counter()
    row = {"model_type": model_type, "head": auto_model_types().get(model_type, ""), "status": "ok",
           "parameters": "", "error": ""}
    signal.alarm(timeout_s)
    try:
        # built and moved as a capture does (fp16/bf16: in that dtype, keeping transformers' fp32 parts)
        loaded = prepare(load_spec(f"hf:{model_type}", size=size, dtype=dtype), CapturePlan(dtype=dtype))
        model, inputs = loaded.model, loaded.inputs
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


def capture_one(model_type: str, size: str, timeout_s: int, mode: str = "train", dtype: str = "float32") -> dict:
    """Capture hf:TYPE through the CLI, in this process: {"captured": "ok" or the error line,
    "joined": the join's match rate}."""
    from profiler.cli import main as cli

    row = {"captured": "ok", "joined": "", "warnings": ""}
    with tempfile.TemporaryDirectory(prefix="fl_hf_capture_") as out:
        said = io.StringIO()
        signal.alarm(timeout_s)
        try:
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
                rc = cli(["capture", f"hf:{model_type}", "--size", size, "--mode", mode, "--dtype", dtype, "--steps", "1",
                          "--ceilings", "quick", "--out", out])
            if rc != 0:
                errors = [line for line in said.getvalue().splitlines() if line.startswith("error")]
                row["captured"] = (errors or [f"exit status {rc}"])[0][:200]
            else:
                summary = json.loads((Path(out) / "summary.json").read_text())
                row["joined"] = round(summary["capture"]["join"]["match_rate"], 4)
                row["warnings"] = " | ".join(summary.get("warnings") or [])[:300]  # steps ran on NaN/inf
        except _TimedOut:
            row["captured"] = f"over {timeout_s} s"
        finally:
            signal.alarm(0)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("types", nargs="*", help="model types (default: all text LM types transformers knows)")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--timeout-s", type=int, default=20)
    ap.add_argument("--capture", action="store_true", help="also capture each type that trains")
    ap.add_argument("--mode", choices=("train", "infer"), default="train", help="the captures' --mode")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                    help="the model's dtype in the build check and the captures")
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
        row = {"date": stamp, "transformers": transformers.__version__, "size": args.size, "mode": args.mode,
               "dtype": args.dtype, **sweep_one(t, args.size, args.timeout_s, args.dtype), "captured": "", "joined": "", "warnings": ""}
        if args.capture and row["status"] == "ok":
            row.update(capture_one(t, args.size, 3 * args.timeout_s, args.mode, args.dtype))
        rows.append(row)
        print(f"{t:32s} {row['status']:8s} {row['parameters']!s:>11s} {row['seconds']:6.2f}s {row['error'][:90]}"
              f"{'' if not args.capture else ' capture ' + str(row['captured'])[:60] + ' joined ' + str(row['joined'])}"
              f"{' NaN/inf: ' + row['warnings'][:60] if row['warnings'] else ''}",
              flush=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok} of {len(rows)} build and train at {args.size} (transformers {transformers.__version__}) -> {args.out}")
    if args.capture:
        joined = [r["joined"] for r in rows if r["captured"] == "ok"]
        warned = [r["model_type"] for r in rows if r["warnings"]]
        print(f"{len(joined)} of {ok} capture; ops joined: min {min(joined, default=0):.3f}, "
              f"{sum(j >= 0.97 for j in joined)} at 97% or more; {len(warned)} ran on NaN/inf"
              f"{': ' + ', '.join(warned) if warned else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU capture check (run by benchmarks/gpu_check.sh on a lent NVIDIA GPU; not a timed test).

1. Kineto and the cupti-python tracer capture the same zoo model in SEPARATE subprocesses (CUPTI
   is process-wide) and must agree on kernel count (exactly) and total kernel time (within 5%).
2. The NVML sampler runs at ~50 Hz (achieved rate per device within 45-55 Hz) while the GPU
   measures its ceilings (device-timed matmul per dtype, copy/triad).
3. The measured ceilings are printed beside the device table's dense datasheet figures.

Writes three files under --out: `capture_check.json` (everything), `capture_check.csv` (long
format, harness columns, date and GPU name in every row) and `capture_check.md` (the tables to
commit). Run directories, raw traces, per-kernel CSVs, NVML samples and the ceilings cache go to
--scratch (the lent machine returns at most 8 files from $OUT). Exit 0 when every check passes,
1 when one fails, 2 when there is no CUDA device.
Usage: python benchmarks/gpu/capture_check.py --out "$OUT" --scratch DIR [--spec gpt2] [--mode train]
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

KERNEL_TIME_TOLERANCE = 0.05
NVML_HZ_RANGE = (45.0, 55.0)


def _summary(result, backend: str, out_dir: Path) -> dict:
    """Kernel count/time, op linkage, NVML counter rate and (kineto) a roofline head, as JSON."""
    trace = result.trace
    ev = trace.events
    kernels = ev[ev["kind"] == "kernel"]
    per_name = kernels.groupby(kernels["name"].astype(str))["dur_us"].agg(["size", "sum"])
    per_name.sort_values("sum", ascending=False).to_csv(out_dir / f"kernels_{backend}.csv")
    counters = trace.counters
    nvml_hz = {}
    for device, rows in counters.groupby("device", observed=True):
        ticks = rows["ts_us"].drop_duplicates().sort_values()
        if len(ticks) > 1:
            nvml_hz[str(device)] = (len(ticks) - 1) / ((ticks.iloc[-1] - ticks.iloc[0]) / 1e6)
    out = {"backend": backend, "kernel_count": int(len(kernels)), "kernel_time_us": float(kernels["dur_us"].sum()),
           "memcpy_count": int((ev["kind"] == "gpu_memcpy").sum()), "memset_count": int((ev["kind"] == "gpu_memset").sum()),
           "kernels_with_external_id": int(kernels["external_id"].notna().sum()),
           "kernels_with_flops": int(kernels["flops"].notna().sum()),
           "kernels_with_module": int(kernels["module"].notna().sum()),
           "cpu_ops": int((ev["kind"] == "cpu_op").sum()),
           "sources_off": dict(result.sources_off), "timings_s": dict(result.timings),
           "device_properties": [dict(p) for p in trace.meta.get("device_properties", ())][:1],
           "nvml_counter_hz_in_capture": nvml_hz, "kernel_names": sorted(str(n) for n in kernels["name"].unique()),
           "top_kernels": per_name.sort_values("sum", ascending=False).head(8)
           .reset_index().to_dict("records")}
    from profiler.analysis.roofline import roofline

    roof = roofline(trace)
    out["roofline"] = {"ceilings": roof.ceilings.source if roof.ceilings else None, "reason": roof.reason,
                       "excluded": dict(roof.excluded), "points": int(len(roof.points)),
                       "top_headroom": roof.by_op_type.head(8)[["kind", "name", "dtype", "count", "dur_us", "bound",
                                                               "pct_of_roof", "headroom_us"]].to_dict("records"),
                       "top_modules": (roof.by_module.head(8)[["module", "dtype", "count", "dur_us", "bound", "pct_of_roof",
                                                               "headroom_us"]].to_dict("records")
                                       if roof.by_module is not None else [])}
    return out


def worker(backend: str, spec: str, mode: str, dtype: str, out_dir: Path, result_path: Path,
           device: str = "cuda") -> int:
    """Child process: one capture with one backend, summary JSON to `result_path`."""
    import profiler.capture.cupti_tracer  # noqa: F401  registers the "cupti" backend
    from profiler.capture.backends import CapturePlan
    from profiler.capture.runner import capture

    plan = CapturePlan(device=device, dtype=dtype, mode=mode, wait=1, warmup=1, active=3, backend=backend)
    run_dir = out_dir / f"run_{backend}"  # out_dir: the scratch directory
    t0 = time.perf_counter()
    result = capture(spec, plan, run_dir, progress=lambda d, t, m: print(f"[{backend}] {d}/{t} {m}", flush=True))
    summary = _summary(result, backend, out_dir)
    summary["wall_s"] = time.perf_counter() - t0
    if result.raw_path and Path(result.raw_path).stat().st_size > 30e6:  # keep $OUT small
        Path(result.raw_path).unlink()
    result_path.write_text(json.dumps(summary, indent=1, default=str))
    return 0


def run_worker(backend: str, args: argparse.Namespace) -> dict:
    path = args.scratch / f"capture_{backend}.json"
    cmd = [sys.executable, __file__, "--out", str(args.scratch), "--spec", args.spec, "--mode", args.mode,
           "--dtype", args.dtype, "--worker", backend, "--result", str(path)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.worker_timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"backend": backend, "error": f"timed out after {args.worker_timeout_s} s"}
    print(proc.stdout[-2000:], proc.stderr[-3000:], sep="\n")
    if proc.returncode != 0 or not path.exists():
        return {"backend": backend, "error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return {**json.loads(path.read_text()), "process_s": time.perf_counter() - t0}


def nvml_and_ceilings(out_dir: Path) -> dict:
    """Measure the GPU's ceilings (device timing) while the NVML sampler runs at 50 Hz (out_dir:
    scratch, for the NVML samples and the ceilings cache)."""
    from profiler.capture.ceilings import measured_ceilings
    from profiler.capture.devices import lookup_device
    from profiler.capture.nvml import NvmlSampler
    import torch

    with NvmlSampler(hz=50) as sampler:
        ceil = measured_ceilings("cuda:0", "quick", refresh=True, root=out_dir / "fusionlens")
        time.sleep(0.5)  # idle tail: the sampler keeps its rate with the GPU idle too
    samples = sampler.samples()
    if not samples.empty:
        samples.to_csv(out_dir / "nvml_samples.csv", index=False)
    table = lookup_device(torch.cuda.get_device_name(0))
    roofs = table.ceilings
    rows = {d: {"measured_tflops": v / 1e12,
                "table_tflops": (roofs.peak_for(d) / 1e12) if roofs and roofs.peak_for(d) else None}
            for d, v in ceil.peak_flops_per_s.items()}
    return {"nvml_unavailable": sampler.unavailable_reason, "nvml_hz": sampler.achieved_hz(),
            "nvml_missed_ticks": sampler.missed_ticks, "nvml_unsupported": {f"{k[0]}:{k[1]}": v for k, v in sampler.unsupported.items()},
            "nvml_counters": sorted(set(samples["name"].astype(str))) if not samples.empty else [],
            "ceilings": ceil.to_json(), "per_dtype": rows, "table_entry": table.spec.name if table.spec else None,
            "table_reason": table.reason, "measured_bw_gb_s": ceil.mem_bw_bytes_per_s / 1e9,
            "table_bw_gb_s": roofs.mem_bw_bytes_per_s / 1e9 if roofs else None}


def checks(kineto: dict, cupti: dict, hw: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if "error" in kineto or "error" in cupti:
        out["backends_ran"] = {"ok": False, "detail": f"kineto: {kineto.get('error')}; cupti: {cupti.get('error')}"}
    else:
        kc, cc = kineto["kernel_count"], cupti["kernel_count"]
        out["kernel_count_equal"] = {"ok": kc == cc and kc > 0, "detail": f"kineto {kc} vs cupti {cc}"}
        kt, ct = kineto["kernel_time_us"], cupti["kernel_time_us"]
        rel = abs(ct - kt) / kt if kt else float("inf")
        out["kernel_time_within_5pct"] = {"ok": rel <= KERNEL_TIME_TOLERANCE,
                                          "detail": f"kineto {kt:.1f} us vs cupti {ct:.1f} us ({100 * rel:.2f}%)"}
        kn, cn = set(kineto["kernel_names"]), set(cupti["kernel_names"])  # CUPTI's are demangled by us
        out["kernel_names_equal"] = {"ok": kn == cn, "detail": f"{len(kn)} names; only kineto: {sorted(kn - cn)[:3]}, "
                                                              f"only cupti: {sorted(cn - kn)[:3]}"}
        linked = cupti["kernels_with_external_id"] / max(cc, 1)
        out["cupti_kernels_linked_to_ops"] = {"ok": linked >= 0.9, "detail": f"{100 * linked:.1f}% carry an External id"}
    rates = hw.get("nvml_hz") or {}
    lo, hi = NVML_HZ_RANGE
    out["nvml_rate_50hz"] = {"ok": bool(rates) and all(lo <= r <= hi for r in rates.values()),
                             "detail": hw.get("nvml_unavailable") or {k: round(v, 2) for k, v in rates.items()}}
    return out


def write_csv(out_dir: Path, kineto: dict, cupti: dict, hw: dict, spec: str, now: str) -> None:
    from benchmarks.harness import CSV_COLUMNS, gpu_name, machine

    mach = f"{gpu_name()}; {machine()}"
    rows = []

    def add(variant, shape, metric, value, unit, notes=""):
        rows.append({"date": now, "machine": mach, "benchmark": "capture_check", "variant": variant, "shape": shape,
                     "metric": metric, "p20": value, "p50": value, "p80": value, "unit": unit, "notes": notes})

    for res in (kineto, cupti):
        if "error" not in res:
            add(res["backend"], spec, "kernel_count", res["kernel_count"], "kernels", "3 active steps")
            add(res["backend"], spec, "kernel_time", res["kernel_time_us"], "us", "sum of kernel durations")
    for dtype, row in hw.get("per_dtype", {}).items():
        add("measured", f"matmul {dtype}", "peak_flops", row["measured_tflops"], "TFLOP/s",
            f"table {row['table_tflops']} TFLOP/s dense")
    if hw.get("measured_bw_gb_s"):
        add("measured", "copy/triad", "mem_bw", hw["measured_bw_gb_s"], "GB/s", f"table {hw.get('table_bw_gb_s')} GB/s")
    for device, hz in (hw.get("nvml_hz") or {}).items():
        add("nvml", f"device {device}", "sample_rate", hz, "Hz", "target 50 Hz")
    with (out_dir / "capture_check.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _fmt(value, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(result: dict, gpu: str, now: str) -> str:
    """The tables to commit: ceilings (measured vs datasheet), Kineto vs CUPTI, NVML rate, checks."""
    hw, lines = result["hardware"], [f"### Capture check on {gpu}, {now}", ""]
    lines += [f"spec `{result['spec']}`, mode {result['mode']}, dtype {result['dtype']}; table entry "
              f"{hw.get('table_entry')} ({hw.get('table_reason')})", ""]
    if "error" in hw:
        lines += [f"ceilings/NVML failed: {hw['error']}", ""]
    else:
        lines += ["| roof | measured | datasheet (dense) |", "|---|---|---|"]
        lines += [f"| matmul {d} | {_fmt(r['measured_tflops'])} TFLOP/s | {_fmt(r['table_tflops'])} TFLOP/s |"
                  for d, r in hw["per_dtype"].items()]
        lines += [f"| memory (max of copy, triad) | {_fmt(hw['measured_bw_gb_s'], '.0f')} GB/s | "
                  f"{_fmt(hw['table_bw_gb_s'], '.0f')} GB/s |", ""]
    lines += ["| backend | kernels | kernel time (us) | kernels with External id | wall (s) |", "|---|---|---|---|---|"]
    for res in (result["kineto"], result["cupti"]):
        if "error" in res:
            lines.append(f"| {res['backend']} | failed: {res['error']} | | | |")
        else:
            lines.append(f"| {res['backend']} | {res['kernel_count']} | {res['kernel_time_us']:.1f} | "
                         f"{res['kernels_with_external_id']} | {res.get('process_s', 0):.1f} |")
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {name} | {'PASS' if c['ok'] else 'FAIL'} | {c['detail']} |" for name, c in result["checks"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the three result files go here")
    ap.add_argument("--scratch", type=Path, help="run dirs, raw traces, samples, caches (default: OUT/../capture_scratch)")
    ap.add_argument("--spec", default="gpt2")
    ap.add_argument("--mode", default="train", choices=("train", "infer"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--worker-timeout-s", type=int, default=45)
    ap.add_argument("--device", default="cuda", help="worker device (cpu: a smoke test of the kineto worker)")
    ap.add_argument("--worker", choices=("kineto", "cupti"), help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        return worker(args.worker, args.spec, args.mode, args.dtype, args.out, args.result, args.device)
    args.scratch = args.scratch or args.out.resolve().parent / "capture_scratch"
    args.scratch.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print(f"capture_check: no CUDA device (torch {torch.__version__}); this check needs an NVIDIA GPU")
        return 2
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    gpu = torch.cuda.get_device_name(0)
    kineto = run_worker("kineto", args)
    cupti = run_worker("cupti", args)
    try:
        hw = nvml_and_ceilings(args.scratch)
    except Exception as exc:  # keep the capture comparison even if the ceilings fail
        hw = {"error": f"{type(exc).__name__}: {exc}", "table_entry": None, "table_reason": None}
    result = {"date": now, "gpu": gpu, "spec": args.spec, "mode": args.mode, "dtype": args.dtype,
              "kineto": kineto, "cupti": cupti, "hardware": hw, "checks": checks(kineto, cupti, hw)}
    if "error" in hw:
        result["checks"]["ceilings_measured"] = {"ok": False, "detail": hw["error"]}
    (args.out / "capture_check.json").write_text(json.dumps(result, indent=1, default=str))
    write_csv(args.out, kineto, cupti, hw, args.spec, now)
    md = markdown(result, gpu, now)
    (args.out / "capture_check.md").write_text(md)
    print("\n" + md)
    return 0 if all(c["ok"] for c in result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

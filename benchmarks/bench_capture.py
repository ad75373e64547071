"""Capture overhead: a profiled steady-state step vs the same step unprofiled, on the zoo models.

Variants, interleaved round by round (harness protocol), per model:
- eager:          the step with no profiler (the baseline);
- kineto:         torch.profiler active (CPU activity; + CUDA on GPU), no shapes: the capture's
                  default mode (target: <= 5% over eager; joined ops get their shapes from the
                  untimed cost pass instead);
- kineto+shapes:  record_shapes=True (--shapes);
- +memory:        record_shapes + profile_memory (heavier: one event per allocation);
- +stack:         record_shapes + with_stack (heavier: Python stacks per op).
Each round enters a fresh profiler (untimed), runs one warm step, then times `--inner` steps;
the ratio variant/eager is taken per round, then summarised (p20/p50/p80). CPU (process) time is
the robust number on a shared machine; wall time is what users feel.

The one-off costs of `runner.capture` (untimed FLOPs pass, trace export, load, join) are reported
separately from one full capture per model.

    .venv/bin/python benchmarks/bench_capture.py [--models gpt2,llama] [--size small] [--mode train]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks.harness import Timing, append_rows, percentiles, print_table  # noqa: E402
from profiler.capture.backends import CapturePlan  # noqa: E402
from profiler.capture.runner import capture, make_step, prepare  # noqa: E402
from profiler.capture.spec import load_spec  # noqa: E402
from profiler.capture.zoo import zoo_models  # noqa: E402

VARIANTS = {
    "eager": None,
    "kineto": dict(record_shapes=False),
    "kineto+shapes": dict(record_shapes=True),
    "+memory": dict(record_shapes=True, profile_memory=True),
    "+stack": dict(record_shapes=True, with_stack=True),
}


def _context(opts: dict | None, cuda: bool):
    if opts is None:
        return contextlib.nullcontext()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(activities=acts, **opts)


def overhead(name: str, size: str, mode: str, device: str, rounds: int, inner: int) -> Timing:
    """Per-step wall and CPU seconds of every variant, interleaved over `rounds` rounds."""
    plan = CapturePlan(device=device, mode=mode)
    step = make_step(prepare(load_spec(name, size=size), plan), plan)
    for i in range(3):  # warm: allocator, optimizer state, kernel selection
        step(i)
    timing = Timing({v: [] for v in VARIANTS}, {v: [] for v in VARIANTS})
    for _ in range(rounds):
        for variant, opts in VARIANTS.items():
            with _context(opts, plan.is_cuda):
                step(0)  # the first profiled step pays one-off set-up: not steady state
                c0, w0 = time.process_time(), time.perf_counter()
                for i in range(inner):
                    step(i)
                w1, c1 = time.perf_counter(), time.process_time()
            timing.wall_s[variant].append((w1 - w0) / inner)
            timing.cpu_s[variant].append((c1 - c0) / inner)
    return timing


def fixed_costs(name: str, size: str, mode: str, device: str) -> dict[str, float]:
    """Timings of one full capture (FLOPs pass, run, export, load, join), seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        res = capture(name, CapturePlan(device=device, mode=mode), tmp, size=size)
    return dict(res.timings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(sorted(zoo_models())))
    ap.add_argument("--size", default="small")
    ap.add_argument("--mode", default="train", choices=["train", "infer"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, table = [], []
    for name in args.models.split(","):
        shape = f"{name}/{args.size}/{args.mode}/{args.device}"
        t = overhead(name, args.size, args.mode, args.device, args.rounds, args.inner)
        note = f"rounds={args.rounds} inner={args.inner}; per step"
        for metric in ("wall_s", "cpu_s"):
            for variant, xs in getattr(t, metric).items():
                p20, p50, p80 = percentiles(x * 1e3 for x in xs)
                rows.append(dict(benchmark="capture_step", variant=variant, shape=shape,
                                 metric=metric.replace("_s", "_time"), p20=p20, p50=p50, p80=p80, unit="ms", notes=note))
                if variant != "eager":
                    # ratio eager/variant <1 is a slowdown; report overhead = variant/eager - 1
                    r20, r50, r80 = t.ratio("eager", variant, metric)
                    over = [100 * (1 / r - 1) for r in (r80, r50, r20)]
                    rows.append(dict(benchmark="capture_overhead", variant=variant, shape=shape,
                                     metric=f"{metric.replace('_s', '')}_overhead", p20=over[0], p50=over[1],
                                     p80=over[2], unit="%", notes="per-round variant/eager - 1; default mode = kineto (target <= 5%)"))
                    if metric == "cpu_s":
                        table.append([name, variant, percentiles(t.cpu_s["eager"])[1] * 1e3, over[1],
                                      100 * (1 / t.ratio("eager", variant, "wall_s")[1] - 1)])
        fc = fixed_costs(name, args.size, args.mode, args.device)
        for key, value in fc.items():
            rows.append(dict(benchmark="capture_fixed", variant="kineto+flops (default)", shape=shape, metric=key,
                             p20=value, p50=value, p80=value, unit="s", notes="one full capture (5 steps), single run"))
        table.append([name, "fixed: flops pass / export / load (s)", fc.get("flops_pass_s", 0.0),
                      fc.get("export_s", 0.0), fc.get("load_s", 0.0)])
    print_table(f"capture overhead per step ({args.size}, {args.mode}, {args.device}; threads={torch.get_num_threads()})",
                ["model", "variant", "eager cpu ms", "cpu overhead %", "wall overhead %"], table)
    path = append_rows("capture.csv", rows)
    print(f"\nappended {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()

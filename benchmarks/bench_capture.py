"""Capture overhead: a profiled steady-state step vs the same step unprofiled, on the zoo models.

Variants (settings from `profiler.capture.kineto.profiler_options` and the capture's own per-step
`ProfilerStep#N` marker `kineto.step_marker`, i.e. exactly what a capture's active steps run):
- eager:           the step with no profiler (the baseline);
- kineto:          the default capture mode (no shapes/memory/stack; target <= 5% over eager);
- kineto-before:   the default before 2026-11-30: torch's schedule with `prof.step()` after every
                   step (its Python `record_function` marker) and external correlation on;
- kineto-profstep: today's settings with `prof.step()` markers (the marker lever alone);
- kineto-extcorr:  today's markers with external correlation on (that lever alone);
- +shapes, +memory, +stack: the heavier modes (`--shapes`, `--memory`, `--stack`).

Protocol (benchmarks/harness.py conventions, plus what a fair A/B of a profiler needs):
- one model, optimizer and allocator state for all variants (same step function, same train or
  inference mode), warmed by 3 unprofiled steps;
- per round, every variant: `gc.collect()`, enter its profiler (untimed), one untimed step (the
  first profiled step pays one-off set-up), then `inner` timed steps; profiler exit, trace
  building and freeing are outside the timed block;
- the variant order rotates every round, so no variant always follows a heavy one;
- `inner` grows until a block is >= --min-block-ms of the eager step (short blocks are mostly
  scheduler noise on a shared machine);
- ratio variant/eager per round, then p20/p50/p80; process CPU time (all threads of this
  process) is the robust number, wall time what users feel; threads and load average recorded.

`--perop` (on by default) first measures the profiler's cost per recorded op on an empty op loop
(`torch.add` on 4-element tensors, one event per call), and the table predicts each model's
overhead as events per step x that cost / the eager step.

    .venv/bin/python benchmarks/bench_capture.py [--models gpt2,llama] [--size small] [--mode train]
        [--variants eager,kineto] [--rounds 9] [--threads 1]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerAction, profile  # noqa: E402

from benchmarks.harness import Timing, append_rows, percentiles, print_table  # noqa: E402
from profiler.capture.backends import CapturePlan  # noqa: E402
from profiler.capture.kineto import profiler_options, quiet_kineto_on_cpu, step_marker  # noqa: E402
from profiler.capture.runner import capture, make_step, prepare  # noqa: E402
from profiler.capture.spec import load_spec  # noqa: E402
from profiler.capture.zoo import zoo_models  # noqa: E402

PLAN_CHANGES = {
    "kineto": {},
    "+shapes": dict(record_shapes=True),
    "+memory": dict(record_shapes=True, profile_memory=True),
    "+stack": dict(record_shapes=True, with_stack=True),
}
ALL_VARIANTS = ("eager", "kineto", "kineto-before", "kineto-profstep", "kineto-extcorr", "+shapes", "+memory", "+stack")
DEFAULT_VARIANTS = ("eager", "kineto", "kineto-before", "+shapes", "+memory", "+stack")
TORCH_STEP = ("kineto-before", "kineto-profstep")  # markers from torch's prof.step()
PEROP_N = 20_000


def options(variant: str, plan: CapturePlan) -> dict | None:
    """`torch.profiler.profile` kwargs of `variant` (None: no profiler)."""
    if variant == "eager":
        return None
    if variant in ("kineto-extcorr", "kineto-before"):
        opts = profiler_options(plan)
        opts["experimental_config"] = None  # torch's default: external correlation on
        return opts
    return profiler_options(dataclasses.replace(plan, **PLAN_CHANGES.get(variant, {})))


def _always_record(step: int) -> ProfilerAction:
    """A schedule that records every step, so `prof.step()` emits ProfilerStep markers."""
    return ProfilerAction.RECORD


def _session(opts: dict | None, torch_step: bool):
    if opts is None:
        return contextlib.nullcontext()
    return profile(schedule=_always_record, **opts) if torch_step else profile(**opts)


def cpu_events(prof) -> int:
    """CPU-side events the profiler recorded (ops, ProfilerStep markers, annotations)."""
    results = prof.profiler.kineto_results if prof is not None and prof.profiler else None
    return 0 if results is None else sum(e.device_type() == DeviceType.CPU for e in results.events())


def _block(step, opts: dict | None, torch_step: bool, inner: int) -> tuple[float, float, float]:
    """(cpu_s, wall_s) per step of `inner` timed steps under `opts`, and events recorded per step.

    Markers: the capture's `step_marker` around each step, or (torch_step) `prof.step()` after it.
    """
    gc.collect()
    run = step if opts is None or torch_step else step_marker(step)
    with _session(opts, torch_step) as prof:
        run(0)  # the first profiled step pays one-off set-up: not steady state
        if torch_step:
            prof.step()
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(inner):
            run(i)
            if torch_step:
                prof.step()
        w1, c1 = time.perf_counter(), time.process_time()
    events = cpu_events(prof) / (inner + 1) if opts is not None else 0
    return (c1 - c0) / inner, (w1 - w0) / inner, events


def _rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def overhead(step, plan: CapturePlan, variants: list[str], rounds: int, inner: int,
             min_block_s: float) -> tuple[Timing, dict[str, float], int]:
    """Interleaved, rotated rounds: per-step seconds per variant, events per step, inner used."""
    for i in range(3):  # warm: allocator, optimizer state, kernel selection
        step(i)
    c0 = time.process_time()
    for i in range(3):
        step(i)
    step_s = (time.process_time() - c0) / 3
    inner = max(inner, math.ceil(min_block_s / max(step_s, 1e-6)))
    opts = {v: options(v, plan) for v in variants}
    timing = Timing({v: [] for v in variants}, {v: [] for v in variants})
    events: dict[str, float] = {}
    for r in range(rounds):
        for v in _rotated(variants, r):
            cpu_s, wall_s, ev = _block(step, opts[v], v in TORCH_STEP, inner)
            timing.cpu_s[v].append(cpu_s)
            timing.wall_s[v].append(wall_s)
            events.setdefault(v, ev)
    return timing, events, inner


def perop_cost(plan: CapturePlan, rounds: int) -> tuple[Timing, dict[str, float]]:
    """Per-call seconds of `torch.add` (4 elements, one event) with no profiler vs each profiler."""
    x, y = torch.ones(4), torch.ones(4)

    def loop(i: int = 0) -> None:
        for _ in range(PEROP_N):
            torch.add(x, y)

    variants = ["eager", "kineto", "kineto-extcorr", "+shapes"]
    timing, events, _ = overhead(loop, plan, variants, rounds, 2, 0.0)  # 1 marker per 20k ops: noise
    for metric in ("cpu_s", "wall_s"):
        for v in variants:
            getattr(timing, metric)[v] = [s / PEROP_N for s in getattr(timing, metric)[v]]
    return timing, {v: e / PEROP_N for v, e in events.items()}


def perop_rows(timing: Timing, events: dict[str, float], shape: str, note: str) -> tuple[list[dict], float]:
    """Rows of the per-op cost (us per op over eager, per round) and the default mode's median."""
    rows = []
    base = timing.cpu_s["eager"]
    cost_us = 0.0
    for v in timing.cpu_s:
        if v == "eager":
            continue
        extra = [1e6 * (a - b) for a, b in zip(timing.cpu_s[v], base)]
        p20, p50, p80 = percentiles(extra)
        cost_us = p50 if v == "kineto" else cost_us
        rows.append(dict(benchmark="capture_perop", variant=v, shape=shape, metric="cpu_us_per_op_over_eager",
                         p20=p20, p50=p50, p80=p80, unit="us",
                         notes=f"{note}; eager {percentiles(base)[1] * 1e6:.3f} us/op; events/op {events.get(v, 0):.3f}"))
    return rows, cost_us


def model_rows(t: Timing, events: dict[str, float], shape: str, note: str) -> list[dict]:
    rows = []
    for metric in ("wall_s", "cpu_s"):
        name = metric.replace("_s", "")
        for variant, xs in getattr(t, metric).items():
            p20, p50, p80 = percentiles(x * 1e3 for x in xs)
            rows.append(dict(benchmark="capture_step", variant=variant, shape=shape, metric=f"{name}_time",
                             p20=p20, p50=p50, p80=p80, unit="ms", notes=note))
            if variant == "eager":
                continue
            over = percentiles(100 * (b / a - 1) for a, b in zip(getattr(t, metric)["eager"], xs))
            rows.append(dict(benchmark="capture_overhead", variant=variant, shape=shape, metric=f"{name}_overhead",
                             p20=over[0], p50=over[1], p80=over[2], unit="%",
                             notes=f"{note}; per-round variant/eager - 1; default = kineto (target <= 5%)"))
    for variant, ev in events.items():
        if variant != "eager":
            rows.append(dict(benchmark="capture_events", variant=variant, shape=shape, metric="cpu_events_per_step",
                             p20=ev, p50=ev, p80=ev, unit="events", notes=note))
    return rows


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
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"eager first, then any of {ALL_VARIANTS[1:]}")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--inner", type=int, default=3, help="minimum timed steps per block")
    ap.add_argument("--min-block-ms", type=float, default=150.0, help="minimum eager CPU time per block")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--no-perop", action="store_true", help="skip the empty-op-loop per-op cost")
    ap.add_argument("--no-fixed", action="store_true", help="skip the one full capture per model")
    ap.add_argument("--dry-run", action="store_true", help="print the table, append no rows")
    args = ap.parse_args()
    quiet_kineto_on_cpu(args.device)  # as the capture CLI: no Kineto start/stop lines per block
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = [v.strip() for v in args.variants.split(",")]
    if variants[0] != "eager" or any(v not in ALL_VARIANTS for v in variants):
        ap.error(f"--variants: eager first, then any of {ALL_VARIANTS[1:]}")
    plan0 = CapturePlan(device=args.device, mode=args.mode)
    rows, table, cost_us = [], [], None
    if not args.no_perop:
        pt, pev = perop_cost(plan0, args.rounds)
        prow, cost_us = perop_rows(pt, pev, f"torch.add 4 elems x {PEROP_N}/{args.device}", f"rounds={args.rounds}")
        rows += prow
        for r in prow:
            table.append(["(empty op loop)", r["variant"], pt.cpu_s["eager"][0] * 1e6, r["p50"], "us/op over eager",
                          "", ""])
    for name in args.models.split(","):
        shape = f"{name}/{args.size}/{args.mode}/{args.device}"
        plan = dataclasses.replace(plan0)
        step = make_step(prepare(load_spec(name, size=args.size), plan), plan)
        t, events, inner = overhead(step, plan, variants, args.rounds, args.inner, args.min_block_ms / 1e3)
        rows += model_rows(t, events, shape, f"rounds={args.rounds} inner={inner} rotated; per step")
        eager_ms = percentiles(t.cpu_s["eager"])[1] * 1e3
        for v in variants[1:]:
            cpu = percentiles(100 * (b / a - 1) for a, b in zip(t.cpu_s["eager"], t.cpu_s[v]))
            wall = percentiles(100 * (b / a - 1) for a, b in zip(t.wall_s["eager"], t.wall_s[v]))
            pred = (f"{100 * events[v] * cost_us * 1e-3 / eager_ms:.1f}" if cost_us is not None and v == "kineto"
                    else "")
            table.append([name, v, eager_ms, f"{cpu[0]:.1f} / {cpu[1]:.1f} / {cpu[2]:.1f}", f"{wall[1]:.1f}",
                          f"{events[v]:.0f}", pred])
        if not args.no_fixed:
            fc = fixed_costs(name, args.size, args.mode, args.device)
            for key, value in fc.items():
                rows.append(dict(benchmark="capture_fixed", variant="kineto+flops (default)", shape=shape, metric=key,
                                 p20=value, p50=value, p80=value, unit="s", notes="one full capture (5 steps), single run"))
    print_table(f"capture overhead per step ({args.size}, {args.mode}, {args.device}; "
                f"threads={torch.get_num_threads()}; rounds={args.rounds})",
                ["model", "variant", "eager cpu ms", "cpu overhead % p20/p50/p80", "wall % p50", "events/step",
                 "predicted %"], table)
    if not args.dry_run:
        path = append_rows("capture.csv", rows)
        print(f"\nappended {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()

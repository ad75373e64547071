"""`python -m profiler capture SPEC ...`: profile a model and write the trace, roofline and summary.

SPEC is a zoo name (gpt2, gpt2-naive, llama, bert, vit, cnn, mlp), `hf:NAME`, `file.py:build` or
`package.module:build`. Writes into --out: the Kineto JSON (Perfetto-openable), the Trace as
Parquet (trace/), roofline.csv per op type and roofline_modules.csv per nn.Module (or
roofline_missing.txt saying why) and summary.json. Progress goes to stderr; bad input is one line
and exit status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from profiler.cli import register_command
from profiler.errors import FusionLensError


class UsageError(FusionLensError):
    """A command-line value that cannot be used."""


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="zoo name, hf:NAME, path/to/file.py:build or package.module:build")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtype", default="float32", type=dtype_name, choices=["float32", "float16", "bfloat16", "float64"],
                   help="model dtype (default float32; bf16, fp16, fp32, fp64, half and double are accepted too)")
    p.add_argument("--autocast", default=None, type=dtype_name, choices=["bfloat16", "float16"],
                   help="mixed precision (AMP): fp32 weights, forward and loss under torch.autocast in this dtype "
                        "(fp16 training adds a GradScaler); off by default")
    p.add_argument("--mode", default="train", choices=["train", "infer"])
    p.add_argument("--steps", type=int, default=3, help="profiled (active) steps (default 3)")
    p.add_argument("--wait", type=int, default=1, help="unprofiled steps first (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps, discarded (default 1)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default <data dir>/captures/SPEC-TIME; the data dir is "
                        "$FUSIONLENS_DATA_DIR or ./.fusionlens)")
    p.add_argument("--nproc", type=int, default=1, help="ranks for a DDP run (gloo on CPU, NCCL on GPU)")
    p.add_argument("--batch", type=int, default=None, help="batch size (zoo, hf, or a build(batch=...) spec)")
    p.add_argument("--size", default="small", help="zoo/hf preset: tiny, small (default) or medium")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="zoo/hf setting, e.g. --set layers=4 --set dim=256 (repeatable)")
    p.add_argument("--backend", default="kineto", help="capture backend: kineto (default) or cupti (GPU)")
    p.add_argument("--memory", action="store_true", help="record memory events (heavier)")
    p.add_argument("--stack", action="store_true", help="record Python stacks (heavier)")
    p.add_argument("--shapes", action="store_true",
                   help="Kineto records every op's shapes (heavier; joined ops get shapes from the FLOPs pass anyway)")
    p.add_argument("--no-flops", action="store_true", help="skip the FLOPs/bytes pass")
    p.add_argument("--no-nvml", action="store_true", help="do not sample NVML counters (GPU)")
    p.add_argument("--ceilings", default="measured", choices=["measured", "quick", "table", "none"],
                   help="roofline ceilings: measured (cached per machine), quick, table (device table) or none")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
                 "bf16": "bfloat16", "fp64": "float64", "double": "float64"}


def dtype_name(value: str) -> str:
    """--dtype value -> the canonical torch name: bf16 -> bfloat16, torch.float16 -> float16."""
    name = value.strip().lower().removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)


def parse_settings(items: list[str]) -> dict[str, Any]:
    """--set KEY=VALUE items -> {key: int | float | bool | str}."""
    from profiler.capture.spec import setting_item

    try:
        return dict(setting_item(item) for item in items)
    except ValueError as exc:
        raise UsageError(f"--set: {exc}") from None


def check_out_dir(out: Path) -> None:
    """Create --out (a folder) before any work, or say in one line why it cannot be one."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create it: {exc.strerror or exc}") from None


def _si(x: float) -> str:
    """1234567 -> '1.23 M' (decimal prefixes)."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g} "


def _progress(quiet: bool):
    def show(done: int, total: int, msg: str) -> None:
        if not quiet:
            print(f"[{done}/{total}] {msg}", file=sys.stderr, flush=True)

    return show


@register_command("capture", "Profile a model spec (zoo, hf:NAME, file.py:build) and write trace, roofline, summary",
                  _add_arguments)
def run(args: argparse.Namespace) -> int:
    if args.nproc == 1:
        from profiler.capture.isolated import prestart

        prestart()  # the capture's process server imports torch now, beside this process's imports
    from profiler.capture.backends import CaptureError, CapturePlan
    from profiler.capture.report import default_out_dir, removed_if_failed, write_outputs

    if args.nproc < 1:
        raise UsageError("--nproc must be >= 1")
    try:
        plan = CapturePlan(device=args.device, dtype=args.dtype, mode=args.mode, wait=args.wait,
                           warmup=args.warmup, active=args.steps, record_shapes=args.shapes,
                           profile_memory=args.memory, with_stack=args.stack, nvml=not args.no_nvml,
                           flops=not args.no_flops, backend=args.backend, autocast=args.autocast)
    except CaptureError as exc:
        raise UsageError(str(exc)) from None
    overrides = parse_settings(args.set)
    from profiler.capture.kineto import quiet_kineto_on_cpu

    quiet_kineto_on_cpu(args.device)
    out = Path(args.out or default_out_dir(args.spec))
    check_out_dir(out)
    show = _progress(args.quiet)
    from profiler.capture.ddp import capture_ranks

    with removed_if_failed(out) if args.out is None else contextlib.nullcontext():  # --out: the user's folder
        result = capture_ranks(args.spec, plan, out, args.nproc, size=args.size, batch=args.batch,
                               overrides=overrides, progress=show)
        show(plan.steps, plan.steps, "writing trace (Parquet), roofline and summary")
        summary = write_outputs(result, plan, out, args.ceilings, {"spec": args.spec, "nproc": args.nproc})
    print(f"captured {args.spec}: {summary['events']} events, ranks {summary['ranks']}, "
          f"median step {summary['step_time_us_median'] or float('nan'):.0f} us, "
          f"{_si(summary['flops_total'])}FLOP, {_si(summary['bytes_moved_total'])}B moved "
          "(algorithmic lower bound)")
    for line in summary["warnings"]:
        print(f"  warning: {line}")
    for name, reason in sorted(summary["sources_off"].items()):
        print(f"  source off: {name}: {reason}")
    if summary["roofline_missing"]:
        print(f"  roofline missing: {summary['roofline_missing']}")
    details = (summary.get("roofline_ceilings") or {}).get("details") or {}
    for key, label in (("remeasured_because", "ceilings re-measured"), ("remeasure_failed", "ceilings not re-measured")):
        if details.get(key):
            print(f"  {label}: {details[key]}")
    roofs = "roofline_missing.txt" if summary["roofline_missing"] else "roofline.csv"
    if "roofline_modules" in summary["files"]:
        roofs += ", roofline_modules.csv"
    print(f"  wrote {out}/ (kineto_rank*.pt.trace.json, trace/, {roofs}, summary.json)")
    return 0

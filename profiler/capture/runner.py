"""Run a model spec under a capture backend and return a Trace with FLOPs, bytes and counters.

`capture(spec, plan, out_dir)`:
1. resolve the spec (spec.py) and move model and inputs to the plan's device and dtype;
2. run one plain step (validates the spec, initialises lazy state such as optimizer moments);
3. run one untimed step under the op-cost recorder (flops.py) when `plan.flops`;
4. run the backend (`plan.backend`, default Kineto) for wait + warmup + active steps, inside the
   NVML sampler on CUDA;
5. join the costs onto the profiled ops (join.py), merge NVML counters, record what was off.

Training mode is forward + backward + optimizer step (AdamW); the loss is `output.loss` when
present, a 0-dim output as is, else the mean of the first tensor output. Inference runs under
`torch.inference_mode()`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import pandas as pd
import torch
from torch.utils._pytree import tree_flatten, tree_map

from profiler.capture.backends import (CaptureError, CapturePlan, CaptureResult, ProgressFn, get_backend,
                                       unavailable_reason)
from profiler.capture.sources import nvml_off_by_plan
from profiler.capture.spec import LoadedModel, SpecError, describe_failure, load_spec
from profiler.trace.model import Trace
from profiler.trace.schema import COUNTER_COLUMNS

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
NVML_HZ = 50


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def loss_of(out: Any) -> torch.Tensor:
    """`out.loss` (or `out["loss"]` of a plain dict, as Lightning-style steps return) if present,
    reduced by its mean when it is per-sample; a 0-dim tensor as is; else the mean of the first
    floating-point tensor output."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor) and loss.is_floating_point():
        return loss if loss.dim() == 0 else loss.float().mean()
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return out
    if isinstance(out, Mapping):
        out = list(out.values())
    first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    if first is None:
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        got = (f"only {', '.join(sorted({str(t.dtype).removeprefix('torch.') for t in tensors}))} tensors" if tensors
               else f"a {type(out).__name__} without tensors")
        raise TypeError(f"the model returned no floating-point tensor to train on ({got})")
    return first.float().mean()


def prepare(loaded: LoadedModel, plan: CapturePlan) -> LoadedModel:
    """Model and inputs on the plan's device and dtype (integer inputs keep their dtype; a spec that
    built itself in the plan's dtype keeps its own precision choices: only moved)."""
    spec = loaded.spec
    if plan.is_cuda and not torch.cuda.is_available():
        raise CaptureError(f"spec {spec!r}: --device cuda requested but no CUDA device is available here")
    index = torch.device(plan.device).index if plan.is_cuda else None
    if index is not None:
        count = torch.cuda.device_count()
        if index >= count:
            raise CaptureError(f"spec {spec!r}: --device {plan.device} requested but this machine has {count} CUDA "
                               f"device{'s' if count != 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    on_meta = [n for n, p in loaded.model.named_parameters() if p.device.type == "meta"]
    if on_meta:
        raise SpecError(f"spec {spec!r}: parameter {on_meta[0]!r} is on the meta device (no data); cannot run it")
    device, dtype = torch.device(plan.device), DTYPES[plan.dtype]

    cast = loaded.dtype != plan.dtype  # else the spec built model and inputs in this dtype itself

    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return t.to(device, dtype) if cast and t.is_floating_point() else t.to(device)

    try:
        model = loaded.model.to(device=device, dtype=dtype) if cast else loaded.model.to(device=device)
        inputs = tree_map(move, dict(loaded.inputs) if isinstance(loaded.inputs, Mapping) else loaded.inputs)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise describe_failure(spec, f"moving the model to {plan.device}/{plan.dtype}", exc) from None
    return dataclasses.replace(loaded, model=model, inputs=inputs)


def adam_eps(params: list[torch.Tensor]) -> float:
    """AdamW's eps for the capture's training step: 1e-8, or 1e-4 when a parameter is fp16, whose
    state then is fp16 too: 1e-8 rounds to 0 there, and an element whose squared grad underflows
    divides 0 by 0, so every pure-fp16 capture trained on NaN weights after its first step."""
    return 1e-4 if any(p.dtype == torch.float16 for p in params) else 1e-8


def make_step(loaded: LoadedModel, plan: CapturePlan, *, recording: bool = False) -> Callable[[int], Any]:
    """step_fn(i): one training step (fwd + bwd + AdamW) or one inference forward, synchronised;
    it returns the loss (training) or the model's output. With `plan.autocast` the forward and the
    loss run under torch.autocast (AMP), and fp16 training scales the loss with a GradScaler, whose
    unscale, inf check and skipped steps are part of such a training step.

    recording=True: the inference step the FLOPs recorder runs, under no_grad instead of
    inference_mode. Under a dispatch mode, inference_mode hands composite ops to the mode whole and
    the views it runs lose requires_grad, so matmul no longer folds a linear on a non-contiguous 3-D
    input into one mm as the real run does (it expanded to bmm: FSMT's seq-first projections
    joined 85% of their ops); under no_grad they decompose before the mode, as ATen runs them."""
    model = loaded.model
    # the plan's GPU: a bare synchronize() waits for the current device only (cuda:0 under --device cuda:1)
    sync = functools.partial(torch.cuda.synchronize, torch.device(plan.device)) if plan.is_cuda else (lambda: None)
    device_type = torch.device(plan.device).type
    amp = (functools.partial(torch.autocast, device_type, dtype=DTYPES[plan.autocast]) if plan.autocast
           else contextlib.nullcontext)
    if plan.mode == "infer":
        model.eval()

        grad_off = torch.no_grad if recording else torch.inference_mode

        def infer_step(i: int) -> Any:
            with grad_off(), amp():
                out = loaded.call()
            sync()
            return out

        return infer_step
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SpecError(f"spec {loaded.spec!r}: the model has no trainable parameters; use --mode infer")
    opt = torch.optim.AdamW(params, lr=1e-4, eps=adam_eps(params))
    scaler = torch.amp.GradScaler(device_type) if plan.autocast == "float16" else None

    def train_step(i: int) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with amp():
            loss = loss_of(loaded.call())
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        sync()
        return loss

    return train_step


# said after a numeric warning of an fp16 capture: its range (max 65504) is what overflows in most models
FP16_HINT = " (fp16 overflows where fp32 would not: --dtype bfloat16 keeps fp32's range)"


def nonfinite_output(out: Any, mode: str, dtype: str = "float32") -> list[str]:
    """[one line] when the first (unprofiled) step's loss, or in inference the mean of its first
    floating-point output, is NaN or inf: the profile then times non-finite arithmetic (and MoE
    routing over NaN scores), not the model's real work; [] otherwise."""
    try:
        value = loss_of(out).detach()
    except TypeError:
        return []
    if bool(torch.isfinite(value).all()):
        return []
    what = "loss" if mode == "train" else "output (mean of its first floating-point tensor)"
    return [f"the first step's {what} was {value.float().item()}: the profiled steps ran non-finite arithmetic"
            + (FP16_HINT if dtype == "float16" else "")]


def nonfinite_parameters(model: torch.nn.Module, dtype: str = "float32") -> list[str]:
    """[one line] naming the parameters holding NaN or inf after the profiled training steps."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module  # named as the user's model
    named = [(n, p) for n, p in model.named_parameters() if p.is_floating_point()]
    bad = [n for n, p in named if not bool(torch.isfinite(p.detach()).all())]
    if not bad:
        return []
    return [f"after the profiled steps {len(bad)} of {len(named)} parameters hold NaN or inf (first: {bad[0]}): "
            "the steps that ran on them timed non-finite arithmetic" + (FP16_HINT if dtype == "float16" else "")]


def unused_parameters(loaded: LoadedModel) -> list[str]:
    """Names of the trainable parameters that get no grad from one training forward and backward
    (run here, untimed, grads cleared after). DDP waits for every parameter's grad unless told
    (find_unused_parameters) which may not come; a failure is one line naming the spec."""
    model = loaded.model
    model.train()
    try:
        loss_of(loaded.call()).backward()
    except Exception as exc:
        raise describe_failure(loaded.spec, "the unused-parameter check (one plain training step)", exc) from None
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


_STEP_LABELS = {-1: "the first (unprofiled) step", -2: "the FLOPs/bytes counting step"}


def step_label(i: int) -> str:
    """How an error names step `i`: profiled steps by number, the two setup steps (-1, -2) in words."""
    return _STEP_LABELS.get(i, f"step {i}")


def guarded(spec: str, step_fn: Callable[[int], Any]) -> Callable[[int], Any]:
    """step_fn whose failures become one-line SpecErrors naming the spec and step."""

    def run(i: int) -> Any:
        try:
            return step_fn(i)
        except (SpecError, CaptureError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise describe_failure(spec, step_label(i), exc) from None

    return run


def _nvml(plan: CapturePlan, off: dict[str, str]) -> Any:
    """An NVML sampler for CUDA plans, else None with the reason in `off`."""
    reason = nvml_off_by_plan(plan)
    if reason:
        off["nvml"] = reason
        return None
    try:
        from profiler.capture.nvml import NvmlSampler
    except ModuleNotFoundError as exc:
        off["nvml"] = f"NVML sampler module unavailable ({exc.name})"
        return None
    return NvmlSampler(hz=NVML_HZ)


def nvml_counters(samples: pd.DataFrame, raw_path: Optional[Path], trace: Trace) -> pd.DataFrame:
    """NVML samples (ts_us in Unix-epoch µs) on the Trace's clock, via Kineto's baseTimeNanoseconds.
    They also go into the Kineto JSON itself as counter tracks (`kineto_counters`), for Perfetto."""
    if samples is None or samples.empty:
        return samples
    base_us = 0.0
    if raw_path is not None and float(samples["ts_us"].max()) > 1e15:
        from profiler.capture.kineto_counters import embed_counters

        base_us = embed_counters(raw_path, samples)
    ts = samples["ts_us"].astype("float64") - base_us - float(trace.meta.get("t0_us", 0.0))
    return samples.assign(ts_us=ts)


def _merge_counters(trace: Trace, extra: Optional[pd.DataFrame]) -> pd.DataFrame:
    if extra is None or extra.empty:
        return trace.counters
    frames = [f for f in (trace.counters, extra[list(COUNTER_COLUMNS)]) if not f.empty]
    merged = pd.concat([f.astype({k: "object" if v == "category" else v for k, v in COUNTER_COLUMNS.items()}) for f in frames],
                       ignore_index=True)
    return merged.astype(COUNTER_COLUMNS)


def _cost_summary(costs: Optional[pd.DataFrame]) -> dict:
    if costs is None:
        return {}
    unknown = costs[costs["rule"] == "unknown"]["name"].value_counts().head(10)
    return {"ops": int(len(costs)), "flops": float(costs["flops"].sum()),
            "bytes_moved": float(costs["bytes_moved"].sum()),
            "unknown_flop_ops": {str(k): int(v) for k, v in unknown.items()}}


def _run_backend(backend: Any, step: Callable[[int], None], plan: CapturePlan, out_dir: Path,
                 say: ProgressFn) -> tuple[CaptureResult, Optional[pd.DataFrame], dict[str, str]]:
    """The backend's capture inside the NVML sampler (CUDA): result, NVML samples, sources off."""
    off: dict[str, str] = {}
    if plan.backend == "kineto":
        cupti_reason = unavailable_reason("cupti")
        off["cupti"] = (f"not used: {cupti_reason}" if cupti_reason else
                        "not used: Kineto is this capture's backend (CUPTI callbacks are process-wide)")
    if not plan.flops:
        off["flops"] = "turned off for this capture"
    sampler = _nvml(plan, off)
    with sampler if sampler is not None else contextlib.nullcontext():
        result = backend.fn(step, plan, out_dir, say)
    samples = None
    if sampler is not None:
        if sampler.unavailable_reason:
            off["nvml"] = sampler.unavailable_reason
        else:
            samples = nvml_counters(sampler.samples(), result.raw_path, result.trace)
    off.update(result.sources_off)
    return result, samples, off


def _flops_source(stats) -> str:
    """What the Trace's flops/bytes_moved columns hold (meta["flops_source"]; ingest's default says
    "none (uploaded trace...)", which a capture overrides)."""
    if stats is None:
        return "none (FLOPs pass off for this capture: flops and bytes_moved are NaN)"
    return (f"FusionLens cost pass (TorchDispatchMode, untimed), joined by order and name to "
            f"{stats.matched_ops:,} of {stats.recorded_ops:,} profiled ops; bytes_moved is an algorithmic lower bound")


COMPILED_REGION = "Torch-Compiled Region"  # Kineto's span around each call of a Dynamo graph


def compiled_note(events: pd.DataFrame, costs: pd.DataFrame, stats: Any) -> Optional[str]:
    """Why the cost pass joins only part of a torch.compile'd model's profile, or None if no
    compiled code ran: the pass records the eager program (Dynamo does not trace under a dispatch
    mode), while the profile shows Inductor's kernels, which replace most of those ops."""
    names = events["name"].astype(str)
    regions = names[names.str.startswith(COMPILED_REGION)]
    if regions.empty or stats is None:
        return None
    recorded = float(costs["flops"].sum()) * max(stats.steps, 1)
    attributed = float(events["flops"].sum()) if "flops" in events else 0.0
    share = f"{attributed / recorded:.0%} of its FLOPs" if recorded > 0 else "its FLOPs"
    return (f"partial: torch.compile'd code ran ({regions.nunique()} compiled graph(s), {len(regions)} calls); "
            f"the cost pass counts the eager program, whose ops Inductor's kernels replace, so "
            f"{stats.matched_ops:,} of {stats.recorded_ops:,} ops and {share} found a profiled op "
            f"(the pass's own totals: summary.json capture.costs)")


def _assemble(loaded: LoadedModel, plan: CapturePlan, trace: Trace, costs: Optional[pd.DataFrame],
              samples: Optional[pd.DataFrame], off: dict[str, str],
              warnings: list[str] = ()) -> tuple[Trace, dict[str, str]]:
    """The final Trace (costs joined onto the events, NVML counters merged, capture meta added, the
    numeric warnings under meta["capture"]["warnings"]) and the sources off: `off`, copied, plus a
    partial join of torch.compile'd code under "flops"."""
    events, stats, off = trace.events, None, dict(off)
    if costs is not None:
        from profiler.capture.join import join_costs

        events, stats = join_costs(trace.events, costs)
        note = compiled_note(events, costs, stats)
        if note:
            off["flops"] = note
    meta = dict(trace.meta)
    meta["capture"] = {"spec": loaded.spec, "spec_kind": loaded.kind, "model_class": type(loaded.model).__name__,
                       "plan": dataclasses.asdict(plan), "sources_off": dict(off), "warnings": list(warnings),
                       "costs": _cost_summary(costs), "join": stats.as_dict() if stats else None,
                       "bytes_note": "bytes_moved: algorithmic lower bound (inputs + outputs, views excluded)"}
    meta["flops_source"] = _flops_source(stats)
    return Trace(events=events, meta=meta, memory=trace.memory, counters=_merge_counters(trace, samples)), off


def capture(spec: str | LoadedModel, plan: CapturePlan, out_dir: str | Path, *, size: str = "small",
            batch: Optional[int] = None, overrides: Optional[Mapping[str, Any]] = None,
            progress: Optional[ProgressFn] = None,
            wrap_model: Optional[Callable[[LoadedModel], torch.nn.Module]] = None) -> CaptureResult:
    """Profile `spec` per `plan`; the raw trace goes to `out_dir`. Raises SpecError / CaptureError.

    `wrap_model(loaded)` (e.g. DistributedDataParallel) returns the prepared model wrapped, before
    the steps run; it gets the inputs too, to try the model first.
    A `LoadedModel` passed in is used as is: it is moved to the plan's device and dtype in place
    and, in train mode, its weights change with every optimizer step; pass a copy to keep it.
    """
    say = progress or (lambda done, total, msg: None)
    backend = get_backend(plan.backend)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    say(0, plan.steps, "building the model")
    loaded = spec if isinstance(spec, LoadedModel) else load_spec(spec, size=size, batch=batch, overrides=overrides,
                                                                    dtype=plan.dtype, device=plan.device)
    loaded = prepare(loaded, plan)
    if wrap_model is not None:
        loaded = dataclasses.replace(loaded, model=wrap_model(loaded))
    step = guarded(loaded.spec, make_step(loaded, plan))
    build_s = time.perf_counter() - t0
    say(0, plan.steps, "first step (unprofiled)")
    warnings = nonfinite_output(step(-1), plan.mode, plan.dtype)
    if wrap_model is not None:  # DDP rebuilds its buckets in its 2nd iteration (broadcasting their
        step(-1)                # indices): keep that one-off out of the FLOPs pass and the profile
    costs = None
    t1 = time.perf_counter()
    if plan.flops:
        from profiler.capture.flops import record_costs, unwrapped_names

        say(0, plan.steps, "counting FLOPs and bytes (untimed pass)")
        recorded = step if plan.mode == "train" else guarded(loaded.spec, make_step(loaded, plan, recording=True))
        costs = unwrapped_names(record_costs(recorded, 1, first_step=-2), loaded.model)
        costs.to_parquet(out_dir / f"op_costs_rank{_rank()}.parquet", index=False)
    flops_s = time.perf_counter() - t1
    say(0, plan.steps, f"running {plan.steps} steps ({plan.wait} wait, {plan.warmup} warm-up, {plan.active} active)")
    result, samples, off = _run_backend(backend, step, plan, out_dir, say)
    if plan.mode == "train":
        warnings += nonfinite_parameters(loaded.model, plan.dtype)
    say(plan.steps, plan.steps, "joining FLOPs and bytes to the profiled ops")
    trace, off = _assemble(loaded, plan, result.trace, costs, samples, off, warnings)
    timings = {"build_s": build_s, "flops_pass_s": flops_s, **result.timings, "total_s": time.perf_counter() - t0}
    say(plan.steps, plan.steps, f"captured in {timings['total_s']:.1f} s")
    return CaptureResult(trace, result.raw_path, off, timings)

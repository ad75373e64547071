"""Pure helpers behind the "Profile a model" page: option lists, the request, the run, result tables.

No streamlit here (the page draws; this module decides), so every rule is unit-testable. The run
is the CLI's: `runner.capture` then `report.write_outputs` into
`<data dir>/captures/<spec>-<UTC time>/` (data dir: $FUSIONLENS_DATA_DIR, default ./.fusionlens).
Model code is imported only from the spec the person at the server typed (DESIGN.md, Quality bars).
"""
from __future__ import annotations

import dataclasses
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import pandas as pd

from profiler.capture.backends import CaptureError, CapturePlan
from profiler.capture.spec import setting_item
from profiler.errors import FusionLensError
from profiler.present.units import si

MODEL_KINDS = ("zoo", "hf", "local")
KIND_LABELS = {"zoo": "Built-in zoo model", "hf": "Hugging Face config (hf:NAME)",
               "local": "Local spec (path/to/file.py:build or package.module:build)"}
CEILING_LABELS = {"measured": "measured on this machine (cached; the first run takes ~10 s)",
                  "quick": "quick measurement (~1-3 s, smaller sizes)",
                  "table": "device datasheet table (GPU traces)", "none": "no roofline"}
# The heavier Kineto options and their measured overhead on the small zoo models
# (README "Capture", benchmarks/bench_capture.py; default capture: 2-9% on small models).
HEAVY_OPTIONS = {
    "record_shapes": ("Record shapes", "+3-5 points of step time; joined ops get shapes from the FLOPs pass anyway"),
    "profile_memory": ("Record memory", "9-19% step-time overhead; allocator events in the trace"),
    "with_stack": ("Record Python stacks", "10-20% step-time overhead"),
}
ROOFLINE_TOP = 15
MAX_RANKS = 8  # the Ranks field's upper bound (each rank is a process running the model)
# One capture at a time per server: torch.profiler and CUPTI are process-wide, and every browser
# session of a Streamlit server shares the process.
CAPTURE_LOCK = threading.Lock()
BYTES_NOTE = ("Bytes are an algorithmic lower bound: inputs + outputs of each op at their dtypes, views excluded; "
              "not measured DRAM traffic.")


class ProfileInputError(FusionLensError):
    """A page input that cannot be run (empty spec, bad settings, unusable device): one line."""


@dataclass(frozen=True)
class ModelKind:
    """One way to name a model; `reason` says why it is off here (None = usable)."""

    kind: str
    label: str
    reason: Optional[str] = None


def model_kinds() -> list[ModelKind]:
    """Zoo, hf: (off without `transformers`, with the reason) and local specs."""
    from profiler.capture.hf import transformers_unavailable_reason

    return [ModelKind(k, KIND_LABELS[k], transformers_unavailable_reason() if k == "hf" else None)
            for k in MODEL_KINDS]


def zoo_choices() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Zoo model name -> (one-line description, preset sizes), from the zoo registry."""
    from profiler.capture.zoo import zoo_models

    return {name: (entry.doc, tuple(entry.presets)) for name, entry in sorted(zoo_models().items())}


def hf_choices() -> dict[str, tuple[str, tuple[str, ...]]]:
    """hf: model name -> (description, preset sizes): the written-out entries first, then every
    other text LM model_type transformers knows (built from its default config, shrunk)."""
    from profiler.capture.hf import HF_MODELS, HF_PRESETS, auto_model_types

    sizes = tuple(HF_PRESETS)
    choices = {name: (entry.doc, sizes) for name, entry in sorted(HF_MODELS.items())}
    choices.update({name: (f"{head.removeprefix('AutoModelFor')} from transformers' {name} config", sizes)
                    for name, head in auto_model_types().items()})
    return choices


def preset_values(kind: str, name: str, size: str) -> dict[str, Any]:
    """The settings a zoo/hf preset runs with (batch included), for the Settings and Batch hints."""
    if kind == "hf":
        from profiler.capture.hf import HF_PRESETS

        return dict(HF_PRESETS.get(size, {}))
    from profiler.capture.zoo import zoo_config

    return dataclasses.asdict(zoo_config(name, size))


def settings_hint(values: Mapping[str, Any]) -> str:
    """'vocab=2048, seq_len=64, ...': a preset's settings, batch left out (it has its own field)."""
    return ", ".join(f"{k}={v}" for k, v in values.items() if k != "batch")


def device_options(env: Mapping[str, Optional[str]]) -> dict[str, Optional[str]]:
    """Device -> None (usable) or why not: cpu always, cuda when torch sees a GPU."""
    return {"cpu": None, "cuda": env.get("cuda")}


def usable(options: Mapping[str, Optional[str]], first: str = "kineto") -> list[str]:
    """The options whose reason is None, `first` (the default backend) leading when present."""
    return sorted((k for k, reason in options.items() if reason is None), key=lambda k: k != first)


def parse_settings(text: str) -> dict[str, Any]:
    """'layers=2, dim=64' (or 'layers=2 dim=64', or one a line) -> {'layers': 2, 'dim': 64} (int,
    float, bool or str values): items split at commas and white space, spaces around '=' allowed."""
    items = re.split(r"[,\s]+", re.sub(r"\s*=\s*", "=", text.strip()))
    try:
        return dict(setting_item(item) for item in items if item)
    except ValueError as exc:
        raise ProfileInputError(f"settings: {exc}") from None


@dataclass(frozen=True)
class ProfileRequest:
    """Everything one run needs. size: zoo/hf preset (ignored by local specs); batch None = preset."""

    spec: str
    plan: CapturePlan
    size: str = "small"
    batch: Optional[int] = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    ceilings: str = "measured"
    nproc: int = 1  # ranks: > 1 is a DDP capture (gloo on CPU, NCCL on GPU; training only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", self.spec.strip())
        if not self.spec:
            raise ProfileInputError("no model spec: pick a zoo model or type path/to/file.py:build")
        if self.batch is not None and (not isinstance(self.batch, int) or self.batch < 1):
            raise ProfileInputError(f"spec {self.spec!r}: batch must be a positive integer, got {self.batch!r}")
        if not isinstance(self.nproc, int) or self.nproc < 1:
            raise ProfileInputError(f"spec {self.spec!r}: ranks must be a positive integer, got {self.nproc!r}")
        if self.nproc > 1 and self.plan.mode != "train":
            raise ProfileInputError(f"spec {self.spec!r}: a {self.nproc}-rank (DDP) capture profiles training: "
                                    "pick Mode train")
        if self.ceilings not in CEILING_LABELS:
            raise ProfileInputError(f"ceilings must be one of {', '.join(CEILING_LABELS)}, got {self.ceilings!r}")

    @property
    def label(self) -> str:
        """How the captured trace is named on the other pages."""
        p = self.plan
        size = "" if self.spec_kind == "local" else f" ({self.size})"
        ranks = f", {self.nproc} ranks (DDP)" if self.nproc > 1 else ""
        amp = f" + autocast {p.autocast}" if p.autocast else ""
        return f"captured: {self.spec}{size}, {p.device}/{p.dtype}{amp}, {p.mode}{ranks}, {p.active} active step(s)"

    @property
    def spec_kind(self) -> str:
        from profiler.capture.spec import split_spec

        kind = split_spec(self.spec)[0]
        return kind if kind in ("zoo", "hf") else "local"


def make_request(spec: str, *, size: str, batch: Optional[int], settings: str, device: str, dtype: str,
                 mode: str, wait: int, warmup: int, active: int, backend: str, ceilings: str,
                 heavy: Mapping[str, bool], flops: bool = True, nvml: bool = True, nproc: int = 1,
                 autocast: Optional[str] = None) -> ProfileRequest:
    """Build and validate a request from the form's values; ProfileInputError names the spec."""
    spec = spec.strip()
    try:
        plan = CapturePlan(device=device, dtype=dtype, mode=mode, wait=int(wait), warmup=int(warmup),
                           active=int(active), backend=backend, flops=flops, nvml=nvml, autocast=autocast,
                           **{k: bool(heavy.get(k, False)) for k in HEAVY_OPTIONS})
    except CaptureError as exc:
        raise ProfileInputError(f"spec {spec!r}: {exc}") from None
    return ProfileRequest(spec, plan, size, None if batch in (None, 0) else int(batch),
                          parse_settings(settings), ceilings, int(nproc))


@dataclass(frozen=True)
class ProfileOutcome:
    """One finished run: the Trace, the CLI's summary dict, the roofline table (or None) and folder."""

    request: ProfileRequest
    trace: Any
    summary: Mapping[str, Any]
    roofline: Optional[pd.DataFrame]
    out_dir: Path
    summary_json: str = "{}"
    roofline_modules: Optional[pd.DataFrame] = None  # per nn.Module (roofline_modules.csv), when known


def quiet_while_timed(progress: Callable[[int, int, str], None], plan: CapturePlan) -> Callable[[int, int, str], None]:
    """`progress` without the updates that would land while profiled steps run.

    The backends report after every step; in the dashboard each report redraws the progress bar in
    the browser, which competes with the next step for the CPU (and the event loop for the GIL).
    Measured on this 2-core machine with headless Chromium, three dashboard runs each: a compiled
    MLP's median step 17-38 ms with those updates against 2.1-3.8 ms without (1.1-1.6 ms from the
    CLI). So after the wait steps the bar says once what is being timed and holds still until the
    end."""
    def quiet(done: int, total: int, message: str) -> None:
        if 0 < done < total and done >= plan.wait:  # the next step is profiled (warm-up or active)
            if done == plan.wait and plan.warmup:  # lands in the first warm-up step, which is discarded
                progress(done, total, f"timing {plan.warmup + plan.active} profiled steps "
                                      "(the bar holds still until they end, so the browser does not compete with them)")
            return
        progress(done, total, message)

    return quiet


def run_profile(req: ProfileRequest, root: Path, progress: Optional[Callable[[int, int, str], None]] = None,
                env: Optional[dict] = None, heartbeat: Optional[Callable[[], None]] = None) -> ProfileOutcome:
    """Capture `req` as `python -m profiler capture` does and write its files under `root`.

    heartbeat: called about once a second while the capture is silent (capture_isolated), so that
    the page's Stop button (or a rerun) can end a capture that hangs or runs long.

    Raises FusionLensError (SpecError, CaptureError, ProfileInputError), MemoryError or OSError.
    """
    from profiler.capture.sources import blocking_reason

    reason = blocking_reason(req.plan, env)
    if reason:
        raise ProfileInputError(f"spec {req.spec!r}: {reason}")
    if not CAPTURE_LOCK.acquire(blocking=False):
        raise ProfileInputError(f"spec {req.spec!r}: another capture is running in this server (the profiler is "
                                "process-wide: one at a time); try again when it has finished")
    try:
        return _run_locked(req, root, progress, heartbeat)
    finally:
        CAPTURE_LOCK.release()


def _run_locked(req: ProfileRequest, root: Path, progress: Optional[Callable[[int, int, str], None]],
                heartbeat: Optional[Callable[[], None]]) -> ProfileOutcome:
    from profiler.capture.ddp import capture_ranks
    from profiler.capture.report import default_out_dir, removed_if_failed, with_ceilings, write_outputs

    say = progress or (lambda done, total, msg: None)
    out_dir = default_out_dir(req.spec, root)  # -2, -3, ... when a run in the same second took it
    out_dir.mkdir(parents=True)
    with removed_if_failed(out_dir):
        result = capture_ranks(req.spec, req.plan, out_dir, req.nproc, size=req.size, batch=req.batch,
                               overrides=dict(req.overrides), progress=say, heartbeat=heartbeat)
        say(req.plan.steps, req.plan.steps,
            f"writing the trace, summary and roofline (ceilings: {CEILING_LABELS[req.ceilings]})")
        summary = write_outputs(result, req.plan, out_dir, req.ceilings,
                                {"spec": req.spec, "nproc": req.nproc, "source": "dashboard"})
    roof_path = out_dir / "roofline.csv"
    roofline = pd.read_csv(roof_path) if roof_path.is_file() else None
    modules_path = summary["files"].get("roofline_modules")
    modules = pd.read_csv(modules_path) if modules_path else None
    summary_json = Path(summary["files"]["summary"]).read_text()
    trace = with_ceilings(result.trace, summary.get("roofline_ceilings"))  # as saved: the roofs go with it
    return ProfileOutcome(req, trace, summary, roofline, out_dir, summary_json, modules)


def error_line(spec: str, exc: BaseException) -> str:
    """One line naming the spec and the cause, for st.error."""
    text = " ".join(str(exc).split())
    spec = spec.strip()
    if isinstance(exc, MemoryError):
        text = f"ran out of memory ({type(exc).__name__}: {text or 'no detail'}); try a smaller batch or size"
    elif isinstance(exc, OSError):
        text = f"{type(exc).__name__}: {text}"
    if spec and not text.startswith(f"spec {spec!r}"):
        text = f"spec {spec!r}: {text}"
    return text[:500]


# ---------------------------------------------------------------- result tables (DataFrames to draw)
def sources_frame(statuses: list) -> pd.DataFrame:
    """SourceStatus list -> (source, state, reason) rows for the Sources panel."""
    return pd.DataFrame({"source": [s.label for s in statuses],
                         "state": ["✅ on" if s.on else "🚫 off" for s in statuses],
                         "reason": [s.reason for s in statuses]})


def join_coverage(summary: Mapping[str, Any]) -> str:
    """Share of the FLOPs pass's ops that found their profiled op ("96.3%"; ranks summed): short,
    for a metric tile (the counts are in summary.json's capture.join)."""
    capture = summary.get("capture") or {}
    joins = list((capture.get("join_per_rank") or {}).values()) or ([capture["join"]] if capture.get("join") else [])
    recorded = sum(j.get("recorded_ops", 0) for j in joins)
    if not recorded:
        return "-"
    matched = sum(j.get("matched_ops", 0) for j in joins)
    return f"{matched / recorded:.1%}"


def summary_metrics(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) pairs for the run's headline numbers, from write_outputs' summary."""
    kinds = summary.get("events_by_kind", {})
    step_us = summary.get("step_time_us_median")
    timings = summary.get("timings_s", {})
    return [
        ("Profiled steps", f"{summary.get('profiled_steps', 0):,}"),
        ("Median step time", "-" if step_us is None else f"{step_us / 1e3:,.3f} ms"),
        ("CPU ops", f"{kinds.get('cpu_op', 0):,}"),
        ("GPU kernels", f"{kinds.get('kernel', 0):,}"),
        ("Events", f"{summary.get('events', 0):,}"),
        ("FLOPs counted", si(summary.get("flops_total"), "FLOP")),
        ("Bytes (algorithmic lower bound)", si(summary.get("bytes_moved_total"), "B")),
        ("FLOPs pass joined", join_coverage(summary)),
        ("Capture time", f"{timings.get('total_s', float('nan')):.1f} s"),
    ]


def sources_off_frame(sources_off: Mapping[str, str]) -> pd.DataFrame:
    """What did not run in this capture and why."""
    return pd.DataFrame({"source": list(sources_off), "why it was off": list(sources_off.values())})


def files_frame(summary: Mapping[str, Any]) -> pd.DataFrame:
    """(file, path) for every file the run wrote."""
    rows = []
    for name, path in summary.get("files", {}).items():
        for p in (path if isinstance(path, list) else [path]):
            rows.append((name, str(p)))
    return pd.DataFrame(rows, columns=["file", "path"])


def ceilings_note(used: Optional[Mapping[str, Any]], dtype: str) -> str:
    """One line naming the roofs the table used: source, mode, cache, peak for `dtype`, bandwidth."""
    from profiler.capture.report import ROOF_DTYPES

    if not used:
        return "Ceilings: none recorded."
    details = used.get("details") or {}
    how = ", ".join(f"{label}{details[k]}" for k, label in (("mode", ""), ("cache", "cache ")) if details.get(k))
    peaks, roof = used.get("peak_flops_per_s") or {}, ROOF_DTYPES.get(dtype, "fp32")
    which = f"({roof})" if peaks.get(roof) is not None or roof == "fp32" else f"(fp32's: no {roof} peak measured)"
    peak = peaks.get(roof, peaks.get("fp32"))
    note = (f"Ceilings: {used.get('source', '?')}{f' ({how})' if how else ''}: peak {si(peak, 'FLOP/s')} "
            f"{which}, bandwidth {si(used.get('mem_bw_bytes_per_s'), 'B/s')}.")
    if details.get("remeasured_because"):
        note += f" Re-measured for this capture: {details['remeasured_because']}."
    return note


def roofline_frame(roofline: Optional[pd.DataFrame], top: int = ROOFLINE_TOP) -> pd.DataFrame:
    """The roofline table's `top` op types (or modules, for roofline_modules.csv) by headroom,
    with display names and units.

    roof GFLOP/s = what the roof allows at the op's intensity, min(peak, intensity x bandwidth),
    which is flops / time_at_roof; % of roof = time at roof / measured time (the CSV's pct_of_roof).
    """
    if roofline is None or roofline.empty:
        return pd.DataFrame()
    r = roofline.sort_values("headroom_us", ascending=False).head(top)
    at_roof_s = r["time_at_roof_us"] / 1e6
    roof = (r["flops"] / at_roof_s).where((r["flops"] > 0) & (at_roof_s > 0))
    first = {"module": r["module"].astype(str)} if "module" in r else {"op": r["name"].astype(str)}
    return pd.DataFrame({
        **first, "headroom (µs)": r["headroom_us"].round(1), "time (µs)": r["dur_us"].round(1),
        "% of roof": r["pct_of_roof"], "bound": r["bound"].astype(str),
        "FLOPs": r["flops"], "bytes (algorithmic lower bound)": r["bytes_moved"],
        "intensity FLOP/B": r["algorithmic_intensity_flop_per_byte"],
        "achieved GFLOP/s": r["achieved_flops_per_s"] / 1e9, "roof GFLOP/s": roof / 1e9,
        "calls": r["count"].astype(int), "dtype": r["dtype"].astype(str),
        **({"kind": r["kind"].astype(str)} if "kind" in r else {}),
    }).reset_index(drop=True)


OWN_OPS = "own ops"


def module_depths(modules: pd.DataFrame) -> list[int]:
    """Depths a per-module table can be summed to: 1 .. one less than its deepest name."""
    deepest = int(modules["module"].astype(str).str.count(r"\.").max()) + 1 if len(modules) else 1
    return list(range(1, deepest))


def modules_at_depth(modules: Optional[pd.DataFrame], depth: Any, used: Optional[Mapping[str, Any]]) -> Optional[pd.DataFrame]:
    """The per-module table as chosen: each module's own ops (OWN_OPS), or summed up the module tree
    to `depth` (`profiler.analysis.roofline.rollup_modules`, against the run's memory roof)."""
    if modules is None or depth == OWN_OPS or not used:
        return modules
    from profiler.analysis.roofline import rollup_modules

    return rollup_modules(modules, int(depth), float(used["mem_bw_bytes_per_s"]))


def roofline_chart(roofline: Optional[pd.DataFrame], used: Optional[Mapping[str, Any]], dtype: str) -> Optional[Any]:
    """The roofline figure of the run's per-op-type table (roofline.csv), or of its per-module table
    (roofline_modules.csv: one marker per module), under the roofs it used.

    None when there is no table or no recorded ceilings (the page already says why). `dtype` is the
    capture's torch dtype name; its roof is drawn, fp32's when the ceilings have no peak for it (as
    the analysis falls back).
    """
    if roofline is None or roofline.empty or not used:
        return None
    by_module = "module" in roofline.columns and "name" not in roofline.columns
    what = "modules" if by_module else "op types"
    if by_module:
        roofline = roofline.assign(name=roofline["module"])
    from profiler.capture.devices import Ceilings
    from profiler.capture.report import ROOF_DTYPES
    from profiler.present.roofline import roofline_figure

    ceilings = Ceilings.from_json(used)
    roof_dtype = ROOF_DTYPES.get(dtype, "fp32")
    if ceilings.peak_for(roof_dtype) is None:
        roof_dtype = "fp32"
    return roofline_figure(roofline, ceilings, roof_dtype, title=f"Roofline: every {what[:-1]} with FLOPs and bytes",
                           what=what)

"""Profile a model page: pick a zoo / hf: / local spec, see which sources will run, capture, inspect.

DESIGN.md journey 2. The run is the CLI's (`python -m profiler capture`): same files under
`<data dir>/captures/<spec>-<time>/`, same summary and roofline table; the captured Trace becomes
the current trace for the other pages. Rules and tables live in `pages/profile_view.py`.
"""
from __future__ import annotations

import streamlit as st

from pages import profile_view as pv
from pages.state import require_router, set_trace
from profiler.capture.backends import AUTOCAST_DTYPES, DTYPES, MODES, CapturePlan, available_backends
from profiler.capture.ceilings import data_dir
from profiler.capture.isolated import prestart
from profiler.capture.sources import environment, plan_sources
from profiler.errors import FusionLensError

RESULT_KEY = "fusionlens_profile_result"
require_router("pages/profile.py")
prestart()  # captures run in a child process (out of memory is an error line, not a dead server); warm its server

st.title("🧪 Profile a model")
st.caption("Runs the model under torch.profiler (Kineto) with a separate untimed FLOPs/bytes pass, then "
           "places every op against the machine's roofline. Same files as `python -m profiler capture`.")

# ------------------------------------------------------------------ model
kinds = pv.model_kinds()
usable = [k.kind for k in kinds if k.reason is None]
kind = st.radio("Model", usable, format_func=pv.KIND_LABELS.get, key="profile_kind", horizontal=True)
for k in kinds:
    if k.reason:
        st.caption(f"🚫 {k.label} is off: {k.reason}")

size, settings, preset = "small", "", {}
if kind in ("zoo", "hf"):
    choices = pv.zoo_choices() if kind == "zoo" else pv.hf_choices()
    col_name, col_size, col_set = st.columns([2, 1, 2])
    name = col_name.selectbox("Zoo model" if kind == "zoo" else "hf: model", list(choices), key=f"profile_{kind}",
                              format_func=lambda n: f"{n}: {choices[n][0]}")
    sizes = list(choices[name][1])
    size = col_size.selectbox("Size", sizes, index=sizes.index("small") if "small" in sizes else 0,
                              key="profile_size")
    preset = pv.preset_values(kind, name, size)
    settings = col_set.text_input("Settings (optional)", key="profile_settings", placeholder=pv.settings_hint(preset),
                                  help="KEY=VALUE overrides of the preset, comma-separated; the preset's values "
                                       "are shown greyed when the field is empty")
    spec = name if kind == "zoo" else f"hf:{name}"
else:
    col_spec, col_set = st.columns([3, 2])
    spec = col_spec.text_input("Model spec", key="profile_spec", placeholder="path/to/file.py:build or package.module:build",
                               help="A function returning (model, inputs); inputs a tuple or a dict of tensors. "
                                    "It may take a batch= keyword (the Batch field) and the keywords set beside; "
                                    "the model and its inputs are then moved to the chosen device and dtype "
                                    "(a build that takes dtype= and device= gets them, and its model is only "
                                    "moved, keeping its own precision choices).")
    settings = col_set.text_input("build() keywords (optional)", key="profile_spec_settings",
                                  placeholder="e.g. layers=4, width=256",
                                  help="KEY=VALUE keywords passed to build(), comma-separated (as the CLI's --set)")
    st.caption("⚠️ This imports and runs that Python code on this machine, as this server's user (in a child "
               "process of it). Only specs typed here are imported, never uploaded files; relative paths start "
               "from the server's folder.")

# ------------------------------------------------------------------ run settings
env = environment()
cols = st.columns(5)
device = cols[0].selectbox("Device", pv.usable(pv.device_options(env)), key="profile_device")
if env["cuda"]:
    cols[0].toggle("cuda", value=False, disabled=True, key="profile_cuda_off", help=env["cuda"])
dtype = cols[1].selectbox("dtype", DTYPES, key="profile_dtype")
autocast = cols[1].selectbox("autocast (AMP)", AUTOCAST_DTYPES, key="profile_autocast",
                             format_func=lambda v: v or "off",
                             help="Mixed precision as AMP trains: fp32 weights (dtype float32), the forward and "
                                  "loss under torch.autocast in this dtype, fp16 training with a GradScaler")
mode = cols[2].radio("Mode", MODES, key="profile_mode", horizontal=True,
                     format_func={"train": "train (fwd+bwd+AdamW)", "infer": "infer"}.get)
batch = cols[3].number_input("Batch", min_value=1, value=None, step=1, key="profile_batch",
                             placeholder=f"preset ({preset['batch']})" if "batch" in preset else "preset",
                             help="Empty: the preset's batch (local specs: their own)")
ceilings = cols[4].selectbox("Roofline ceilings", list(pv.CEILING_LABELS), key="profile_ceilings",
                             format_func=pv.CEILING_LABELS.get)
if env["cuda"]:  # full width: in the Device column the reason wrapped into a narrow stack of lines
    st.caption(f"🚫 cuda is off: {env['cuda']}")
cols = st.columns(4)
wait = cols[0].number_input("Wait steps (unprofiled)", 0, 100, 1, key="profile_wait")
warmup = cols[1].number_input("Warm-up steps (profiled, discarded)", 0, 100, 1, key="profile_warmup")
active = cols[2].number_input("Active steps (kept)", 1, 100, 3, key="profile_active")
nproc = cols[3].number_input("Ranks (DDP)", 1, pv.MAX_RANKS, 1, key="profile_nproc",
                             help="2 or more: a DistributedDataParallel training run over that many processes "
                                  "(gloo on CPU, NCCL on GPU, one GPU per rank), one trace per rank; as "
                                  "`python -m profiler capture --nproc N`")

backends = available_backends()
with st.expander("Heavier options and backend"):
    heavy = {k: st.checkbox(label, key=f"profile_{k}", help=cost) for k, (label, cost) in pv.HEAVY_OPTIONS.items()}
    st.caption("Overheads measured on the small zoo models (README, Capture); the default capture costs 2-9% there "
               "and under 3% on the medium ones.")
    backend = st.selectbox("Backend", pv.usable(backends), key="profile_backend",
                           help="kineto: torch.profiler (CPU ops + GPU kernels); cupti: kernel-only tracer (NVIDIA)")
    for name_, reason in backends.items():
        if reason:
            st.caption(f"🚫 backend {name_} is off: {reason}")
    flops = st.checkbox("FLOPs/bytes pass (untimed; needed for the roofline)", value=True, key="profile_flops")
    nvml = st.checkbox("NVML counters (GPU)", value=True, key="profile_nvml")

# ------------------------------------------------------------------ sources panel
st.subheader("Sources")
preview = CapturePlan(device=device, backend=backend, flops=flops, nvml=nvml)
st.table(pv.sources_frame(plan_sources(preview, env)), hide_index=True, border="horizontal")

# ------------------------------------------------------------------ run
if st.button("Profile", type="primary", key="profile_run"):
    bar = st.progress(0.0, text="starting")
    shown = [0.0, "starting"]  # what the bar says, for the heartbeat to say again

    def progress(done: int, total: int, message: str) -> None:
        shown[:] = [min(done / max(total, 1), 1.0), message]
        bar.progress(shown[0], text=shown[1])

    def heartbeat() -> None:  # a Streamlit call now and then: the Stop button can end a silent capture
        bar.progress(shown[0], text=shown[1])

    try:
        request = pv.make_request(spec, size=size, batch=batch, settings=settings, device=device, dtype=dtype,
                                  mode=mode, wait=wait, warmup=warmup, active=active, backend=backend,
                                  ceilings=ceilings, heavy=heavy, flops=flops, nvml=nvml, nproc=nproc,
                                  autocast=autocast)
        outcome = pv.run_profile(request, data_dir() / "captures", pv.quiet_while_timed(progress, request.plan), env,
                                 heartbeat)
    except (FusionLensError, MemoryError, OSError) as exc:
        st.session_state.pop(RESULT_KEY, None)
        st.error(pv.error_line(spec, exc))
    else:
        set_trace(outcome.trace, request.label)
        st.session_state[RESULT_KEY] = outcome
    finally:
        bar.empty()

outcome = st.session_state.get(RESULT_KEY)
if outcome is None:
    st.info("Pick a model and press Profile. The captured trace becomes the current trace for the other pages.")
    st.stop()

# ------------------------------------------------------------------ results
summary = outcome.summary
st.subheader(outcome.request.label)
metrics = pv.summary_metrics(summary)
for start in range(0, len(metrics), 5):
    for col, (label, value) in zip(st.columns(5), metrics[start:start + 5]):
        col.metric(label, value)
st.caption(pv.BYTES_NOTE)
for line in summary.get("warnings") or []:
    st.warning(line, icon="⚠️")

if summary.get("sources_off"):
    st.markdown("**Sources off in this capture**")
    st.table(pv.sources_off_frame(summary["sources_off"]), hide_index=True, border="horizontal")

roof = pv.roofline_frame(outcome.roofline)
points, modules, depth = outcome.roofline, outcome.roofline_modules, pv.OWN_OPS
if outcome.roofline is not None and modules is not None:
    col_per, col_depth = st.columns(2)
    per = col_per.radio("Roofline points", ["op types", "modules"], horizontal=True, key="profile_roofline_points",
                        help="one marker per op type (roofline.csv) or per nn.Module (roofline_modules.csv)")
    depth = col_depth.selectbox("Modules", [pv.OWN_OPS, *pv.module_depths(modules)], key="profile_module_depth",
                                format_func=lambda d: d if d == pv.OWN_OPS else f"summed to depth {d} (with their children)",
                                help="each module's own ops, or every module summed into its ancestor at that depth "
                                     "of the name (Model.blocks.0 at depth 3)")
    modules = pv.modules_at_depth(modules, depth, summary.get("roofline_ceilings"))
    points = modules if per == "modules" else outcome.roofline
compute_dtype = outcome.request.plan.autocast or outcome.request.plan.dtype  # the matmuls' dtype
chart = pv.roofline_chart(points, summary.get("roofline_ceilings"), compute_dtype)
if chart is not None:
    st.plotly_chart(chart, width="stretch", key="profile_roofline_chart")
st.markdown(f"**Roofline: top {pv.ROOFLINE_TOP} op types by headroom**")
if roof.empty:
    st.warning(f"No roofline table: {summary.get('roofline_missing') or 'no op carried FLOPs and bytes'}")
else:
    st.caption(pv.ceilings_note(summary.get("roofline_ceilings"), compute_dtype) +
               " Intensity is algorithmic (FLOPs / lower-bound bytes). Headroom = time - time at the roof.")
    num = st.column_config.NumberColumn
    roof_columns = {
        "op": st.column_config.TextColumn(width="medium"), "module": st.column_config.TextColumn(width="medium"),
        "kind": st.column_config.TextColumn(width="small"),
        "dtype": st.column_config.TextColumn(width="small"), "calls": num(width="small"),
        "FLOPs": num(format="compact", help="counted by the untimed FLOPs pass"),
        "bytes (algorithmic lower bound)": num(format="compact", help=pv.BYTES_NOTE),
        "intensity FLOP/B": num(format="%.3g", help="algorithmic intensity: FLOPs / lower-bound bytes"),
        "achieved GFLOP/s": num(format="%.3g"),
        "roof GFLOP/s": num(format="%.3g", help="what the roof allows at this intensity: min(peak, intensity x bandwidth)"),
        "% of roof": num(format="%.3g %%", help="time at the roof / measured time")}
    st.dataframe(roof, hide_index=True, width="stretch", height="content", column_config=roof_columns)
    by_module = pv.roofline_frame(modules)
    if not by_module.empty:
        st.markdown(f"**Roofline: top {pv.ROOFLINE_TOP} modules by headroom**")
        whose = ("Each nn.Module's own ops (not its children's)" if depth == pv.OWN_OPS else
                 f"Each module at depth {depth} with all of its children's ops")
        st.caption(f"{whose}, forward and backward together, named as in the model (qualified names); ops "
                   "outside any module, such as the optimizer step, are left out.")
        st.dataframe(by_module, hide_index=True, width="stretch", height="content", column_config=roof_columns)

st.markdown("**Files written**")
st.table(pv.files_frame(summary), hide_index=True, border="horizontal")
cols = st.columns(2)
if outcome.roofline is not None:
    cols[0].download_button("Download roofline CSV", outcome.roofline.to_csv(index=False), key="profile_dl_csv",
                            file_name=f"{outcome.out_dir.name}-roofline.csv", mime="text/csv")
if outcome.roofline_modules is not None:
    cols[0].download_button("Download per-module roofline CSV", outcome.roofline_modules.to_csv(index=False),
                            key="profile_dl_modules_csv", file_name=f"{outcome.out_dir.name}-roofline_modules.csv",
                            mime="text/csv")
cols[1].download_button("Download summary JSON", outcome.summary_json, key="profile_dl_json",
                        file_name=f"{outcome.out_dir.name}-summary.json", mime="application/json")

"""The Triton provider's entry points, as library ops while a profiler or a dispatch mode watches.

Kineto and a TorchDispatchMode (the capture's FLOPs/bytes pass) see only what goes through the
dispatcher, and the Triton provider launches its kernels from Python. So while either is active,
each entry point runs as `torch.ops.fusionlens.triton_<name>`, with the schema and argument names of
the C++ op of the same job: Kineto shows a cpu_op that the launched GPU kernels link to, and the
cost pass records it with its arguments (`kernels.op_cost`, the same numbers as the C++ op). While
torch.compile traces, the entry points go through the ops as well: Dynamo then puts an opaque op
with a fake kernel in the graph instead of tracing the Python launchers. The rest of the time the
module function is called directly: no dispatcher on the hot path. The ops are defined, and the
entry points built, when the triton provider is probed (outside any trace), with impls for CUDA
and, for Triton's CPU interpreter, CPU.
"""
from __future__ import annotations

import functools
import importlib
import threading
from types import SimpleNamespace
from typing import Any, Callable

import torch

# C++ op name -> (Triton module, function, schema arguments): the C++ op's, name for name, but for
# LAMB's grad_divisor, a device tensor on the Triton side (computed there without a host read).
ENTRY_POINTS: dict[str, tuple[str, str, str]] = {
    "act_fwd": ("kernels.triton_activations", "act_fwd", "Tensor x, Tensor? bias, Tensor(a!) out, int kind"),
    "act_bwd": ("kernels.triton_activations", "act_bwd",
                "Tensor grad, Tensor x, Tensor? bias, Tensor(a!) grad_x, Tensor(b!)? grad_bias, int kind"),
    "glu_fwd": ("kernels.triton_activations", "glu_fwd", "Tensor a, Tensor b, Tensor(a!) out, int kind"),
    "glu_bwd": ("kernels.triton_activations", "glu_bwd",
                "Tensor grad, Tensor a, Tensor b, Tensor(a!) grad_a, Tensor(b!) grad_b, int kind"),
    "softmax_fwd": ("kernels.triton_softmax", "softmax_fwd",
                    "Tensor x, Tensor? mask, Tensor(a!) out, float scale, bool causal"),
    "softmax_bwd": ("kernels.triton_softmax", "softmax_bwd",
                    "Tensor grad, Tensor y, Tensor(a!) grad_x, float scale, bool causal"),
    "rope_apply": ("kernels.triton_rope", "rope_apply",
                   "Tensor x, Tensor cos, Tensor sin, Tensor(a!) out, bool backward"),
    "layer_norm_fwd": ("kernels.triton_norms", "layer_norm_fwd",
                       "Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps, Tensor(a!) y, "
                       "Tensor(b!) sum_out, Tensor(c!) mean, Tensor(d!) rstd"),
    "layer_norm_bwd": ("kernels.triton_norms", "layer_norm_bwd",
                       "Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, Tensor? dadd, "
                       "Tensor(a!) dx, Tensor(b!) dw, Tensor(c!) db"),
    "rms_norm_fwd": ("kernels.triton_norms", "rms_norm_fwd",
                     "Tensor x, Tensor? residual, Tensor? weight, float eps, bool llama_cast, Tensor(a!) y, "
                     "Tensor(b!) sum_out, Tensor(c!) rstd"),
    "rms_norm_bwd": ("kernels.triton_norms", "rms_norm_bwd",
                     "Tensor dy, Tensor x, Tensor? weight, Tensor rstd, Tensor? dadd, bool llama_cast, "
                     "Tensor(a!) dx, Tensor(b!) dw"),
    "ce_forward": ("kernels.triton_cross_entropy", "forward",
                   "Tensor logits, Tensor target, int ignore_index, float label_smoothing, "
                   "Tensor(a!) loss_rows, Tensor(b!) lse"),
    "ce_backward": ("kernels.triton_cross_entropy", "backward",
                    "Tensor logits, Tensor target, Tensor lse, Tensor grad_rows, int ignore_index, "
                    "float label_smoothing, Tensor(a!) grad"),
    "ce_fused_": ("kernels.triton_cross_entropy", "fused_",
                  "Tensor(a!) logits, Tensor target, int ignore_index, float label_smoothing, float grad_scale, "
                  "Tensor(b!) loss_rows"),
    "adamw_step_": ("kernels.triton_optim", "adamw_step",
                    "Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
                    "Tensor(d!)[] max_exp_avg_sqs, Tensor(e!)[] steps, float lr, float beta1, float beta2, "
                    "float eps, float weight_decay, bool amsgrad, bool maximize"),
    "lamb_step_": ("kernels.triton_optim", "lamb_step",
                   "Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
                   "Tensor(e!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
                   "Tensor grad_divisor, bool bias_correction, bool adam_w_mode, bool grad_averaging, "
                   "bool use_nvlamb"),
}
# Entry points whose Python function takes its hyper-parameters by keyword: how many of the
# schema's arguments go by position (the rest by their schema names).
POSITIONAL = {"adamw_step_": 6, "lamb_step_": 5}
PREFIX = "triton_"

_lock = threading.Lock()
_library: Any = None


_DISPATCH_STACK_LEN = getattr(torch._C, "_len_torch_dispatch_stack", None)


def dispatch_mode_active() -> bool:
    """A TorchDispatchMode is on the stack (a private torch name, present in 2.11 and 2.13: read
    defensively). kernels.tuning asks too: it never times a call under one."""
    return _DISPATCH_STACK_LEN is not None and _DISPATCH_STACK_LEN() > 0


def watched() -> bool:
    """A compiler traces, a profiler records or a dispatch mode intercepts: the entry points then
    run as their library ops (`_is_profiler_enabled` is private too: read defensively)."""
    return (torch.compiler.is_compiling() or getattr(torch.autograd.profiler, "_is_profiler_enabled", False)
            or dispatch_mode_active())


def define_ops() -> None:
    """Define every `fusionlens::triton_<name>` op once (impls for CUDA and CPU, a no-op fake)."""
    global _library
    if _library is not None:  # the usual case, and the only one a compiler's trace sees
        return
    with _lock:
        if _library is not None:
            return
        lib = torch.library.Library("fusionlens", "FRAGMENT")
        for name, (module, function, args) in ENTRY_POINTS.items():
            lib.define(f"{PREFIX}{name}({args}) -> ()")
            impl = _positional(name, _direct(module, function))
            for key in ("CUDA", "CPU"):
                lib.impl(f"{PREFIX}{name}", impl, key)
            torch.library.register_fake(f"fusionlens::{PREFIX}{name}", lib=lib)(_writes_only)
        _library = lib


def _writes_only(*args: Any, **kwargs: Any) -> None:
    """Fake kernel: the ops write into arguments and return nothing."""
    return None


def _direct(module: str, function: str) -> Callable[..., None]:
    return getattr(importlib.import_module(module), function)


def _keyword_names(name: str) -> list[str]:
    """Schema names of the arguments `name`'s Python function takes by keyword."""
    args = [a.strip().split()[-1] for a in ENTRY_POINTS[name][2].split(",")]
    return args[POSITIONAL[name]:] if name in POSITIONAL else []


def _positional(name: str, fn: Callable[..., None]) -> Callable[..., None]:
    """`fn` called with every argument by position, in schema order (as the op's impl is)."""
    names = _keyword_names(name)
    if not names:
        return fn
    n = POSITIONAL[name]
    return lambda *args: fn(*args[:n], **dict(zip(names, args[n:])))


def entry(name: str) -> Callable[..., None]:
    """The callable the provider uses for C++ op `name`: the Triton function itself, through its
    library op while `watched()` (keyword arguments put in schema order)."""
    module, function, _ = ENTRY_POINTS[name]
    direct = _direct(module, function)
    names = _keyword_names(name)

    def launch(*args: Any, **kwargs: Any) -> None:
        if not watched():
            return direct(*args, **kwargs)
        define_ops()
        return getattr(torch.ops.fusionlens, PREFIX + name)(*args, *(kwargs[k] for k in names))

    return functools.wraps(direct)(on_tensor_device(launch))


def foreign_cuda_device(args: tuple) -> int | None:
    """The index of the CUDA device a call's tensors are on when it is not the current device, else
    None. A call's tensors share one device (the optimizers bucket parameters by device), so the
    first argument tells: a tensor, or a list of them."""
    first = args[0] if args else None
    if type(first) is list or type(first) is tuple:
        first = first[0] if first else None
    if not isinstance(first, torch.Tensor) or not first.is_cuda:  # is_cuda: 5x cheaper than .device.type
        return None
    index = first.get_device()
    return None if index == torch.cuda.current_device() else index


def on_tensor_device(fn: Callable[..., None]) -> Callable[..., None]:
    """`fn` run with its tensors' CUDA device made current. Triton launches on the current device
    and its current stream, so tensors on cuda:1 while cuda:0 is current (a model spread over GPUs
    in one process, as `device_map="auto"` does) would be an illegal memory access, or Triton's
    "cannot be accessed from Triton". Under torch.compile the compiled graph sets its own device."""
    def run(*args: Any, **kwargs: Any) -> None:
        index = None if torch.compiler.is_compiling() else foreign_cuda_device(args)
        if index is None:
            return fn(*args, **kwargs)
        with torch.cuda.device(index):
            return fn(*args, **kwargs)

    return run


_NAMESPACES: dict[str, SimpleNamespace] = {}  # a plain dict: a compiler's trace reads it as is


def namespace(module: str) -> SimpleNamespace:
    """The entry points of one Triton module, under the names its callers use."""
    ns = _NAMESPACES.get(module)
    if ns is None:
        ns = _NAMESPACES[module] = SimpleNamespace(**{
            function: entry(name) for name, (mod, function, _) in ENTRY_POINTS.items() if mod == module})
    return ns


def prepare() -> None:
    """Define the ops and build every module's entry points (imports the Triton modules): the
    triton provider's probe calls it, so a first call inside torch.compile finds them ready."""
    define_ops()
    for module in sorted({mod for mod, _, _ in ENTRY_POINTS.values()}):
        namespace(module)

"""The op-cost recorder: FLOPs and bytes of every aten op in one untimed pass (DESIGN.md, Capture).

`OpCostRecorder` is a `TorchDispatchMode`: it sees each aten op below autograd (composites such as
aten::linear arrive decomposed into aten::t + aten::addmm) and writes one row per op with
`name` (as the profiler spells it, "aten::addmm"), `flops` (from `formulas.FLOP_FORMULAS`, then
the pointwise/reduction/foreach rules, then known zero-FLOP data movement; NaN when unknown) and
`bytes_moved`, an algorithmic lower bound (inputs + outputs at their dtypes, views 0; see
formulas.py), plus `input_dims`/`input_types` in Kineto's record_shapes format, so a capture
gets every joined op's shapes without paying record_shapes in the timed steps. `join.py` joins these rows to the profiled cpu_op rows.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from profiler.capture import formulas as fm

COST_COLUMNS = {"step": "int32", "seq": "int64", "name": "string", "overload": "string",
                "flops": "float64", "bytes_moved": "float64", "rule": "string",
                "input_dims": "string", "input_types": "string", "module": "string"}

# torch dtype -> the name Kineto writes in "Input type" (c10 TypeMeta names).
KINETO_DTYPE_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}

# Ops that move or make data but do no arithmetic (FLOPs 0, bytes by the default rule; the empty*
# allocations are `is_allocation`'s).
ZERO_FLOP_OPS = frozenset({
    "cat", "stack", "index_select", "gather", "index", "index_put", "index_put_", "scatter",
    "scatter_", "constant_pad_nd", "ones_like", "zeros_like", "full", "full_like", "ones", "zeros",
    "arange", "randint", "randn", "rand", "randperm", "randint_like", "randn_like", "rand_like",
    "tril", "triu", "repeat", "roll", "flip", "_local_scalar_dense", "resolve_conj", "resolve_neg",
    "new_zeros", "new_ones", "new_full", "resize_", "set_", "copy_", "_to_copy", "clone", "fill_", "zero_",
    "lift_fresh_copy", "slice_backward", "select_backward", "as_strided_scatter", "slice_scatter",
    "select_scatter", "_unsafe_view", "masked_fill", "masked_fill_", "where", "detach_",
    "_index_put_impl_", "embedding", "scalar_tensor", "uniform_", "normal_", "bernoulli_",
    "random_", "_pin_memory", "split_with_sizes_copy", "unbind_copy",
    "expand_copy", "permute_copy", "view_copy", "t_copy", "transpose_copy", "tril_indices",
    "triu_indices", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "_assert_async",
    "_foreach_copy_", "_foreach_zero_",
    # selection and comparison-only (0, as eq/lt; formulas_ext's docstring)
    "sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin",
    "nonzero", "nonzero_static", "searchsorted", "bucketize", "_is_all_true", "_is_any_true", "eye",
    "im2col", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_unique2", "unique_dim",
    "unique_consecutive", "exponential_", "geometric_", "cauchy_", "log_normal_",
    # rearrangement, padding and placement (formulas_layers' docstring)
    "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle", "diag_embed",
    "diagonal_copy", "diagonal_backward", "rot90", "block_diag", "masked_select", "masked_scatter",
    "index_fill", "index_fill_", "max_unpool2d", "max_unpool3d", "reflection_pad1d", "reflection_pad2d",
    "reflection_pad3d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "_pack_padded_sequence", "_pad_packed_sequence", "_linalg_check_errors", "_efficientzerotensor",
})
# Ops whose outputs are views of their input although their schemas carry no alias annotation
# (ATen's "unsafe" split/chunk, which RNN cells use to split their gates): cost 0, like views.
UNANNOTATED_VIEWS = frozenset({"unsafe_split", "unsafe_chunk", "unsafe_split_with_sizes"})


@lru_cache(maxsize=None)
def is_view(func: Any) -> bool:
    """True when every return of `func` aliases an input without writing it (views, alias ops), or
    `func` changes only an input's metadata in place (squeeze_, t_, as_strided_: tag inplace_view)."""
    if getattr(func, "is_view", False) or torch.Tag.inplace_view in func.tags:
        return True
    if func._schema.name.split("::")[-1] in UNANNOTATED_VIEWS:
        return True
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def is_allocation(func: Any) -> bool:
    """An uninitialised allocation (PyTorch names them empty*: aten::empty_like, new_empty_strided,
    the FusionLens kernels' fusionlens::empty_pooled): no arithmetic, no data moved."""
    name = func._schema.name.split("::")[-1]
    return name.startswith(("empty", "new_empty"))


_CIA = "CompositeImplicitAutograd"


@lru_cache(maxsize=None)
def _has_own_kernel(name: str, device_type: str) -> bool:
    """Whether op `name` has a kernel of its own for `device_type`'s backend or a
    CompositeExplicitAutograd one: then the dispatcher never uses its CompositeImplicitAutograd
    kernel for that backend."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        own = (torch._C._dispatch_key_for_device(device_type),)
    except RuntimeError:  # a device type without a dispatch key of its own
        own = ()
    return any(has(name, k) for k in own + ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"))


def decompose(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run `func` as ATen would outside a dispatch mode when that means its C++
    CompositeImplicitAutograd kernel (aten::linear under inference_mode), else NotImplemented.

    Ops with a kernel of their own that also carry a decomposition (aten::silu_backward,
    mish_backward) run whole, as the profiler shows them. Not `OpOverload.decompose`: that prefers
    a Python decomposition where one is registered, and those may differ (torch._decomp's
    aten::dropout clones its input in eval mode, where ATen's returns it as it is)."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _CIA):
        return NotImplemented
    found = fm.tensors((args, kwargs))
    if _has_own_kernel(func.name(), found[0].device.type if found else "cpu"):
        return NotImplemented
    return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def library_cost(func: Any, args: tuple, kwargs: dict) -> Any:
    """FusionLens's own kernels (`torch.ops.fusionlens.*`) count what their registry says
    (`kernels.op_cost`, the numbers KernelSpec.cost gives the advisor), None for other ops. Their
    outputs are arguments written in place, which the generic rules would count as read too."""
    if func.namespace != "fusionlens":
        return None
    import kernels  # already loaded: its ops exist only once it is

    bound = dict(zip((a.name for a in func._schema.arguments), args))
    bound.update(kwargs)
    return kernels.op_cost(func._schema.name, **bound)


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Algorithmic lower bound on bytes moved: inputs + outputs, views 0, BYTE_RULES first."""
    if is_view(func) or is_allocation(func):
        return 0
    cost = library_cost(func, args, kwargs)
    if cost is not None:
        return int(cost.bytes_fused)
    rule = fm.BYTE_RULES.get(func.overloadpacket)
    if rule is not None:
        return int(rule(args, kwargs, out))
    inputs = fm.tensors((args, kwargs))
    outputs = fm.tensors(out) or _written_args(func, args, kwargs)  # void in-place ops (_foreach_*_)
    return sum(fm.tensor_bytes(t) for t in inputs) + sum(fm.tensor_bytes(t) for t in outputs)


def _written_args(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors an op mutates in place (schema alias annotations with a write, e.g. Tensor(a!)[])."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
            written.extend(fm.tensors(value))
    return written


def _foreach_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    base = func._schema.name.split("::")[-1][len("_foreach_"):]
    per = fm.POINTWISE_FLOPS.get(base, fm.POINTWISE_FLOPS.get(base.rstrip("_"), 1))
    first = args[0] if args and isinstance(args[0], (list, tuple)) else []
    return int(per * sum(fm.numel(t) for t in first))


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[float, str]:
    """(FLOPs, rule used). NaN and "unknown" when no rule covers the op."""
    if is_view(func):
        return 0.0, "view"
    packet = func.overloadpacket
    formula = fm.FLOP_FORMULAS.get(packet)
    if formula is not None:
        return float(formula(*args, out_val=out, **kwargs)), "formula"
    if is_allocation(func):
        return 0.0, "allocation"
    cost = library_cost(func, args, kwargs)
    if cost is not None:
        return float(cost.flops), "kernel cost"
    name = func._schema.name.split("::")[-1]
    if name.startswith("_foreach_") and name not in ZERO_FLOP_OPS:
        return float(_foreach_flops(func, args, kwargs, out)), "foreach"
    if name in ZERO_FLOP_OPS:
        return 0.0, "data-movement"
    tags = set(func.tags)
    if torch.Tag.pointwise in tags or fm.tabled_pointwise(name) is not None:  # the table names untagged ones too
        return float(fm.pointwise_flops(func, args, kwargs, out)), "pointwise"
    if getattr(torch.Tag, "reduction", None) in tags:
        return float(fm.reduction_flops(func, args, kwargs, out)), "reduction"
    return math.nan, "unknown"


def _dims_and_type(value: Any, wants_tensor: bool = False) -> tuple[Any, str]:
    if wants_tensor and isinstance(value, (bool, int, float)):  # a wrapped-number tensor
        return [], {bool: "bool", int: "long int", float: "double"}[type(value)]
    if isinstance(value, torch.Tensor):
        return list(value.shape), KINETO_DTYPE_NAMES.get(value.dtype, str(value.dtype))
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, torch.Tensor) for v in value):
            return [list(v.shape) for v in value], "TensorList"
        return [], "ScalarList"
    if value is None:
        return [], ""
    if isinstance(value, (bool, int, float, complex, torch.SymInt, torch.SymFloat, torch.dtype,
                          torch.memory_format, torch.layout)):
        return [], "Scalar"
    return [], ""  # strings, devices, ...: Kineto writes an empty type


def signature(func: Any, args: tuple, kwargs: dict) -> tuple[str, str]:
    """(input_dims, input_types) as Kineto writes them with record_shapes: one entry per schema
    argument (defaults filled), compact JSON, so the untimed pass can supply shapes."""
    dims, types = [], []
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            value = arg.default_value if arg.has_default_value() else None
        d, t = _dims_and_type(value, str(arg.type) == "Tensor")
        dims.append(d)
        types.append(t)
    return json.dumps(dims, separators=(",", ":")), json.dumps(types, separators=(",", ":"))


@dataclass(frozen=True)
class OpCost:
    """One recorded aten op. bytes_moved is an algorithmic lower bound (inputs + outputs, views 0)."""

    step: int
    seq: int
    name: str
    overload: str
    flops: float
    bytes_moved: float
    rule: str
    input_dims: str
    input_types: str
    module: str | None = None


def innermost_module(parents: Any, entered: Mapping[str, tuple[int, bool]] | None = None) -> str | None:
    """The innermost of ModuleTracker's active module names ("Global" outside any module).

    Names nest as Root.child.grandchild. An active module with an active descendant is not the
    innermost, unless the tracker saw its forward start after that descendant was entered: under
    activation checkpointing a block's forward is recomputed inside the backward of its last layer,
    and then the block, then its first layer, run inside that layer. A parent entered in backward
    (a parent returning its child's output is entered there after the child) never is. Among the
    rest (siblings active together, as in that recomputation) the one entered last. `entered`:
    name -> (order, entered in backward), OrderedModuleTracker's; without it, the deepest name.
    """
    names = [n for n in parents if n != "Global"]
    order = entered or {}

    def outer(a: str) -> bool:  # an ancestor of an active module, not re-entered by a forward since
        tick, backward = order.get(a, (-1, True))
        return any(d.startswith(a + ".") and (backward or tick < order.get(d, (-1, True))[0]) for d in names)

    inner = [n for n in names if not outer(n)]
    if not inner:
        return None
    return max(inner, key=lambda n: (order.get(n, (-1, True))[0], n.count("."), len(n)))


def _module_tracker() -> Any:
    """torch's ModuleTracker, remembering the order modules were entered in (forward, backward and
    recomputation) where its hook factory is as in torch 2.4-2.13; the plain tracker otherwise, and
    None on a torch without one (the rows then name no module)."""
    try:
        from torch.utils.module_tracker import ModuleTracker
    except ImportError:
        return None

    if not callable(getattr(ModuleTracker, "_get_append_fn", None)):
        return ModuleTracker()

    class OrderedModuleTracker(ModuleTracker):
        def __init__(self) -> None:
            super().__init__()
            self.entered: dict[str, tuple[int, bool]] = {}  # name -> (order, in backward)
            self._tick = itertools.count()

        def _get_append_fn(self, name, is_bw):
            append = super()._get_append_fn(name, is_bw)

            def fn(*args) -> None:
                append(*args)
                self.entered[name] = (next(self._tick), is_bw)

            return fn

        # A tensor autograd cannot hook (a view taken under no_grad of a tensor that requires grad:
        # Reformer's reversible layers run their blocks inside an autograd Function's forward;
        # DBRX's experts pass views of their weights sliced under no_grad in inference) made
        # torch's hooks raise (AssertionError, or AttributeError where the view's own view has no
        # grad_fn) and the whole cost pass fail; the module is still entered and left, only its
        # backward goes unnamed.
        def _fw_pre_hook(self, mod, input) -> None:
            try:
                super()._fw_pre_hook(mod, input)
            except (AssertionError, AttributeError):
                pass

        def _fw_post_hook(self, mod, input, output) -> None:
            try:
                super()._fw_post_hook(mod, input, output)
            except (AssertionError, AttributeError):
                pass

    return OrderedModuleTracker()


class OpCostRecorder(TorchDispatchMode):
    """Records an OpCost per aten op run under it; `mark_step()` starts the next step's rows.

    With a `torch.utils.module_tracker.ModuleTracker` entered around it, each row also names the
    innermost module whose forward (or backward) ran the op, by qualified name
    ("GPT.blocks.0.attn.proj"), which the join carries to the profiled ops: the roofline's
    per-module table at no cost to the timed steps."""

    def __init__(self, tracker: Any = None) -> None:
        super().__init__()
        self.rows: list[OpCost] = []
        self.step = 0
        self._seq = 0
        self._tracker = tracker

    def mark_step(self) -> None:
        self.step += 1
        self._seq = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket not in fm.FLOP_FORMULAS:
            # A CompositeImplicitAutograd op reaches the mode whole under inference_mode
            # (aten::linear); record what it runs (aten::t, aten::addmm), as the profiler nests it.
            with self:
                decomposed = decompose(func, args, kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if func.namespace == "profiler":  # record_function markers: annotations, not ops
            return out
        try:
            flops, rule = op_flops(func, args, kwargs, out)
        except Exception as exc:  # a formula that cannot read these args: say so, keep running
            flops, rule = math.nan, f"error: {type(exc).__name__}"
        try:
            nbytes = float(op_bytes(func, args, kwargs, out))
        except Exception as exc:  # likewise for a byte rule (a library op's cost function)
            nbytes, rule = math.nan, f"{rule}; bytes error: {type(exc).__name__}"
        module = (innermost_module(self._tracker.parents, getattr(self._tracker, "entered", None))
                  if self._tracker is not None else None)
        self.rows.append(OpCost(self.step, self._seq, func._schema.name, func._overloadname, flops,
                                nbytes, rule, *signature(func, args, kwargs), module))
        self._seq += 1
        return out

    def frame(self) -> pd.DataFrame:
        """Rows as a DataFrame with COST_COLUMNS."""
        if not self.rows:
            return pd.DataFrame({k: pd.Series(dtype=v) for k, v in COST_COLUMNS.items()})
        df = pd.DataFrame([r.__dict__ for r in self.rows])
        return df.astype(COST_COLUMNS)[list(COST_COLUMNS)]


def record_costs(step_fn: Callable[[int], None], steps: int = 1, first_step: int = 0) -> pd.DataFrame:
    """Run `step_fn(i)` for `steps` steps under the recorder; one row per aten op (COST_COLUMNS).

    torch.compile'd code runs eagerly for the pass (stance "force_eager"): Dynamo skips a frame it
    meets under a dispatch mode and keeps skipping that code afterwards, so without the stance the
    pass would leave a compiled model eager for the profiled steps that follow. A ModuleTracker
    names each op's module (forward and backward).
    """
    tracker = _module_tracker()
    recorder = OpCostRecorder(tracker)
    with warnings.catch_warnings(), torch.compiler.set_stance("force_eager"), tracker or nullcontext(), recorder:
        # a compiled module under the tracker's global hooks fires them for its wrapper too (its
        # ops are named OptimizedModule._orig_mod.*); torch warns about that on every call
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        for i in range(steps):
            if i:
                recorder.mark_step()
            step_fn(first_step + i)
    return recorder.frame()


WRAPPERS = (("DistributedDataParallel", "module"), ("OptimizedModule", "_orig_mod"))  # class, attribute


def unwrapped_names(costs: pd.DataFrame, model: torch.nn.Module) -> pd.DataFrame:
    """`costs` whose module names start at the user's model, not at its wrappers: a DDP or
    torch.compile'd model's ops are recorded as `DistributedDataParallel.module.<child>` /
    `OptimizedModule._orig_mod.<child>`; they become `<ModelClass>.<child>`, as an unwrapped
    capture names them."""
    prefix, inner = type(model).__name__, model
    for cls, attr in WRAPPERS * 2:  # DDP around a compiled model, or the other way round
        if type(inner).__name__ == cls and isinstance(getattr(inner, attr, None), torch.nn.Module):
            prefix, inner = f"{prefix}.{attr}", getattr(inner, attr)
    if inner is model:
        return costs
    names = costs["module"].astype("string")
    return costs.assign(module=names.str.replace(rf"^{re.escape(prefix)}(?=\.|$)", type(inner).__name__, regex=True))


def costs_of(fn: Callable[[], Any]) -> pd.DataFrame:
    """Rows for one call of `fn()` (tests, notebooks)."""
    return record_costs(lambda _: fn(), 1)

"""What a GPU row is: computation, communication or memory; which collective; tensor cores or not.

Kernel types follow HTA's three classes. `memory` = `gpu_memcpy` / `gpu_memset` rows (plus the
few copy/fill kernels that runtimes launch as ordinary kernels, e.g. ROCm's
`__amd_rocclr_copyBuffer`). `communication` is recognised by content, not only by an `nccl`
prefix: a row is communication when it carries NCCL/RCCL collective args (`collective_name`), or
its name matches one of `COMM_PATTERNS` (NCCL, RCCL, MSCCL, NVSHMEM kernels, and all-reduce /
all-gather / reduce-scatter / all-to-all kernels of other libraries such as vLLM's
`cross_device_reduce_*` or PyTorch symmetric-memory `multimem_all_reduce_kernel`). Everything
else on the GPU is `computation`.

Tensor-core kernels are recognised by name (`TENSOR_CORE_PATTERNS`): a name is the only evidence a
trace holds, so this is an estimate, as in the TensorBoard profiler. Patterns are data (tuples of
frozen `NamePattern`s); matching is done once per distinct name (names are categorical), never
once per event.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np
import pandas as pd

COMPUTATION = "computation"
COMMUNICATION = "communication"
MEMORY = "memory"
KERNEL_TYPES: tuple[str, ...] = (COMPUTATION, COMMUNICATION, MEMORY)
GPU_ACTIVITY_KINDS: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
MEMORY_KINDS: tuple[str, ...] = ("gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class NamePattern:
    """A named, case-insensitive regular expression searched in a kernel (or collective) name."""

    label: str
    regex: str
    note: str = ""
    compiled: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("NamePattern needs a label")
        try:
            object.__setattr__(self, "compiled", re.compile(self.regex, re.IGNORECASE))
        except re.error as exc:
            raise ValueError(f"pattern {self.label!r}: bad regex {self.regex!r}: {exc}") from exc


def _check_unique(patterns: tuple[NamePattern, ...], what: str) -> tuple[NamePattern, ...]:
    seen = [p.label for p in patterns]
    dup = sorted({x for x in seen if seen.count(x) > 1})
    if dup:
        raise ValueError(f"duplicate {what} pattern labels: {dup}")
    return patterns


# Communication kernels: a match on any of these makes a kernel `communication`.
COMM_PATTERNS: tuple[NamePattern, ...] = _check_unique((
    NamePattern("nccl", r"^(void\s+)?nccl|ncclDevKernel|ncclKernel", "NCCL kernels"),
    NamePattern("rccl", r"^(void\s+)?rccl|rcclKernel", "RCCL (AMD) kernels"),
    NamePattern("msccl", r"msccl", "MSCCL / MSCCL++ kernels"),
    NamePattern("nvshmem", r"nvshmem", "NVSHMEM device-initiated communication"),
    NamePattern("all_reduce", r"all_?reduce|allreduce", "e.g. multimem_all_reduce_kernel, one_shot_all_reduce"),
    NamePattern("cross_device_reduce", r"cross_device_reduce", "vLLM custom all-reduce"),
    NamePattern("all_gather", r"all_?gather", ""),
    NamePattern("reduce_scatter", r"reduce_?scatter", ""),
    NamePattern("all_to_all", r"all_?to_?all", ""),
), "communication")

# Which collective a communication row performs. First match wins, so the specific names come
# before their substrings (reduce_scatter and all_reduce before reduce).
COLLECTIVE_PATTERNS: tuple[NamePattern, ...] = _check_unique((
    NamePattern("all_reduce", r"all_?reduce|allreduce|cross_device_reduce"),
    NamePattern("reduce_scatter", r"reduce_?scatter"),
    NamePattern("all_gather", r"all_?gather"),
    NamePattern("all_to_all", r"all_?to_?all"),
    NamePattern("broadcast", r"broadcast|bcast"),
    NamePattern("send_recv", r"send_?recv|\bsend\b|\brecv\b|_send|_recv|send$|recv$|sendrecv"),
    NamePattern("reduce", r"reduce"),
    NamePattern("barrier", r"barrier"),
    NamePattern("gather", r"gather"),
    NamePattern("scatter", r"scatter"),
), "collective")

# Kernels that only move or fill memory although launched as ordinary kernels.
MEMORY_KERNEL_PATTERNS: tuple[NamePattern, ...] = _check_unique((
    NamePattern("rocclr_copy_fill", r"__amd_rocclr_(copy|fill)", "ROCm runtime copy/fill kernels"),
), "memory kernel")

# Tensor-core kernels, by name.
TENSOR_CORE_PATTERNS: tuple[NamePattern, ...] = _check_unique((
    NamePattern("wmma", r"wmma", "WMMA API (NVIDIA) / RDNA WMMA (AMD)"),
    NamePattern("mma", r"(^|[^a-z])(h|i|wg)?mma([^a-z]|$)|hmma|imma|wgmma", "mma.sync / HMMA / WGMMA in the name"),
    NamePattern("tensorop", r"tensorop", "CUTLASS tensor-op kernels (cutlass_80_tensorop_*, cutlass3x_*tensorop*)"),
    NamePattern("xmma", r"xmma", "cuBLAS/cuDNN xmma kernels (sm80_xmma_*, sm90_xmma_*)"),
    NamePattern("shape_gemm", r"[hsi]\d{3,6}(gemm|cudnn)", "volta_h884gemm, ampere_*_s16816gemm, s1688gemm"),
    NamePattern("nvjet", r"nvjet", "Hopper/Blackwell cuBLASLt JIT kernels"),
    NamePattern("cutlass_sm9", r"cutlass.*sm(90|100|120)", "CUTLASS 3.x Hopper+ GEMMs (WGMMA)"),
    NamePattern("gmma", r"gmma", "Hopper GMMA (cutlass::gemm::...Gmma...)"),
    NamePattern("amd_mfma", r"^Cijk_.*_MI\d+x\d+|mfma|xdlops|_xdl_|gemm_xdl", "AMD MFMA: Tensile Cijk_*_MI16x16x1, CK xdl"),
    NamePattern("flash_attention", r"flash_fwd|flash_bwd|flash::|fmha_cutlass[fb]_(f16|bf16)|fmha_.*(f16|bf16)|sdpa",
                "FlashAttention / fused MHA (half precision)"),
), "tensor core")


def _match_any(names: Iterable[str], patterns: tuple[NamePattern, ...]) -> np.ndarray:
    """Bool per name: does any pattern match? (one combined regex per call)."""
    names = list(names)
    if not names or not patterns:
        return np.zeros(len(names), dtype=bool)
    combined = re.compile("|".join(f"(?:{p.regex})" for p in patterns), re.IGNORECASE)
    return np.fromiter((combined.search(str(n)) is not None for n in names), dtype=bool, count=len(names))


def first_label(names: Iterable[str], patterns: tuple[NamePattern, ...]) -> list[str | None]:
    out: list[str | None] = []
    for n in names:
        s = str(n)
        out.append(next((p.label for p in patterns if p.compiled.search(s)), None))
    return out


def per_distinct(values: pd.Series, fn) -> np.ndarray:
    """Apply `fn(list_of_distinct_values) -> array` once per distinct value, broadcast to rows."""
    cat = values.astype("category") if not isinstance(values.dtype, pd.CategoricalDtype) else values
    codes = cat.cat.codes.to_numpy()
    per_cat = np.asarray(fn(list(cat.cat.categories)))
    if len(per_cat) == 0:
        return np.full(len(codes), None if per_cat.dtype == object else False, dtype=per_cat.dtype)
    out = per_cat[np.maximum(codes, 0)]
    if (codes < 0).any():  # missing names match nothing
        out = out.copy()
        out[codes < 0] = None if out.dtype == object else False
    return out


def names_match(names: pd.Series, patterns: tuple[NamePattern, ...]) -> np.ndarray:
    """Bool per row: does the row's name match any of `patterns`?"""
    return per_distinct(names, lambda cats: _match_any(cats, patterns))


def is_communication(rows: pd.DataFrame) -> np.ndarray:
    """Bool per row: a kernel that communicates (collective args or a communication name)."""
    kernel = (rows["kind"] == "kernel").to_numpy()
    has_args = rows["collective_name"].notna().to_numpy() if "collective_name" in rows else False
    return kernel & (has_args | names_match(rows["name"], COMM_PATTERNS))


def kernel_type(rows: pd.DataFrame) -> pd.Series:
    """Kernel type per GPU-activity row (computation/communication/memory); NaN for other kinds."""
    code = np.full(len(rows), -1, dtype=np.int8)  # codes into KERNEL_TYPES; -1 = not GPU activity
    is_kernel = (rows["kind"] == "kernel").to_numpy()
    code[is_kernel] = KERNEL_TYPES.index(COMPUTATION)
    code[is_kernel & names_match(rows["name"], MEMORY_KERNEL_PATTERNS)] = KERNEL_TYPES.index(MEMORY)
    code[is_communication(rows)] = KERNEL_TYPES.index(COMMUNICATION)
    code[rows["kind"].isin(MEMORY_KINDS).to_numpy()] = KERNEL_TYPES.index(MEMORY)
    cat = pd.Categorical.from_codes(code, categories=list(KERNEL_TYPES))
    return pd.Series(cat, index=rows.index, name="kernel_type")


def collective(rows: pd.DataFrame) -> pd.Series:
    """Collective performed by each communication row (all_reduce, all_gather, ...), else NaN.

    Taken from the `collective_name` arg when recorded, else from the kernel name; a communication
    kernel whose name says nothing (e.g. `ncclDevKernel_Generic`) is `other`.
    """
    comm = is_communication(rows)
    from_arg = per_distinct(rows["collective_name"].astype("string").fillna(""),
                             lambda cats: np.array(first_label(cats, COLLECTIVE_PATTERNS), dtype=object))
    from_name = per_distinct(rows["name"], lambda cats: np.array(first_label(cats, COLLECTIVE_PATTERNS), dtype=object))
    label = np.where(pd.isna(from_arg), from_name, from_arg)
    label = np.where(pd.isna(label), "other", label)
    label = np.where(comm, label, None)
    cats = [p.label for p in COLLECTIVE_PATTERNS] + ["other"]
    return pd.Series(pd.Categorical(label, categories=cats), index=rows.index, name="collective")


def is_tensor_core(rows: pd.DataFrame) -> np.ndarray:
    """Bool per row: a kernel whose name says it runs on tensor cores (MMA/MFMA)."""
    kernel = (rows["kind"] == "kernel").to_numpy()
    return kernel & names_match(rows["name"], TENSOR_CORE_PATTERNS)

"""Device table: datasheet ceilings per GPU, and the `Ceilings` every roofline reads (DESIGN.md, Roofline).

The table is the only place FusionLens knows hardware numbers (STYLE habit 12). Each entry keeps
peak *dense* FLOP/s per dtype and the 2:4-structured-sparse figures in a separate mapping that no
roofline ever reads, memory bandwidth, L2 size, SM/CU count and, for every figure, the document it
came from. Where a datasheet prints only sparse figures, the dense value is half of it and the
source says so. `lookup_device` picks an entry from a trace's `deviceProperties` (or a name) by
normalised name rules tried in table order, so the same name always gives the same entry.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

from profiler.errors import FusionLensError

T = 1e12  # TFLOP/s -> FLOP/s
GB_S = 1e9  # GB/s -> bytes/s
MIB = 1024 * 1024

# Roofline dtypes. "<x>_tensor" is the matrix-unit rate of dtype <x> where it differs from the
# vector rate (FP64 tensor cores, AMD FP32 matrix cores); the roof of <x> is the larger of the two.
# tf32 is its own entry: PyTorch does not use it for float32 matmuls unless asked.
DTYPES: tuple[str, ...] = ("fp64", "fp64_tensor", "fp32", "fp32_tensor", "tf32", "fp16", "bf16", "fp8")
CEILING_SOURCES = re.compile(r"^(measured|table:[\w.\-]+)$")


class DeviceTableError(FusionLensError):
    """An invalid ceiling or device entry (a programming error in the table or a bad cache)."""


def _check_flops(where: str, flops: Mapping[str, float]) -> Mapping[str, float]:
    for dtype, value in flops.items():
        if dtype not in DTYPES:
            raise DeviceTableError(f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DeviceTableError(f"{where}: peak for {dtype} must be a positive finite FLOP/s, got {value!r}")
    return MappingProxyType({k: float(v) for k, v in flops.items()})


@dataclass(frozen=True)
class Ceilings:
    """The roofs one roofline uses: dense peak FLOP/s per dtype and memory bandwidth.

    source: "measured" or "table:<entry name>". details: provenance (figure sources, machine
    fingerprint, load average, sizes timed, ...), free-form but JSON-serialisable.
    """

    peak_flops_per_s: Mapping[str, float]
    mem_bw_bytes_per_s: float
    source: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.peak_flops_per_s:
            raise DeviceTableError("Ceilings need at least one peak FLOP/s figure")
        object.__setattr__(self, "peak_flops_per_s", _check_flops("Ceilings", self.peak_flops_per_s))
        bw = self.mem_bw_bytes_per_s
        if not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
            raise DeviceTableError(f"Ceilings: memory bandwidth must be a positive finite bytes/s, got {bw!r}")
        object.__setattr__(self, "mem_bw_bytes_per_s", float(bw))
        if not isinstance(self.source, str) or not CEILING_SOURCES.match(self.source):
            raise DeviceTableError(f"Ceilings: source must be 'measured' or 'table:<name>', got {self.source!r}")
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def peak_for(self, dtype: str) -> Optional[float]:
        """The roof for `dtype`: the larger of its vector and matrix rates; None when unknown."""
        values = [self.peak_flops_per_s.get(k) for k in (dtype, f"{dtype}_tensor")]
        values = [v for v in values if v is not None]
        return max(values) if values else None

    def ridge_flop_per_byte(self, dtype: str) -> Optional[float]:
        """Intensity where the memory roof meets the compute roof of `dtype`."""
        peak = self.peak_for(dtype)
        return None if peak is None else peak / self.mem_bw_bytes_per_s

    def with_details(self, **extra: Any) -> "Ceilings":
        """The same roofs with `extra` added to the details (where they came from, what happened)."""
        return dataclasses.replace(self, details={**self.details, **extra})

    def to_json(self) -> dict[str, Any]:
        return {"peak_flops_per_s": dict(self.peak_flops_per_s), "mem_bw_bytes_per_s": self.mem_bw_bytes_per_s,
                "source": self.source, "details": _plain(self.details)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Ceilings":
        try:
            return cls(dict(data["peak_flops_per_s"]), data["mem_bw_bytes_per_s"], data["source"],
                       dict(data.get("details", {})))
        except (KeyError, TypeError) as exc:
            raise DeviceTableError(f"Ceilings JSON lacks or mistypes a field: {exc}") from exc


def _plain(value: Any) -> Any:
    """MappingProxy/tuple -> dict/list, for JSON."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class DeviceSpec:
    """One table entry. `sources` maps a field ('dense', 'sparse', 'mem_bw', 'l2', 'sm_count',
    'identity') to the document it was read from; every figure present has a source."""

    name: str
    vendor: str
    dense_flops_per_s: Mapping[str, float]
    sparse_flops_per_s: Mapping[str, float]
    mem_bw_bytes_per_s: float
    memory_bytes: Optional[int]
    l2_bytes: Optional[int]
    sm_count: Optional[int]
    sources: Mapping[str, str]
    notes: str = ""

    def __post_init__(self) -> None:
        where = f"device {self.name!r}"
        object.__setattr__(self, "dense_flops_per_s", _check_flops(where + " dense", self.dense_flops_per_s))
        object.__setattr__(self, "sparse_flops_per_s", _check_flops(where + " sparse", self.sparse_flops_per_s))
        for dtype, sparse in self.sparse_flops_per_s.items():
            dense = self.dense_flops_per_s.get(dtype)
            if dense is None or not 1.9 <= sparse / dense <= 2.1:  # 2:4 sparsity doubles the math rate
                raise DeviceTableError(f"{where}: sparse {dtype} must be ~2x a dense figure (dense={dense}, sparse={sparse})")
        if not (self.mem_bw_bytes_per_s > 0 and math.isfinite(self.mem_bw_bytes_per_s)):
            raise DeviceTableError(f"{where}: memory bandwidth must be positive")
        needed = {"dense", "mem_bw"} | ({"sparse"} if self.sparse_flops_per_s else set())
        needed |= {k for k in ("l2", "sm_count") if getattr(self, {"l2": "l2_bytes", "sm_count": "sm_count"}[k])}
        missing = needed - set(self.sources)
        if missing:
            raise DeviceTableError(f"{where}: figures without a source: {', '.join(sorted(missing))}")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def ceilings(self) -> Ceilings:
        """Dense ceilings from this entry (sparse figures never become a roof)."""
        return Ceilings(dict(self.dense_flops_per_s), self.mem_bw_bytes_per_s, f"table:{self.name}",
                        {"sources": dict(self.sources), "notes": self.notes})


@dataclass(frozen=True)
class DeviceMatch:
    """Result of a lookup: the entry or None, and why (always a human line)."""

    spec: Optional[DeviceSpec]
    reason: str

    @property
    def ceilings(self) -> Optional[Ceilings]:
        return self.spec.ceilings() if self.spec else None


# Name rules, tried in order; the first whose regex matches the normalised name wins. Normalised:
# lower case, every run of non-alphanumerics -> one space ("NVIDIA A100-SXM4-80GB" ->
# "nvidia a100 sxm4 80gb"). More specific rules come first.
_RULES: tuple[tuple[str, str], ...] = (
    (r"\bh200\b", "H200-SXM-141GB"),
    (r"^(?=.*\bh100\b)(?=.*\bpcie\b)", "H100-PCIE-80GB"),
    (r"\bh100\b", "H100-SXM5-80GB"),
    (r"^(?=.*\ba100\b)(?=.*\bpg509\b)", "A100-PG509-200"),
    (r"^(?=.*\ba100\b)(?=.*\bpcie\b)(?=.*\b80gb\b)", "A100-PCIE-80GB"),
    (r"^(?=.*\ba100\b)(?=.*\bpcie\b)", "A100-PCIE-40GB"),
    (r"^(?=.*\ba100\b)(?=.*\b80gb\b)", "A100-SXM4-80GB"),
    (r"\ba100\b", "A100-SXM4-40GB"),
    (r"\bl40s\b", "L40S"),
    (r"\bl4\b", "L4"),
    (r"\brtx 4090\b", "RTX-4090"),
    (r"\ba10g\b", "A10G"),
    (r"^(?=.*\bv100\b)(?=.*\bdgxs\b)", "V100-DGXS"),
    (r"^(?=.*\bv100\b)(?=.*\bpcie\b)", "V100-PCIE"),
    (r"\bv100\b", "V100-SXM2"),
    (r"\b2080 ti\b", "RTX-2080-Ti"),
    (r"\bmi300x\b", "MI300X"),
    (r"\bmi250x\b", "MI250X-GCD"),
    (r"\bmi250\b", "MI250-GCD"),
)
# Names that look like a table entry but are not it: refused with the reason rather than mismatched.
_NOT_IN_TABLE: tuple[tuple[str, str], ...] = (
    (r"\bmig\b", "a MIG slice has a fraction of the GPU's SMs and bandwidth: datasheet ceilings do not apply"),
    (r"\bnvl\b", "NVL variants (H100 NVL, H200 NVL) have their own clocks and memory and are not in the table"),
)
# Names that say nothing about the model (ROCm builds report MI250 GCDs as "AMD Radeon Graphics"):
# these match by hardware signature (CU count and memory size) instead.
_GENERIC_NAMES = frozenset({"amd radeon graphics", "radeon graphics"})


def normalise_name(name: str) -> str:
    """Lower case, runs of non-alphanumerics -> one space, trimmed."""
    return re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()


def device_table() -> Mapping[str, DeviceSpec]:
    """Every entry by name (the table lives in device_table.py; imported lazily)."""
    from profiler.capture.device_table import DEVICE_TABLE

    return MappingProxyType({spec.name: spec for spec in DEVICE_TABLE})


def _by_signature(props: Mapping[str, Any], table: Mapping[str, DeviceSpec]) -> Optional[DeviceSpec]:
    sms, mem = props.get("numSms"), props.get("totalGlobalMem")
    if not isinstance(sms, int) or not isinstance(mem, (int, float)) or mem <= 0:
        return None
    vendor = "amd" if props.get("warpSize") == 64 else "nvidia"
    hits = [s for s in table.values() if s.vendor == vendor and s.sm_count == sms and s.memory_bytes
            and abs(mem - s.memory_bytes) / s.memory_bytes < 0.1]
    return hits[0] if len(hits) == 1 else None


def lookup_device(device: Mapping[str, Any] | str | None) -> DeviceMatch:
    """Pick the table entry for one `deviceProperties` entry (or a bare device name).

    Never raises on odd input: an empty/unknown name gives `DeviceMatch(None, reason)`.
    """
    props: Mapping[str, Any] = device if isinstance(device, Mapping) else {"name": device}
    raw = props.get("name")
    if not isinstance(raw, str) or not raw.strip():
        return DeviceMatch(None, "deviceProperties has no device name: no datasheet ceilings")
    table = device_table()
    norm = normalise_name(raw)
    if norm in _GENERIC_NAMES:
        spec = _by_signature(props, table)
        if spec is None:
            return DeviceMatch(None, f"generic device name {raw!r} and no unique table entry with "
                                     f"{props.get('numSms')} SMs/CUs and {props.get('totalGlobalMem')} bytes")
        return DeviceMatch(spec, f"generic name {raw!r} matched {spec.name} by SM/CU count and memory size")
    for pattern, why in _NOT_IN_TABLE:
        if re.search(pattern, norm):
            return DeviceMatch(None, f"device {raw!r}: {why}")
    for pattern, entry in _RULES:
        if re.search(pattern, norm):
            return DeviceMatch(table[entry], f"{raw!r} matched {entry} by name")
    return DeviceMatch(None, f"device {raw!r} is not in the device table")


def ceilings_from_meta(meta: Mapping[str, Any]) -> DeviceMatch:
    """Table ceilings for a Trace's first device (`meta['device_properties'][0]`), with the reason."""
    props = meta.get("device_properties") or ()
    if not props:
        return DeviceMatch(None, "trace has no deviceProperties (CPU trace or not recorded)")
    return lookup_device(props[0])

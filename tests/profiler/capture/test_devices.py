"""Device table: lookups for the test traces' deviceProperties, dense vs sparse kept apart, sources."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profiler.capture.devices import DTYPES, Ceilings, DeviceTableError, ceilings_from_meta, device_table, lookup_device

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
# Expected entry per deviceProperties name in tests/data/traces (read from the files below).
EXPECTED = {
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100-PG509-200": "A100-PG509-200",
    "AMD Radeon Graphics": "MI250-GCD",  # generic ROCm name: matched by 104 CUs + 64 GB
    "Tesla V100-SXM2-32GB": "V100-SXM2",
    "Tesla V100-SXM2-16GB": "V100-SXM2",
    "Tesla V100-DGXS-32GB": "V100-DGXS",
    "NVIDIA GeForce RTX 2080 Ti": "RTX-2080-Ti",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "AMD Instinct MI300X": "MI300X",
}


def _first_device_props(path: Path):
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    return props[0] if props else None


def test_every_trace_device_resolves():
    seen = set()
    for path in sorted(TRACES.glob("*.json.gz")):
        props = _first_device_props(path)
        if props is None:
            continue
        match = lookup_device(props)
        if not props.get("name"):
            assert match.spec is None and "no device name" in match.reason, path.name
            continue
        seen.add(props["name"])
        assert match.spec is not None, f"{path.name}: {match.reason}"
        assert match.spec.name == EXPECTED[props["name"]], path.name
        if match.spec.sm_count:  # the table agrees with what the device itself reported
            assert match.spec.sm_count == props["numSms"], path.name
    assert seen == set(EXPECTED)


@pytest.mark.parametrize("name, entry", [
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"), ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"), ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("NVIDIA H200", "H200-SXM-141GB"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"), ("NVIDIA A10G", "A10G"), ("Tesla V100-PCIE-16GB", "V100-PCIE"),
    ("AMD Instinct MI250X", "MI250X-GCD"), ("  nvidia   h100_80gb hbm3 ", "H100-SXM5-80GB"),
])
def test_names_resolve_deterministically(name, entry):
    first, second = lookup_device(name), lookup_device(name)
    assert first.spec.name == second.spec.name == entry


@pytest.mark.parametrize("bad", ["", "   ", None, {"name": ""}, {}, "NVIDIA A10", "Intel Arc A770", "NVIDIA H100 NVL",
                                 "NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "NVIDIA GH200 480GB"])
def test_unknown_or_empty_names_give_none_with_reason(bad):
    match = lookup_device(bad)
    assert match.spec is None and match.ceilings is None and match.reason


def test_dense_and_sparse_never_mixed():
    h100 = lookup_device("NVIDIA H100 80GB HBM3").spec
    assert h100.dense_flops_per_s["bf16"] == pytest.approx(989.4e12)
    assert h100.sparse_flops_per_s["bf16"] == pytest.approx(1978.9e12)
    ceil = h100.ceilings()
    assert ceil.peak_for("bf16") == pytest.approx(989.4e12) and ceil.source == "table:H100-SXM5-80GB"
    for spec in device_table().values():
        roofs = spec.ceilings().peak_flops_per_s
        assert dict(roofs) == dict(spec.dense_flops_per_s), spec.name
        for dtype, sparse in spec.sparse_flops_per_s.items():
            assert sparse == pytest.approx(2 * spec.dense_flops_per_s[dtype], rel=0.03), (spec.name, dtype)
            assert roofs[dtype] < sparse


def test_every_figure_has_a_source_and_sane_magnitudes():
    for spec in device_table().values():
        assert {"dense", "mem_bw"} <= set(spec.sources), spec.name
        assert all(len(s) > 20 for s in spec.sources.values()), spec.name
        assert 1e11 < spec.mem_bw_bytes_per_s < 1e13, spec.name  # 100 GB/s .. 10 TB/s
        assert set(spec.dense_flops_per_s) <= set(DTYPES)
        assert spec.dense_flops_per_s["fp32"] > 1e12


def test_ceilings_validate_themselves():
    ok = Ceilings({"fp32": 1e12}, 1e11, "measured")
    assert ok.ridge_flop_per_byte("fp32") == 10.0 and ok.peak_for("bf16") is None
    assert Ceilings.from_json(ok.to_json()) == ok
    for bad in [dict(peak_flops_per_s={}, mem_bw_bytes_per_s=1.0, source="measured"),
                dict(peak_flops_per_s={"fp32": -1.0}, mem_bw_bytes_per_s=1.0, source="measured"),
                dict(peak_flops_per_s={"int4": 1.0}, mem_bw_bytes_per_s=1.0, source="measured"),
                dict(peak_flops_per_s={"fp32": 1.0}, mem_bw_bytes_per_s=float("nan"), source="measured"),
                dict(peak_flops_per_s={"fp32": 1.0}, mem_bw_bytes_per_s=1.0, source="guess")]:
        with pytest.raises(DeviceTableError):
            Ceilings(**bad)


def test_ceilings_from_trace_meta():
    assert ceilings_from_meta({"device_properties": ()}).spec is None
    match = ceilings_from_meta({"device_properties": ({"name": "Tesla V100-SXM2-16GB"},)})
    assert match.ceilings.mem_bw_bytes_per_s == 900e9

"""`python -m kernels`: the inventory matches the registry and each provider's probe, in text and JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernels
from kernels.__main__ import NOT_PROBED, inventory, main, render
from kernels.registry import KERNELS, available_providers

ROOT = Path(__file__).resolve().parents[2]


def test_inventory_matches_registry_and_probes(tmp_path) -> None:
    out = tmp_path / "inv.json"
    assert main(["list", "--json", str(out)]) == 0
    inv = json.loads(out.read_text())
    assert [k["name"] for k in inv["kernels"]] == sorted(KERNELS)
    for k in inv["kernels"]:
        spec = KERNELS[k["name"]]
        assert set(k["providers"]) == set(spec.providers) | {"reference"}
        assert k["dtypes"] == [str(d).replace("torch.", "") for d in spec.supports.dtypes]
        assert k["devices"] == list(spec.supports.devices)
    probes = available_providers()
    assert set(inv["providers"]) == set(probes)
    for name, p in inv["providers"].items():
        assert p == {"available": probes[name] is None, "reason": probes[name]}, name


def test_text_shows_every_reason_and_marks_off_providers() -> None:
    inv = inventory(build=False)
    assert inv["providers"]["cpu"] == {"available": False, "reason": NOT_PROBED}
    text = render(inv)
    for name, p in inv["providers"].items():
        assert f"{name:<10} {'available' if p['available'] else 'off: ' + p['reason']}" in text
    # the cpu provider is off in this inventory, so every kernel shows it in brackets
    layer_norm = next(line for line in text.splitlines() if line.strip().startswith("layer_norm "))
    assert "[cpu]" in layer_norm and "reference" in layer_norm
    assert len([line for line in text.splitlines() if line.startswith("  ") and "/" in line]) >= len(KERNELS)


def test_module_entry_point_and_bad_arguments() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ok = subprocess.run([sys.executable, "-m", "kernels", "--no-build", "--json", "-"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    inv = json.loads(ok.stdout)
    assert inv["providers"]["triton"]["reason"] == kernels.available_providers()["triton"]
    bad = subprocess.run([sys.executable, "-m", "kernels", "frobnicate"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_decisions_lists_measured_choices_and_forget_drops_them(tmp_path, monkeypatch, capsys) -> None:
    """`decisions` shows what the measured choice picked per shape class (from the decisions file
    of this machine and build); `forget` drops them, file included, and the next call measures."""
    import torch

    from kernels import tuning

    kernels.available_providers()  # probe (and build) in the normal data dir first: not in tmp_path
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.ENV_MODE, "measure")
    tuning.forget_decisions()
    try:
        assert main(["decisions"]) == 0
        assert "No measured provider choices stored" in capsys.readouterr().out
        x = torch.randn(64, 96)
        choice = kernels.provider_choice("gelu", x)
        assert choice.how == "measured"
        tuning.forget_decisions()  # what a new process sees: the file
        out = tmp_path / "dec.json"
        assert main(["decisions", "--json", str(out)]) == 0
        text = capsys.readouterr().out
        (row,) = json.loads(out.read_text())["decisions"]
        assert row["kernel"] == "gelu" and row["provider"] == choice.provider and row["pass"] == "fwd"
        assert row["times_us"] == pytest.approx(dict(choice.times_us))
        assert row["threads"] == f"t{torch.get_num_threads()}" and row["key"] == choice.key
        assert f"-> {choice.provider}" in text and "gelu" in text
        assert main(["forget"]) == 0
        assert "forgot 1 measured provider choice(s)" in capsys.readouterr().out
        assert json.loads((tmp_path / "tuning" / "provider_choice.json").read_text())["machines"] == {}
        assert kernels.provider_choice("gelu", x).how == "measured"  # measured anew
    finally:
        tuning.forget_decisions()

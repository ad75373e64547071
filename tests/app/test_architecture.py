"""The dependency direction of DESIGN.md, enforced on the source text.

pages/app.py -> fusion_advisor -> profiler, kernels; kernels imports neither; only app.py and
pages/ import streamlit.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _package_files(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("pkg", ["profiler", "fusion_advisor", "kernels"])
def test_core_never_imports_streamlit(pkg: str) -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _package_files(pkg) if "streamlit" in _imports(p)]
    assert offenders == [], f"streamlit imported outside app.py/pages: {offenders}"


@pytest.mark.parametrize("pkg, forbidden", [
    ("kernels", {"profiler", "fusion_advisor", "pages"}),
    ("profiler", {"fusion_advisor", "pages"}),
    ("fusion_advisor", {"pages"}),
])
def test_dependencies_point_one_way(pkg: str, forbidden: set[str]) -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(_imports(p) & forbidden) for p in _package_files(pkg)}
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"{pkg} imports against the design's direction: {offenders}"


def test_the_checker_sees_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import streamlit as st\nfrom profiler.trace import Trace\n")
    assert _imports(probe) == {"streamlit", "profiler"}

"""The README's examples and links work as written: its Python quick start runs (in a fresh
interpreter, as a user would paste it), the commands it lists exist, and every relative link in
the README and docs/ points at a file (and heading) that is there."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_python_quick_start_runs() -> None:
    blocks = _blocks("python")
    assert blocks, "the README has no Python example"
    code = "\n".join(blocks) + "\nmodel(torch.randn(4, 768)).sum().backward()\nopt.step()\n"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert run.returncode == 0, run.stderr[-3000:]


def test_listed_commands_exist() -> None:
    """Each `python -m PKG SUBCOMMAND` of the README's command list is a subcommand PKG accepts."""
    listed = re.findall(r"^python -m (profiler|kernels) (\w+)", "\n".join(_blocks("sh")), re.M)
    assert {p for p, _ in listed} == {"profiler", "kernels"}
    for pkg, sub in sorted(set(listed)):
        run = subprocess.run([sys.executable, "-m", pkg, sub, "--help"], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert run.returncode == 0, f"python -m {pkg} {sub} --help: {run.stderr[-1000:]}"


def test_make_targets_exist() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make ([\w-]+)", README.read_text())) | set(re.findall(r"^make ([\w-]+)", README.read_text(), re.M))
    assert named and named <= targets, named - targets


@pytest.mark.parametrize("doc", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = {_anchor(line) for line in file.read_text().splitlines() if line.startswith("#")}
            if anchor not in headings:
                broken.append(target)
    assert not broken, f"{doc.name}: broken links {broken}"

"""First-build time of the CPU kernels' C++ extension: the working tree against a git revision.

What a user waits for on the first kernel call (kernels/_build.py). Each variant's `kernels/`
package is copied into a temporary tree (the revision's through `git archive`), and every round
builds it from nothing into a fresh data dir in a child process (ninja's default jobs), the
variants alternating round by round. Reports wall time and the children's CPU time (user + sys,
all compiler processes), p20/p50/p80, and the per-round speedup.

    .venv/bin/python benchmarks/bench_build.py [--rev c7c4a25] [--rounds 2] [--csv cpp_build.csv]

Rows (benchmark "cpp_build", variants "rev <REV>" / "working tree", metrics wall_time, cpu_time,
speedup) go to benchmarks/results/<csv>. Each build takes 40-70 s on a 2-core machine.
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

from benchmarks.harness import append_rows, percentiles, print_table  # noqa: E402

BUILD = "import kernels._build as b; b.load_cpu_ops()"


def tree_at(rev: str | None, dest: Path) -> Path:
    """A directory holding `kernels/` as in git `rev` (None: the working tree), without caches."""
    dest.mkdir(parents=True)
    if rev is None:
        shutil.copytree(ROOT / "kernels", dest / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    else:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels"], check=True,
                              capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def build_once(tree: Path, data_dir: Path) -> tuple[float, float]:
    """(wall s, children's CPU s) of one build from nothing of `tree`'s extension."""
    shutil.rmtree(data_dir, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", BUILD], cwd=tree, check=True, capture_output=True,
                   env={**os.environ, "FUSIONLENS_DATA_DIR": str(data_dir),
                        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"})  # ninja
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="c7c4a25", help="git revision to compare with (default: the last "
                                                      "commit before the lighter #includes)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--csv", default="cpp_build.csv")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fl_bench_build_") as tmp:
        trees = {f"rev {args.rev}": tree_at(args.rev, Path(tmp) / "old"),
                 "working tree": tree_at(None, Path(tmp) / "new")}
        wall: dict[str, list[float]] = {k: [] for k in trees}
        cpu: dict[str, list[float]] = {k: [] for k in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                w, c = build_once(trees[name], Path(tmp) / f"data_{r}_{len(wall[name])}")
                wall[name].append(w)
                cpu[name].append(c)
                print(f"round {r + 1}: {name}: {w:.1f} s wall, {c:.1f} s CPU", flush=True)
    old, new = list(trees)
    speedup = percentiles(a / b for a, b in zip(wall[old], wall[new]))
    rows, table = [], []
    for name in trees:
        for metric, xs in (("wall_time", wall[name]), ("cpu_time", cpu[name])):
            p20, p50, p80 = percentiles(xs)
            rows.append(dict(benchmark="cpp_build", variant=name, shape="all kernels/csrc", metric=metric,
                             p20=p20, p50=p50, p80=p80, unit="s", notes=f"{args.rounds} rounds, fresh data dir"))
        table.append([name, f"{percentiles(wall[name])[1]:.1f}", f"{percentiles(cpu[name])[1]:.1f}"])
    rows.append(dict(benchmark="cpp_build", variant=f"working tree vs rev {args.rev}", shape="all kernels/csrc",
                     metric="speedup", p20=speedup[0], p50=speedup[1], p80=speedup[2], unit="x",
                     notes="per-round wall-time ratio old/new"))
    table.append(["speedup (wall, per round)", f"{speedup[1]:.2f}x", f"p20-p80 {speedup[0]:.2f}-{speedup[2]:.2f}"])
    print_table("first C++ build, fresh data dir", ["variant", "wall p50 s", "CPU p50 s"], table)
    path = append_rows(args.csv, rows)
    print(f"rows appended to {path}")


if __name__ == "__main__":
    main()

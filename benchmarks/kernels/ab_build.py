"""Shared machinery of the kernel A/B scripts (norms_ab.py, port_ab.py, flags_ab.py).

An A/B builds kernels/csrc sources twice (two git revisions, or one snapshot with two flag sets)
and times both in ONE process, interleaved round by round. The steps every script shares live here:

1. `sources_at(rev, names)`: the named .cpp files and every kernels/csrc header, all from the same
   place (the working tree, or git revision `rev`), so an old source never compiles against new
   headers. Read once: a file edited meanwhile by someone else cannot skew one side.
2. `build_variant(label, files, cflags, cache_root)` (`load_side` does 1 and 2 and returns the ops):
   copy them into a hash-keyed directory under
   `cache_root` with the ops renamed from `fusionlens` to `fusionlens_<label>` (so the project's own
   extension and the other side are untouched), build once with torch.utils.cpp_extension.load and
   load the library; returns the op namespace (`getattr(torch.ops, ns)`).
3. `run_ab(...)`: interleave the variants (benchmarks.harness), append the long-format rows (wall
   and CPU time of each variant and the per-round speedup of the candidate over the baseline) and
   print the before/after p20/p50/p80 table.

Nothing builds at import; the include set of the sources is not assumed (any header they name is
copied next to them).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Mapping

from benchmarks.harness import Timing, append_rows, interleave, percentiles, print_table, timing_rows

ROOT = Path(__file__).resolve().parents[2]
CSRC = "kernels/csrc"
CACHE = ROOT / "benchmarks" / ".cache"
# The flags every kernel was built with before the portable per-ISA build (the A/Bs' "old" side).
OLD_CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only", "-std=c++17")
_REGISTRATION = re.compile(rb"\b(TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?)\(\s*fusionlens\s*,")
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ABBuildError(RuntimeError):
    """An A/B side cannot be assembled or built (bad revision, missing file, failed compile)."""


def _git(args: list[str], what: str) -> bytes:
    """stdout of `git <args>` in the repository; ABBuildError with git's first line on failure."""
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        first = (done.stderr.decode(errors="replace").strip().splitlines() or ["git failed"])[0]
        raise ABBuildError(f"{what}: {first}")
    return done.stdout


def header_names(rev: str | None) -> list[str]:
    """Sorted names of the kernels/csrc headers in the working tree (None) or at git `rev`."""
    if rev is None:
        return sorted(p.name for p in (ROOT / CSRC).glob("*.h"))
    _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], f"no git revision {rev!r}")
    listing = _git(["ls-tree", "--name-only", rev, f"{CSRC}/"], f"cannot list {CSRC} at {rev}")
    return sorted(Path(p).name for p in listing.decode().split() if p.endswith(".h"))


def sources_at(rev: str | None, names: Iterable[str]) -> dict[str, bytes]:
    """The kernels/csrc files `names` (in order), then every header (sorted), from one place.

    Args:
        rev: a git revision, or None for the working tree.
        names: the .cpp file names to build (kernels/csrc/<name>).
    Returns:
        file name -> bytes, sources first; the headers come from the same revision.
    """
    names = list(names)
    if not names:
        raise ABBuildError("no sources named")
    files: dict[str, bytes] = {}
    for name in [*names, *header_names(rev)]:
        if rev is None:
            path = ROOT / CSRC / name
            if not path.is_file():
                raise ABBuildError(f"{CSRC}/{name} does not exist in the working tree")
            files[name] = path.read_bytes()
        else:
            files[name] = _git(["show", f"{rev}:{CSRC}/{name}"], f"{CSRC}/{name} at {rev}")
    return files


def snapshot_id(files: Mapping[str, bytes]) -> str:
    """12 hex digits naming a set of files (names and bytes, in order): recorded in the notes."""
    return hashlib.sha256(b"".join(n.encode() + b for n, b in files.items())).hexdigest()[:12]


def rename_namespace(text: bytes, namespace: str) -> bytes:
    """Re-register a source's ops under `namespace` instead of `fusionlens` (C++ names untouched)."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ABBuildError(f"op namespace {namespace!r} is not a C++ identifier")
    return _REGISTRATION.sub(lambda m: m.group(1) + b"(" + namespace.encode() + b",", text)


def _write_if_changed(path: Path, data: bytes) -> None:
    """Write only on a change, so ninja sees unchanged files as up to date."""
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def stage(label: str, files: Mapping[str, bytes], cflags: list[str], cache_root: Path) -> tuple[Path, str]:
    """Copy `files` into cache_root/<key>/ with the .cpp ops renamed to fusionlens_<label>.

    The key hashes the files, the label and the flags, so each distinct build gets its own
    directory (built once, then reused). Returns (that directory, the op namespace).
    """
    namespace = f"fusionlens_{label}"
    sources = {n: rename_namespace(b, namespace) for n, b in files.items() if n.endswith(".cpp")}
    if not sources:
        raise ABBuildError(f"side {label!r}: no .cpp among {sorted(files)}")
    for name, (old, new) in ((n, (files[n], s)) for n, s in sources.items()):
        if old == new:
            raise ABBuildError(f"side {label!r}: {name} registers no ops under fusionlens (TORCH_LIBRARY*)")
    key = hashlib.sha256(f"{label}\0{' '.join(cflags)}\0{snapshot_id(files)}".encode()).hexdigest()[:12]
    out = Path(cache_root) / f"{label}_{key}"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        _write_if_changed(out / name, sources.get(name, data))
    return out, namespace


def build_variant(label: str, files: Mapping[str, bytes], cflags: Iterable[str], cache_root: Path) -> str:
    """Build (first time) and load `files` as one library with ops under torch.ops.fusionlens_<label>.

    Returns the op namespace; callers do `getattr(torch.ops, namespace)`.
    """
    from torch.utils import cpp_extension

    from kernels._build import LDFLAGS

    cflags = list(cflags)
    out, namespace = stage(label, files, cflags, cache_root)
    sources = [str(out / n) for n in files if n.endswith(".cpp")]
    try:
        cpp_extension.load(name=f"fl_ab_{out.name}", sources=sources, extra_cflags=list(cflags),
                           extra_ldflags=list(LDFLAGS), extra_include_paths=[str(out)], build_directory=str(out),
                           is_python_module=False)
    except Exception as exc:  # compiler errors arrive as RuntimeError/CalledProcessError: one line
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error:" in ln), lines[-1] if lines else type(exc).__name__)
        raise ABBuildError(f"side {label!r} failed to build in {out}: {first}") from exc
    return namespace


def load_side(label: str, rev: str | None, names: Iterable[str], cflags: Iterable[str], subdir: str) -> object:
    """One A/B side in one call: the sources `names` (and all headers) at `rev` (None: the working
    tree), built under CACHE/<subdir> with `cflags`; returns the op namespace object
    (torch.ops.fusionlens_<label>)."""
    import torch

    return getattr(torch.ops, build_variant(label, sources_at(rev, names), cflags, CACHE / subdir))


def ratio_text(ratio: tuple[float, float, float]) -> str:
    """p20/p50/p80 of a speedup as '1.02/1.05/1.09'."""
    return "/".join(f"{v:.2f}" for v in ratio)


def ab_rows(benchmark: str, shape: str, timing: Timing, baseline: str, candidate: str, speedup_variant: str,
            notes: str) -> list[dict[str, object]]:
    """Wall/CPU rows (ms) of every variant plus the per-round speedup baseline/candidate (x)."""
    speed = timing.ratio(baseline, candidate)
    rows = timing_rows(benchmark, shape, timing, notes=notes)
    rows.append(dict(benchmark=benchmark, variant=speedup_variant, shape=shape, metric="speedup_wall",
                     p20=speed[0], p50=speed[1], p80=speed[2], unit="x", notes=notes))
    return rows


def ab_table(timing: Timing, baseline: str) -> list[list[object]]:
    """One row per variant: name, wall p20/p50/p80 in ms, and baseline/variant per round (blank for
    the baseline itself)."""
    table = []
    for variant, xs in timing.wall_s.items():
        ratio = "" if variant == baseline else ratio_text(timing.ratio(baseline, variant))
        table.append([variant, *percentiles(x * 1e3 for x in xs), ratio])
    return table


def run_ab(variants: Mapping[str, Callable[[], object]], *, baseline: str, candidate: str, speedup_variant: str,
           benchmark: str, shape: str, title: str, threads: int, detail: str, csv: str, rounds: int, inner: int,
           ratio_header: str = "before/after p20/p50/p80") -> Timing:
    """Time `variants` interleaved, append the rows to results/<csv> and print the table.

    Notes read 'threads=N; load=L; preallocated outputs; <detail>' (load: 1-min average before
    the case); the table's title is `title` followed by the threads and load.
    """
    load = os.getloadavg()[0]
    timing = interleave(variants, rounds=rounds, inner=inner)
    notes = f"threads={threads}; load={load:.1f}; preallocated outputs; {detail}"
    append_rows(csv, ab_rows(benchmark, shape, timing, baseline, candidate, speedup_variant, notes))
    print_table(f"{title} threads={threads} load={load:.1f}", ["variant", "p20 ms", "p50 ms", "p80 ms", ratio_header],
                ab_table(timing, baseline))
    return timing

"""Builds the one C++ extension that holds every CPU kernel, once, and caches it.

All `kernels/csrc/*.cpp` files compile into a single shared library (one build, ~44 s on this
2-core VM the first time) under `<data dir>/cpp_build/<hash>/`, where the hash covers the sources, the compiler flags,
torch's version and this CPU. The flags target the compiler's baseline (no -march=native): every
kernel's hot loops are compiled once per instruction set (AVX-512, AVX2+FMA, baseline; see
csrc/per_isa.h) and the best copy the CPU runs is picked at run time, so the library itself is
portable; keying the hash on the CPU too is only conservative. Each source registers its ops with
`TORCH_LIBRARY_FRAGMENT(fusionlens, m)`, so they appear as `torch.ops.fusionlens.<op>`.
The sources include only the ATen/c10 headers they use, never <torch/extension.h> (23 s of parsing
per file against 3-6 s): that made the first build 1.6x faster (73 -> 44 s, benchmarks/bench_build.py).
Earlier builds beyond the newest few are deleted after a load (`_prune_builds`).

Nothing is built at import time: the first call of `load_cpu_ops()` builds or loads.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from kernels.registry import register_provider_probe

CSRC = Path(__file__).parent / "csrc"
# Portable flags: no -march=native (the hot loops are compiled once per instruction set through
# csrc/per_isa.h and picked at run time, so one build runs on any x86-64) and no -ffast-math (the
# kernels' reductions are written in vector form, so results keep IEEE rounding). -fno-math-errno
# only stops libm calls from setting errno, which nothing reads; without it GCC keeps std::sqrt
# a checked call that blocks vectorization of the optimizer loops. It changes no result.
# Tuples, and copies passed to cpp_extension.load: it appends its own -L/-l flags to the list it
# is given, which changed the build hash (and tuning_store's fingerprint) after the first load.
CFLAGS = ("-O3", "-fopenmp", "-fno-math-errno")
LDFLAGS = ("-fopenmp",)
KEEP_BUILDS = 3  # the current build and the two most recently used others (switching branches back and forth)
PRUNE_MIN_AGE_S = 600.0
LAST_USED = "last_used"
_lock = threading.Lock()
_loaded = False


def data_dir() -> Path:
    """FusionLens data directory (FUSIONLENS_DATA_DIR, default ./.fusionlens)."""
    return Path(os.environ.get("FUSIONLENS_DATA_DIR", ".fusionlens")).resolve()


def cpuinfo(keys: tuple[str, ...] = ("model name",)) -> str:
    """The first /proc/cpuinfo line of each of `keys`, joined; else platform's processor name."""
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip()
            if key in keys and key not in found:
                found[key] = line.split(":", 1)[1].strip() if ":" in line else ""
                if len(found) == len(keys):
                    break
    except OSError:
        pass
    return "\n".join(found[k] for k in keys if k in found) or platform.processor() or platform.machine()


def _cpu_id() -> str:
    """The CPU: model and feature flags. The build no longer depends on them (no -march=native;
    the ISA copy is picked at run time), but keeping them in the hash costs one rebuild per
    machine and guards against a future flag that does depend on the CPU."""
    return cpuinfo(("model name", "flags"))


def _inputs() -> list[Path]:
    """Every file that goes into the build: the .cpp sources and the headers they include."""
    return sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))


def _build_hash(sources: list[Path]) -> str:
    h = hashlib.sha256()
    for src in sources:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(_cpu_id().encode())
    return h.hexdigest()[:16]


def load_cpu_ops(verbose: bool = False) -> None:
    """Build (first time) or load the extension; afterwards torch.ops.fusionlens.* exist."""
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        from torch.utils import cpp_extension  # heavy import, only when needed

        sources = sorted(CSRC.glob("*.cpp"))
        if not sources:
            raise RuntimeError(f"no C++ sources in {CSRC}")
        build_dir = build_dir_for(_inputs())
        build_dir.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(build_dir)
        # One builder per directory at a time, across processes; the kernel drops the lock when
        # its holder dies, so a killed build never blocks the others.
        with open(build_dir / "fusionlens.flock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            if not (build_dir / "fusionlens_cpu.so").exists():
                reused = _seed_from_previous(build_dir)
                print(f"FusionLens: building the CPU kernels once into {build_dir} "
                      f"(about 45 s on 2 cores, less on more; {reused} unchanged objects reused)...", file=sys.stderr, flush=True)
            try:
                cpp_extension.load(
                    name="fusionlens_cpu",
                    sources=[str(s) for s in sources],
                    extra_cflags=list(CFLAGS),
                    extra_ldflags=list(LDFLAGS),
                    extra_include_paths=[str(CSRC)],
                    build_directory=str(build_dir),
                    is_python_module=False,
                    verbose=verbose,
                )
            except Exception as exc:
                raise RuntimeError(_failure_summary(exc, build_dir)) from exc
        _mark_used(build_dir)
        _prune_builds(build_dir)
        from kernels import _alloc

        _alloc.attach_pool()  # large CPU outputs come from the extension's pool from now on
        _loaded = True


def _mark_used(build_dir: Path) -> None:
    """Touch the build's `last_used` stamp (what pruning orders by; the library's own mtime is ninja's)."""
    try:
        (build_dir / LAST_USED).touch()
    except OSError:
        pass


def _prune_builds(current: Path, keep: int = KEEP_BUILDS, min_age_s: float = PRUNE_MIN_AGE_S) -> list[Path]:
    """Delete earlier builds beyond the newest `keep` (each is ~5 MB; every source edit or torch
    upgrade makes one); returns what was deleted.

    A build directory is left alone while another process holds its lock (a build running there)
    or when it was used in the last `min_age_s` (a process may be about to load it). A library
    already loaded elsewhere stays mapped after its file is deleted, so running processes are safe.
    """
    try:
        builds = [d for d in current.parent.iterdir() if d.is_dir() and d != current]
    except OSError:
        return []

    def last_used(d: Path) -> float:
        try:
            return max(m.stat().st_mtime for m in (d / LAST_USED, d / "fusionlens_cpu.so", d / ".ninja_log", d)
                       if m.exists())
        except (OSError, ValueError):  # vanished meanwhile: oldest, and the loop below skips it
            return 0.0

    builds.sort(key=last_used, reverse=True)
    deleted = []
    now = time.time()
    for d in builds[max(keep - 1, 0):]:  # `keep` counts the current build
        try:
            if now - last_used(d) < min_age_s:
                continue
            with open(d / "fusionlens.flock", "a") as lock_file:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # someone is building there
                shutil.rmtree(d)
            deleted.append(d)
        except OSError:
            continue  # vanished meanwhile, or not ours to delete: leave it
    return deleted


def _seed_from_previous(build_dir: Path) -> int:
    """Copy object files and ninja's logs from the newest earlier build, so ninja recompiles only
    the sources (or headers) that changed since; returns how many objects were copied.

    Timestamps are preserved (copy2): ninja compares them with the sources' and its deps log
    (header dependencies) decides the rest, so a stale object is never reused.
    """
    previous = [d for d in build_dir.parent.iterdir()
                if d != build_dir and (d / ".ninja_log").exists() and (d / "fusionlens_cpu.so").exists()]
    if not previous or (build_dir / ".ninja_log").exists():
        return 0
    newest = max(previous, key=lambda d: (d / ".ninja_log").stat().st_mtime)
    copied = 0
    for f in [*newest.glob("*.o"), newest / ".ninja_log", newest / ".ninja_deps"]:
        if f.exists():
            shutil.copy2(f, build_dir / f.name)
            copied += f.suffix == ".o"
    return copied


def build_dir_for(inputs: list[Path]) -> Path:
    """The cache directory of one build: keyed by sources, headers, flags, torch and CPU.

    Developers editing different sources build into different directories (seeded with the
    unchanged objects of the newest earlier build); processes building the same sources share
    one directory and take turns on an flock (then ninja finds the library up to date).
    """
    return data_dir() / "cpp_build" / _build_hash(inputs)


def _clear_stale_lock(build_dir: Path, max_age_s: float = 900.0) -> None:
    """Remove a build lock left by a killed build (older than max_age_s), so nobody waits forever."""
    lock = build_dir / "lock"
    try:
        if lock.exists() and time.time() - lock.stat().st_mtime > max_age_s:
            lock.unlink()
    except OSError:
        pass


def _failure_summary(exc: Exception, build_dir: Path) -> str:
    """One line naming the source that failed to compile and its first compiler error."""
    text = str(exc)
    failed = re.findall(r"FAILED: (\S+)", text)
    errors = [ln.strip() for ln in text.splitlines() if "error:" in ln]
    what = f"{', '.join(failed)}: " if failed else ""
    first = errors[0] if errors else (text.strip().splitlines() or [type(exc).__name__])[-1]
    return f"C++ build failed in {build_dir}: {what}{first}"


@register_provider_probe("cpu")
def _probe_cpu() -> str | None:
    """The cpu provider needs a C++ compiler and ninja; the reason is kept when either fails."""
    from torch.utils import cpp_extension

    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "ninja not found (pip install ninja)"
    try:
        from kernels.providers import cpu_ops

        cpu_ops()  # loads the extension and keeps its namespace where provider_ops reads it
    except Exception as exc:  # compiler missing, build error: keep the reason, fall back
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


@register_provider_probe("triton")
def _probe_triton() -> str | None:
    """The triton provider needs Triton and a CUDA GPU (or TRITON_INTERPRET=1, for tests)."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"Triton not installed ({exc})"
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        return "no CUDA GPU"
    from kernels import profiled_ops

    profiled_ops.prepare()  # library ops and entry points ready before any compiler traces a call
    return None

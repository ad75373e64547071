"""Builds the one C++ extension that holds every CPU kernel, once, and caches it.

All `kernels/csrc/*.cpp` files compile into a single shared library (one build, ~20 s the first
time) under `<data dir>/cpp_build/<hash>/`, where the hash covers the sources, the compiler flags,
torch's version and this CPU. Each source registers its ops with
`TORCH_LIBRARY_FRAGMENT(fusionlens, m)`, so they appear as `torch.ops.fusionlens.<op>`.

Nothing is built at import time: the first call of `load_cpu_ops()` builds or loads.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
from pathlib import Path

import torch

from kernels.registry import register_provider_probe

CSRC = Path(__file__).parent / "csrc"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only", "-std=c++17"]
LDFLAGS = ["-fopenmp"]
_lock = threading.Lock()
_loaded = False


def data_dir() -> Path:
    """FusionLens data directory (FUSIONLENS_DATA_DIR, default ./.fusionlens)."""
    return Path(os.environ.get("FUSIONLENS_DATA_DIR", ".fusionlens")).resolve()


def _cpu_id() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        build_dir = data_dir() / "cpp_build" / _build_hash(sources)
        build_dir.mkdir(parents=True, exist_ok=True)
        if not (build_dir / "fusionlens_cpu.so").exists():
            print(f"FusionLens: building the CPU kernels once into {build_dir} (about 20-60 s)...",
                  file=sys.stderr, flush=True)
        cpp_extension.load(
            name="fusionlens_cpu",
            sources=[str(s) for s in sources],
            extra_cflags=CFLAGS,
            extra_ldflags=LDFLAGS,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=verbose,
        )
        _loaded = True


@register_provider_probe("cpu")
def _probe_cpu() -> str | None:
    """The cpu provider needs a C++ compiler and ninja; the reason is kept when either fails."""
    from torch.utils import cpp_extension

    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "ninja not found (pip install ninja)"
    try:
        load_cpu_ops()
    except Exception as exc:  # compiler missing, build error: keep the reason, fall back
        first = str(exc).strip().splitlines()
        return f"C++ build failed: {first[-1] if first else type(exc).__name__}"
    return None


@register_provider_probe("triton")
def _probe_triton() -> str | None:
    """The triton provider needs Triton and a CUDA GPU (or TRITON_INTERPRET=1, for tests)."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"Triton not installed ({exc})"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None

"""Kernel-only A/B of compiler flags: the per-ISA kernels (norms, activations, softmax) built from
ONE snapshot of kernels/csrc with the old flags (-march=native -ffast-math) and with the current
ones (kernels/_build.py CFLAGS), timed in one process, interleaved round by round.

Not a bench_kernels family (no `cases`): run it directly,

    .venv/bin/python benchmarks/kernels/flags_ab.py [--threads 1] [--rounds 11]
        [--shapes 4096x768,4096x4096] [--csv kernels_flags_ab.csv]

Both builds live under benchmarks/.cache/flags_ab/<flags>/ with their ops renamed
(fusionlens_old / fusionlens_new), so the project's own extension is not touched and a source
edited meanwhile by someone else cannot skew one side. Forward passes only, fp32 (--dtype for bf16/fp16), preallocated
outputs: the question is whether dropping the global flags slowed the loops that now get their
vector ISA from per_isa.h's pragmas. Rows (benchmark "flags_ab", variants old_flags / new_flags
and the speedup new over old) go to benchmarks/results/<csv>.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402

OLD_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only", "-std=c++17"]
SOURCES = ("norms.cpp", "activations.cpp", "softmax.cpp")


def _source_files(rev: str) -> dict[str, bytes]:
    """The three sources and every header of kernels/csrc: the working tree's, or git `rev`'s."""
    csrc = ROOT / "kernels" / "csrc"
    if not rev:
        return {f.name: f.read_bytes() for f in [csrc / s for s in SOURCES] + sorted(csrc.glob("*.h"))}
    listing = subprocess.run(["git", "ls-tree", "--name-only", rev, "kernels/csrc/"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    names = list(SOURCES) + sorted(Path(p).name for p in listing if p.endswith(".h"))
    return {n: subprocess.run(["git", "show", f"{rev}:kernels/csrc/{n}"], cwd=ROOT, check=True,
                              capture_output=True).stdout for n in names}


def snapshot(rev: str = "") -> Path:
    """Copy the three sources (ops renamed to fusionlens_<side> later) and every header once."""
    files = _source_files(rev)
    digest = hashlib.sha256(b"".join(n.encode() + b for n, b in files.items())).hexdigest()[:12]
    snap = ROOT / "benchmarks" / ".cache" / "flags_ab" / digest
    if not snap.exists():
        tmp = snap.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        tmp.rename(snap)
    return snap


def build(snap: Path, side: str, cflags: list[str]) -> object:
    """Build the snapshot's three sources with `cflags`, ops under torch.ops.fusionlens_<side>."""
    from torch.utils import cpp_extension

    from kernels._build import LDFLAGS

    src_dir = snap / side
    src_dir.mkdir(exist_ok=True)
    sources = []
    for name in SOURCES:
        text = (snap / name).read_text()
        text = text.replace("TORCH_LIBRARY_FRAGMENT(fusionlens,", f"TORCH_LIBRARY_FRAGMENT(fusionlens_{side},")
        text = text.replace("TORCH_LIBRARY_IMPL(fusionlens,", f"TORCH_LIBRARY_IMPL(fusionlens_{side},")
        path = src_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        sources.append(str(path))
    cpp_extension.load(name=f"fl_flags_ab_{side}_{snap.name}", sources=sources, extra_cflags=cflags,
                       extra_ldflags=LDFLAGS, extra_include_paths=[str(snap)], build_directory=str(src_dir),
                       is_python_module=False)
    return getattr(torch.ops, f"fusionlens_{side}")


def buffers(m: int, n: int, dtype: torch.dtype = torch.float32) -> dict:
    """Inputs and outputs in `dtype`; norm weights and statistics stay fp32 (as norms.py passes)."""
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(dtype) for k in ("x", "b2")}
    t.update(w=1 + 0.1 * torch.randn(n, generator=g), bias=(0.1 * torch.randn(n, generator=g)).to(dtype),
             y=torch.empty(m, n, dtype=dtype), mean=torch.empty(m), rstd=torch.empty(m),
             none=torch.empty(0, dtype=dtype))
    return t


def op_calls(ops, t: dict) -> dict:
    """Zero-argument forward calls of each op on preallocated outputs (kinds: activations.cpp)."""
    x, b2, w, bias, y, mean, rstd, none = (t[k] for k in ("x", "b2", "w", "bias", "y", "mean", "rstd", "none"))
    b32 = bias.float()
    return {
        "layer_norm": lambda: ops.layer_norm_fwd(x, None, w, b32, 1e-5, y, none, mean, rstd),
        "rms_norm": lambda: ops.rms_norm_fwd(x, None, w, 1e-6, True, y, none, rstd),
        "gelu_erf": lambda: ops.act_fwd(x, None, y, 1),
        "bias_gelu_tanh": lambda: ops.act_fwd(x, bias, y, 2),
        "swiglu": lambda: ops.glu_fwd(x, b2, y, 0),
        "softmax": lambda: ops.softmax_fwd(x, None, y, 1.0, False),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--shapes", default="4096x768,4096x4096")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 inputs/outputs")
    ap.add_argument("--csv", default="kernels_flags_ab.csv")
    ap.add_argument("--alt-flags", default="", help="a third build's flags (space separated), timed as alt_flags")
    ap.add_argument("--old-rev", default="", help="build the old-flags side from this git revision's kernels/csrc "
                    "(default: the same working-tree snapshot as the new side)")
    args = ap.parse_args(argv)
    from kernels._build import CFLAGS

    snap = snapshot()
    old_snap = snapshot(args.old_rev) if args.old_rev else snap
    old, new = build(old_snap, "old", OLD_CFLAGS), build(snap, "new", CFLAGS)
    alt_flags = args.alt_flags.split()
    alt = build(snap, "alt", alt_flags) if alt_flags else None
    print(f"snapshot {snap.name} (old side {old_snap.name}); old flags {' '.join(OLD_CFLAGS)}; new flags {' '.join(CFLAGS)}; "
          f"ISA copies old/new: norms {old.norms_isa()}/{new.norms_isa()}, "
          f"activations {old.activations_isa()}/{new.activations_isa()}, softmax {old.softmax_isa()}/{new.softmax_isa()}")
    torch.set_num_threads(args.threads)
    for m, n in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
        dtype = getattr(torch, args.dtype)
        calls_o, calls_n = op_calls(old, buffers(m, n, dtype)), op_calls(new, buffers(m, n, dtype))
        calls_a = op_calls(alt, buffers(m, n, dtype)) if alt is not None else {}
        inner = max(2, int(6e6 / (m * n)))
        for op in calls_n:
            load = os.getloadavg()[0]
            variants = {"old_flags": calls_o[op], "new_flags": calls_n[op]}
            if calls_a:
                variants["alt_flags"] = calls_a[op]
            timing = interleave(variants, rounds=args.rounds, inner=inner)
            shape = f"{m}x{n} {args.dtype} fwd"
            src = f"snapshot {snap.name}" + (f"; old side from {args.old_rev} ({old_snap.name})" if args.old_rev else "")
            notes = (f"threads={args.threads}; load={load:.1f}; preallocated outputs; {src}; "
                     f"old={' '.join(OLD_CFLAGS)}; new={' '.join(CFLAGS)}" + (f"; alt={args.alt_flags}" if alt else ""))
            rows = timing_rows(f"flags_ab {op}", shape, timing, notes=notes)
            speed = timing.ratio("old_flags", "new_flags")
            rows.append(dict(benchmark=f"flags_ab {op}", variant="new_vs_old_flags", shape=shape,
                             metric="speedup_wall", p20=speed[0], p50=speed[1], p80=speed[2], unit="x", notes=notes))
            append_rows(args.csv, rows)
            po = percentiles(x * 1e3 for x in timing.wall_s["old_flags"])
            pn = percentiles(x * 1e3 for x in timing.wall_s["new_flags"])
            table = [["old_flags", *po, ""], ["new_flags", *pn, "/".join(f"{v:.2f}" for v in speed)]]
            if calls_a:
                pa = percentiles(x * 1e3 for x in timing.wall_s["alt_flags"])
                table.append(["alt_flags", *pa, "/".join(f"{v:.2f}" for v in timing.ratio("old_flags", "alt_flags"))])
            print_table(f"{op} {shape} threads={args.threads} load={load:.1f}",
                        ["variant", "p20 ms", "p50 ms", "p80 ms", "old/this p20/p50/p80"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

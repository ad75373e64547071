"""Compile the Triton kernels for a real NVIDIA GPU on a machine without one (ahead of time).

The interpreter (TRITON_INTERPRET=1) checks what the kernels compute, but never runs Triton's
compiler, so it cannot see what fails or slows down only when compiled: a construct the code
generator rejects, a row held in registers that spills to local memory at a real row length, a
shared-memory budget blown, scalar loads where a memory-bound kernel needs 128-bit ones.

`compile_only(arch)` runs the public API with `provider="triton"` on CPU tensors, but every kernel
launch only compiles: a stand-in driver names the target (sm_90 = H100/H200, sm_80 = A100), Triton
lowers each specialization to PTX and then to a cubin with its own bundled `ptxas`, and nothing
runs (outputs stay uninitialised, so this proves compilation and resources, never numerics or
speed). Each compiled variant is recorded with the registers, spills, stack and shared memory
`ptxas -v` reports, and the global-load widths in its PTX.

Run it in its own process (`python -m tests.kernels.triton_aot`, or `tests/kernels/
test_triton_aot.py`): it replaces Triton's active driver, and Triton must not be in interpreter
mode when the kernel modules are imported.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterator

import torch

# Compute capability -> the target it names. sm_90 is what the lent H200 runs.
ARCHS: dict[int, str] = {90: "sm_90a (H100/H200)", 80: "sm_80 (A100)"}
# Registers per SM, and the most shared memory one block may use, on sm_90 / sm_80 (CUDA C++
# Programming Guide, technical specifications per compute capability).
REGS_PER_SM = 65536
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
TRITON_MODULES = ("kernels.triton_norms", "kernels.triton_activations", "kernels.triton_softmax",
                  "kernels.triton_rope", "kernels.triton_cross_entropy", "kernels.triton_optim")


@dataclass(frozen=True)
class Variant:
    """One compiled specialization of one kernel (what Triton would cache and launch)."""
    kernel: str  # module.function, e.g. triton_norms._ln_fwd
    arch: int
    num_warps: int
    constexprs: str  # "BLOCK=1024 HAS_W=True ..." (the compile-time parameters, sorted)
    signature: str  # argument types and the integer specializations ("N:i32/16" = divisible by 16)
    registers: int  # per thread
    spill_stores: int  # bytes per thread
    spill_loads: int
    stack: int  # bytes per thread
    shared: int  # bytes per block (Triton's dynamic shared memory)
    loads: str  # global loads in the PTX by width: "128x12 32x2" = twelve 128-bit, two 32-bit
    widest_load_bits: int
    compile_s: float

    @property
    def occupancy_warps(self) -> int:
        """Resident warps per SM the registers allow (64 at most on sm_80/90), ignoring shared memory."""
        regs_per_warp = max(self.registers, 1) * 32
        blocks = REGS_PER_SM // (regs_per_warp * self.num_warps)
        return min(64, blocks * self.num_warps)


class _CompileOnlyDriver:
    """A stand-in for Triton's CUDA driver: names the target, owns no device and launches nothing."""

    def __init__(self, capability: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def __getattr__(self, name: str):
        raise RuntimeError(f"compile-only Triton driver: {name} needs a real GPU")


def _ptxas_path(capability: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        return get_ptxas(capability).path
    except TypeError:  # older Triton: get_ptxas() without the arch
        return get_ptxas().path


_PTXAS_LINE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def ptxas_usage(ptx: str, capability: int) -> dict[str, int]:
    """Registers, stack and spill bytes per thread, from `ptxas -v` on the kernel's PTX."""
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run([_ptxas_path(capability), "-v", f"--gpu-name={arch}", str(src), "-o",
                               str(Path(tmp) / "k.cubin")], capture_output=True, text=True, check=True)
    log = proc.stderr + proc.stdout
    frame, regs = _PTXAS_LINE.search(log), _REGS.search(log)
    if frame is None or regs is None:
        raise RuntimeError(f"unexpected ptxas -v output: {log[:300]!r}")
    return {"registers": int(regs.group(1)), "stack": int(frame.group(1)),
            "spill_stores": int(frame.group(2)), "spill_loads": int(frame.group(3))}


def load_widths(ptx: str) -> dict[int, int]:
    """{bits per load instruction: count} over the PTX's global loads (ld.global.v4.b32 = 128)."""
    widths: dict[int, int] = {}
    for op in re.findall(r"\bld\.global\S*", ptx):
        vec = re.search(r"\.v(\d)\.", op)
        bits = re.search(r"\.[bfsu](\d+)$", op)
        if bits is None:
            continue
        width = int(vec.group(1) if vec else 1) * int(bits.group(1))
        widths[width] = widths.get(width, 0) + 1
    return widths


def describe(signature: dict, constexprs: dict, attrs: dict, params: list) -> tuple[str, str]:
    """(constexprs as "NAME=value ...", signature as "ARG:type[/16] ...") of one specialization."""
    names = [p.name for p in params]
    consts = []
    for path, value in sorted(constexprs.items()):
        name = names[path[0]] if isinstance(path, tuple) and len(path) == 1 else str(path)
        consts.append(f"{name}={value}")
    sig = []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        spec = attrs.get((names.index(name),)) if name in names else None
        sig.append(f"{name}:{ty}" + ("/16" if spec and "tt.divisibility" in str(spec) else ""))
    return " ".join(consts), " ".join(sig)


@contextlib.contextmanager
def compile_only(capability: int = 90) -> Iterator[list[Variant]]:
    """Inside: Triton launches compile for `capability` and record a Variant each; nothing runs.

    Also lets the triton provider accept CPU tensors (as under the interpreter) so the public API
    can be driven on this machine. Everything is restored on exit.
    """
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from kernels import registry
    # Import the kernel modules first, so names they bind from the registry at import time
    # (triton_cross_entropy's triton_interpreted) keep the real, compiled-mode answers.
    for module in TRITON_MODULES:
        importlib.import_module(module)

    variants: list[Variant] = []
    seen: set[tuple] = set()
    original_run, original_compile = JITFunction.run, JITFunction._do_compile
    original_interp = registry.triton_interpreted
    original_probe = registry._PROBE_RESULTS.get("triton", "unset")
    original_driver = driver._active  # None until first used; reset_active() would probe for a GPU

    def run(self, *args, grid, warmup, **kwargs):
        return original_run(self, *args, grid=grid, warmup=True, **kwargs)

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        t0 = time.perf_counter()
        kernel = original_compile(self, key, signature, device, constexprs, options, attrs, warmup)
        elapsed = time.perf_counter() - t0
        consts, sig = describe(signature, constexprs, attrs, self.params)
        name = f"{self.module.rsplit('.', 1)[-1]}.{self.fn.__name__}"  # triton_softmax._fwd_kernel
        tag = (name, consts, sig, options.num_warps)
        if tag not in seen:
            seen.add(tag)
            ptx = kernel.asm["ptx"]
            widths = load_widths(ptx)
            variants.append(Variant(kernel=name, arch=capability, num_warps=options.num_warps,
                                    constexprs=consts, signature=sig, shared=int(kernel.metadata.shared),
                                    loads=" ".join(f"{b}x{n}" for b, n in sorted(widths.items(), reverse=True)),
                                    widest_load_bits=max(widths, default=0), compile_s=round(elapsed, 3),
                                    **ptxas_usage(ptx, capability)))
        return kernel

    driver.set_active(_CompileOnlyDriver(capability))
    JITFunction.run, JITFunction._do_compile = run, do_compile
    registry.triton_interpreted = lambda: True
    registry._PROBE_RESULTS["triton"] = None
    try:
        yield variants
    finally:
        JITFunction.run, JITFunction._do_compile = original_run, original_compile
        registry.triton_interpreted = original_interp
        if original_probe == "unset":
            registry._PROBE_RESULTS.pop("triton", None)
        else:
            registry._PROBE_RESULTS["triton"] = original_probe
        driver._active = original_driver


# ---------------------------------------------------------------------------------------------
# What to compile: the public API at the GPU check's shapes, every option, odd sizes.
# ---------------------------------------------------------------------------------------------

def _fwd_bwd(fn: Callable[[], object], inputs: list[torch.Tensor]) -> None:
    """Run fn (compiles its forward), then backward through every output (compiles the backward)."""
    for t in inputs:
        t.requires_grad_(True)
    out = fn()
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
    grads = [torch.ones_like(o) for o in outs if o.requires_grad]
    torch.autograd.backward([o for o in outs if o.requires_grad], grads)


def _t(shape, dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, dtype=torch.float32) * scale).to(dtype)


DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def drive_norms(full: bool) -> None:
    import kernels

    shapes = [(64, 4096), (16, 8192), (5, 4099), (4, 65536)] + ([(64, 768), (8, 16384), (3, 17)] if full else [])
    for dtype in DTYPES if full else (torch.float32, torch.bfloat16):
        for m, n in shapes:
            x, r, w, b = _t((m, n), dtype), _t((m, n), dtype), _t((n,), dtype), _t((n,), dtype)
            _fwd_bwd(lambda: kernels.layer_norm(x, w, b, 1e-5, provider="triton"), [x, w, b])
            _fwd_bwd(lambda: kernels.rms_norm(x, w, 1e-6, provider="triton"), [x, w])
            _fwd_bwd(lambda: kernels.add_layer_norm(x, r, w, b, 1e-5, provider="triton"), [x, r, w, b])
            _fwd_bwd(lambda: kernels.add_rms_norm(x, r, w, 1e-6, provider="triton"), [x, r, w])
            if dtype != torch.float32:  # an fp32 weight on 16-bit rows: llama casting's fp32 y and dy
                w32 = _t((n,), torch.float32)
                _fwd_bwd(lambda: kernels.rms_norm(x, w32, 1e-6, provider="triton"), [x, w32])
            if full:
                _fwd_bwd(lambda: kernels.layer_norm(x, None, None, 1e-5, provider="triton"), [x])
                _fwd_bwd(lambda: kernels.rms_norm(x, w, 1e-6, offset=1.0, provider="triton"), [x, w])
                with torch.no_grad():
                    kernels.layer_norm(x, w, b, 1e-5, provider="triton")
                    kernels.rms_norm(x, w, 1e-6, provider="triton")


def drive_activations(full: bool) -> None:
    import kernels

    shapes = [(64, 3072), (7, 4099)] + ([(64, 11008), (3, 5)] if full else [])
    for dtype in DTYPES if full else (torch.float32, torch.bfloat16):
        for m, n in shapes:
            x, b, a = _t((m, n), dtype), _t((n,), dtype), _t((m, n), dtype)
            for approx in ("none", "tanh"):
                _fwd_bwd(lambda: kernels.gelu(x, approximate=approx, provider="triton"), [x])
                _fwd_bwd(lambda: kernels.bias_gelu(x, b, approximate=approx, provider="triton"), [x, b])
                _fwd_bwd(lambda: kernels.geglu(a, x, approximate=approx, provider="triton"), [a, x])
            _fwd_bwd(lambda: kernels.swiglu(a, x, provider="triton"), [a, x])
            h = _t((m, 2 * n), dtype)  # the row-strided halves of one projection
            _fwd_bwd(lambda: kernels.swiglu(*h.chunk(2, -1), provider="triton"), [h])
            _fwd_bwd(lambda: kernels.geglu(*h.chunk(2, -1), approximate="tanh", provider="triton"), [h])


def drive_softmax(full: bool) -> None:
    import kernels

    shapes = [(2, 12, 128, 512), (3, 4099), (2, 40000)] + ([(2, 4, 64, 2048), (1, 5), (2, 131072)] if full else [])
    for dtype in DTYPES if full else (torch.float32, torch.bfloat16):
        for shape in shapes:
            x = _t(shape, dtype)
            _fwd_bwd(lambda: kernels.softmax(x, provider="triton"), [x])
            _fwd_bwd(lambda: kernels.softmax(x, scale=0.125, causal=True, provider="triton"), [x])
            mask = torch.zeros(shape[-2:] if len(shape) > 2 else shape, dtype=dtype)
            _fwd_bwd(lambda: kernels.softmax(x, scale=0.125, mask=mask, provider="triton"), [x])


def drive_rope(full: bool) -> None:
    import kernels

    shapes = [(4, 12, 512, 64), (2, 8, 33, 128)] + ([(1, 32, 2048, 128), (1, 3, 5, 6)] if full else [])
    for dtype in DTYPES if full else (torch.float32, torch.bfloat16):
        for bsz, h, s, d in shapes:
            q, k = _t((bsz, h, s, d), dtype), _t((bsz, h, s, d), dtype)
            cos, sin = _t((s, d), dtype), _t((s, d), dtype)
            _fwd_bwd(lambda: kernels.rope(q, k, cos, sin, provider="triton"), [q, k])
            qt, kt = (_t((bsz, s, h, d), dtype).transpose(1, 2) for _ in range(2))  # HF's views: strided out
            _fwd_bwd(lambda: kernels.rope(qt, kt, cos, sin, provider="triton"), [qt, kt])


def drive_cross_entropy(full: bool) -> None:
    import kernels

    shapes = [(64, 32000), (5, 50257)] + ([(8, 128256), (3, 7)] if full else [])
    for dtype in DTYPES if full else (torch.float32, torch.bfloat16):
        for n, v in shapes:
            logits = _t((n, v), dtype)
            target = torch.randint(0, v, (n,))
            _fwd_bwd(lambda: kernels.cross_entropy(logits, target, provider="triton"), [logits])
            with torch.no_grad():
                kernels.cross_entropy(logits, target, provider="triton")
        for v, hidden in ((32000, 768), (50257, 64)):  # an aligned vocabulary and GPT-2's odd one
            x, w = _t((64, hidden), dtype), _t((v, hidden), dtype)
            target = torch.randint(0, v, (64,))
            _fwd_bwd(lambda: kernels.fused_linear_cross_entropy(x, w, target, chunk_size=32, provider="triton"),
                     [x, w])


def drive_optim(full: bool) -> None:
    import kernels

    for dtype in DTYPES if full else (torch.float32, torch.bfloat16):
        params = [torch.nn.Parameter(_t(s, dtype)) for s in ((768, 768), (768,), (3, 5), (50257, 64))]
        for p in params:
            p.grad = _t(p.shape, dtype, 0.01)
        for cls in (kernels.AdamW, kernels.LAMB):
            opt = cls(params, lr=1e-3, weight_decay=0.01, provider="triton")
            opt.step()


DRIVERS: dict[str, Callable[[bool], None]] = {
    "norms": drive_norms, "activations": drive_activations, "softmax": drive_softmax,
    "rope": drive_rope, "cross_entropy": drive_cross_entropy, "optim": drive_optim,
}


def compile_all(capability: int = 90, families: tuple[str, ...] = tuple(DRIVERS), full: bool = False,
                log: Callable[[str], None] | None = None) -> tuple[list[Variant], dict[str, str]]:
    """Compile every kernel variant the drivers reach. Returns (variants, {family: error})."""
    errors: dict[str, str] = {}
    with compile_only(capability) as variants:
        for family in families:
            t0 = time.perf_counter()
            before = len(variants)
            try:
                DRIVERS[family](full)
            except Exception as exc:  # keep going: one family's compile error must not hide the rest
                errors[family] = f"{type(exc).__name__}: {str(exc).strip()[:2000]}"
            if log:
                log(f"{family}: {len(variants) - before} variants in {time.perf_counter() - t0:.1f} s"
                    + (f" -- FAILED: {errors[family].splitlines()[0]}" if family in errors else ""))
    return list(variants), errors


def write_table(variants: list[Variant], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([fl.name for fl in fields(Variant)] + ["occupancy_warps"])
        for v in variants:
            w.writerow(list(asdict(v).values()) + [v.occupancy_warps])


def summary_markdown(variants: list[Variant], title: str) -> str:
    """One row per kernel: variants, registers, occupancy, spills and load widths (min-max)."""
    lines = [f"### {title}", "",
             "| kernel | variants | warps | registers/thread | resident warps/SM (registers) | spilling variants "
             "(max bytes) | shared B | widest load, bits (min-max over variants) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(v.kernel for v in variants):
        vs = [v for v in variants if v.kernel == name]
        spills = [v for v in vs if v.spill_stores or v.spill_loads]

        def span(values) -> str:
            lo, hi = min(values), max(values)
            return f"{lo}" if lo == hi else f"{lo}-{hi}"

        lines.append(f"| {name} | {len(vs)} | {span([v.num_warps for v in vs])} | {span([v.registers for v in vs])} "
                     f"| {span([v.occupancy_warps for v in vs])} | {len(spills)}"
                     + (f" ({max(v.spill_stores for v in spills)})" if spills else "")
                     + f" | {span([v.shared for v in vs])} | {span([v.widest_load_bits for v in vs])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, choices=sorted(ARCHS), help="compute capability")
    ap.add_argument("--family", action="append", choices=sorted(DRIVERS), help="default: all")
    ap.add_argument("--full", action="store_true", help="every dtype and more shapes (slower)")
    ap.add_argument("--csv", type=Path, help="write one row per compiled variant")
    ap.add_argument("--md", type=Path, help="write a per-kernel summary table (markdown)")
    args = ap.parse_args(argv)
    families = tuple(args.family or DRIVERS)
    t0 = time.perf_counter()
    variants, errors = compile_all(args.arch, families, args.full, log=lambda s: print(s, flush=True))
    if args.csv:
        write_table(variants, args.csv)
    if args.md:
        import triton

        title = (f"Triton kernels compiled for {ARCHS[args.arch]}, Triton {triton.__version__}, "
                 f"{time.strftime('%Y-%m-%d')}{' (--full)' if args.full else ''}")
        args.md.write_text(summary_markdown(variants, title))
    spills = [v for v in variants if v.spill_stores or v.spill_loads]
    print(f"{len(variants)} variants for {ARCHS[args.arch]} in {time.perf_counter() - t0:.0f} s; "
          f"{len(spills)} spill; {len(errors)} families failed")
    for v in spills:
        print(f"  spill: {v.kernel} warps={v.num_warps} {v.constexprs} [{v.signature}] "
              f"regs={v.registers} stores={v.spill_stores} B loads={v.spill_loads} B")
    for family, err in errors.items():
        print(f"  FAILED {family}: {err}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

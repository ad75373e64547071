"""Benchmark cases for cross-entropy and the chunked fused linear + cross-entropy.

Contract: `benchmarks/kernels/__init__.py` (`cases(threads)`, driven by bench_kernels.py).
- cross_entropy, tokens 4096 x vocab 32000 fp32 (FL_BENCH_QUICK=1: 1024 x 32000), fwd and
  fwd+bwd: naive (log_softmax + gather + masked mean, the eager reference), aten
  (F.cross_entropy), ours (provider="cpu"), torch.compile of the reference (by the driver).
- fused_linear_cross_entropy, x 4096 x 768, W 32000 x 768 (+ bias), fwd+bwd: naive
  (F.linear + F.cross_entropy, the full logits), ours (chunked, provider="cpu").
FL_BENCH_CE=ce or =flce runs only those cases.

Peak memory is not a timing, so it has its own entry point, each variant in a fresh process
(peak RSS above the post-setup baseline, `benchmarks/kernels/memory_probe.py`):
    .venv/bin/python benchmarks/kernels/cross_entropy.py --memory [--tokens 4096]
which prints a table and appends `peak_rss` rows to benchmarks/results/kernels.csv.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.cross_entropy import SPEC, cross_entropy  # noqa: E402
from kernels.linear_cross_entropy import fused_linear_cross_entropy  # noqa: E402

VOCAB, HIDDEN = 32000, 768
GPT2_VOCAB = 50257  # odd: rows start off 16-byte boundaries (the Triton kernels peel them)


def _inputs(n: int, v: int, seed: int = 0, device: str = "cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (2.0 * torch.randn(n, v, generator=g)).to(device=device, dtype=dtype)
    t = torch.randint(0, v, (n,), generator=g).to(device)
    return x, t


def _ce_cases(n: int, device: str = "cpu", provider: str = "cpu", dtype=torch.float32,
              vocab: int = VOCAB) -> list[dict]:
    x, t = _inputs(n, vocab, device=device, dtype=dtype)
    xg = x.clone().requires_grad_()
    fns = {"naive": SPEC.reference, "aten": F.cross_entropy,
           "ours": lambda a, b: cross_entropy(a, b, provider=provider)}

    def fwd(fn):
        def step():
            with torch.no_grad():
                return fn(x, t)
        return step

    def fwd_bwd(fn):
        return lambda: torch.autograd.grad(fn(xg, t), xg)

    shape, es, dt = f"{n}x{vocab}", x.element_size(), str(dtype).replace("torch.", "")
    hp = f"; FUSIONLENS_HUGEPAGES={os.environ.get('FUSIONLENS_HUGEPAGES', '1')}"
    return [
        dict(kernel="cross_entropy", **{"pass": "fwd"}, shape=shape, dtype=dt,
             variants={k: fwd(f) for k, f in fns.items()}, baseline="naive",
             compile=lambda: fwd(torch.compile(SPEC.reference)), bytes=float(n * vocab * es),
             notes="bytes: logits read once" + hp),
        dict(kernel="cross_entropy", **{"pass": "fwd+bwd"}, shape=shape, dtype=dt,
             variants={k: fwd_bwd(f) for k, f in fns.items()}, baseline="naive",
             compile=lambda: fwd_bwd(torch.compile(SPEC.reference)), bytes=float(3 * n * vocab * es),
             notes="bytes: logits read in fwd, read + grad written in bwd" + hp),
    ]


def _flce_inputs(n: int, seed: int = 1, device: str = "cpu", dtype=torch.float32, hidden: int = HIDDEN):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, hidden, generator=g).to(device=device, dtype=dtype).requires_grad_()
    w = (0.02 * torch.randn(VOCAB, hidden, generator=g)).to(device=device, dtype=dtype).requires_grad_()
    b = torch.zeros(VOCAB, device=device, dtype=dtype).requires_grad_()
    t = torch.randint(0, VOCAB, (n,), generator=g).to(device)
    return x, w, b, t


def _flce_unfused(x, w, b, t):
    return F.cross_entropy(F.linear(x, w, b), t)


def _flce_case(n: int, device: str = "cpu", provider: str = "cpu", dtype=torch.float32,
               hidden: int = HIDDEN) -> dict:
    x, w, b, t = _flce_inputs(n, device=device, dtype=dtype, hidden=hidden)

    def step(fn):
        return lambda: torch.autograd.grad(fn(x, w, b, t), (x, w, b))

    ours = lambda x, w, b, t: fused_linear_cross_entropy(x, w, t, b, provider=provider)  # noqa: E731
    return dict(kernel="fused_linear_cross_entropy", **{"pass": "fwd+bwd"},
                shape=f"{n}x{hidden}->{VOCAB}", dtype=str(dtype).replace("torch.", ""),
                variants={"naive": step(_flce_unfused), "ours": step(ours)}, baseline="naive",
                compile=lambda: step(torch.compile(_flce_unfused)), inner=1,
                notes="3 matmuls of 2*N*H*V flops dominate; peak memory: --memory")


def cases(threads: int) -> list[dict]:
    """FL_BENCH_CE=ce,flce picks the cross_entropy and/or fused linear + CE cases (default both)."""
    quick = os.environ.get("FL_BENCH_QUICK") == "1"
    n = 1024 if quick else 4096
    wanted = os.environ.get("FL_BENCH_CE", "ce,flce").split(",")
    return (_ce_cases(n) if "ce" in wanted else []) + ([_flce_case(n)] if "flce" in wanted else [])


def gpu_cases(device: str = "cuda") -> list[dict]:
    """CUDA cases for benchmarks/gpu/kernels_check.py (Triton provider)."""
    return (_ce_cases(16384, device, "triton", torch.bfloat16)
            + [_flce_case(8192, device, "triton", torch.bfloat16, hidden=4096)]
            + _ce_cases(8192, device, "triton", torch.bfloat16, vocab=GPT2_VOCAB))  # odd rows: peeled


def gpu_checks(device: str = "cuda") -> list[tuple[str, object]]:
    """Correctness of the Triton kernels at real sizes vs the float64 truth."""
    from kernels.linear_cross_entropy import SPEC as FLCE
    from tests.kernels.numerics import check_against_reference

    def ce_check(dtype, vocab=VOCAB):
        x, t = _inputs(4096, vocab, device=device, dtype=dtype)
        t[::7] = -100
        check_against_reference(lambda a, b: cross_entropy(a, b, provider="triton"), SPEC.reference,
                                [x, t], dtype)

    def flce_check(dtype):
        x, w, b, t = (a.detach() for a in _flce_inputs(2048, device=device, dtype=dtype))
        check_against_reference(
            lambda x, w, t, b: fused_linear_cross_entropy(x, w, t, b, provider="triton"),
            FLCE.reference, [x, w, t, b], dtype)

    return [(f"cross_entropy 4096x{VOCAB} {dt}", lambda dt=dt: ce_check(dt))
            for dt in (torch.float32, torch.bfloat16)] + \
        [(f"cross_entropy 4096x{GPT2_VOCAB} bfloat16 (odd rows, peeled)",
          lambda: ce_check(torch.bfloat16, GPT2_VOCAB))] + \
        [(f"fused_linear_cross_entropy 2048x{HIDDEN}->{VOCAB} bfloat16", lambda: flce_check(torch.bfloat16))]


# ---- peak memory (fresh process per variant) -------------------------------------------------

def _measure_child(variant: str, n: int) -> None:
    from benchmarks.kernels.memory_probe import peak_rss_delta_bytes

    small = _flce_inputs(8)
    fns = {"naive": _flce_unfused,
           "ours": lambda x, w, b, t: fused_linear_cross_entropy(x, w, t, b, provider="cpu")}
    fn = fns[variant]
    fn(*small).backward()  # load the C++ ops and start the threads outside the measurement
    x, w, b, t = _flce_inputs(n)

    def step():
        loss = fn(x, w, b, t)
        loss.backward()
        return float(loss.detach())

    loss, peak = peak_rss_delta_bytes(step)
    print(json.dumps(dict(peak_bytes=peak, loss=loss)))


def memory_main(n: int) -> None:
    from benchmarks.harness import append_rows, print_table

    results = {}
    for variant in ("naive", "ours"):
        proc = subprocess.run([sys.executable, __file__, "--child", variant, "--tokens", str(n)],
                              cwd=ROOT, text=True, capture_output=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    logits_mb = n * VOCAB * 4 / 1e6
    shape = f"{n}x{HIDDEN}->{VOCAB} float32 fwd+bwd"
    notes = (f"threads={torch.get_num_threads()}; malloc={os.environ.get('GLIBC_TUNABLES', 'glibc-default')}; "
             f"peak RSS above post-setup baseline, fresh process; logits would be {logits_mb:.0f} MB")
    rows = [dict(benchmark="fused_linear_cross_entropy", variant=v, shape=shape, metric="peak_rss",
                 p20=r["peak_bytes"] / 1e6, p50=r["peak_bytes"] / 1e6, p80=r["peak_bytes"] / 1e6,
                 unit="MB", notes=notes) for v, r in results.items()]
    ratio = results["naive"]["peak_bytes"] / max(results["ours"]["peak_bytes"], 1)
    rows.append(dict(benchmark="fused_linear_cross_entropy", variant="naive_over_ours", shape=shape,
                     metric="peak_rss_ratio", p20=ratio, p50=ratio, p80=ratio, unit="x", notes=notes))
    append_rows("kernels.csv", rows)
    print_table(f"fused_linear_cross_entropy peak memory, {shape}",
                ["variant", "peak MB", "loss"],
                [[v, r["peak_bytes"] / 1e6, r["loss"]] for v, r in results.items()])
    print(f"  unfused / fused peak: {ratio:.1f}x (one [N, V] fp32 logits tensor = {logits_mb:.0f} MB)")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="fused linear + cross-entropy peak memory")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--child", choices=["naive", "ours"])
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    if args.child:
        _measure_child(args.child, args.tokens)
    else:
        memory_main(args.tokens)

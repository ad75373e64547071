"""Randomised differential fuzzing of the public kernels against eager and a float64 truth.

`python -m tests.kernels.fuzz --seconds 600` (`make fuzz`; not part of `make test`, whose
`test_fuzz_smoke.py` runs 400 fixed cases) draws cases the parametrised tests do not enumerate:
random shapes (batch dims, 1 row, zero rows, odd and wide last dims), an independent memory
layout per tensor (contiguous, transposed, every other element), mixed parameter dtypes, value
ranges that stress the numerics (a large common offset under a tiny spread, large logits),
planted NaN/Inf, broadcast masks with fully masked rows, GQA and seq-first RoPE layouts, ignored
targets, smoothing, reductions and chunk sizes. Every provider a call admits (`cpu`, `aten`; not
`triton` without a GPU) runs with poisoned outputs, forward and backward. `--provider triton`
(`make fuzz-triton`) judges the Triton kernels alone; without a GPU through Triton's CPU
interpreter, its fp32 -> bf16 cast made to round as the GPU's, and with `--approximate-math` its
fp32 math as inexact as the GPU's (tests/kernels/interpreter_rounding.py). Ours are judged by
`judge` (numerics.assert_matches's protocol: error against float64 within 2x the larger of
eager's and ATen's fused op's, non-finite positions as the truth's or eager's); ATen's own op is
the baseline, held only to running where eager runs. Where eager raises, every provider must
raise too. The optimizers (AdamW, LAMB) get short training runs, judged on params and states
(tests/kernels/fuzz_optim.py). A failure prints one line with the seed that reproduces it:
`python -m tests.kernels.fuzz --seed S --cases 1`.

Found and fixed with it (2026-12-03): softmax over a moved size-1 dim with a mask (the kernel
refused the view), the aten LayerNorm admitting an fp32 bias alone on bf16/fp16 x, cross-entropy
gradients at fp32 logits ~30-100 (30-60 ulps off) and ignored rows with NaN logits (0, eager
NaN), the LayerNorm mean at a large common offset, and the bias / norm weight gradients' fp32
chains over thousands of rows (5-11x eager's error); a mask on a zero-size input moved to
another dim; AMSGrad's max dropping a NaN, LAMB's unused decay term, the Triton LAMB's per-tensor
norms poisoned by an earlier NaN, and non-dense params stepping in another arithmetic; the C++
LAMB's fp32 lane sums, reciprocal clipping and fp32(wd) amplified in cancellations (docs/kernels.md,
"The optimizers on awkward parameters"). Not ours: torch 2.13's oneDNN corrupting the heap on
bf16 matmuls with inner dim 1 (tests/kernels/repro_onednn_bf16_k1.py; main() raises its cache).
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

import kernels
from kernels.registry import KERNELS, triton_interpreted
from tests.kernels.numerics import DTYPES, fwd_bwd, make, max_err, poisoned, to_f64, with_nonfinite

MAX_NUMEL = 1 << 15  # per tensor: keeps a case in milliseconds on one core
LEAD_SIZES = (1, 1, 2, 3, 5, 7, 16, 33)
LAST_SIZES = (1, 2, 3, 5, 8, 16, 31, 33, 64, 100, 127, 128, 255, 256, 768, 1000, 1025, 2049, 4099)
LAYOUTS = ("contiguous", "contiguous", "transposed", "strided")
EAGER_REFUSES = (RuntimeError, IndexError, ValueError, TypeError)


@dataclass
class Case:
    """One call: kernels.<kernel>(*inputs, **kwargs). Floating `inputs` get gradients; tensors in
    `kwargs` (masks, rotary tables) do not."""
    kernel: str
    inputs: list
    kwargs: dict = field(default_factory=dict)
    what: str = ""
    factor: float = 2.0  # the error bar: factor x the larger of eager's and ATen's error
    # input index -> the size of the terms its gradient is a difference of, where that exceeds the
    # gradient itself (atol is in eps of that size: the rounding of those terms is what is left)
    grad_scale: dict = field(default_factory=dict)

    def check(self) -> list[str]:
        return check_case(self)

    def describe(self) -> list[str]:
        return [f"{tuple(t.shape)}:{str(t.dtype)[6:]}" for t in self.inputs if isinstance(t, torch.Tensor)]

    def judged_dtype(self) -> torch.dtype:
        """The dtype eager's result has (promotion of the floating inputs): atol is in its eps."""
        floats = [t.dtype for t in [*self.inputs, *self.kwargs.values()]
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
        out = floats[0]
        for d in floats[1:]:
            out = torch.promote_types(out, d)
        return out


class Draw:
    """Random choices for one case, all from one seed (so a seed reproduces the case)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.notes: list[str] = []

    def pick(self, options, label: str = "") -> Any:
        value = self.rng.choice(options)
        if label:
            self.notes.append(f"{label}={value}")
        return value

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def dtype(self) -> torch.dtype:
        return self.pick(DTYPES)

    def lead(self, last: int, max_dims: int = 3) -> list[int]:
        """Leading dims whose product times `last` stays under MAX_NUMEL; now and then a zero."""
        dims = [self.pick(LEAD_SIZES) for _ in range(self.pick(range(max_dims + 1)))]
        while dims and math.prod(dims) * last > MAX_NUMEL:
            dims[dims.index(max(dims))] //= 2
        if dims and self.chance(0.03):
            dims[self.rng.randrange(len(dims))] = 0
        return dims

    def last(self) -> int:
        return self.pick(LAST_SIZES)

    def tensor(self, shape, dtype, *, scale: float = 1.0, shift: float = 0.0, layout: Optional[str] = None,
               label: str = "") -> torch.Tensor:
        layout = layout or self.pick(LAYOUTS)
        if layout == "transposed" and len(shape) < 2:
            layout = "contiguous"
        if label and layout != "contiguous":
            self.notes.append(f"{label}:{layout}")
        return make(shape, dtype, self.rng.randrange(1 << 30), scale=scale, shift=shift, layout=layout)

    def values(self) -> tuple[float, float]:
        """(scale, shift) of an input: mostly N(0,1); sometimes tiny spread on a large offset
        (cancellation in a variance), small or large magnitudes."""
        scale, shift = self.pick(((1.0, 0.0),) * 5 + ((0.01, 5.0), (1e-3, 0.0), (20.0, 0.0), (1.0, 3.0)))
        if (scale, shift) != (1.0, 0.0):
            self.notes.append(f"values={scale}*N+{shift}")
        return scale, shift

    def maybe_nonfinite(self, x: torch.Tensor, p: float = 0.08) -> torch.Tensor:
        if x.numel() and x.dim() >= 2 and self.chance(p):
            self.notes.append("nan/inf planted")
            return with_nonfinite(x)
        return x


# ---- the case generators' registry (fuzz_kernels.py: one per public kernel; fuzz_optim.py: AdamW, LAMB)

GENERATORS: dict[str, Callable[[Draw], Case]] = {}


def generator(name: str):
    def register(fn: Callable[[Draw], Case]) -> Callable[[Draw], Case]:
        GENERATORS[name] = fn
        return fn
    return register


# ---- running and judging ----------------------------------------------------------------------

def draw_case(seed: int, kernel: Optional[str] = None) -> Case:
    d = Draw(seed)
    name = kernel or d.rng.choice(sorted(GENERATORS))
    case = GENERATORS[name](d)
    case.what = f"{name} " + " ".join(case.describe() + d.notes)
    return case


ONLY: Optional[set[str]] = None  # --provider: judge only these providers (None: every one that runs)
JUDGED: Counter = Counter()  # provider -> cases whose results it was judged on (it ran and eager ran)
RUN_DEVICE = "cpu"  # the device type run() puts the cases on


def providers_to_judge(spec_providers, extra: tuple[str, ...] = ()) -> list[str]:
    """The providers of a kernel (plus `extra`) to run: with --provider, those named and `aten` (the
    baseline the judge widens its bar by); else every one but triton off a GPU (its interpreter,
    ~100x slower a case, is for `--provider triton` runs)."""
    names = [*spec_providers, *extra]
    if ONLY is not None:
        return [p for p in names if p in ONLY or p == "aten"]
    return [p for p in names if p != "triton" or RUN_DEVICE != "cpu" or triton_interpreted()]


def _providers(name: str) -> list[str]:
    return providers_to_judge(KERNELS[name].providers)


def on_device(x: Any, device: torch.device) -> Any:
    """x (a tensor, or nested lists, tuples and dicts of them) on `device` with the same sizes,
    strides and storage offset, so transposed and every-other-element views stay what they were
    (`Tensor.to` makes a non-dense view contiguous). Other items unchanged."""
    if isinstance(x, torch.Tensor):
        if x.device == device:
            return x
        x = x.detach()
        n = x.untyped_storage().nbytes() // x.element_size()
        flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), 0, (n,), (1,))
        return flat.to(device).as_strided(x.shape, x.stride(), x.storage_offset())
    if isinstance(x, (list, tuple)):
        return type(x)(on_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: on_device(v, device) for k, v in x.items()}
    return x


def case_on(case: Any, device: torch.device) -> Any:
    """The case with its tensors on `device` (a kernel Case's inputs and kwargs; an optimizer run's
    params and grads). Cases are drawn on the CPU, so a seed draws the same values everywhere."""
    for name in ("inputs", "kwargs", "params", "steps"):
        if hasattr(case, name):
            setattr(case, name, on_device(getattr(case, name), device))
    return case


def _nonfinite_like(x: torch.Tensor, ref: torch.Tensor) -> bool:
    """NaN, +Inf and -Inf at the same positions in x and ref."""
    a, b = x.detach().double(), ref.detach().double()
    return all(torch.equal(f(a), f(b)) for f in (torch.isnan, lambda t: t == math.inf, lambda t: t == -math.inf))


def judge(ours: tuple, eager: tuple, truth: tuple, dtype: torch.dtype, baseline: Optional[tuple] = None, *,
          factor: float = 2.0, atol_eps: float = 16.0, scales: Optional[dict] = None) -> list[str]:
    """Problems of `ours` against the float64 `truth` ([] when none), in numerics.assert_matches's
    terms with two allowances: non-finite positions may follow the truth's or eager's (the same op
    in the same dtype overflows where float64 does not, and ATen's vector and scalar paths differ
    on gelu(-inf)), and the error bar is factor x the larger of eager's and the `baseline`'s (ATen's
    fused op, the alternative a user picks: its reductions are not eager's pairwise sums). atol is
    in eps of max(1, |truth|, scales[i]): scales gives a result's cancelled terms' size."""
    if len(ours) != len(truth):
        return [f"{len(ours)} results, the reference has {len(truth)}"]
    problems = []
    for i, (o, e, t) in enumerate(zip(ours, eager, truth)):
        b = baseline[i] if baseline is not None else None
        if o is None or t is None:
            if (o is None) != (t is None):
                problems.append(f"result {i}: None mismatch (ours {o is None}, reference {t is None})")
            continue
        if o.shape != e.shape or o.dtype != e.dtype:
            problems.append(f"result {i}: {tuple(o.shape)} {o.dtype}, eager {tuple(e.shape)} {e.dtype}")
            continue
        # Where the truth lies beyond o's dtype's range, +-max and +-inf are both right answers.
        keep = ~(t.isfinite() & (t.abs() > torch.finfo(o.dtype).max))
        if not (_nonfinite_like(o[keep], t[keep]) or _nonfinite_like(o[keep], e[keep])):
            n = int((o.detach().double().isfinite() != t.isfinite())[keep].sum())
            problems.append(f"result {i}: non-finite at other positions than the truth's and eager's ({n} differ)")
            continue
        both = o.detach().double().isfinite() & t.isfinite() & keep
        if not bool(both.any()):
            continue
        # The bars are measured where the other result is finite too: an overflow there is not an
        # error bar (it would admit anything), and a NaN there says nothing about the other values.
        at = both & e.detach().double().isfinite()
        bar = max_err(e[at], t[at])
        if b is not None and b.shape == o.shape:
            at = both & b.detach().double().isfinite()
            bar = max(bar, max_err(b[at], t[at]))
        err = max_err(o[both], t[both])
        unit = max(torch.finfo(dtype).eps, torch.finfo(o.dtype).eps)  # an fp16 input's gradient is fp16
        atol = atol_eps * unit * max(1.0, float(t[both].abs().max()), (scales or {}).get(i, 0.0))
        if not err <= factor * bar + atol:
            problems.append(f"result {i} ({str(o.dtype)[6:]}, {tuple(o.shape)}): error {err:.3g} against float64 > "
                            f"{factor} x {bar:.3g} (eager{' / aten' if b is not None else ''}) + atol {atol:.3g}")
    return problems


def check_case(case: Case) -> list[str]:
    """Judge every provider on one case: [] when all agree with the truth, else one line each."""
    fn = getattr(kernels, case.kernel)
    kw64 = {k: to_f64(v) for k, v in case.kwargs.items()}
    try:
        eager = fwd_bwd(lambda *a: fn(*a, provider="reference", **case.kwargs), case.inputs)
        truth = fwd_bwd(lambda *a: fn(*a, provider="reference", **kw64), to_f64(case.inputs))
    except EAGER_REFUSES:
        eager = truth = None
    results: dict[str, Any] = {}
    for provider in _providers(case.kernel):
        call = lambda *a: fn(*a, provider=provider, **case.kwargs)  # noqa: E731
        try:
            with poisoned():
                results[provider] = fwd_bwd(call, case.inputs)
        except ValueError as exc:
            if "unavailable" not in str(exc):  # else: this provider does not admit the call, and says why
                results[provider] = exc
        except Exception as exc:  # noqa: BLE001 - any raise where eager succeeds is a finding
            results[provider] = exc
    aten = results.get("aten")
    baseline = aten if isinstance(aten, tuple) else None
    first_grad = len(eager) - len(case.inputs) if eager is not None else 0  # results: (*outputs, *grads)
    scales = {first_grad + k: v for k, v in case.grad_scale.items()}
    problems = []
    for provider, got in results.items():
        if isinstance(got, Exception):
            if eager is not None:
                problems.append(f"{provider}: raised {type(got).__name__}: {str(got).splitlines()[0][:200]}")
        elif eager is None:
            problems.append(f"{provider}: ran where eager raises")
        elif provider != "aten":  # ATen's fused op is the baseline, not under test (only its raises)
            JUDGED[provider] += 1
            problems += [f"{provider}: {p}" for p in judge(got, eager, truth, case.judged_dtype(), baseline,
                                                           factor=case.factor, scales=scales)]
    return problems


def run(seed: int, cases: Optional[int], seconds: float, kernel: Optional[str] = None,
        log: Callable[[str], None] = print, device: str = "cpu") -> dict:
    """Draw and check cases from `seed` on (case i uses seed + i) until `cases` or `seconds` run out,
    each run on `device`. Returns {"cases": n, "failures": [(seed, what, problems)], "per_kernel":
    {name: n}}."""
    global RUN_DEVICE
    RUN_DEVICE = torch.device(device).type
    flags = "".join(f" --provider {p}" for p in sorted(ONLY or ())) + (f" --device {device}" if device != "cpu" else "")
    t0, i = time.perf_counter(), 0
    failures, per_kernel = [], {}
    while (cases is None or i < cases) and time.perf_counter() - t0 < seconds:
        case_seed = seed + i
        case = draw_case(case_seed, kernel)
        per_kernel[case.kernel] = per_kernel.get(case.kernel, 0) + 1
        try:
            problems = case_on(case, torch.device(device)).check()
        except Exception:  # noqa: BLE001 - a broken case is reported, never ends the run
            problems = ["harness: " + traceback.format_exc().strip().splitlines()[-1]]
        if problems:
            failures.append((case_seed, case.what, problems))
            log(f"FAIL --seed {case_seed} --cases 1{flags}: {case.what}")
            for p in problems:
                log(f"    {p}")
        i += 1
    return {"cases": i, "failures": failures, "per_kernel": per_kernel, "seconds": time.perf_counter() - t0}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="first case's seed (default: from the clock)")
    ap.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    ap.add_argument("--seconds", type=float, default=300.0, help="stop after this long (default 300)")
    ap.add_argument("--kernel", choices=sorted(GENERATORS), default=None, help="only this kernel")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--provider", action="append", default=None,
                    help="judge only this provider (repeatable); `triton` without a GPU runs through "
                         "Triton's CPU interpreter (TRITON_INTERPRET=1, set here before triton loads)")
    ap.add_argument("--device", default="cpu",
                    help="run the cases on this device (e.g. cuda: the compiled Triton kernels; default cpu)")
    ap.add_argument("--approximate-math", action="store_true",
                    help="with --provider triton off a GPU: the interpreter's fp32 divide, sqrt, exp and log "
                         "as inexact as sm_90's approximate instructions may be (interpreter_rounding.py)")
    args = ap.parse_args(argv)
    global ONLY
    ONLY = set(args.provider) if args.provider else None
    interpret = bool(ONLY) and "triton" in ONLY and torch.device(args.device).type == "cpu"
    if args.approximate_math and not interpret:
        ap.error("--approximate-math models the GPU in Triton's interpreter: it needs --provider triton "
                 "and --device cpu")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels' triton modules first load
        from tests.kernels import interpreter_rounding
        interpreter_rounding.install(approximate=args.approximate_math)  # the GPU's casts (and math)
        import warnings

        import numpy
        numpy.seterr(all="ignore")  # the interpreter's numpy ops on planted NaN/Inf: judged, not logged
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # (its all-NaN max and the like)
    # torch 2.13's oneDNN corrupts the heap on bf16 matmuls with k = 1 once its primitive cache
    # (1024 by default) evicts (tests/kernels/repro_onednn_bf16_k1.py). Our kernels avoid those
    # products; the eager references the cases are judged against do not, and a fuzz run draws far
    # more distinct shapes than a model. Read lazily, at oneDNN's first primitive: nothing before
    # this line multiplies.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")
    torch.set_num_threads(args.threads)
    seed = args.seed if args.seed is not None else int(time.time()) * 1000
    unavailable = kernels.available_providers()
    print(f"fuzz: seed {seed}; providers off here: "
          + (", ".join(f"{k} ({v})" for k, v in unavailable.items() if v) or "none")
          + f"; oneDNN primitive cache {os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY']}", flush=True)
    out = run(seed, args.cases, args.seconds, args.kernel, log=lambda s: print(s, flush=True), device=args.device)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(out["per_kernel"].items()))
    judged = ", ".join(f"{k} {v}" for k, v in sorted(JUDGED.items())) or "none"
    print(f"fuzz: judged results of {judged} (cases a provider admitted, where eager ran)")
    print(f"fuzz: {out['cases']} cases in {out['seconds']:.0f} s ({counts}); {len(out['failures'])} failed")
    return 1 if out["failures"] else 0


# The kernels' cases and the optimizers' (a short training run each) register themselves into
# GENERATORS.
from tests.kernels import fuzz_kernels, fuzz_optim  # noqa: E402,F401

if __name__ == "__main__":
    # Run this module's imported copy, the one fuzz_kernels and fuzz_optim registered into.
    from tests.kernels import fuzz as _fuzz

    sys.exit(_fuzz.main())

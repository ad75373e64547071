"""What the measured provider choice (`kernels/tuning.py`) picks for the real kernels, how long
one decision takes, and how stable the pick is.

Usage (from the repo root):
    .venv/bin/python benchmarks/bench_provider_choice.py [--threads 1,2] [--shapes 4096x768,4096x4096]
        [--kernels softmax,layer_norm,rms_norm,gelu,swiglu,swiglu_packed] [--repeats 3] [--fresh]

For each thread count, kernel, shape and mode (forward under no_grad; forward+backward when the
input requires grad), the decision is made `--repeats` times from scratch (in-memory decisions
forgotten, a private data dir), interleaving kernels and modes between repeats so a slow spell of
the shared machine spreads over all of them. Reported: the providers picked (stability), the
decision's wall seconds (p20/p50/p80 over the repeats), and each provider's measured median per
call (p20/p50/p80 over the repeats). Rows go to `benchmarks/results/provider_choice.csv`.
With --fresh each decision is the first call of its own process: a first call's one-time costs
(fresh pages) are then in its warm-ups, which once decided alone and picked the unfused reference.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402

import kernels  # noqa: E402
from benchmarks.harness import append_rows, machine, percentiles, print_table  # noqa: E402
from kernels import registry, tuning  # noqa: E402


def call_args(name: str, rows: int, hidden: int, grad: bool) -> tuple:
    """The dispatch arguments of one realistic call of `name` (fp32 CPU tensors)."""
    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).requires_grad_(grad)

    x = t(rows, hidden)
    return {
        "softmax": lambda: (x,),
        "layer_norm": lambda: (x, t(hidden), t(hidden), 1e-5),
        "rms_norm": lambda: (x, t(hidden), 1e-6),
        "add_rms_norm": lambda: (x, t(rows, hidden), t(hidden), 1e-6),
        "gelu": lambda: (x, "none"),
        "bias_gelu": lambda: (x, t(hidden), "none"),
        "swiglu": lambda: (x, t(rows, hidden)),
        # the halves of one packed gate/up projection, as the SwiGLU module takes them
        "swiglu_packed": lambda: t(rows, 2 * hidden).chunk(2, -1),
    }[name]()


KERNEL_OF = {"swiglu_packed": "swiglu"}  # bench case -> kernel name, where they differ


def decide(name: str, rows: int, hidden: int, grad: bool) -> tuning.Choice:
    """One decision from scratch (in-memory decisions forgotten) for a realistic call."""
    args = call_args(name, rows, hidden, grad)
    tuning.forget_decisions()
    with torch.enable_grad() if grad else torch.no_grad():
        return kernels.provider_choice(KERNEL_OF.get(name, name), *args)


def decide_fresh(name: str, rows: int, hidden: int, grad: bool, threads: int) -> tuning.Choice:
    """The same decision as the first call of a new process (its memory never touched before: the
    case where a first call's page faults once made the unfused reference win)."""
    cmd = [sys.executable, __file__, "--one", f"{name},{rows},{hidden},{int(grad)},{threads}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ)
    if run.returncode:
        raise SystemExit(f"decision subprocess failed: {run.stderr.strip()[-2000:]}")
    rec = json.loads(run.stdout.strip().splitlines()[-1])
    return tuning.Choice(rec["kernel"], rec["provider"], "measured", times_us=rec["times_us"],
                         decision_s=rec["decision_s"])


def _one(spec: str) -> None:
    name, rows, hidden, grad, threads = spec.split(",")
    torch.set_num_threads(int(threads))
    c = decide(name, int(rows), int(hidden), bool(int(grad)))
    print(json.dumps({"kernel": c.kernel, "provider": c.provider, "times_us": c.times_us,
                      "decision_s": c.decision_s}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default="4096x768,4096x4096")
    ap.add_argument("--kernels", default="softmax,layer_norm,rms_norm,gelu,swiglu,swiglu_packed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fresh", action="store_true",
                    help="each decision as the first call of its own process (slower: ~3 s per process)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one decision, printed as JSON
    opts = ap.parse_args()
    if opts.one:
        return _one(opts.one)
    reason = registry.provider_unavailable_reason("cpu")  # build in the normal data dir first
    if reason:
        print(f"note: cpu provider unavailable ({reason}); measuring the others")
    os.environ["FUSIONLENS_DATA_DIR"] = tempfile.mkdtemp(prefix="fusionlens_choice_")
    os.environ[tuning.ENV_MODE] = "measure"
    shapes = [tuple(int(v) for v in s.split("x")) for s in opts.shapes.split(",")]
    names = opts.kernels.split(",")
    out_rows, table = [], []
    for threads in (int(v) for v in opts.threads.split(",")):
        torch.set_num_threads(threads)
        for rows, hidden in shapes:
            picks: dict[tuple, list[str]] = defaultdict(list)
            decision_s: dict[tuple, list[float]] = defaultdict(list)
            times: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for _ in range(opts.repeats):
                for grad in (False, True):
                    for name in names:
                        c = (decide_fresh(name, rows, hidden, grad, threads) if opts.fresh
                             else decide(name, rows, hidden, grad))
                        case = (name, grad)
                        picks[case].append(c.provider)
                        decision_s[case].append(c.decision_s)
                        for p, us in c.times_us.items():
                            times[case][p].append(us)
            for (name, grad), chosen in picks.items():
                mode = "fwd+bwd" if grad else "fwd"
                shape = f"{rows}x{hidden}"
                clock = "process_cpu" if threads == 1 else "wall"
                notes = f"threads={threads}; picks={'/'.join(chosen)}; clock={clock}"
                notes += "; fresh" if opts.fresh else ""
                d20, d50, d80 = percentiles(decision_s[(name, grad)])
                out_rows.append(dict(benchmark="provider_choice", variant=f"{name}:decision", shape=shape,
                                     metric=f"{mode}_decision_s", p20=d20, p50=d50, p80=d80, unit="s", notes=notes))
                cells = []
                for p, us in times[(name, grad)].items():
                    p20, p50, p80 = percentiles(us)
                    out_rows.append(dict(benchmark="provider_choice", variant=f"{name}:{p}", shape=shape,
                                         metric=f"{mode}_us", p20=p20, p50=p50, p80=p80, unit="us", notes=notes))
                    cells.append(f"{p}={p50:.0f}")
                table.append([threads, shape, name, mode, "/".join(chosen), d50, " ".join(cells)])
    print(f"machine: {machine()}")
    print_table("measured provider choice (median us per call per provider; picks over repeats)",
                ["threads", "shape", "kernel", "mode", "picks", "decision_s", "median us"], table)
    print(f"\nrows appended to {append_rows('provider_choice.csv', out_rows)}")


if __name__ == "__main__":
    main()

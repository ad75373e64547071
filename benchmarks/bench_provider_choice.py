"""What the measured provider choice (`kernels/tuning.py`) picks for the real kernels, how long
one decision takes, and how stable the pick is.

Usage (from the repo root):
    .venv/bin/python benchmarks/bench_provider_choice.py [--threads 1,2] [--shapes 4096x768,4096x4096]
        [--kernels softmax,layer_norm,rms_norm,gelu,swiglu] [--repeats 3]

For each thread count, kernel, shape and mode (forward under no_grad; forward+backward when the
input requires grad), the decision is made `--repeats` times from scratch (in-memory decisions
forgotten, a private data dir), interleaving kernels and modes between repeats so a slow spell of
the shared machine spreads over all of them. Reported: the providers picked (stability), the
decision's wall seconds (p20/p50/p80 over the repeats), and each provider's measured median per
call (p20/p50/p80 over the repeats). Rows go to `benchmarks/results/provider_choice.csv`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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
    }[name]()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default="4096x768,4096x4096")
    ap.add_argument("--kernels", default="softmax,layer_norm,rms_norm,gelu,swiglu")
    ap.add_argument("--repeats", type=int, default=3)
    opts = ap.parse_args()
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
                        args = call_args(name, rows, hidden, grad)
                        tuning.forget_decisions()
                        with torch.enable_grad() if grad else torch.no_grad():
                            c = kernels.provider_choice(name, *args)
                        case = (name, grad)
                        picks[case].append(c.provider)
                        decision_s[case].append(c.decision_s)
                        for p, us in c.times_us.items():
                            times[case][p].append(us)
                        del args
            for (name, grad), chosen in picks.items():
                mode = "fwd+bwd" if grad else "fwd"
                shape = f"{rows}x{hidden}"
                clock = "process_cpu" if threads == 1 else "wall"
                notes = f"threads={threads}; picks={'/'.join(chosen)}; clock={clock}"
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

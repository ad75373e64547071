"""Shared benchmark protocol: interleaved rounds, percentiles, ratios, long-format CSV rows.

Every FusionLens benchmark uses this so numbers compare across runs and machines:
- variants run interleaved, round by round, so slow drift of a shared machine hits all of them
  alike; a ratio is computed per round, then summarised. The order is shuffled every round
  (seeded, e.g. A C B, C B A, A B C) so that no variant always follows the same one: on CPU a
  variant that frees large temporaries (an unfused chain) makes glibc hand the memory back, and
  whatever runs next pays the page faults of fresh outputs (measured: a fused kernel right after
  the eager chain took 2.9 ms a call instead of 1.0 ms, and the same kernel placed after it in a
  fixed order escaped while the one before paid);
- both CPU time (process time: robust on a shared machine) and wall time (what users feel);
- p20 / p50 / p80 of each;
- machine facts recorded with every row: CPU model, threads, load average, allocator setting.

Rows are appended to `benchmarks/results/<file>.csv` with the columns in `CSV_COLUMNS`; past 4 MiB
a file's rows move into `<file>_archive.csv.gz` (`rotate`, `read_results` reads both).
"""
from __future__ import annotations

import csv
import datetime as _dt
import gzip
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

RESULTS = Path(__file__).parent / "results"
CSV_COLUMNS = ("date", "machine", "benchmark", "variant", "shape", "metric", "p20", "p50", "p80",
               "unit", "notes")


def machine() -> str:
    """One short string naming the machine: CPU model, cores, torch threads, load, allocator."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        threads = torch.get_num_threads()
    except ImportError:
        threads = -1
    load1 = os.getloadavg()[0]
    malloc = os.environ.get("GLIBC_TUNABLES", "glibc-default")
    return f"{cpu}; {os.cpu_count()} cpus; torch_threads={threads}; load1={load1:.2f}; malloc={malloc}"


def gpu_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return None


def percentiles(xs: Iterable[float]) -> tuple[float, float, float]:
    """(p20, p50, p80) by linear interpolation; a single value repeats."""
    data = sorted(xs)
    if not data:
        return (float("nan"),) * 3
    if len(data) == 1:
        return (data[0],) * 3
    q = statistics.quantiles(data, n=10, method="inclusive")  # deciles
    return q[1], statistics.median(data), q[7]


@dataclass
class Timing:
    """Per-variant samples from interleaved rounds (seconds)."""

    wall_s: dict[str, list[float]] = field(default_factory=dict)
    cpu_s: dict[str, list[float]] = field(default_factory=dict)

    def ratio(self, baseline: str, variant: str, metric: str = "wall_s") -> tuple[float, float, float]:
        """Per-round speedup baseline/variant (>1 means `variant` is faster), as p20/p50/p80."""
        a = getattr(self, metric)[baseline]
        b = getattr(self, metric)[variant]
        return percentiles(x / y for x, y in zip(a, b) if y > 0)


def round_orders(names: list[str], rounds: int, seed: int = 0) -> list[list[str]]:
    """The variant order of each round: a seeded shuffle per round, so every variant follows
    (and precedes) the others about equally often, not always the same neighbour."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def interleave(variants: Mapping[str, Callable[[], object]], rounds: int = 7, inner: int = 1,
               warmup: int = 1, sync: Callable[[], None] | None = None, settle: int = 0) -> Timing:
    """Time each variant `inner` times per round, interleaved over `rounds` rounds.

    Returns per-call seconds (round total / inner). `sync` runs after each variant (e.g.
    torch.cuda.synchronize) so asynchronous work is counted. The order within a round is a seeded
    shuffle (`round_orders`), the same in every run. `settle` untimed calls open each variant's
    turn, so its timed calls see its own steady state (heap and caches as its previous call left
    them), not the memory the variant before it freed.
    """
    timing = Timing({k: [] for k in variants}, {k: [] for k in variants})
    for fn in variants.values():
        for _ in range(warmup):
            fn()
        if sync:
            sync()
    for order in round_orders(list(variants), rounds):
        for name in order:
            fn = variants[name]
            for _ in range(settle):
                fn()
            if settle and sync:
                sync()
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(inner):
                fn()
            if sync:
                sync()
            w1, c1 = time.perf_counter(), time.process_time()
            timing.wall_s[name].append((w1 - w0) / inner)
            timing.cpu_s[name].append((c1 - c0) / inner)
    return timing


# A results CSV over this size moves its rows into <stem>_archive.csv.gz before the next append,
# so the files kept in git stay small (the archive compresses ~10x); readers take both.
ROTATE_BYTES = 4 * 2**20


def archive_path(path: Path) -> Path:
    """Where rotate() keeps a results CSV's older rows (gzip, one member per rotation)."""
    return path.with_name(f"{path.stem}_archive.csv.gz")


def rotate(path: Path, limit: int = ROTATE_BYTES) -> bool:
    """Move path's rows into its gzip archive when path is larger than limit; True if it did.
    The archive keeps one header (its first member's); later members are rows only."""
    if not path.exists() or path.stat().st_size <= limit:
        return False
    archive = archive_path(path)
    lines = path.read_bytes().splitlines(keepends=True)
    body = lines if not archive.exists() else lines[1:]
    with gzip.open(archive, "ab") as gz:
        gz.writelines(body)
    path.unlink()
    return True


def read_results(path: Path):
    """A results CSV with its archived rows first, as one DataFrame (pandas imported here only)."""
    import pandas as pd

    parts = [pd.read_csv(p) for p in (archive_path(path), path) if p.exists()]
    if not parts:
        raise FileNotFoundError(f"no {path.name} (nor its archive) in {path.parent}")
    return pd.concat(parts, ignore_index=True)


def append_rows(filename: str, rows: Iterable[Mapping[str, object]]) -> Path:
    """Append rows (dicts with CSV_COLUMNS keys; date/machine filled in) to results/<filename>
    (or to `filename` itself when it is an absolute path), rotating it first when it is large."""
    path = RESULTS / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    rotate(path)
    new = not path.exists()
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    mach = machine()
    gpu = gpu_name()
    if gpu:
        mach = f"{gpu}; {mach}"
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        for row in rows:
            full = {"date": now, "machine": mach, "notes": ""}
            full.update(row)
            for k in ("p20", "p50", "p80"):
                if isinstance(full.get(k), float):
                    full[k] = f"{full[k]:.6g}"
            writer.writerow(full)
    return path


def timing_rows(benchmark: str, shape: str, timing: Timing, unit_scale: float = 1e3,
                unit: str = "ms", notes: str = "") -> list[dict[str, object]]:
    """Long-format rows for every variant's wall and CPU time."""
    rows: list[dict[str, object]] = []
    for metric in ("wall_s", "cpu_s"):
        for variant, xs in getattr(timing, metric).items():
            p20, p50, p80 = percentiles(x * unit_scale for x in xs)
            rows.append(dict(benchmark=benchmark, variant=variant, shape=shape,
                             metric=metric.replace("_s", "_time"), p20=p20, p50=p50, p80=p80,
                             unit=unit, notes=notes))
    return rows


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    """A plain aligned text table on stdout."""
    cells = [[str(h) for h in header]] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))

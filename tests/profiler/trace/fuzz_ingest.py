"""Mutation fuzzing of trace ingestion and of everything that reads a loaded Trace.

`python -m tests.profiler.trace.fuzz_ingest --seconds 300` (`make fuzz-trace`; not part of
`make test`, whose test_fuzz_ingest_smoke.py runs a fixed set of seeds) takes the small real traces
of tests/data/traces, mutates each draw the way broken or unusual profiler output looks (fields of
the wrong type, missing or absurd numbers, unknown phases, dangling or cyclic links, shuffled,
duplicated or dropped events, odd metadata, garbage kernel names, a second rank (a shifted copy or
another job's trace), truncated or flipped bytes, the ranks as members of a zip (any method) or
a tar (any format, maybe gzipped), headers sometimes damaged; sometimes every timestamp moved onto
a Unix-epoch µs clock with ns fractions (1712195495519689.047: the loader's exact-text path), drawn
from a generator of its own so that no earlier draw of a seed changes; sometimes, from another such
generator, complete events stripped of their category or given another tool's (a JAX/TensorFlow Chrome
trace, all of them or a share: refused in one line, or counted as unread); sometimes a real trace to diff
against; sometimes the loaded Trace saved as Parquet with bytes overwritten, and reopened), and
checks the contract a user of the Load page relies on:

1. `load_trace` returns a Trace or raises TraceError with one line (< 400 characters); nothing else.
2. A Trace it returns goes through the Load page's summary (`summarize` and pages/load_view.py's
   helpers) and `build_report` (every registered analysis and rule, as `python -m profiler report`
   runs them) with no analysis or rule failing (`report["errors"]` empty), and the report
   serialises as strict JSON (no NaN).

A failure prints one line with the seed that reproduces it:
`python -m tests.profiler.trace.fuzz_ingest --seed S --cases 1 [--show]` (and the same `--max-bytes`,
which picks the corpus the seed draws from).
"""
from __future__ import annotations

import argparse
import copy
import gzip
import json
import random
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from tests.profiler.trace.fuzz_damage import ARCHIVES, corrupt_bytes, flip_parquet_bytes

TRACES_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
MAX_CORPUS_BYTES = 200_000  # compressed: keeps a case well under a second on one core
MAX_MESSAGE = 400


def corpus(max_bytes: int = MAX_CORPUS_BYTES) -> dict[str, dict]:
    """The real traces of at most `max_bytes` (gzipped), parsed once: {file name: document}."""
    docs = {}
    for path in sorted(TRACES_DIR.glob("*.json.gz")):
        if path.stat().st_size <= max_bytes:
            docs[path.name] = json.loads(gzip.decompress(path.read_bytes()))
    if not docs:
        raise SystemExit(f"fuzz_ingest: no trace under {max_bytes} bytes in {TRACES_DIR}")
    return docs


# ---- values and mutations ------------------------------------------------------------------------

NASTY = (None, "", "abc", "12", "1e3", -1, 0, 1, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1,
         1e308, -1e308, 1e-320, 0.5, -0.5, 3.7, True, False, [], {}, [1, 2], {"a": 1}, "x" * 5000,
         "\u00e9\u4e2d\U0001f600", "_ZN3foo3barEv", "_Z", "_ZNK" + "N" * 50, "void k<(int)1>(float*)")
PHASES = ("X", "B", "E", "i", "I", "s", "f", "t", "C", "M", "b", "e", "n", "", "XX", "x")
CATEGORIES = ("kernel", "Kernel", "cpu_op", "Operator", "cuda_runtime", "cuda_driver", "gpu_memcpy", "gpu_memset",
              "user_annotation", "gpu_user_annotation", "python_function", "ac2g", "fwdbwd", "cuda_sync",
              "Trace", "", "made_up")
ARG_KEYS = ("correlation", "External id", "stream", "device", "context", "grid", "block", "Python id",
            "Python parent id", "Ev Idx", "Input Dims", "Input type", "Collective name", "In msg nelems",
            "Group size", "Process Group Ranks", "Process Group Name", "bytes", "memory bandwidth (GB/s)",
            "registers per thread", "shared memory", "est. achieved occupancy %", "Bytes", "Total Allocated",
            "Total Reserved", "Addr", "Device Id", "Device Type")


def _events(doc: dict) -> list:
    ev = doc.get("traceEvents")
    return ev if isinstance(ev, list) else []


def _some(rng: random.Random, events: list, most: int = 40) -> list:
    """A few events, the ones that are dicts."""
    picked = rng.sample(range(len(events)), min(len(events), rng.randint(1, most))) if events else []
    return [events[i] for i in picked if isinstance(events[i], dict)]


def m_field_value(rng, doc):
    """An event field (top level or args) set to a value of the wrong type or an absurd number."""
    for e in _some(rng, _events(doc)):
        if rng.random() < 0.5 or not isinstance(e.get("args"), dict):
            key = rng.choice(("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "args", "s"))
            e[key] = rng.choice(NASTY)
        else:
            e["args"][rng.choice(ARG_KEYS)] = rng.choice(NASTY)


def m_drop_field(rng, doc):
    """A field (top level or args) removed from a few events."""
    for e in _some(rng, _events(doc)):
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        keys = list(e) + [f"args.{k}" for k in args]
        if keys:
            k = rng.choice(keys)
            if k.startswith("args."):
                e["args"].pop(k[5:], None)
            else:
                e.pop(k, None)


def m_phase_category(rng, doc):
    """A few events given another phase or category, known or not."""
    for e in _some(rng, _events(doc)):
        if rng.random() < 0.5:
            e["ph"] = rng.choice(PHASES)
        else:
            e["cat"] = rng.choice(CATEGORIES)


def m_times(rng, doc):
    """Timestamps and durations: negative, zero, equal, huge, reversed, sub-microsecond."""
    events = _events(doc)
    how = rng.choice(("neg_dur", "zero_dur", "same_ts", "huge_ts", "neg_ts", "shift", "tiny", "swap"))
    for e in _some(rng, events, 200):
        if how == "neg_dur":
            d = e.get("dur")
            e["dur"] = -abs(d) if isinstance(d, (int, float)) and d else -1.0
        elif how == "zero_dur":
            e["dur"] = 0
        elif how == "same_ts":
            e["ts"] = 1000.0
        elif how == "huge_ts":
            e["ts"] = rng.choice((1e15, 1.7e12, 9.2e18, 1e30))
        elif how == "neg_ts":
            e["ts"] = -rng.random() * 1e6
        elif how == "shift" and isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + rng.uniform(-1e4, 1e4)
        elif how == "tiny" and isinstance(e.get("ts"), (int, float)):
            e["ts"] = e["ts"] + 1e-4
            e["dur"] = 1e-4
        elif how == "swap" and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)):
            e["ts"], e["dur"] = e["dur"], e["ts"]


def m_links(rng, doc):
    """Correlation ids, flow ids and Python parents pointed elsewhere: dangling, shared, cyclic."""
    events = [e for e in _events(doc) if isinstance(e, dict)]
    ids = [e["args"].get("correlation") for e in events if isinstance(e.get("args"), dict)] or [1]
    for e in _some(rng, events, 100):
        args = e.setdefault("args", {}) if isinstance(e.get("args", {}), dict) else None
        if args is None:
            continue
        choice = rng.random()
        if choice < 0.3:
            args["correlation"] = rng.choice(ids + [0, -1, 10**12])
        elif choice < 0.5:
            args["External id"] = rng.choice(ids + [0, -5])
        elif choice < 0.7:
            args["Python parent id"] = args.get("Python id", 1)  # its own parent
        elif choice < 0.85 and e.get("ph") in ("s", "f"):
            e["id"] = rng.choice(ids + [0, "x"])
        else:
            args["Python id"] = rng.randint(0, 3)  # many share one id


def m_structure(rng, doc):
    """Events duplicated, dropped, shuffled, reversed, or non-dict entries planted."""
    events = _events(doc)
    how = rng.choice(("dup", "drop", "shuffle", "reverse", "junk", "keep_kind"))
    if how == "dup" and events:
        for e in _some(rng, events, 60):
            events.insert(rng.randrange(len(events) + 1), copy.deepcopy(e))
    elif how == "drop":
        keep = rng.uniform(0.05, 0.95)
        doc["traceEvents"] = [e for e in events if rng.random() < keep]
    elif how == "shuffle":
        rng.shuffle(events)
    elif how == "reverse":
        events.reverse()
    elif how == "junk":
        for _ in range(rng.randint(1, 3)):
            events.insert(rng.randrange(len(events) + 1), rng.choice(NASTY))
    else:  # only one kind of event left: a CPU-only or GPU-only trace
        cats = sorted({str(e.get("cat")) for e in events if isinstance(e, dict)})
        if cats:
            cat = rng.choice(cats)
            doc["traceEvents"] = [e for e in events if isinstance(e, dict) and (str(e.get("cat")) == cat or e.get("ph") == "M")]


def m_metadata(rng, doc):
    """The document's own keys: distributedInfo, deviceProperties, units, schema."""
    key = rng.choice(("distributedInfo", "deviceProperties", "displayTimeUnit", "schemaVersion", "baseTimeNanoseconds",
                      "traceName", "cupti_version"))
    if key == "distributedInfo":
        doc[key] = rng.choice((None, {}, {"rank": rng.choice(NASTY)}, {"rank": 3, "world_size": 2},
                               {"rank": 0, "world_size": 0}, {"backend": "nccl", "rank": 1, "world_size": 8}, "x"))
    elif key == "deviceProperties":
        doc[key] = rng.choice((None, [], [{}], [{"id": "x", "name": 5}], [{"id": 0, "name": "NVIDIA H200",
                               "totalGlobalMem": -1, "numSms": 0, "computeMajor": 9, "computeMinor": 0}], {"a": 1}))
    elif key == "displayTimeUnit":
        doc[key] = rng.choice(("ns", "ms", "us", "", 3))
    else:
        doc[key] = rng.choice(NASTY)


def m_names(rng, doc):
    """Kernel and op names: empty, huge, mangled-looking garbage, non-ASCII, templates."""
    for e in _some(rng, _events(doc), 60):
        base = str(e.get("name", ""))
        e["name"] = rng.choice(("", base * 50, "_ZN" + base, "_ZN7ck_tile" + "9" * rng.randint(1, 30) + "x",
                                "_Z" + "".join(rng.choice("NKSt0123456789_EIv") for _ in range(rng.randint(1, 80))),
                                base + "\u00e9\U0001f600", "void " + base + "<" * 40, "ProfilerStep#" + str(rng.choice(NASTY))))


MUTATORS: dict[str, Callable[[random.Random, dict], None]] = {
    "field_value": m_field_value,
    "drop_field": m_drop_field,
    "phase_category": m_phase_category,
    "times": m_times,
    "links": m_links,
    "structure": m_structure,
    "metadata": m_metadata,
    "names": m_names,
}


EPOCH_NS = 1712195495519689 * 1000  # an April 2024 Unix time, in ns
_EPOCH_MARK = re.compile(rb'"@ts:(-?[0-9]+\.[0-9]{3})"')


def to_epoch(rng: random.Random, doc: dict) -> None:
    """Every finite numeric ts (or a share of them) as Unix-epoch µs with 3 decimals, as some Kineto
    versions write them; held as marked strings until `dumps` writes them as bare JSON numbers
    (json.dumps of such a float would round it to float64's 0.25 µs first)."""
    share = rng.choice((1.0, 1.0, 0.5))
    timed = [e for e in _events(doc) if isinstance(e, dict) and type(e.get("ts")) in (int, float)
             and abs(e["ts"]) < 1e300]
    t0 = min((e["ts"] for e in timed), default=0)
    for e in timed:
        if rng.random() > share:
            continue
        ts = e["ts"]  # the trace's own clock, moved to start at EPOCH_NS; whole µs get ns digits
        total = EPOCH_NS + round((ts - t0) * 1000) + rng.randrange(1000) * (type(ts) is int)
        sign, total = ("-", -total) if total < 0 else ("", total)
        e["ts"] = f"@ts:{sign}{total // 1000}.{total % 1000:03d}"


def dumps(doc: dict) -> bytes:
    """json.dumps, with `to_epoch`'s marked timestamps written as bare numbers."""
    return _EPOCH_MARK.sub(rb"\1", json.dumps(doc).encode())


OTHER_TOOL_CATEGORIES = (None, None, "XLA Ops", "TPU", "xpu_runtime", "privateuse1_runtime", "a\nb\u2028c\x1e",
                         "made up " * 20)


def as_other_tool(rng: random.Random, doc: dict) -> None:
    """Complete events (all, or a share) without their Kineto category (None: the key removed), as
    in a Chrome trace of another tool."""
    share = rng.choice((1.0, rng.uniform(0.05, 0.95)))
    for e in _events(doc):
        if isinstance(e, dict) and e.get("ph") == "X" and rng.random() < share:
            cat = rng.choice(OTHER_TOOL_CATEGORIES)
            if cat is None:
                e.pop("cat", None)
            else:
                e["cat"] = cat


def second_rank(rng: random.Random, doc: dict) -> dict:
    """A copy of `doc` as another rank of the same job (shifted in time), for the multi-rank analyses."""
    other = copy.deepcopy(doc)
    info = other.get("distributedInfo") if isinstance(other.get("distributedInfo"), dict) else {}
    rank = info.get("rank", 0) if isinstance(info.get("rank"), int) else 0
    other["distributedInfo"] = {**info, "rank": rank + 1, "world_size": max(2, rank + 2)}
    shift = rng.uniform(-50.0, 50.0)
    for e in _events(other):
        if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) and not isinstance(e.get("ts"), bool):
            e["ts"] = e["ts"] + shift
    return other


# ---- one case ------------------------------------------------------------------------------------

@dataclass
class Case:
    seed: int
    source: str
    mutations: list
    payloads: list  # bytes, one per rank
    compare: Optional[tuple[str, bytes]] = None  # (name, JSON) of a trace to diff against
    saved_flip: Optional[int] = None  # save the loaded Trace (Parquet), overwrite bytes by this seed, reopen

    def describe(self) -> str:
        diff = f", diffed against {self.compare[0]}" if self.compare else ""
        return f"seed {self.seed}: {self.source} with {', '.join(self.mutations) or 'no mutation'}{diff}"


def draw(seed: int, docs: dict[str, dict]) -> Case:
    """The case of one seed: a trace, 1-4 mutations, maybe a second rank, maybe byte damage, maybe
    a real trace to diff it against and another job's trace as one more rank, then maybe the ranks
    packed into an archive and a saved-folder damage (each later draw added after the earlier
    ones, so the earlier draws of a seed never change)."""
    rng = random.Random(seed)
    name = rng.choice(sorted(docs))
    doc = copy.deepcopy(docs[name])
    names = [rng.choice(sorted(MUTATORS)) for _ in range(rng.randint(1, 4))]
    for m in names:
        MUTATORS[m](rng, doc)
    ranks = [doc]
    if rng.random() < 0.25:
        ranks.append(second_rank(rng, doc))
        names.append("second_rank")
    epoch = random.Random(f"epoch {seed}")  # its own draws: the main generator's stay as they were
    if epoch.random() < 0.2:
        for d in ranks:
            to_epoch(epoch, d)
        names.append("epoch_ns_clock")
    other_tool = random.Random(f"other tool {seed}")  # its own draws too
    if other_tool.random() < 0.1:
        for d in ranks:
            as_other_tool(other_tool, d)
        names.append("other_tool_categories")
    payloads = [dumps(d) for d in ranks]
    if rng.random() < 0.1:
        payloads[0] = corrupt_bytes(rng, payloads[0])
        names.append("bytes")
    elif rng.random() < 0.3:
        payloads = [gzip.compress(p, compresslevel=1) for p in payloads]
        names.append("gzip")
    compare = None
    if rng.random() < 0.2:
        other = rng.choice(sorted(docs))
        compare = (other, json.dumps(docs[other]).encode())
    if rng.random() < 0.1 and "bytes" not in names:  # a rank from another job: other device, clock, ops
        other = rng.choice(sorted(docs))
        foreign = copy.deepcopy(docs[other])
        foreign["distributedInfo"] = {"rank": len(payloads) + rng.randint(0, 3), "world_size": 8}
        payloads.append(json.dumps(foreign).encode())
        names.append(f"foreign_rank({other})")
    if compare is not None and rng.random() < 0.5:  # the trace diffed against is damaged too
        doc2 = json.loads(compare[1])
        how = rng.choice(sorted(MUTATORS))
        MUTATORS[how](rng, doc2)
        compare = (f"{compare[0]} ({how})", json.dumps(doc2).encode())
    if rng.random() < 0.1 and "bytes" not in names:  # drawn last too: the ranks as members of one archive
        kind = rng.choice(sorted(ARCHIVES))
        payloads = [ARCHIVES[kind](rng, payloads)]
        names.append(kind)
    saved_flip = rng.randrange(2**31) if rng.random() < 0.1 else None  # drawn last of all
    if saved_flip is not None:
        names.append("saved_parquet_damaged")
    return Case(seed, name, names, payloads, compare, saved_flip)


def check(case: Case) -> tuple[str, Optional[str]]:
    """(outcome, problem): outcome "loaded" or "refused" (a TraceError); problem None when the
    contract holds, else one line saying how it broke."""
    from profiler.trace import TraceError, load_trace

    source = case.payloads[0] if len(case.payloads) == 1 else list(case.payloads)
    try:
        trace = load_trace(source, workers=1)
    except TraceError as exc:
        msg = str(exc)
        if "\n" in msg or len(msg) >= MAX_MESSAGE or not msg.strip():
            return "refused", f"TraceError message is not one short line: {msg[:200]!r}"
        return "refused", None
    except Exception as exc:  # noqa: BLE001 - the point: anything but TraceError is a bug
        return "raised", f"load_trace raised {type(exc).__name__}: {_where(exc)}"
    compare = None
    if case.compare:
        try:
            compare = load_trace(case.compare[1], workers=1)
        except TraceError:
            pass  # the damaged comparison trace was refused (its own contract): no diff this case
        except Exception as exc:  # noqa: BLE001
            return "raised", f"load_trace raised {type(exc).__name__} on the comparison trace: {_where(exc)}"
    problem = check_loaded(trace, compare)
    if problem is None and case.saved_flip is not None:
        problem = check_saved_damage(trace, case.saved_flip)
    return "loaded", problem


def check_saved_damage(trace, seed: int) -> Optional[str]:
    """The saved-folder contract (what the Load page's earlier captures and `analyze DIR` open):
    the Trace saved as Parquet, damaged by `flip_parquet_bytes(seed)`, reopens as one short
    FusionLensError line or as a Trace that passes check_loaded."""
    import tempfile

    from profiler.capture.artifacts import load_traces_or_saved, save_trace
    from profiler.errors import FusionLensError

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "trace"
        try:
            save_trace(trace, folder)
        except Exception as exc:  # noqa: BLE001
            return f"save_trace raised {type(exc).__name__}: {_where(exc)}"
        flip_parquet_bytes(folder, seed)
        try:
            reopened = load_traces_or_saved([str(folder)])
        except FusionLensError as exc:
            msg = str(exc)
            return None if "\n" not in msg and 0 < len(msg) < MAX_MESSAGE else f"saved folder: not one short line: {msg[:200]!r}"
        except Exception as exc:  # noqa: BLE001
            return f"the damaged saved folder raised {type(exc).__name__}: {_where(exc)}"
        problem = check_loaded(reopened)
        return None if problem is None else f"the damaged saved folder: {problem}"


def check_loaded(trace, compare=None) -> Optional[str]:
    """The contract for a Trace that loaded (also used for saved Trace folders): None when the Load
    page's summary and every analysis run on it without error into strict JSON, else one line."""
    from pages import load_view as lv
    from profiler.analysis.report_json import build_report
    from profiler.trace.summary import summarize

    try:  # what the Load page shows of a trace, through the same pure helpers
        summary = summarize(trace)
        lv.fmt_duration_us(summary["kernel_total_us"]), lv.fmt_duration_us(summary["span_us"])
        lv.clock_warning(trace), lv.rank_frame(trace), lv.identity_line(trace.meta), lv.top_kernels(trace, 15)
    except Exception as exc:  # noqa: BLE001
        return f"the Load page's summary raised {type(exc).__name__}: {_where(exc)}"
    try:
        report = build_report(trace, compare=compare)
    except Exception as exc:  # noqa: BLE001
        return f"build_report raised {type(exc).__name__}: {_where(exc)}"
    if report["errors"]:
        name, err = next(iter(report["errors"].items()))
        return f"analysis {name} failed: {err[:200]}" + (f" (+{len(report['errors']) - 1} more)" if len(report["errors"]) > 1 else "")
    try:
        json.dumps(report, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"report is not strict JSON: {exc}"
    return None


def _where(exc: BaseException) -> str:
    """The message and the innermost project frame, in one line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/profiler/" in f.filename or "/pages/" in f.filename]
    at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{str(exc)[:200]}{at}".replace("\n", " ")


def run(seed: int, cases: Optional[int], seconds: float, log: Callable[[str], None] = print,
        max_bytes: int = MAX_CORPUS_BYTES) -> dict[str, Any]:
    """Cases seed, seed + 1, ... until `cases` ran or `seconds` passed."""
    docs = corpus(max_bytes)
    start = time.perf_counter()
    failures, n, outcomes = [], 0, {}
    while (cases is None or n < cases) and time.perf_counter() - start < seconds:
        case = draw(seed + n, docs)
        n += 1
        outcome, problem = check(case)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if problem:
            failures.append((case, problem))
            log(f"FAIL {case.describe()}: {problem}")
    return {"cases": n, "failures": failures, "seconds": time.perf_counter() - start, "outcomes": outcomes}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="first case's seed (default: from the clock)")
    ap.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    ap.add_argument("--seconds", type=float, default=300.0, help="stop after this long (default 300)")
    ap.add_argument("--max-bytes", type=int, default=MAX_CORPUS_BYTES,
                    help=f"corpus: the traces of at most this many bytes, gzipped (default {MAX_CORPUS_BYTES}; "
                         "2000000 takes all of tests/data/traces, at several seconds a case)")
    ap.add_argument("--show", action="store_true", help="write the first case's payloads to ./fuzz_case_*.json")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) * 1000
    print(f"fuzz_ingest: seed {seed}; corpus: {', '.join(corpus(args.max_bytes))}", flush=True)
    if args.show:
        case = draw(seed, corpus(args.max_bytes))
        for i, p in enumerate(case.payloads):
            Path(f"fuzz_case_{i}.json").write_bytes(p)
        print(case.describe())
    out = run(seed, args.cases, args.seconds, log=lambda s: print(s, flush=True), max_bytes=args.max_bytes)
    seen = ", ".join(f"{k} {v}" for k, v in sorted(out["outcomes"].items()))
    print(f"fuzz_ingest: {out['cases']} cases in {out['seconds']:.0f} s ({seen}); {len(out['failures'])} failed")
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""A saved Trace folder (Parquet + meta.json, what `capture` writes and the Load page and `analyze`
reopen) that was damaged or edited by hand: one TraceError line, or a Trace every analysis reads
(the contract of tests/profiler/trace/fuzz_ingest.py, applied to the Parquet path)."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from profiler.capture.artifacts import save_trace
from profiler.trace import load_trace
from tests.profiler.capture.damage import open_damaged
from tests.profiler.trace.conftest import trace_named
from tests.profiler.trace.fuzz_damage import flip_parquet_bytes


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved") / "trace"
    save_trace(load_trace(trace_named("tracelens_h100_bert_small")), folder)
    return folder


def _edit_events(fn):
    def damage(folder):
        path = folder / "events.parquet"
        df = pd.read_parquet(path)
        fn(df).to_parquet(path)
    return damage


def _set(column, value):
    def fn(df):
        df[column] = pd.Series([value] * len(df), dtype=object).astype(type(value)) if value is not None else None
        return df
    return fn


DAMAGES = {
    "truncated events": lambda f: (f / "events.parquet").write_bytes((f / "events.parquet").read_bytes()[:100]),
    "memory table gone": lambda f: (f / "memory.parquet").unlink(),
    "meta not JSON": lambda f: (f / "meta.json").write_text("{not json"),
    "meta a list": lambda f: (f / "meta.json").write_text("[1, 2]"),
    "meta null": lambda f: (f / "meta.json").write_text("null"),
    "meta fields of the wrong type": lambda f: (f / "meta.json").write_text(json.dumps(
        {"t0_us": "x", "sources": 5, "per_rank": [1], "device_properties": {"a": 1}, "skipped_events": "many"})),
    "ts as text": _edit_events(_set("ts_us", "abc")),
    "dur all missing": _edit_events(_set("dur_us", None)),
    "unknown kind": _edit_events(_set("kind", "bogus")),
    "rank as text": _edit_events(_set("rank", "zero")),
    "a column gone": _edit_events(lambda df: df.drop(columns=["correlation"])),
    "no rows": _edit_events(lambda df: df.iloc[:0]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_saved_trace_is_one_line_or_readable(saved, tmp_path, damage):
    folder = tmp_path / "trace"
    shutil.copytree(saved, folder)
    DAMAGES[damage](folder)
    open_damaged(folder)


# Seeds whose flips escaped load_saved_trace as pyarrow's ArrowNotImplementedError (225, 257),
# ArrowIndexError (238, 1048), pandas' KeyError 'pandas_type' (740, 1087) and TypeError
# (873, 2149) before it caught them (a byte-flip fuzz of 6,000 seeds, pyarrow as pinned,
# 2026-12-04), and a stretch of ordinary ones.
FLIP_SEEDS = [225, 257, 238, 1048, 740, 1087, 873, 2149, *range(20)]


def test_flipped_parquet_bytes_are_one_line_or_readable(saved, tmp_path):
    outcomes = []
    for seed in FLIP_SEEDS:
        folder = tmp_path / f"trace{seed}"
        shutil.copytree(saved, folder)
        flip_parquet_bytes(folder, seed)
        msg, _ = open_damaged(folder)
        outcomes.append("loaded" if msg is None else "refused")
    assert outcomes.count("refused") >= 8  # the eight listed seeds at least

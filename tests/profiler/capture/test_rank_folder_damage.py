"""A folder of per-rank captures (what `capture_this_rank` leaves under torchrun: Kineto JSON and
op costs per rank), opened from a typed path or `analyze DIR`, when a file in it is damaged,
renamed or replaced: one line (CaptureError), or a Trace every analysis reads. Damaged Parquet used
to escape as pyarrow's ArrowInvalid, pandas' KeyError and more, and a trace named
kineto_rankX.pt.trace.json as int()'s ValueError."""
from __future__ import annotations

import random
import shutil

import pandas as pd
import pytest

from profiler.capture.artifacts import is_rank_folder, load_traces_or_saved
from profiler.capture.backends import CapturePlan
from tests.profiler.capture.damage import open_damaged


@pytest.fixture(scope="module")
def rank_folder(tmp_path_factory):
    """One rank's Kineto JSON and op costs from a real capture (mlp tiny, training), alone in a folder."""
    from profiler.capture.runner import capture

    out = tmp_path_factory.mktemp("cap")
    capture("mlp", CapturePlan(mode="train", wait=0, warmup=0, active=1), out, size="tiny")
    folder = tmp_path_factory.mktemp("ranks")
    for name in ("kineto_rank0.pt.trace.json", "op_costs_rank0.parquet"):
        shutil.copy(out / name, folder / name)
    assert is_rank_folder(folder)
    return folder


def _flip(seed: int):
    def damage(folder):
        rng = random.Random(seed)
        path = folder / "op_costs_rank0.parquet"
        data = bytearray(path.read_bytes())
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
    return damage


def _costs(edit):
    def damage(folder):
        path = folder / "op_costs_rank0.parquet"
        edit(pd.read_parquet(path)).to_parquet(path)
    return damage


def _as_text(df):
    df["flops"] = "x"
    return df


DAMAGES = {
    "costs truncated": lambda f: (f / "op_costs_rank0.parquet").write_bytes((f / "op_costs_rank0.parquet").read_bytes()[:200]),
    "costs not parquet": lambda f: (f / "op_costs_rank0.parquet").write_text("hello"),
    "costs another table": lambda f: pd.DataFrame({"a": [1, 2]}).to_parquet(f / "op_costs_rank0.parquet"),
    "costs flops as text": _costs(_as_text),
    "costs no rows": _costs(lambda df: df.iloc[:0]),
    "a trace not named by its rank": lambda f: shutil.copy(f / "kineto_rank0.pt.trace.json", f / "kineto_rankX.pt.trace.json"),
    **{f"costs bytes flipped ({seed})": _flip(seed) for seed in range(6)},
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_rank_folder_is_one_line_or_readable(rank_folder, tmp_path, damage):
    folder = tmp_path / "ranks"
    shutil.copytree(rank_folder, folder)
    DAMAGES[damage](folder)
    msg, trace = open_damaged(folder)
    if msg is not None:
        assert "op_costs_rank0.parquet" in msg, msg
    else:
        assert sorted(trace.events["rank"].dropna().unique().tolist()) == [0]


def test_an_intact_rank_folder_joins_its_costs(rank_folder):
    trace = load_traces_or_saved([str(rank_folder)])
    assert trace.meta["capture"]["join_per_rank"][0]["match_rate"] == 1.0
    assert trace.events["flops"].sum() > 0

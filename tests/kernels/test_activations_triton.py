"""Triton activation launch geometry: every BLOCK_M x BLOCK_N tile is numbered on grid axis 0.

A 2-D grid with column tiles on axis 1 fails to launch on CUDA once N > 65535 * BLOCK_N (16.7M
columns, e.g. gelu on a large 1-D tensor), because CUDA caps grid axes 1 and 2 at 65535. The
interpreter does not enforce that cap, so the limit is checked on the grid itself, and the tile
numbering (row-major over several row AND column tiles, partial tiles at both edges) is checked
against the float64 truth under the interpreter.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")

CUDA_GRID_AXIS0_MAX = 2**31 - 1


@pytest.mark.parametrize("m,n", [(1, 1), (16384, 4096), (1, 20_000_000), (3, 2**28), (2**20, 8)])
def test_grid_is_one_axis_with_one_program_per_tile(m: int, n: int) -> None:
    from kernels import triton_activations as ta

    grid = ta._grid(m, n)
    tiles_m, tiles_n = -(-m // ta.BLOCK_M), -(-n // ta.BLOCK_N)
    assert grid == (tiles_m * tiles_n,)  # one axis: axes 1/2 (65535 max) are never used
    assert grid[0] <= CUDA_GRID_AXIS0_MAX


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled Triton is checked at real sizes")
def test_several_row_and_column_tiles_match_float64_interpreted() -> None:
    from tests.kernels.numerics import run_in_triton_interpreter

    # (40, 600): 3 x 3 tiles of 16 x 256, partial at the bottom and right edges; the bias gradient
    # sums partials of 3 row tiles.
    out = run_in_triton_interpreter(
        "import torch\n"
        "from tests.kernels.test_activations import check, inputs\n"
        "n = 0\n"
        "for case in ('bias_gelu', 'bias_gelu_tanh', 'gelu', 'swiglu'):\n"
        "    for dtype in (torch.float32, torch.bfloat16):\n"
        "        check(case, 'triton', inputs(case, (40, 600), dtype), dtype)\n"
        "        n += 1\n"
        "print(n)\n")
    assert int(out.strip().splitlines()[-1]) == 8

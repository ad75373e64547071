"""Triton norm kernels under the CPU interpreter (TRITON_INTERPRET=1, in a subprocess so the flag
never leaks into this process): tiny shapes, fp32/bf16/fp16, non-contiguous, NaN/Inf, forward and
backward vs float64. Cases are grouped to pay the subprocess start (torch import) three times."""
from __future__ import annotations

import importlib.util

import pytest

from tests.kernels.norm_cases import CASES
from tests.kernels.numerics import run_in_triton_interpreter

import torch

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed"),
    # on a GPU machine test_norms_cuda.py runs the same kernels compiled, at real sizes
    pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled tests cover Triton"),
]

GROUPS = {
    "layer_norm": [c for c in CASES if c.startswith("layer_norm")],
    "rms_norm": [c for c in CASES if c.startswith("rms_norm")],
    "add_norms": [c for c in CASES if c.startswith("add_")],
}


def test_groups_cover_every_case() -> None:
    assert sorted(c for g in GROUPS.values() for c in g) == sorted(CASES)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_triton_norms_interpreted(group: str) -> None:
    names = GROUPS[group]
    out = run_in_triton_interpreter(
        "from tests.kernels.norm_cases import run_interpreted\n"
        f"for name in {names!r}: print(name, run_interpreted(name))")
    counts = dict(line.split() for line in out.strip().splitlines())
    assert sorted(counts) == sorted(names)
    assert all(int(v) >= 14 for v in counts.values())


def test_triton_norms_second_derivatives_interpreted() -> None:
    """create_graph=True on the triton road (Python Function, interpreted kernels forward, the
    reference's grads with a graph) against float64, every norm, weight included."""
    out = run_in_triton_interpreter(
        "import torch\n"
        "from tests.kernels.test_double_backward import NORMS, _awkward, _close_to, _gen, _hvp_with_weight\n"
        "for name in sorted(NORMS):\n"
        "    x, w = _awkward((9, 24), torch.float32, 'transposed'), torch.rand(24, generator=_gen(2)) + 0.5\n"
        "    got = _hvp_with_weight(lambda a, b: NORMS[name](a, b, 'triton'), x, w)\n"
        "    want = _hvp_with_weight(lambda a, b: NORMS[name](a, b, 'reference'), x.double(), w.double())\n"
        "    _close_to(got, want, 1e-5)\n"
        "    print(name)\n")
    from tests.kernels.test_double_backward import NORMS
    assert sorted(line.split()[0] for line in out.strip().splitlines()) == sorted(NORMS)


def test_triton_layer_norm_keeps_the_mean_in_two_parts_interpreted() -> None:
    """As test_norms_accuracy.py's cpu test: y, dx, dw within 0.1x eager's error at a large common offset
    (a mean rounded into one float gave 0.3-2.7x)."""
    out = run_in_triton_interpreter(
        "from tests.kernels.norm_cases import OFFSET_CASES, offset_error_ratios\n"
        "for shape, shift in OFFSET_CASES[:2]:\n"
        "    print(max(offset_error_ratios('triton', shape, shift, seeds=3)))\n")
    ratios = [float(v) for v in out.split()]
    assert len(ratios) == 2 and max(ratios) <= 0.1, ratios

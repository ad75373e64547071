"""Rotate-half RoPE on q and k: the cpu provider vs the float64 truth (forward and backward),
judged by eager's own error; HF cos/sin layouts, grouped-query heads, the transposed q/k view HF
attention makes, odd sizes, NaN/Inf, zero-size, poisoned outputs; provider fallbacks, costs,
module; Triton under the interpreter (subprocess)."""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import kernels
from kernels.registry import KERNELS, select_provider
from tests.kernels.numerics import (DTYPES, bits, check_against_reference, fwd_bwd, make,
                                    run_in_triton_interpreter, with_nonfinite)
rp = importlib.import_module("kernels.rope")  # the module; `kernels.rope` is the function


def tables(seq: int, dim: int, dtype, batch: int | None = None, offset: int = 0):
    """HF-style cos/sin: emb = cat(freqs, freqs) for positions offset..offset+seq (per batch)."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    pos = torch.arange(seq, dtype=torch.float64)
    if batch is not None:
        pos = pos[None] + torch.arange(batch, dtype=torch.float64)[:, None] * 3 + offset  # [B, S]
    freqs = pos[..., None] * inv  # [..., S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., S, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def qk(batch: int, hq: int, hk: int, seq: int, dim: int, dtype, transposed: bool = False):
    """q [B, Hq, S, D], k [B, Hk, S, D]; transposed=True gives HF's view(B, S, H, D).transpose(1, 2)."""
    if transposed:
        q = make((batch, seq, hq, dim), dtype, seed=1).transpose(1, 2)
        k = make((batch, seq, hk, dim), dtype, seed=2).transpose(1, 2)
        return q, k
    return make((batch, hq, seq, dim), dtype, seed=1), make((batch, hk, seq, dim), dtype, seed=2)


def check(provider: str, q, k, cos, sin, dtype, backward: bool = True) -> None:
    # cos/sin are constants (passed by closure: no gradient is asked of them)
    check_against_reference(lambda q, k: kernels.rope(q, k, cos, sin, provider=provider),
                            lambda q, k: rp.rope_reference(q, k, cos.to(q.dtype), sin.to(q.dtype)),
                            [q, k], dtype, backward=backward)


SHAPES = [  # (batch, heads_q, heads_k, seq, head_dim)
    (1, 1, 1, 1, 2), (2, 3, 3, 5, 8), (1, 4, 2, 17, 64), (2, 2, 1, 3, 4098), (3, 1, 1, 129, 128),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["shared", "per_batch", "per_batch_4d"])
def test_matches_float64(shape, layout: str, dtype) -> None:
    b, hq, hk, s, d = shape
    q, k = qk(b, hq, hk, s, d, dtype)
    cos, sin = tables(s, d, dtype, batch=None if layout == "shared" else b)
    if layout == "per_batch_4d":
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    check("cpu", q, k, cos, sin, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hf_transposed_view_is_read_in_place(dtype) -> None:
    q, k = qk(2, 4, 2, 9, 32, dtype, transposed=True)
    assert not q.is_contiguous()
    cos, sin = tables(9, 32, dtype, batch=2, offset=100)
    check("cpu", q, k, cos, sin, dtype)


def test_outputs_take_the_layout_eager_gives() -> None:
    """HF's transposed q/k: eager's q * cos + rotate_half(q) * sin comes out in q's memory layout
    ([B, S, H, D] in memory); ours too (both walk it in memory order), forward and backward."""
    q, k = qk(2, 4, 2, 9, 32, torch.float32, transposed=True)
    cos, sin = tables(9, 32, torch.float32, batch=2)
    eager = rp.rope_reference(q, k, cos, sin)
    ours = kernels.rope(q, k, cos, sin, provider="cpu")
    for o, e, x in zip(ours, eager, (q, k)):
        assert o.stride() == e.stride() == x.stride()
        torch.testing.assert_close(o, e)
    g = make(q.shape, torch.float32, seed=5).transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] memory
    gq = rp._rotate(rp._ops("cpu"), g, rp._table(cos), rp._table(sin), True)
    assert gq.stride() == g.stride()
    plain = kernels.rope(q.contiguous(), k.contiguous(), cos, sin, provider="cpu")
    assert all(t.is_contiguous() for t in plain)


def test_slices_of_a_fused_qkv_projection() -> None:
    """q, k as slices of one [B, S, 3, H, D] projection (not dense): the output is dense, in the
    slice's dimension order, and right."""
    qkv = make((2, 7, 3, 4, 16), torch.float32, seed=3)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    cos, sin = tables(7, 16, torch.float32)
    oq, ok = kernels.rope(q, k, cos, sin, provider="cpu")
    assert oq.stride() == (7 * 4 * 16, 16, 4 * 16, 1)
    check("cpu", q, k, cos, sin, torch.float32)


@pytest.mark.parametrize("expand_dim", [0, 1, 2])
def test_expanded_inputs_with_stride_0_dims(expand_dim: int) -> None:
    """q, k broadcast by expand (one sequence over the batch, one head over the heads, one position
    over the sequence): outputs are contiguous (were refused by the C++ check:
    the stride-0 dim was taken as the innermost), and grads reach the unexpanded source."""
    shape = [2, 3, 5, 16]
    src = [make([1 if i == expand_dim else n for i, n in enumerate(shape)], torch.float32, seed=s)
           for s in (1, 2)]
    cos, sin = tables(5, 16, torch.float32)
    # the expand is part of the function, so the grads are the source's (a stride-0 leaf cannot be copied into)
    check_against_reference(lambda a, b: kernels.rope(a.expand(*shape), b.expand(*shape), cos, sin, provider="cpu"),
                            lambda a, b: rp.rope_reference(a.expand(*shape), b.expand(*shape), cos, sin),
                            src, torch.float32)
    oq, ok = kernels.rope(*(t.expand(*shape) for t in src), cos, sin, provider="cpu")
    assert oq.is_contiguous() and ok.is_contiguous()  # as eager's q * cos is


def test_strided_last_dim_and_batch_one_tables() -> None:
    q = make((2, 3, 5, 16), torch.float32, seed=1, layout="strided")
    k = make((2, 3, 5, 16), torch.float32, seed=2)
    cos, sin = tables(5, 16, torch.float32, batch=1)
    check("cpu", q, k, cos, sin, torch.float32)


def test_matches_hf_rotation_semantics() -> None:
    # one 2-D rotation per pair (j, j + D/2) by angle pos * inv_freq[j]: x1' = x1 c - x2 s
    q = torch.zeros(1, 1, 2, 4)
    q[0, 0, :, 0] = 1.0  # x1 of pair 0 = 1, x2 = 0
    cos, sin = tables(2, 4, torch.float32)
    out, _ = kernels.rope(q, q, cos, sin, provider="cpu")
    assert torch.allclose(out[0, 0, 1, 0], torch.tensor(math.cos(1.0)))
    assert torch.allclose(out[0, 0, 1, 2], torch.tensor(math.sin(1.0)))


def test_nan_inf_propagate_like_reference() -> None:
    q, k = qk(1, 2, 2, 4, 8, torch.float32)
    q = with_nonfinite(q)
    cos, sin = tables(4, 8, torch.float32)
    check("cpu", q, k, cos, sin, torch.float32)


@pytest.mark.parametrize("nan_bits", [0x7FFFFFFF, 0xFFC00001, 0x7F800001], ids=hex)
@pytest.mark.parametrize("heads_inner", [False, True], ids=["rows_bhs", "rows_bsh"])
def test_bf16_rows_keep_fp32_table_nans(nan_bits: int, heads_inner: bool) -> None:
    """The op called directly with fp32 tables holding NaNs with low payload bits (kernels.rope's
    own tables come from bf16 and have none): bf16 rows are rotated by 32-bit words and rounded
    without a NaN select, so the tables' NaNs are made ones the rounding cannot carry out of
    (0x7FFFFFFF + 0x7FFF would wrap to -0). Every NaN stays NaN; the rest match the fp32 math."""
    x = make((2, 3, 5, 16), torch.bfloat16, seed=4)
    if heads_inner:  # HF's transposed view: rows walked (b, s, h)
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    cos, sin = (t.float().unsqueeze(0).expand(2, 5, 16).contiguous() for t in tables(5, 16, torch.float32))
    nan = torch.tensor([nan_bits], dtype=torch.int64).to(torch.int32).view(torch.float32)
    cos[0, 1, 3], sin[1, 4, 10], cos[1, 2, 8], sin[0, 0, 0] = nan, nan, nan, nan
    out = torch.full_like(x, 7.0)
    rp._ops("cpu").rope_apply(x, cos, sin, out, False)
    want = rp.rope_reference(x.double(), x.double(), cos.double().unsqueeze(1), sin.double().unsqueeze(1))[0]
    assert torch.equal(out.isnan(), want.isnan()) and want.isnan().sum() >= 4 * 3
    finite = ~want.isnan()
    torch.testing.assert_close(out.double()[finite], want.to(torch.bfloat16).double()[finite], rtol=8e-3, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 2, 3, 8), (1, 2, 0, 8), (1, 2, 3, 0)], ids=str)
def test_zero_size(shape) -> None:
    q = torch.randn(shape)
    cos, sin = tables(shape[2], shape[3], torch.float32)
    check("cpu", q, q.clone(), cos, sin, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 2), (2, 4, 2, 17, 64)], ids=str)
def test_mixed_dtypes_promote_like_eager(shape, dtype) -> None:
    """fp32 tables on bf16/fp16 q and k give fp32 outputs (eager's promotion), fused; and
    low-precision tables on fp32 q and k keep fp32."""
    b, hq, hk, s, d = shape
    q, k = qk(b, hq, hk, s, d, dtype)
    cos, sin = tables(s, d, torch.float32)
    check_against_reference(lambda q, k: kernels.rope(q, k, cos, sin, provider="cpu"),
                            lambda q, k: rp.rope_reference(q, k, cos, sin), [q, k], dtype)
    assert kernels.rope(q, k, cos, sin, provider="cpu")[0].dtype == torch.float32
    assert select_provider(KERNELS["rope"], (q, k, cos, sin), {}) == ("cpu", {})
    q32, k32 = qk(b, hq, hk, s, d, torch.float32)
    c16, s16 = tables(s, d, dtype)
    check_against_reference(lambda q, k: kernels.rope(q, k, c16, s16, provider="cpu"),
                            lambda q, k: rp.rope_reference(q, k, c16, s16), [q32, k32], torch.float32)


def test_fallbacks_keep_reasons() -> None:
    q, k = qk(1, 2, 2, 4, 8, torch.float32)
    cos, sin = tables(4, 8, torch.float32)
    spec = KERNELS["rope"]
    assert select_provider(spec, (q, k, cos, sin), {})[0] == "cpu"
    for args, why in [((q, k, cos.double(), sin.double()), "only the reference runs float64"),
                      ((q[..., :7], k[..., :7], cos[:, :7], sin[:, :7]), "odd"),
                      ((q, k, cos[:3], sin[:3]), "is not [seq, dim]"),
                      ((q[0], k[0], cos, sin), "must be [batch, heads, seq, head_dim]")]:
        chosen, skipped = select_provider(spec, args, {})
        assert chosen == "reference" and why in skipped["cpu"], skipped
    # learned tables: only the reference differentiates them
    c = cos.clone().requires_grad_()
    chosen, skipped = select_provider(spec, (q, k, c, sin), {})
    assert chosen == "reference" and "require grad" in skipped["cpu"]
    qo, _ = kernels.rope(q, k, c, sin)
    qo.sum().backward()
    assert c.grad is not None


def test_cost_and_module() -> None:
    q, k = qk(4, 12, 12, 512, 64, torch.float32)
    cos, sin = tables(512, 64, torch.float32)
    c = KERNELS["rope"].cost(q, k, cos, sin)
    n = 2 * q.numel() * 4
    # cos and sin are read once for q and once for k, fused and eager alike
    assert c.bytes_fused == 2 * n + 4 * cos.numel() * 4 and c.bytes_saved == 8 * n
    qo, ko = rp.RotaryEmbedding()(q, k, cos, sin)
    rq, rk = rp.rope_reference(q, k, cos, sin)
    torch.testing.assert_close(qo, rq)
    torch.testing.assert_close(ko, rk)


def run_interpreted() -> int:
    """The same through the Triton provider at tiny sizes (run with TRITON_INTERPRET=1)."""
    count = 0
    for dtype in DTYPES:
        for b, hq, hk, s, d in [(1, 1, 1, 1, 2), (2, 3, 1, 5, 8), (1, 2, 2, 3, 6)]:
            q, k = qk(b, hq, hk, s, d, dtype)
            check("triton", q, k, *tables(s, d, dtype), dtype)
            check("triton", q, k, *tables(s, d, dtype, batch=b), dtype)
            count += 2
    q, k = qk(2, 4, 2, 3, 8, torch.float32, transposed=True)
    check("triton", q, k, *tables(3, 8, torch.float32, batch=2), torch.float32)
    assert kernels.rope(q, k, *tables(3, 8, torch.float32), provider="triton")[0].stride() == q.stride()
    check("triton", with_nonfinite(q), k, *tables(3, 8, torch.float32), torch.float32)
    check("triton", torch.randn(0, 2, 3, 8), torch.randn(0, 2, 3, 8), *tables(3, 8, torch.float32),
          torch.float32)
    q, k = qk(1, 2, 1, 3, 8, torch.bfloat16)  # fp32 tables promote: fp32 outputs
    cos, sin = tables(3, 8, torch.float32)
    check_against_reference(lambda q, k: kernels.rope(q, k, cos, sin, provider="triton"),
                            lambda q, k: rp.rope_reference(q, k, cos, sin), [q, k], torch.bfloat16)
    q, k = make((2, 3, 4, 8), torch.float32, seed=1), make((2, 3, 2, 8), torch.float32, seed=2)  # seq-first
    cos, sin = (t.unsqueeze(2) for t in tables(3, 8, torch.float32, batch=2))
    check("triton", q, k, cos, sin, torch.float32)
    assert kernels.rope(q, k, cos, sin, provider="triton")[0].is_contiguous()
    return count + 5


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled Triton is checked at real sizes by test_cuda_*")
def test_triton_interpreted() -> None:
    out = run_in_triton_interpreter("from tests.kernels.test_rope import run_interpreted\nprint(run_interpreted())")
    assert int(out.strip().splitlines()[-1]) == 3 * 6 + 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_cuda_triton_rope_real_sizes() -> None:
    from benchmarks.kernels.rope import gpu_checks

    for _, check in gpu_checks("cuda"):
        check()


ISA_ORDER = ["base", "avx2", "avx512"]


@pytest.mark.parametrize("isa", ["avx512", "avx2", "base"])
def test_every_instruction_set_copy_matches_float64(isa: str, monkeypatch) -> None:
    """rope.cpp compiles its row loop once per instruction set, picked at run time;
    FUSIONLENS_CPU_ISA lowers the pick, so every copy this CPU can run is checked here. Half head
    dims of 17, 41 and 2049 leave tails after every vector width (4, 8, 16 floats) and after the
    8-wide fp16 conversions; fp16 runs the F16C path in the AVX2/AVX-512 copies."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    kernels.rope(*qk(1, 1, 1, 1, 2, torch.float32), *tables(1, 2, torch.float32), provider="cpu")
    assert ISA_ORDER.index(torch.ops.fusionlens.rope_isa()) <= ISA_ORDER.index(isa)
    for dtype in DTYPES:
        for b, hq, hk, s, d in [(2, 3, 1, 5, 34), (1, 2, 2, 3, 82), (1, 1, 1, 2, 4098)]:
            q, k = qk(b, hq, hk, s, d, dtype, transposed=True)
            check("cpu", q, k, *tables(s, d, dtype, batch=b), dtype)
    q, k = qk(1, 2, 2, 3, 34, torch.float32)
    check("cpu", with_nonfinite(q), k, *tables(3, 34, torch.float32), torch.float32)


def test_avx512_and_avx2_copies_agree_bit_for_bit(monkeypatch) -> None:
    """Rotation is elementwise: both vector copies contract the same multiply-adds, so q, k and
    their gradients are the same bits (NaN as NaN) in every dtype; the base copy has no FMA."""
    kernels.rope(*qk(1, 1, 1, 1, 2, torch.float32), *tables(1, 2, torch.float32), provider="cpu")
    if torch.ops.fusionlens.rope_isa() != "avx512":
        pytest.skip("this CPU has no AVX-512: only one vector copy runs here")
    for dtype in DTYPES:
        for b, hq, hk, s, d in [(2, 3, 1, 5, 34), (1, 2, 2, 3, 82), (1, 1, 1, 2, 4098)]:
            q, k = qk(b, hq, hk, s, d, dtype, transposed=True)
            q = with_nonfinite(q)
            cos, sin = tables(s, d, dtype, batch=b)
            got = {}
            for isa in ("avx512", "avx2"):
                monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
                got[isa] = fwd_bwd(lambda q, k: kernels.rope(q, k, cos, sin, provider="cpu"), [q, k])
            for i, (a, c) in enumerate(zip(got["avx512"], got["avx2"])):
                assert torch.equal(bits(a), bits(c)), (dtype, (b, hq, hk, s, d), i)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 4, 2, 17, 64), (1, 3, 3, 1, 8), (2, 2, 1, 5, 4098)], ids=str)
@pytest.mark.parametrize("batch_tables", [True, False], ids=["per_batch", "shared"])
def test_seq_first_layout(shape, batch_tables: bool, dtype) -> None:
    """q [B, S, H, D] with cos/sin [B or 1, S, 1, D] (HF's unsqueeze_dim=2): the reference ran
    before; now the kernels on transposed views, outputs contiguous in that layout as eager's
    (decode steps, seq 1, included)."""
    b, hq, hk, s, d = shape
    q, k = make((b, s, hq, d), dtype, seed=1), make((b, s, hk, d), dtype, seed=2)
    cos, sin = tables(s, d, dtype, batch=b if batch_tables else None)
    cos, sin = (t.unsqueeze(2) if batch_tables else t[None, :, None] for t in (cos, sin))
    assert select_provider(KERNELS["rope"], (q, k, cos, sin), {}, "cpu")[0] == "cpu"
    check("cpu", q, k, cos, sin, dtype)
    q2, k2 = kernels.rope(q, k, cos, sin, provider="cpu")
    assert q2.shape == q.shape and q2.is_contiguous() and k2.is_contiguous()

"""FLOP and byte formulas against hand counts (independent arithmetic written in the test)."""
import math

import pytest
import torch
import torch.nn.functional as F

from profiler.capture import formulas
from profiler.capture.flops import costs_of


def only(df, name):
    rows = df[df["name"] == name]
    assert len(rows) == 1, df[["name", "flops", "bytes_moved"]]
    return rows.iloc[0]


def test_matmul_flops_and_bytes():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    row = only(costs_of(lambda: a @ b), "aten::mm")
    assert row.flops == 2 * 5 * 7 * 3
    assert row.bytes_moved == 4 * (5 * 7 + 7 * 3 + 5 * 3)


def test_addmm_and_linear_decomposition():
    x, lin = torch.randn(4, 6), torch.nn.Linear(6, 10)
    df = costs_of(lambda: lin(x))
    assert only(df, "aten::addmm").flops == 2 * 4 * 6 * 10
    assert only(df, "aten::t").bytes_moved == 0  # a view moves nothing
    assert only(df, "aten::addmm").bytes_moved == 4 * (10 + 4 * 6 + 6 * 10 + 4 * 10)


def test_conv2d_flops():
    x, w = torch.randn(2, 3, 9, 9), torch.randn(8, 3, 3, 3)
    row = only(costs_of(lambda: F.conv2d(x, w, padding=1, stride=2)), "aten::convolution")
    h_out = (9 + 2 - 3) // 2 + 1
    assert row.flops == 2 * 2 * 8 * h_out * h_out * 3 * 3 * 3


def test_cpu_fused_attention_flops():
    b, h, l, d = 2, 3, 5, 4
    q, k, v = (torch.randn(b, h, l, d) for _ in range(3))
    df = costs_of(lambda: F.scaled_dot_product_attention(q, k, v))
    row = only(df, "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert row.flops == 2 * (2 * b * h * l * l * d)  # QK^T and PV, 2 FLOPs per MAC


def test_cpu_attention_backward_flops():
    b, h, l, d = 1, 2, 4, 8
    q, k, v = (torch.randn(b, h, l, d, requires_grad=True) for _ in range(3))
    df = costs_of(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward())
    row = only(df, "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert row.flops == 5 * (2 * b * h * l * l * d)


def test_layer_norm_flops():
    x = torch.randn(3, 4, 10)
    ln = torch.nn.LayerNorm(10)
    n, rows = 3 * 4 * 10, 3 * 4
    assert only(costs_of(lambda: ln(x)), "aten::native_layer_norm").flops == 7 * n + 2 * rows
    plain = costs_of(lambda: F.layer_norm(x, (10,)))
    assert only(plain, "aten::native_layer_norm").flops == 5 * n + 2 * rows


def test_softmax_and_log_softmax_flops():
    x = torch.randn(6, 11)
    assert only(costs_of(lambda: torch.softmax(x, -1)), "aten::_softmax").flops == 5 * 66
    assert only(costs_of(lambda: torch.log_softmax(x, -1)), "aten::_log_softmax").flops == 5 * 66


def test_elementwise_reduction_and_gelu_flops():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    assert only(costs_of(lambda: x + y), "aten::add").flops == 20
    assert only(costs_of(lambda: x.sum(-1)), "aten::sum").flops == 20
    assert only(costs_of(lambda: F.gelu(x, approximate="tanh")), "aten::gelu").flops == 8 * 20
    assert only(costs_of(lambda: F.gelu(x)), "aten::gelu").flops == 5 * 20
    assert only(costs_of(lambda: x.clone()), "aten::clone").flops == 0


def test_ops_with_their_own_kernel_are_recorded_whole():
    # aten::silu_backward has a CPU kernel (the profiler shows it as one op) and also a
    # CompositeImplicitAutograd decomposition; it once arrived as sigmoid/fill_/sub_/mul/add rows.
    x, g = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    df = costs_of(lambda: F.silu(x).backward(g))
    assert only(df, "aten::silu_backward").flops == 10 * 20
    assert only(df, "aten::silu_backward").bytes_moved == 4 * 3 * 20
    assert not df["name"].isin(["aten::sigmoid", "aten::sub", "aten::sub_"]).any(), df["name"].tolist()


def test_composites_decompose_as_aten_runs_them():
    # Under inference_mode composites reach the recorder whole and are decomposed with ATen's own
    # kernel: eval-mode dropout returns its input (torch._decomp's Python version clones it).
    x, lin = torch.randn(4, 6), torch.nn.Linear(6, 3)
    with torch.inference_mode():
        df = costs_of(lambda: lin(F.dropout(x, 0.1, training=False)))
    assert df["name"].tolist() == ["aten::t", "aten::addmm"]
    assert only(df, "aten::addmm").flops == 2 * 4 * 6 * 3


def test_cross_entropy_and_embedding():
    logits, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
    df = costs_of(lambda: F.cross_entropy(logits, target))
    assert only(df, "aten::_log_softmax").flops == 5 * 40
    assert only(df, "aten::nll_loss_forward").flops == 8
    emb, idx = torch.nn.Embedding(100, 16), torch.randint(0, 100, (3, 4))
    row = only(costs_of(lambda: emb(idx)), "aten::embedding")
    assert row.flops == 0
    # lower bound: the 12 indices (int64) + 12 rows read + 12 rows written, not the 100-row table
    assert row.bytes_moved == 12 * 8 + 2 * 12 * 16 * 4


def test_bytes_inplace_broadcast_and_copy():
    a, b = torch.randn(6, 4), torch.randn(4)
    row = only(costs_of(lambda: a.add_(b)), "aten::add_")
    assert row.bytes_moved == 4 * (24 + 4 + 24)  # read a, read b, write a
    e = torch.randn(1, 4).expand(6, 4)
    row = only(costs_of(lambda: e * 2.0), "aten::mul")
    assert row.bytes_moved == 4 * (4 + 24)  # the stride-0 input counts its 4 distinct elements
    dst, src = torch.empty(3, 3, dtype=torch.float64), torch.randn(3, 3)
    row = only(costs_of(lambda: dst.copy_(src)), "aten::copy_")
    assert row.bytes_moved == 9 * 4 + 9 * 8  # read float32 source, write float64 destination
    half = torch.randn(10, dtype=torch.float16)
    assert only(costs_of(lambda: half * half), "aten::mul").bytes_moved == 3 * 10 * 2


def test_duplicate_registration_is_an_error():
    with pytest.raises(ValueError, match="duplicate"):
        formulas.register_flops(torch.ops.aten.mm)(lambda *a, **k: 0)
    with pytest.raises(ValueError, match="duplicate"):
        formulas.register_bytes(torch.ops.aten.embedding)(lambda *a: 0)


def test_unknown_op_is_nan_not_zero():
    x = torch.randn(4, 4) * 0.1
    # no rule for the matrix exponential: its work depends on its norm
    row = only(costs_of(lambda: torch.linalg.matrix_exp(x)), "aten::linalg_matrix_exp")
    assert math.isnan(row.flops) and row.rule == "unknown"
    assert row.bytes_moved == 2 * 64  # x and its exponential


def test_foreach_ops_count_every_tensor():
    a, b = [torch.randn(3), torch.randn(4, 5)], [torch.randn(3), torch.randn(4, 5)]
    row = only(costs_of(lambda: torch._foreach_add_(a, b)), "aten::_foreach_add_")
    assert row.flops == 3 + 20
    assert row.bytes_moved == 4 * (2 * (3 + 20) + (3 + 20))  # read a and b, write a


def test_allocations_move_no_bytes_whatever_their_namespace():
    """empty* ops allocate uninitialised memory: 0 FLOPs and 0 bytes, ATen's and a library's alike
    (the FusionLens kernels allocate large CPU outputs through fusionlens::empty_pooled)."""
    lib = torch.library.Library("fl_formulas_test", "FRAGMENT")
    lib.define("empty_scratch(int[] shape) -> Tensor")
    lib.impl("empty_scratch", lambda shape: torch.empty(shape), "CompositeExplicitAutograd")
    x = torch.randn(8, 8)
    df = costs_of(lambda: (torch.ops.fl_formulas_test.empty_scratch([64, 64]), torch.empty_like(x),
                           x.new_empty((3, 3))))
    for name in ("fl_formulas_test::empty_scratch", "aten::empty_like", "aten::new_empty"):
        rows = df[df["name"] == name]
        assert len(rows) >= 1 and (rows.bytes_moved == 0).all() and (rows.flops == 0).all(), df
    assert (df[df["name"] == "fl_formulas_test::empty_scratch"].rule == "allocation").all()


def test_a_failing_byte_rule_is_nan_and_said(monkeypatch):
    from profiler.capture import flops

    def broken(*args, **kwargs):
        raise ValueError("cannot read these args")

    monkeypatch.setattr(flops, "op_bytes", broken)
    x = torch.randn(3, 4)
    row = only(costs_of(lambda: x * 2), "aten::mul")
    assert row.flops == 12 and math.isnan(row.bytes_moved)
    assert row.rule == "pointwise; bytes error: ValueError"

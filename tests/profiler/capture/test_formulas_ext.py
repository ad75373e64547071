"""FLOPs of the ops beyond the basics (profiler/capture/formulas_ext.py) against hand counts, and
the MoE expert GEMMs against the same model's per-expert loop, counted by torch's own formulas."""
import math

import pytest
import torch
import torch.nn.functional as F

from profiler.capture.flops import costs_of


def only(df, name):
    rows = df[df["name"] == name]
    assert len(rows) == 1, df[["name", "flops", "rule"]]
    return rows.iloc[0]


def _grouped(a, b, offs=None):
    return costs_of(lambda: torch._grouped_mm(a, b, offs=offs))


def test_grouped_mm_in_each_layout_is_the_sum_of_its_groups():
    sizes = [3, 0, 9, 4]  # rows (or columns, or K) per group; an empty group too
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    m, k, n, g = 4, 8, 12, len(sizes)  # the CPU kernel wants 16-byte strides
    # 2D x 3D: tokens sorted by expert, [16, K] @ [G, K, N]
    row = only(_grouped(torch.randn(sum(sizes), k), torch.randn(g, n, k).transpose(1, 2), offs), "aten::_grouped_mm")
    assert row.flops == sum(2 * s * k * n for s in sizes)
    # 3D x 2D: [G, M, K] @ [K, 16] split by columns
    row = only(_grouped(torch.randn(g, m, k), torch.randn(sum(sizes), k).t(), offs), "aten::_grouped_mm")
    assert row.flops == sum(2 * m * k * s for s in sizes)
    # 2D x 2D: the groups split K (a weight gradient), out [G, M, N]
    row = only(_grouped(torch.randn(m, sum(sizes)), torch.randn(n, sum(sizes)).t(), offs), "aten::_grouped_mm")
    assert row.flops == sum(2 * m * s * n for s in sizes)
    # 3D x 3D: a batched matmul
    row = only(_grouped(torch.randn(g, m, k), torch.randn(g, n, k).transpose(1, 2)), "aten::_grouped_mm")
    assert row.flops == g * 2 * m * k * n


def test_grouped_mm_counts_only_the_rows_its_offsets_reach():
    """Rows past offs[-1] (expert parallelism's parked tokens) are not computed."""
    offs = torch.tensor([2, 5], dtype=torch.int32)
    row = only(_grouped(torch.randn(8, 8), torch.randn(2, 4, 8).transpose(1, 2), offs), "aten::_grouped_mm")
    assert row.flops == 2 * 5 * 8 * 4


def _moe_matmul_flops(implementation: str) -> tuple[float, set]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                     num_experts_per_tok=2, experts_implementation=implementation)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()

    costs = costs_of(step)
    assert not (costs["rule"] == "unknown").any(), costs.loc[costs["rule"] == "unknown", "name"].tolist()
    matmuls = costs[costs["name"].isin(["aten::mm", "aten::addmm", "aten::bmm", "aten::_grouped_mm"])]
    return float(matmuls["flops"].sum()), set(matmuls["name"])


def test_moe_experts_as_grouped_gemms_count_what_the_per_expert_loop_counts():
    """Same model, same routing: transformers' grouped_mm experts (forward and backward) against
    its eager loop of per-expert linears, whose mm/addmm torch.utils.flop_counter counts."""
    grouped, grouped_ops = _moe_matmul_flops("grouped_mm")
    eager, eager_ops = _moe_matmul_flops("eager")
    assert "aten::_grouped_mm" in grouped_ops and "aten::_grouped_mm" not in eager_ops
    assert grouped == eager > 0


def test_routing_ops():
    x = torch.randn(6, 5)
    index = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 1, 0, 0]])
    src = torch.randn(2, 5)
    assert only(costs_of(lambda: x.scatter_add(0, index, src)), "aten::scatter_add").flops == 10
    assert only(costs_of(lambda: x.index_add(0, torch.tensor([1, 3]), src)), "aten::index_add").flops == 10
    assert only(costs_of(lambda: torch.cumsum(x, 1)), "aten::cumsum").flops == 30
    assert only(costs_of(lambda: torch.histc(x, bins=4)), "aten::histc").flops == 30
    assert only(costs_of(lambda: torch.floor_divide(x, 2.0)), "aten::floor_divide").flops == 30
    for name, fn in (("aten::topk", lambda: x.topk(2)), ("aten::sort", lambda: x.sort())):
        row = only(costs_of(fn), name)
        assert row.flops == 0 and row.rule == "data-movement"


def test_pooling():
    x = torch.randn(2, 3, 8, 8)
    assert only(costs_of(lambda: F.avg_pool2d(x, 2)), "aten::avg_pool2d").flops == 2 * 3 * 4 * 4 * 4
    assert only(costs_of(lambda: F.max_pool2d(x, 3, stride=1)), "aten::max_pool2d_with_indices").flops == \
        2 * 3 * 6 * 6 * 9
    assert only(costs_of(lambda: F.adaptive_avg_pool2d(x, 2)), "aten::_adaptive_avg_pool2d").flops == \
        2 * 3 * 64 + 2 * 3 * 4
    xg = x.clone().requires_grad_()
    df = costs_of(lambda: F.avg_pool2d(xg, 2).sum().backward())
    assert only(df, "aten::avg_pool2d_backward").flops == 2 * 3 * 4 * 4 * 4


def test_fft_solve_and_group_norm():
    z = torch.randn(3, 16, dtype=torch.complex64)
    assert only(costs_of(lambda: torch.fft.fft(z)), "aten::_fft_c2c").flops == 5 * 48 * 4  # 5 N log2(16)
    r = torch.randn(3, 16)
    assert only(costs_of(lambda: torch.fft.rfft(r)), "aten::_fft_r2c").flops == 2.5 * 48 * 4
    a = torch.randn(5, 5).triu() + 5 * torch.eye(5)
    b = torch.randn(5, 3)
    row = only(costs_of(lambda: torch.linalg.solve_triangular(a, b, upper=True)), "aten::linalg_solve_triangular")
    assert row.flops == 5 * 5 * 3  # n^2 k
    x = torch.randn(2, 6, 4, 4)
    gn = torch.nn.GroupNorm(3, 6)
    row = only(costs_of(lambda: gn(x)), "aten::native_group_norm")
    assert row.flops == 7 * x.numel() + 2 * 2 * 3
    assert math.isfinite(row.bytes_moved) and row.bytes_moved > 0


def test_in_place_and_vector_forms_of_the_gemm_family():
    m, k, n, b = 3, 5, 7, 2
    a, w, c, v, u = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n), torch.randn(k), torch.randn(m)
    a3, w3, c3 = torch.randn(b, m, k), torch.randn(b, k, n), torch.randn(b, m, n)
    counts = {  # op -> (call, hand count: 2 per multiply-add)
        "aten::addmm_": (lambda: c.clone().addmm_(a, w), 2 * m * k * n),
        "aten::baddbmm_": (lambda: c3.clone().baddbmm_(a3, w3), 2 * b * m * k * n),
        "aten::addbmm": (lambda: torch.addbmm(c, a3, w3), 2 * b * m * k * n),
        "aten::addbmm_": (lambda: c.clone().addbmm_(a3, w3), 2 * b * m * k * n),
        "aten::mv": (lambda: torch.mv(a, v), 2 * m * k),
        "aten::addmv": (lambda: torch.addmv(u, a, v), 2 * m * k),
        "aten::dot": (lambda: torch.dot(v, v), 2 * k),
        "aten::addr": (lambda: torch.addr(a, u, v), 2 * m * k),
        "aten::linalg_cross": (lambda: torch.linalg.cross(torch.randn(4, 3), torch.randn(4, 3)), 3 * 12),
        "aten::_cdist_forward": (lambda: torch.cdist(a, torch.randn(4, k)), 3 * k * m * 4),
    }
    for name, (call, flops) in counts.items():
        assert only(costs_of(call), name).flops == flops, name
    # the in-place form counts what torch's rule gives the out-of-place op
    assert only(costs_of(lambda: torch.addmm(c, a, w)), "aten::addmm").flops == 2 * m * k * n


def test_metadata_only_in_place_ops_are_views():
    df = costs_of(lambda: torch.randn(3, 1, 4).squeeze_(1).t_().unsqueeze_(0))
    for name in ("aten::squeeze_", "aten::t_", "aten::unsqueeze_"):
        row = only(df, name)
        assert row.flops == 0 and row.bytes_moved == 0


def test_fused_linear_cross_entropy_training_step_has_no_unknown_op():
    import kernels

    x = torch.randn(24, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    target = torch.randint(0, 50, (24,))
    df = costs_of(lambda: kernels.fused_linear_cross_entropy(x, weight, target, chunk_size=8).backward())
    assert not df["flops"].isna().any(), df[df["flops"].isna()][["name", "rule"]]
    # the chunks' logits and weight-gradient GEMMs: forward x @ W^T, backward dlogits @ W and dlogits^T @ x
    gemm = df[df["name"].isin(["aten::mm", "aten::addmm", "aten::addmm_"])]["flops"].sum()
    assert gemm >= 3 * 2 * 24 * 16 * 50


def test_grad_scaler_ops():
    """AMP's GradScaler: unscaling multiplies every grad element once (the inf check is a
    comparison, 0); the scale update is 2 (scale and growth tracker). Bytes: grads read and
    written, plus the scalars."""
    grads = [torch.randn(7, 3), torch.randn(11)]
    found_inf, inv_scale = torch.zeros(1), torch.full((1,), 0.5)
    row = only(costs_of(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)),
               "aten::_amp_foreach_non_finite_check_and_unscale_")
    assert row.flops == 21 + 11 and row.rule != "unknown"
    assert row.bytes_moved >= 2 * 4 * (21 + 11)  # each grad read and written in place
    scale, tracker = torch.full((1,), 65536.0), torch.zeros(1, dtype=torch.int32)
    row = only(costs_of(lambda: torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)),
               "aten::_amp_update_scale_")
    assert row.flops == 2 and row.rule != "unknown"

"""FLOPs of the layers beyond transformer LMs (profiler/capture/formulas_layers.py, the linear
algebra in formulas_ext.py) against hand counts, and the fused LSTM layer and nn.Transformer's fast
path against the same layers run op by op, which the basic rules count independently."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from profiler.capture import formulas_layers as fl
from profiler.capture.flops import costs_of


def only(df, name):
    rows = df[df["name"] == name]
    assert len(rows) == 1, df[["name", "flops", "rule"]]
    return rows.iloc[0]


def grad_step(fn, *leaves):
    """costs of fn(*leaves) forward and backward."""
    def step():
        fn(*leaves).float().sum().backward()
    return costs_of(step)


# every layer and loss the scan found without a rule (forward and backward): none is unknown now
LAYERS = {
    "lstm": lambda x: nn.LSTM(8, 6)(x.view(3, 2, 8))[0], "gru_cell": lambda x: nn.GRUCell(8, 6)(x.view(6, 8)),
    "embedding_bag": lambda x: F.embedding_bag(torch.tensor([1, 2, 4, 4, 0]), x.view(6, 8), torch.tensor([0, 2]), mode="mean"),
    "prelu": lambda x: F.prelu(x, torch.full((1,), 0.2)), "bilinear": lambda x: nn.Bilinear(8, 8, 3)(x, x),
    "hardswish": lambda x: F.hardswish(x), "hardtanh": lambda x: F.relu6(x), "leaky": lambda x: F.leaky_relu(x),
    "elu": lambda x: F.elu(x), "rrelu": lambda x: F.rrelu(x, training=True), "shrink": lambda x: F.softshrink(x) + F.hardshrink(x),
    "upsample": lambda x: F.interpolate(x.view(1, 3, 4, 4), scale_factor=2, mode="bilinear")
    + F.interpolate(x.view(1, 3, 4, 4), scale_factor=2, mode="bicubic") + F.interpolate(x.view(1, 3, 4, 4), scale_factor=2),
    "upsample_aa": lambda x: F.interpolate(x.view(1, 3, 4, 4), size=(2, 2), mode="bilinear", antialias=True),
    "linear1d": lambda x: F.interpolate(x.view(2, 3, 8), scale_factor=2, mode="linear"),
    "grid": lambda x: F.grid_sample(x.view(1, 3, 4, 4), F.affine_grid(torch.eye(2, 3)[None] * 0.9, (1, 3, 4, 4), align_corners=False), align_corners=False),
    "pad": lambda x: F.pad(x.view(1, 3, 4, 4), (1, 1, 1, 1), mode="reflect") .sum() + F.pad(x.view(1, 3, 4, 4), (1, 1, 1, 1), mode="replicate").sum(),
    "pixel_shuffle": lambda x: F.pixel_shuffle(x.view(1, 12, 2, 2), 2), "adaptive_max": lambda x: F.adaptive_max_pool2d(x.view(1, 3, 4, 4), 3),
    "weight_norm": lambda x: torch._weight_norm(x, torch.ones(6, 1), 0),
    "losses": lambda x: F.smooth_l1_loss(x, x.detach() * 0.5) + F.huber_loss(x, x.detach()) + F.soft_margin_loss(x, torch.ones_like(x))
    + F.binary_cross_entropy(torch.sigmoid(x), torch.full_like(x, 0.3)) + F.binary_cross_entropy_with_logits(x, torch.full_like(x, 0.3))
    + F.multi_margin_loss(x, torch.arange(6)) + F.multilabel_margin_loss(x, torch.zeros(6, 8, dtype=torch.long)),
    "ctc": lambda x: F.ctc_loss(F.log_softmax(x.view(6, 1, 8), -1), torch.tensor([[1, 2]]), torch.tensor([6]), torch.tensor([2])),
    "distances": lambda x: F.pdist(x).sum() + torch.cdist(x, x).sum() + torch.dist(x, x * 2),
    "linalg": lambda x: torch.linalg.inv(x[:, :6] + 4 * torch.eye(6)).sum() + torch.linalg.det(x[:, :6] + 4 * torch.eye(6))
    + torch.linalg.solve(x[:, :6] + 4 * torch.eye(6), x[:, 6:]).sum() + torch.linalg.qr(x)[1].sum() + torch.linalg.svdvals(x).sum()
    + torch.linalg.eigh(x[:, :6] @ x[:, :6].T)[0].sum() + torch.linalg.cholesky(x[:, :6] @ x[:, :6].T + torch.eye(6)).sum(),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_and_losses_have_rules_forward_and_backward(name):
    x = torch.randn(6, 8, requires_grad=True)
    costs = grad_step(LAYERS[name], x)
    unknown = costs[costs["rule"].str.startswith("unknown") | costs["rule"].str.contains("error")]
    assert unknown.empty, unknown[["name", "rule"]].values.tolist()


@pytest.mark.parametrize("options", [{}, {"num_layers": 2, "bidirectional": True}, {"bias": False}])
def test_the_fused_lstm_layer_counts_what_the_same_lstm_counts_op_by_op(options):
    """oneDNN's mkldnn_rnn_layer against ATen's own cell loop (oneDNN off), whose addmm, sigmoid,
    tanh, mul and add the basic rules count: equal forward; backward within 8% (a fused backward
    counts twice its forward, the loop its ops' own backward rules: 2.4-5.1% apart here)."""
    torch.manual_seed(0)
    lstm, x = nn.LSTM(8, 6, **options), torch.randn(5, 3, 8, requires_grad=True)

    def total(fused: bool, backward: bool) -> tuple[float, set]:
        def step():
            with torch.backends.mkldnn.flags(enabled=fused):
                out = lstm(x)[0]
                if backward:
                    out.sum().backward()
        costs = costs_of(step)
        return costs["flops"].sum(), set(costs["name"])

    fused, names = total(True, False)
    assert "aten::mkldnn_rnn_layer" in names
    loop, names = total(False, False)
    assert "aten::mkldnn_rnn_layer" not in names and names & {"aten::addmm", "aten::mm"}
    assert fused == loop
    fused_bwd, loop_bwd = total(True, True)[0], total(False, True)[0]
    assert abs(fused_bwd - loop_bwd) <= 0.08 * loop_bwd


def test_one_lstm_layer_by_hand():
    """15 tokens, 8 inputs, 6 hidden, 4 gates: the two GEMMs, the gate sums and the cells."""
    row = only(costs_of(lambda: nn.LSTM(8, 6)(torch.randn(5, 3, 8))), "aten::mkldnn_rnn_layer")
    assert row.flops == 2 * 15 * (24 * 8 + 24 * 6) + 15 * 6 * (4 + 18)


def test_cudnn_and_miopen_stacks_count_what_their_layers_count():
    """The GPU formulas (called directly: no GPU here) over a 2-layer bidirectional LSTM's weights
    equal the four oneDNN layers of the same LSTM on this CPU; a GRU (mode 3) by hand."""
    torch.manual_seed(0)
    lstm, x = nn.LSTM(8, 6, num_layers=2, bidirectional=True), torch.randn(5, 3, 8)
    layers = costs_of(lambda: lstm(x))
    per_layer = layers.loc[layers["name"] == "aten::mkldnn_rnn_layer", "flops"]
    assert len(per_layer) == 4
    weights = lstm._flat_weights
    cudnn = fl.cudnn_rnn_flops(x, weights, 4, None, None, None, 2, 6, 0, 2, False, 0.0, True, True, [])
    miopen = fl.miopen_rnn_flops(x, weights, 4, None, None, 2, 6, 2, False, 0.0, True, True, [])
    assert cudnn == miopen == per_layer.sum()
    assert fl.cudnn_rnn_backward_flops(x, weights, 4, None, None, None, None, None, None, None, 2, 6, 0, 2,
                                       False, 0.0, True, True, []) == 2 * cudnn
    gru = nn.GRU(8, 6)
    assert fl.cudnn_rnn_flops(x, gru._flat_weights, 4, None, None, None, 3, 6, 0, 1, False, 0.0, True, False, []) \
        == 2 * 15 * (18 * 8 + 18 * 6) + 15 * 6 * (3 + 15)
    packed = torch.randn(11, 8)  # a packed sequence: 11 tokens in all, batch_sizes given
    assert fl.cudnn_rnn_flops(packed, gru._flat_weights, 4, None, None, None, 3, 6, 0, 1, False, 0.0, True,
                              False, [3, 3, 3, 2]) == 2 * 11 * (18 * 8 + 18 * 6) + 11 * 6 * 18


def test_embedding_bags_by_hand():
    weight, idx, offs = torch.randn(10, 4, requires_grad=True), torch.tensor([1, 2, 4, 4, 0, 9, 3]), torch.tensor([0, 3])
    for mode, per_gathered, per_out in (("sum", 1, 0), ("mean", 1, 1), ("max", 1, 0)):
        costs = grad_step(lambda w: F.embedding_bag(idx, w, offs, mode=mode), weight)
        assert only(costs, "aten::_embedding_bag").flops == 7 * 4 * per_gathered + 2 * 4 * per_out
        assert only(costs, "aten::_embedding_bag_backward").flops == 7 * 4 * (2 if mode == "mean" else 1)
    table = torch.randn(100_000, 4)  # a big table is not read whole: 7 rows of 16 bytes
    row = only(costs_of(lambda: F.embedding_bag(idx, table, offs, mode="sum")), "aten::_embedding_bag_forward_only")
    # indices and offsets (int64), the 7 rows, the bags [2, 4] fp32, offset2bag [0], bag_size and
    # max_indices [2] (int64)
    assert row.bytes_moved == (7 + 2) * 8 + 7 * 16 + 2 * 4 * 4 + 2 * 2 * 8
    psw = torch.rand(7, requires_grad=True)
    costs = grad_step(lambda w, p: F.embedding_bag(idx, w, offs, mode="sum", per_sample_weights=p), weight, psw)
    assert only(costs, "aten::_embedding_bag").flops == 2 * 7 * 4
    assert only(costs, "aten::_embedding_bag_per_sample_weights_backward").flops == 2 * 7 * 4


def test_resampling_by_hand():
    x = torch.randn(2, 3, 4, 5, requires_grad=True)
    out = 2 * 3 * 8 * 10
    costs = grad_step(lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"), x)
    assert only(costs, "aten::upsample_bilinear2d").flops == 7 * out
    assert only(costs, "aten::upsample_bilinear2d_backward").flops == 8 * out
    costs = grad_step(lambda t: F.interpolate(t, scale_factor=2, mode="bicubic"), x)
    assert only(costs, "aten::upsample_bicubic2d").flops == 31 * out
    costs = grad_step(lambda t: F.interpolate(t, scale_factor=2), x)
    assert only(costs, "aten::upsample_nearest2d").flops == 0
    assert only(costs, "aten::upsample_nearest2d_backward").flops == out
    # anti-aliased 4x5 -> 2x2: bilinear support 2 widened by the downscale to 4 and 5 taps
    costs = costs_of(lambda: F.interpolate(x.detach(), size=(2, 2), mode="bilinear", antialias=True))
    assert only(costs, "aten::_upsample_bilinear2d_aa").flops == (2 * 4 * 5 - 1) * 2 * 3 * 2 * 2
    theta = (torch.eye(2, 3)[None] * 0.9).expand(2, 2, 3)
    grid = F.affine_grid(theta, (2, 3, 6, 7), align_corners=False)
    assert only(costs_of(lambda: F.affine_grid(theta, (2, 3, 6, 7), align_corners=False)),
                "aten::affine_grid_generator").flops == 2 * 3 * (2 * 6 * 7 * 2)
    costs = costs_of(lambda: F.grid_sample(x.detach(), grid, align_corners=False))
    assert only(costs, "aten::grid_sampler_2d").flops == 7 * (2 * 3 * 6 * 7) + 4 * (2 * 6 * 7)
    costs = costs_of(lambda: F.grid_sample(x.detach(), grid, mode="nearest", align_corners=False))
    assert only(costs, "aten::grid_sampler_2d").flops == 4 * (2 * 6 * 7)  # only the coordinates


def test_pooling_padding_and_rearranging_by_hand():
    x = torch.randn(2, 3, 5, 7, requires_grad=True)
    # adaptive windows of 5 -> 3 rows: [0, 2) [1, 4) [3, 5) = 7 taps; 7 -> 3 columns: [0, 3) [2, 5) [4, 7) = 9
    costs = grad_step(lambda t: F.adaptive_max_pool2d(t, 3), x)
    assert only(costs, "aten::adaptive_max_pool2d").flops == 2 * 3 * 7 * 9
    assert only(costs, "aten::adaptive_max_pool2d_backward").flops == 2 * 3 * 3 * 3
    costs = grad_step(lambda t: F.pad(t, (1, 1, 2, 2), mode="reflect"), x)
    assert only(costs, "aten::reflection_pad2d").flops == 0
    assert only(costs, "aten::reflection_pad2d_backward").flops == 2 * 3 * 9 * 9
    row = only(costs_of(lambda: F.pixel_shuffle(torch.randn(1, 8, 3, 3), 2)), "aten::pixel_shuffle")
    assert row.flops == 0 and row.bytes_moved == 2 * 72 * 4
    gru_split = costs_of(lambda: torch.randn(4, 9).unsafe_split(3, dim=1))
    assert only(gru_split, "aten::unsafe_split").rule == "view"  # a view in all but its schema: 0 bytes


def test_activations_in_place_or_untagged_count_their_table_entry():
    x = torch.randn(4, 8)
    for call, name, per in ((lambda: F.silu(x.clone(), inplace=True), "aten::silu_", 5),
                            (lambda: F.hardswish(x.clone(), inplace=True), "aten::hardswish_", 4),
                            (lambda: torch.sigmoid_(x.clone()), "aten::sigmoid_", 4),
                            (lambda: F.hardswish(x), "aten::hardswish", 4)):
        assert only(costs_of(call), name).flops == per * 32, name
    mask = torch.rand(4, 8) > 0.5  # the table's zeros stay 0 (tagged pointwise data movement)
    assert only(costs_of(lambda: torch.logical_not(mask)), "aten::logical_not").flops == 0
    assert only(costs_of(lambda: torch.bitwise_not(mask)), "aten::bitwise_not").flops == 0
    xg = torch.randn(4, 8, requires_grad=True)
    for fn, name, per in ((F.relu6, "aten::hardtanh_backward", 1), (F.leaky_relu, "aten::leaky_relu_backward", 2),
                          (F.elu, "aten::elu_backward", 6)):
        assert only(grad_step(fn, xg), name).flops == per * 32, name


def test_prelu_bilinear_weight_norm_and_losses_by_hand():
    x = torch.randn(6, 8, requires_grad=True)
    costs = grad_step(lambda t: F.prelu(t, torch.full((1,), 0.25)), x)
    assert only(costs, "aten::_prelu_kernel").flops == 2 * 48
    assert only(costs, "aten::_prelu_kernel_backward").flops == 4 * 48
    # nn.Bilinear(8, 8, 3): x1 * W over [6, 3, 8, 8], then a multiply-add with x2 per point
    tri = costs_of(lambda: nn.Bilinear(8, 8, 3)(x.detach(), x.detach()))
    assert only(tri, "aten::_trilinear").flops == 3 * 6 * 3 * 8 * 8
    v = torch.randn(5, 7, requires_grad=True)
    costs = grad_step(lambda t: torch._weight_norm(t, torch.ones(5, 1), 0), v)
    assert only(costs, "aten::_weight_norm_interface").flops == 3 * 35 + 2 * 5
    assert only(costs, "aten::_weight_norm_interface_backward").flops == 6 * 35 + 2 * 5
    t = torch.full((6, 8), 0.3)
    for loss, name, fwd, bwd in ((lambda a: F.smooth_l1_loss(a, t), "smooth_l1_loss", 5, 4),
                                 (lambda a: F.huber_loss(a, t), "huber_loss", 5, 4),
                                 (lambda a: F.binary_cross_entropy(torch.sigmoid(a), t), "binary_cross_entropy", 5, 4),
                                 (lambda a: F.soft_margin_loss(a, torch.ones(6, 8)), "soft_margin_loss", 4, 5)):
        costs = grad_step(loss, x)
        assert only(costs, f"aten::{name}").flops == fwd * 48, name
        assert only(costs, f"aten::{name}_backward").flops == bwd * 48, name
    assert only(costs_of(lambda: F.binary_cross_entropy_with_logits(x.detach(), t)),
                "aten::binary_cross_entropy_with_logits").flops == 7 * 48


def test_ctc_counts_its_lattice():
    log_probs = F.log_softmax(torch.randn(9, 2, 6), -1).requires_grad_()
    costs = grad_step(lambda lp: F.ctc_loss(lp, torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([9, 7]),
                                            torch.tensor([3, 2])), log_probs)
    lattice = 2 * 9 * (2 * 3 + 1)  # batch x time x extended labels of the longest target
    assert only(costs, "aten::_ctc_loss").flops == 6 * lattice
    assert only(costs, "aten::_ctc_loss_backward").flops == 12 * lattice


def test_dense_linear_algebra_by_the_textbook():
    n = 6
    a = torch.randn(3, n, n) + 4 * torch.eye(n)
    spd = a @ a.mT + torch.eye(n)
    rhs = torch.randn(3, n, 2)
    checks = {
        "aten::linalg_cholesky_ex": (lambda: torch.linalg.cholesky(spd), 3 * n ** 3 / 3),
        "aten::linalg_inv_ex": (lambda: torch.linalg.inv(a), 3 * 2 * n ** 3),
        "aten::_linalg_solve_ex": (lambda: torch.linalg.solve(a, rhs), 3 * (2 * n ** 3 / 3 + 2 * n ** 2 * 2)),
        "aten::_linalg_det": (lambda: torch.linalg.det(a), 3 * (n ** 3 - n ** 3 / 3 + n)),
        "aten::_linalg_eigh": (lambda: torch.linalg.eigh(spd), 3 * 9 * n ** 3),
        "aten::linalg_qr": (lambda: torch.linalg.qr(torch.randn(9, n)), 2 * (2 * 9 * n ** 2 - 2 * n ** 3 / 3)),
    }
    for name, (call, want) in checks.items():
        assert only(costs_of(call), name).flops == int(want), name
    thin = only(costs_of(lambda: torch.linalg.svd(torch.randn(9, n), full_matrices=False)), "aten::_linalg_svd")
    assert thin.flops == 6 * 9 * n ** 2 + 20 * n ** 3
    full = only(costs_of(lambda: torch.linalg.svd(torch.randn(9, n))), "aten::_linalg_svd")
    assert full.flops == 4 * 9 ** 2 * n + 22 * n ** 3


def test_transformer_fast_path_counts_what_its_parts_count():
    """nn.TransformerEncoderLayer in eval under inference_mode runs one fused op; in train mode
    (dropout 0) the same layer runs op by op. Equal, but for the q/k/v bias add the op-by-op path
    does separately (the fused op's GEMMs take their biases, as torch's addmm rule leaves out)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0)
    x = torch.randn(2, 5, 16)

    def fused():
        layer.eval()
        with torch.inference_mode():
            layer(x)

    def parts():
        layer.train()
        with torch.no_grad():
            layer(x)

    fast = costs_of(fused)
    assert only(fast, "aten::_transformer_encoder_layer_fwd").rule == "formula"
    slow = costs_of(parts)
    assert "aten::_transformer_encoder_layer_fwd" not in set(slow["name"])
    qkv_bias_add = 10 * 3 * 16
    assert fast["flops"].sum() == slow["flops"].sum() - qkv_bias_add
    mha = costs_of(lambda: torch._native_multi_head_attention(
        x, x, x, 16, 4, layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias,
        layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias, need_weights=False))
    assert only(mha, "aten::_native_multi_head_attention").flops == 2 * 10 * 16 * 16 * 4 + 4 * 5 * 5 * 16 * 2
    assert math.isfinite(fast["flops"].sum())

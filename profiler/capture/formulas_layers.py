"""FLOP formulas for the layers of vision, audio, recommender and recurrent models, which
`formulas` and `formulas_ext` (transformer LMs) left without a rule. Registered into the same
registry (`formulas.FLOP_FORMULAS`) on import.

A scan of torch.nn.functional's layers and losses, forward and backward, found 107 ops the
recorder could not count: an LSTM's fused CPU layer (all of its compute), bilinear upsampling
(segmentation and diffusion U-Nets), binary cross-entropy, embedding bags, grid sampling, ...
Conventions as in `formulas` (per element of the named tensor; a multiply-add is 2; a comparison
or a select 0; backward about twice the forward):

- fused recurrent layers (CPU oneDNN `mkldnn_rnn_layer`, one layer and direction; cuDNN
  `_cudnn_rnn` and MIOpen `miopen_rnn`, the whole stack): every 2-D weight matrix multiplies
  every token once, 2 * tokens * numel(W) (w_ih, w_hh, LSTM's projection w_hr); the gates' input
  and hidden parts added, 1 per gate unit; the cell per hidden unit: LSTM 18 (three sigmoids at 4,
  two tanh, c = f*c + i*g, h = o*tanh(c)), GRU 15 (two sigmoids, n = tanh(x_n + r*h_n),
  h = (1 - z)*n + z*h), a plain RNN 1. The bias adds are left out, as torch's addmm rule leaves
  them out: so the fused layer counts what the same LSTM counts run op by op (a test checks
  the two are equal). Backward twice the forward (the two GEMMs per weight of any matmul);
- embedding bags: 1 per gathered element (sum, mean or max over the bag), + 1 per gathered element
  with per-sample weights, + 1 per output element for mean; backward the same per gathered
  element (scatter-add), per-sample weights' gradient 2 (a dot product per index). Bytes: the rows
  gathered, one per index, not the whole table (as `formulas.embedding_bytes`);
- PReLU 2 per element, its backward 4 (both gradients); nn.Bilinear's `_trilinear`: the product of
  the first two inputs over their broadcast, then a multiply-add per point of the whole broadcast
  space (3 per point for x1 W x2);
- resampling: linear interpolation 2 * taps - 1 per output element (taps: linear 2, bilinear 4,
  trilinear 8, bicubic 16; anti-aliased filters widen with the downscale), backward 2 * taps per
  gradient element; nearest 0 (a gather; `flops.ZERO_FLOP_OPS`) and its backward 1 per gradient
  element (a scatter-add); grid sampling as interpolation plus 2 per coordinate of each grid
  point, backward twice that; affine grids one [points, K] @ [K, 2 or 3] product (2K per output
  element), backward the same;
- adaptive max pooling 1 per element of each window (windows overlap where the sizes do not
  divide), backward 1 per gradient element; padding (reflection, replication) 0 and its backward
  1 per gradient element (folded-back borders add);
- weight norm: 3N + 2R (squares summed per row, a root and a division per row, a multiply per
  element), backward 6N + 2R;
- losses, per element: smooth L1 and Huber 5 (difference, magnitude, the square or linear branch,
  sum), backward 4; binary cross-entropy 5 (two logs, the weighted sum), with logits 7 (a
  log-sigmoid and its complement), backward 4; soft margin 4 (log1p(exp(-yx)), sum), backward 5;
  multi margin 4 per logit (margin, difference, clamp, sum), multilabel margin 4 per logit and
  target pair's row, backward 2; CTC 6 per cell of its lattice (batch x time x extended labels,
  the log_alpha it returns) for the alpha pass (log-sum-exp of up to three predecessors),
  backward 12 (the beta pass and the gradient);
- pairwise distances: `_pdist_forward` 3 per (pair, feature), `_cdist_backward` and
  `_pdist_backward` twice the forward; `dist` 3 per element; `renorm` and `embedding_renorm_`
  2 per element read (norm) plus 1 per element rescaled; `trace` 1 per diagonal element;
- window functions and ramps: `linspace` 2, `logspace` 3, Hann/Hamming/Blackman windows 3-5 per
  element (a cosine or two, scale, shift);
- nn.Transformer's inference fast path (`_native_multi_head_attention`,
  `_transformer_encoder_layer_fwd`): what its parts count one by one: the Q, K, V and output
  projections (2 E^2 per token each), scores and weighted sum (4 L S E), layer norms 7N + 2R,
  residual adds, the feed-forward GEMMs and activation.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from profiler.capture.formulas import (_first_out, _packets, numel, per_input, per_output, register_bytes,
                                       register_flops, tensor_bytes, tensors)

# ---------------------------------------------------------------- recurrent layers
CELL_FLOPS = {4: 18, 3: 15, 1: 1}  # gates -> pointwise FLOPs per hidden unit per token (LSTM, GRU, RNN)


def _tokens(x: torch.Tensor, packed: bool) -> int:
    """Time steps x batch of an RNN input: [T, B, I] or [B, T, I] (both T*B), or packed [sum(B_t), I]."""
    if packed or x.dim() == 2:
        return x.shape[0]
    return numel(x) // x.shape[-1] if x.shape[-1] else 0


def _rnn_flops(tokens: int, matrices: Sequence[torch.Tensor], hidden: int, gates: int, layers: int) -> int:
    """GEMMs of every 2-D weight over every token, the gate sums and the cells of `layers`
    (layer, direction) pairs."""
    gemm = 2 * tokens * sum(numel(w) for w in matrices if isinstance(w, torch.Tensor) and w.dim() == 2)
    return gemm + tokens * layers * hidden * (gates + CELL_FLOPS.get(gates, 1))


@register_flops(*_packets("mkldnn_rnn_layer"))
def mkldnn_rnn_layer_flops(x, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode, hidden_size,
                           *args, out_val=None, **kwargs) -> int:
    """One layer and direction of a CPU LSTM: w_ih [G*H, I], w_hh [G*H, H]."""
    gates = w_ih.shape[0] // hidden_size if hidden_size else 1
    return _rnn_flops(_tokens(x, bool(batch_sizes)), (w_ih, w_hh), hidden_size, gates, 1)


@register_flops(*_packets("mkldnn_rnn_layer_backward"))
def mkldnn_rnn_layer_backward_flops(x, w_ih, w_hh, b_ih, b_hh, hx, cx, output, hy, cy, grad_out, grad_hy,
                                    grad_cy, reverse, mode, hidden_size, num_layers, has_biases, train,
                                    bidirectional, batch_sizes, *args, out_val=None, **kwargs) -> int:
    gates = w_ih.shape[0] // hidden_size if hidden_size else 1
    return 2 * _rnn_flops(_tokens(x, bool(batch_sizes)), (w_ih, w_hh), hidden_size, gates, 1)


MODE_GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # cuDNN / MIOpen mode: RNN_RELU, RNN_TANH, LSTM, GRU


def _stack_flops(x, weights, mode, hidden_size, num_layers, bidirectional, batch_sizes) -> int:
    layers = int(num_layers) * (2 if bidirectional else 1)
    return _rnn_flops(_tokens(x, bool(batch_sizes)), weights, int(hidden_size), MODE_GATES.get(int(mode), 1), layers)


@register_flops(*_packets("_cudnn_rnn"))
def cudnn_rnn_flops(x, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers,
                    batch_first, dropout, train, bidirectional, batch_sizes, *args, out_val=None, **kwargs) -> int:
    """The whole stack: weight lists each layer and direction's w_ih, w_hh (and w_hr), biases."""
    return _stack_flops(x, weight, mode, hidden_size, num_layers, bidirectional, batch_sizes)


@register_flops(*_packets("_cudnn_rnn_backward"))
def cudnn_rnn_backward_flops(x, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                             grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
                             bidirectional, batch_sizes, *args, out_val=None, **kwargs) -> int:
    return 2 * _stack_flops(x, weight, mode, hidden_size, num_layers, bidirectional, batch_sizes)


@register_flops(*_packets("miopen_rnn"))
def miopen_rnn_flops(x, weight, weight_stride0, hx, cx, mode, hidden_size, num_layers, batch_first, dropout,
                     train, bidirectional, batch_sizes, *args, out_val=None, **kwargs) -> int:
    return _stack_flops(x, weight, mode, hidden_size, num_layers, bidirectional, batch_sizes)


@register_flops(*_packets("miopen_rnn_backward"))
def miopen_rnn_backward_flops(x, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                              grad_cy, mode, hidden_size, num_layers, batch_first, dropout, train, bidirectional,
                              batch_sizes, *args, out_val=None, **kwargs) -> int:
    return 2 * _stack_flops(x, weight, mode, hidden_size, num_layers, bidirectional, batch_sizes)


# ---------------------------------------------------------------- embedding bags
EMBEDDING_BAG_MEAN = 1  # mode: 0 sum, 1 mean, 2 max


@register_flops(*_packets("_embedding_bag", "_embedding_bag_forward_only"))
def embedding_bag_flops(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                        per_sample_weights=None, *args, out_val=None, **kwargs) -> int:
    gathered = numel(indices) * weight.shape[-1]
    return (gathered * (1 + (per_sample_weights is not None))
            + (numel(_first_out(out_val)) if int(mode) == EMBEDDING_BAG_MEAN else 0))


def _bag_backward(grad: torch.Tensor, indices: torch.Tensor, mode: int, per_sample_weights: Any) -> int:
    """Scatter-add of one gradient row per index (scaled for mean or per-sample weights: + 1)."""
    scaled = int(mode) == EMBEDDING_BAG_MEAN or per_sample_weights is not None
    return numel(indices) * grad.shape[-1] * (1 + scaled)


@register_flops(*_packets("_embedding_bag_backward"))
def embedding_bag_backward_flops(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, sparse, per_sample_weights=None, *args,
                                 out_val=None, **kwargs) -> int:
    return _bag_backward(grad, indices, mode, per_sample_weights)


@register_flops(*_packets("_embedding_bag_dense_backward"))
def embedding_bag_dense_backward_flops(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                       scale_grad_by_freq, mode, per_sample_weights=None, *args,
                                       out_val=None, **kwargs) -> int:
    return _bag_backward(grad, indices, mode, per_sample_weights)


@register_flops(*_packets("_embedding_bag_sparse_backward"))
def embedding_bag_sparse_backward_flops(grad, indices, offsets, offset2bag, bag_size, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights=None, *args,
                                        out_val=None, **kwargs) -> int:
    return _bag_backward(grad, indices, mode, per_sample_weights)


@register_bytes(*_packets("_embedding_bag", "_embedding_bag_forward_only"))
def embedding_bag_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """Indices, offsets and per-sample weights, the rows gathered (one per index: a table of
    millions of rows is not read whole) and the outputs written."""
    weight, indices = args[0], args[1]
    return (sum(tensor_bytes(t) for t in tensors((args[1:], kwargs))) + _rows_bytes(weight, indices)
            + sum(tensor_bytes(t) for t in tensors(out)))


@register_bytes(*_packets("embedding_renorm_"))
def embedding_renorm_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """The referenced rows read and rewritten in place, and the indices."""
    weight, indices = args[0], args[1]
    return tensor_bytes(indices) + 2 * _rows_bytes(weight, indices)


def _rows_bytes(weight: torch.Tensor, indices: torch.Tensor) -> int:
    """One table row per index (repeats counted: the kernels read them again)."""
    return numel(indices) * (weight.shape[-1] if weight.dim() else 1) * weight.element_size()


@register_flops(*_packets("_embedding_bag_per_sample_weights_backward"))
def embedding_bag_psw_backward_flops(grad, weight, indices, *args, out_val=None, **kwargs) -> int:
    """A dot product of the bag's gradient row and the weight row, per index."""
    return 2 * numel(indices) * weight.shape[-1]


# ---------------------------------------------------------------- PReLU, bilinear
register_flops(*_packets("_prelu_kernel"))(lambda x, w, *a, out_val=None, **k: 2 * numel(x))
register_flops(*_packets("_prelu_kernel_backward"))(lambda g, x, w, *a, out_val=None, **k: 4 * numel(x))


def _expanded_shape(t: torch.Tensor, expand: Sequence[int], dims: int) -> list[int]:
    shape = list(t.shape)
    for d in sorted(int(e) for e in expand):
        shape.insert(d, 1)
    return shape + [1] * (dims - len(shape))


@register_flops(*_packets("_trilinear"))
def trilinear_flops(i1, i2, i3, expand1, expand2, expand3, sumdim, *args, out_val=None, **kwargs) -> int:
    """i1 * i2 over their broadcast, then a multiply-add with i3 per point of the whole space."""
    dims = i1.dim() + len(expand1)
    s1, s2, s3 = (_expanded_shape(t, e, dims) for t, e in ((i1, expand1), (i2, expand2), (i3, expand3)))
    first = math.prod(max(a, b) for a, b in zip(s1, s2))
    space = math.prod(max(a, b, c) for a, b, c in zip(s1, s2, s3))
    return first + 2 * space


# ---------------------------------------------------------------- resampling
def _taps_linear(per_dim: int, dims: int):
    """Linear-family interpolation: forward 2*taps - 1 per output element, backward 2*taps per
    gradient element (args grad_output, output_size, input_size, ...)."""
    taps = per_dim ** dims

    def forward(x, *args, out_val=None, **kwargs) -> int:
        return (2 * taps - 1) * numel(_first_out(out_val))

    def backward(grad, *args, out_val=None, **kwargs) -> int:
        return 2 * taps * numel(grad)
    return forward, backward


for _name, _per_dim, _dims in (("upsample_linear1d", 2, 1), ("upsample_bilinear2d", 2, 2),
                               ("upsample_trilinear3d", 2, 3), ("upsample_bicubic2d", 4, 2)):
    _fwd, _bwd = _taps_linear(_per_dim, _dims)
    register_flops(*_packets(_name))(_fwd)
    register_flops(*_packets(f"{_name}_backward"))(_bwd)


def _aa_taps(in_sizes: Sequence[int], out_sizes: Sequence[int], support: int) -> int:
    """Anti-aliased filter taps: `support` per dim, widened by the downscale factor."""
    return math.prod(max(support, math.ceil(support * int(i) / max(int(o), 1))) for i, o in zip(in_sizes, out_sizes))


def _aa(support: int):
    def forward(x, *args, out_val=None, **kwargs) -> int:
        out = _first_out(out_val)
        return (2 * _aa_taps(x.shape[-2:], out.shape[-2:], support) - 1) * numel(out)

    def backward(grad, output_size, input_size, *args, out_val=None, **kwargs) -> int:
        return 2 * _aa_taps(list(input_size)[-2:], list(output_size)[-2:], support) * numel(grad)
    return forward, backward


for _name, _support in (("_upsample_bilinear2d_aa", 2), ("_upsample_bicubic2d_aa", 4)):
    _fwd, _bwd = _aa(_support)
    register_flops(*_packets(_name))(_fwd)
    register_flops(*_packets(f"{_name}_backward"))(_bwd)


@register_flops(*_packets("upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_nearest3d_backward",
                          "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d_backward",
                          "_upsample_nearest_exact3d_backward", "reflection_pad1d_backward",
                          "reflection_pad2d_backward", "reflection_pad3d_backward", "replication_pad1d_backward",
                          "replication_pad2d_backward", "replication_pad3d_backward",
                          "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward"))
def scatter_back_flops(grad, *args, out_val=None, **kwargs) -> int:
    """Each incoming element added (or placed) into the input's gradient: 1 per element."""
    return numel(grad)


GRID_TAPS = {0: 4, 1: 0, 2: 16}  # interpolation_mode: bilinear, nearest, bicubic (2-D)


def _grid_flops(x: torch.Tensor, grid: torch.Tensor, mode: int, out: Any) -> int:
    coords = grid.shape[-1]
    taps = GRID_TAPS.get(int(mode), 4) if coords == 2 else (8 if int(mode) == 0 else 0)
    points = numel(grid) // coords
    return max(2 * taps - 1, 0) * numel(out) + 2 * coords * points


@register_flops(*_packets("grid_sampler_2d", "grid_sampler_3d", "cudnn_grid_sampler"))
def grid_sampler_flops(x, grid, interpolation_mode=0, *args, out_val=None, **kwargs) -> int:
    """cuDNN's sampler (x, grid) is bilinear: the default mode."""
    return _grid_flops(x, grid, interpolation_mode, _first_out(out_val))


@register_flops(*_packets("grid_sampler_2d_backward", "grid_sampler_3d_backward"))
def grid_sampler_backward_flops(grad, x, grid, interpolation_mode=0, *args, out_val=None, **kwargs) -> int:
    return 2 * _grid_flops(x, grid, interpolation_mode, grad)


@register_flops(*_packets("cudnn_grid_sampler_backward"))
def cudnn_grid_sampler_backward_flops(x, grid, grad, *args, out_val=None, **kwargs) -> int:
    return 2 * _grid_flops(x, grid, 0, grad)


@register_flops(*_packets("affine_grid_generator"))
def affine_grid_flops(theta, size, *args, out_val=None, **kwargs) -> int:
    """[N, points, K] @ [N, K, 2 or 3]: 2K per output element."""
    return 2 * theta.shape[-1] * numel(_first_out(out_val))


@register_flops(*_packets("affine_grid_generator_backward"))
def affine_grid_backward_flops(grad, size, *args, out_val=None, **kwargs) -> int:
    return 2 * (len(size) - 1) * numel(grad)


# ---------------------------------------------------------------- pooling
def _adaptive_window_total(inp: int, out: int) -> int:
    """Sum over output positions of the adaptive window's length (start floor, end ceil)."""
    return sum(-(-((i + 1) * inp) // out) - (i * inp) // out for i in range(out)) if out else 0


@register_flops(*_packets("adaptive_max_pool2d", "adaptive_max_pool3d"))
def adaptive_max_pool_flops(x, output_size, *args, out_val=None, **kwargs) -> int:
    dims = len(output_size)
    lead = math.prod(x.shape[:-dims])
    return lead * math.prod(_adaptive_window_total(int(i), int(o)) for i, o in zip(x.shape[-dims:], output_size))


# ---------------------------------------------------------------- weight norm
def _weight_rows(v: torch.Tensor, dim: int) -> int:
    return v.shape[dim] if v.dim() and dim not in (-1, None) else 1


@register_flops(*_packets("_weight_norm_interface"))
def weight_norm_flops(v, g, dim=0, *args, out_val=None, **kwargs) -> int:
    return 3 * numel(v) + 2 * _weight_rows(v, int(dim))


@register_flops(*_packets("_weight_norm_interface_backward"))
def weight_norm_backward_flops(grad_w, v, g, norms, dim, *args, out_val=None, **kwargs) -> int:
    return 6 * numel(v) + 2 * _weight_rows(v, int(dim))


# ---------------------------------------------------------------- losses
def _per_second(per: float):
    """Backward losses: (grad_output, self, ...) counted per element of self."""
    def flops(grad, x, *args, out_val=None, **kwargs) -> int:
        return int(per * numel(x))
    return flops


register_flops(*_packets("smooth_l1_loss", "huber_loss"))(per_input(5))
register_flops(*_packets("smooth_l1_loss_backward", "huber_loss_backward"))(_per_second(4))
register_flops(*_packets("binary_cross_entropy"))(per_input(5))
register_flops(*_packets("binary_cross_entropy_with_logits"))(per_input(7))
register_flops(*_packets("binary_cross_entropy_backward"))(_per_second(4))
register_flops(*_packets("soft_margin_loss"))(per_input(4))
register_flops(*_packets("soft_margin_loss_backward"))(_per_second(5))
register_flops(*_packets("multi_margin_loss"))(per_input(4))
register_flops(*_packets("multi_margin_loss_backward"))(_per_second(2))
register_flops(*_packets("multilabel_margin_loss_forward"))(per_input(4))
register_flops(*_packets("multilabel_margin_loss_backward"))(_per_second(2))


@register_flops(*_packets("_ctc_loss"))
def ctc_loss_flops(log_probs, targets, *args, out_val=None, **kwargs) -> int:
    """The alpha pass over log_alpha [batch, time, 2 * longest target + 1]: 6 per cell."""
    return 6 * numel(out_val[1])


@register_flops(*_packets("_ctc_loss_backward"))
def ctc_loss_backward_flops(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, *args,
                            out_val=None, **kwargs) -> int:
    """The beta pass and the gradient: 12 per lattice cell."""
    return 12 * numel(log_alpha)


# ---------------------------------------------------------------- distances, norms, windows
@register_flops(*_packets("_pdist_forward"))
def pdist_flops(x, *args, out_val=None, **kwargs) -> int:
    """[N, D]: N(N-1)/2 pairs, 3 per (pair, feature) as cdist counts."""
    return 3 * x.shape[-1] * numel(_first_out(out_val))


@register_flops(*_packets("_pdist_backward"))
def pdist_backward_flops(grad, x, *args, out_val=None, **kwargs) -> int:
    return 6 * x.shape[-1] * numel(grad)


@register_flops(*_packets("_cdist_backward"))
def cdist_backward_flops(grad, x1, x2, *args, out_val=None, **kwargs) -> int:
    return 6 * x1.shape[-1] * numel(grad)


register_flops(*_packets("dist"))(per_input(3))
register_flops(*_packets("trace"))(lambda x, *a, out_val=None, **k: min(x.shape[-2:]) if x.dim() >= 2 else 0)


@register_flops(*_packets("renorm", "renorm_"))
def renorm_flops(x, *args, out_val=None, **kwargs) -> int:
    return 3 * numel(x)


@register_flops(*_packets("embedding_renorm_"))
def embedding_renorm_flops(weight, indices, *args, out_val=None, **kwargs) -> int:
    """Norm of each referenced row (2 per element) and its rescale (1)."""
    return 3 * numel(indices) * (weight.shape[-1] if weight.dim() else 1)


register_flops(*_packets("linspace"))(per_output(2))
register_flops(*_packets("logspace"))(per_output(3))
register_flops(*_packets("hann_window", "hamming_window"))(per_output(3))
register_flops(*_packets("blackman_window"))(per_output(5))


# ---------------------------------------------------------------- nn.Transformer's inference fast path
def _tokens_of(t: torch.Tensor, embed_dim: int) -> int:
    """Tokens of [B, L, E] (or a nested tensor of sequences: its elements / E)."""
    return numel(t) // int(embed_dim) if embed_dim else 0


def _attention_flops(q_tokens: int, kv_tokens: int, batch: int, embed_dim: int) -> int:
    """Q, K, V projections, scores and weighted sum (4 * L * S * E per batch), softmax (5 per
    score and head is left out, as torch counts fused attention), output projection."""
    e = int(embed_dim)
    projections = 2 * q_tokens * e * e + 2 * 2 * kv_tokens * e * e + 2 * q_tokens * e * e
    scores = 4 * (q_tokens // max(batch, 1)) * (kv_tokens // max(batch, 1)) * e * batch
    return projections + scores


@register_flops(*_packets("_native_multi_head_attention"))
def native_mha_flops(query, key, value, embed_dim, num_head, *args, out_val=None, **kwargs) -> int:
    batch = query.shape[0] if query.dim() == 3 and not query.is_nested else 1
    return _attention_flops(_tokens_of(query, embed_dim), _tokens_of(key, embed_dim), batch, embed_dim)


@register_flops(*_packets("_transformer_encoder_layer_fwd"))
def transformer_encoder_layer_flops(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                    norm_bias_2, ffn_weight_1, *args, out_val=None, **kwargs) -> int:
    """Self-attention, two layer norms (7N + 2R), two residual adds, the feed-forward's two GEMMs
    and its activation (GELU 5, ReLU 1 per hidden element)."""
    tokens = _tokens_of(src, embed_dim)
    batch = src.shape[0] if src.dim() == 3 and not src.is_nested else 1
    hidden = ffn_weight_1.shape[0]
    n = tokens * int(embed_dim)
    return (_attention_flops(tokens, tokens, batch, embed_dim) + 2 * (7 * n + 2 * tokens) + 2 * n
            + 2 * 2 * tokens * int(embed_dim) * hidden + (5 if use_gelu else 1) * tokens * hidden)

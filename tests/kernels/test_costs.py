"""`KernelSpec.cost` checked by hand, one shape per family, and against the eager reference's own
traffic counted op by op (a TorchDispatchMode summing each aten op's input and output bytes).

The roofline and the advisor's predicted saving read these numbers, so a wrong count is a wrong
claim in the product. Unfused bytes = what the eager reference chain reads and writes; fused
bytes = one read of every input and one write of every output (+ the per-row stats saved).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import kernels

K = kernels.KERNELS
N, D = 64, 1024
E = N * D
_VIEWS = {"view", "_unsafe_view", "expand", "t", "slice", "detach", "unsqueeze", "alias",
          "transpose", "select", "reshape", "squeeze", "permute",
          "empty", "empty_like", "empty_strided"}  # allocations write nothing


class _Traffic(TorchDispatchMode):
    """Sums input + output bytes of every aten op that moves data (views move none)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in _VIEWS:
            for t in tree_flatten((args, kwargs or {}))[0] + tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.bytes += t.numel() * t.element_size()
        return out


def _measured(name: str, *args) -> int:
    with _Traffic() as m:
        K[name].reference(*args)
    return m.bytes


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def test_every_kernel_has_reference_cpu_triton_and_cost() -> None:
    assert len(K) >= 14
    for name, spec in K.items():
        assert {"cpu", "triton"} <= set(spec.providers), name
        assert callable(spec.reference) and callable(spec.cost), name
        assert spec.supports.dtypes and set(spec.supports.devices) == {"cpu", "cuda"}, name
    for name in ("layer_norm", "rms_norm", "add_layer_norm", "gelu", "bias_gelu", "softmax",
                 "cross_entropy", "adamw_step"):  # ATen has a fused op for these
        assert "aten" in K[name].providers, name


def test_layer_norm_fp32_by_hand() -> None:
    x, w, b = _t(N, D), _t(D), _t(D)
    c = K["layer_norm"].cost(x, w, b, 1e-5)
    # read x, write y, read w and b, write fp32 mean and rstd per row
    assert c.bytes_fused == 4 * E + 4 * E + 4 * D + 4 * D + 2 * 4 * N
    # mean(x) 1, x-mean 2, pow 2, mean 1, x-mean 2, *rstd 2, *w 2, +b 2 passes of 4E; + w, b
    assert c.bytes_unfused == 14 * 4 * E + 8 * D
    assert c.bytes_unfused == pytest.approx(_measured("layer_norm", x, w, b, 1e-5), rel=0.01)


def test_rms_norm_bf16_llama_by_hand() -> None:
    x, w = _t(N, D, dtype=torch.bfloat16), _t(D, dtype=torch.bfloat16)
    c = K["rms_norm"].cost(x, w, 1e-6, 0.0)
    assert c.bytes_fused == 2 * E + 2 * E + 2 * D + 4 * N  # x, y, w, rstd (RMS saves no mean)
    # x.float() 6E, pow 8E, mean 4E, *rstd 8E, .to(bf16) 6E, w * normed 4E (bf16), + w
    assert c.bytes_unfused == 36 * E + 2 * D
    assert c.bytes_unfused == pytest.approx(_measured("rms_norm", x, w, 1e-6, 0.0), rel=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "gemma", "add_layer_norm",
                                  "add_rms_norm", "add_gemma"])
def test_norm_unfused_matches_the_reference_traffic(case, dtype, with_params) -> None:
    x, r = _t(N, D, dtype=dtype), _t(N, D, dtype=dtype)
    w = _t(D, dtype=dtype) if with_params else None
    b = _t(D, dtype=dtype) if with_params else None
    args = {"layer_norm": (x, w, b, 1e-5), "rms_norm": (x, w, 1e-6, 0.0),
            "gemma": (x, w, 1e-6, 1.0), "add_layer_norm": (x, r, w, b, 1e-5),
            "add_rms_norm": (x, r, w, 1e-6), "add_gemma": (x, r, w, 1e-6, 1.0)}[case]
    name = {"gemma": "rms_norm", "add_gemma": "add_rms_norm"}.get(case, case)
    c = K[name].cost(*args)
    assert c.bytes_unfused == pytest.approx(_measured(name, *args), rel=0.01)  # per-row scalars aside
    assert c.bytes_fused < c.bytes_unfused


def test_activations_by_hand() -> None:
    x, b = _t(N, D, dtype=torch.bfloat16), _t(D, dtype=torch.bfloat16)
    c = K["bias_gelu"].cost(x, b, "tanh")
    assert c.bytes_fused == 2 * E * 2 + 2 * D  # read x, write y, read bias
    assert c.bytes_unfused == (2 * E * 2 + 2 * D) + 2 * E * 2  # x + b -> t, gelu(t)
    assert c.bytes_unfused == _measured("bias_gelu", x, b, "tanh")
    a, g = _t(N, D), _t(N, D)
    c = K["swiglu"].cost(a, g)
    assert (c.bytes_fused, c.bytes_unfused) == (3 * 4 * E, 5 * 4 * E)  # silu(a) -> t, t * b
    assert c.bytes_unfused == _measured("swiglu", a, g)
    c = K["gelu"].cost(a, "none")
    assert c.bytes_fused == c.bytes_unfused == 2 * 4 * E == _measured("gelu", a, "none")


def test_softmax_by_hand() -> None:
    x, mask = _t(N, D), _t(N, D)
    c = K["softmax"].cost(x, -1, 0.5, mask, False)
    assert c.bytes_fused == 3 * 4 * E  # read x and mask, write y
    assert c.bytes_unfused == (2 + 3 + 2) * 4 * E  # x * scale, + mask, softmax
    assert c.bytes_unfused == _measured("softmax", x, -1, 0.5, mask, False)


def test_rope_by_hand() -> None:
    s, d = 64, 128
    q, k = _t(2, 8, s, d), _t(2, 2, s, d)
    cos, sin = _t(s, d), _t(s, d)
    n, table = q.numel() + k.numel(), 2 * s * d * 4
    c = K["rope"].cost(q, k, cos, sin)
    assert c.bytes_fused == 2 * n * 4 + 2 * table  # q, k read + written; cos and sin per tensor
    assert c.bytes_unfused == 10 * n * 4 + 2 * table
    assert c.bytes_unfused == _measured("rope", q, k, cos, sin)


def test_cross_entropy_by_hand() -> None:
    v = 4099
    logits, target = _t(N, v), torch.randint(0, v, (N,))
    c = K["cross_entropy"].cost(logits, target)
    assert c.bytes_fused == N * v * 4 + N * (8 + 4 + 8)  # logits once; target, fp32 loss, (max, log_sum)
    assert c.bytes_unfused == 3 * N * v * 4 + N * (8 + 8)  # log_softmax (read + write), NLL read
    assert c.bytes_unfused == pytest.approx(_measured("cross_entropy", logits, target), rel=0.01)


def test_optimizers_by_hand() -> None:
    n = 1000
    p = _t(n)
    c = K["adamw_step"].cost(p)
    assert c.bytes_fused == 7 * 4 * n  # read g, p, m, v; write p, m, v
    assert c.bytes_unfused == 20 * 4 * n
    assert K["adamw_step"].cost(p, amsgrad=True).bytes_fused == 9 * 4 * n  # + max v read, written
    ps, gs, m, v, mx = [p.clone()], [_t(n)], [torch.zeros(n)], [torch.zeros(n)], [torch.zeros(n)]
    with _Traffic() as t:
        K["adamw_step"].reference(ps, gs, m, v, mx, [0], lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                                  weight_decay=0.01, amsgrad=False, maximize=False)
    assert t.bytes - 4 * n == c.bytes_unfused  # addcmul_(g, g) passes g twice: one read counted twice
    c = K["lamb_step"].cost(p)
    assert c.bytes_fused == 10 * 4 * n  # pass 1: g, p, m, v in, m, v out; pass 2: m, v, p in, p out
    assert c.bytes_unfused == 37 * 4 * n


def _fwd_bwd_traffic(fn) -> int:
    with _Traffic() as m:
        fn().backward()
    return m.bytes


def test_fused_linear_cross_entropy_by_hand() -> None:
    n, h, v, chunk = 512, 64, 4096, 128  # 4 chunks
    nv, nh, vh = n * v * 4, n * h * 4, v * h * 4
    t = torch.randint(0, v, (n,))

    def inputs():
        return _t(n, h).requires_grad_(), _t(v, h).requires_grad_()

    c = K["fused_linear_cross_entropy"].cost(*inputs(), t, None, chunk_size=chunk)
    # fused: logits written, CE-grad in place (read + write), read by the dx and dW matmuls;
    # x read twice + dx written; per chunk W read twice and the dW accumulator read + written
    assert c.bytes_fused == 5 * nv + 3 * nh + 4 * 2 * vh + 4 * 2 * vh
    # eager: linear 1, log_softmax 2, nll 1, nll backward 1, log_softmax backward 3, matmuls 2
    assert c.bytes_unfused == 10 * nv + 3 * nh + 3 * vh
    x, w = inputs()
    eager = _fwd_bwd_traffic(lambda: K["fused_linear_cross_entropy"].reference(x, w, t, None))
    # nll_loss_backward takes the logits for their shape only (- nv); per-row scalars aside
    assert eager - nv == pytest.approx(c.bytes_unfused, rel=1e-3)
    x, w = inputs()
    ours = _fwd_bwd_traffic(lambda: kernels.fused_linear_cross_entropy(x, w, t, None, chunk, provider="cpu"))
    # the in-place CE-grad op shows as a read only (+ nv); dW's zero fill is not counted (<3%)
    assert ours + nv == pytest.approx(c.bytes_fused, rel=0.03)

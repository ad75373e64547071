"""Chunked fused linear + cross-entropy vs the float64 truth (judged against eager's own error),
forward and backward: chunk sizes, options, layouts, NaN/Inf, autocast and mixed dtypes, partial
grads, bad input; its memory saving (peak RSS, in a subprocess)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.cross_entropy import CrossEntropyError
from kernels.linear_cross_entropy import SPEC as FLCE_SPEC
from kernels.linear_cross_entropy import _mm, default_chunk_size, fused_linear_cross_entropy
from tests.kernels.ce_cases import flce, targets
from tests.kernels.numerics import DTYPES, REPO_ROOT, check_against_reference, fwd_bwd, make

pytestmark = pytest.mark.usefixtures("cpu_provider")


@pytest.mark.parametrize("chunk_size", [1, 7, None])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", ["cpu", "aten"])
def test_fused_linear_cross_entropy_matches_float64(provider, dtype, chunk_size) -> None:
    x, w, b = make((2, 19, 48), dtype, 1), make((1003, 48), dtype, 2, scale=0.3), make((1003,), dtype, 3)
    t = targets(38, 1003, ignore_rows=(1, 20)).view(2, 19)
    check_against_reference(flce(provider, chunk_size), FLCE_SPEC.reference, [x, w, t, b], dtype,
                            names=["loss", "dx", "dW", "target", "db"])


@pytest.mark.parametrize("kw", [{"reduction": "sum"}, {"label_smoothing": 0.2}])
def test_fused_linear_cross_entropy_options(kw) -> None:
    x, w = make((13, 32), seed=4), make((301, 32), seed=5, scale=0.3)
    t = targets(13, 301, ignore_rows=(0, 5))
    check_against_reference(flce("cpu", 4), FLCE_SPEC.reference, [x, w, t, None], torch.float32, **kw)


@pytest.mark.parametrize("provider", ["cpu", "aten"])
def test_fused_linear_cross_entropy_non_contiguous_and_one_token(provider) -> None:
    x = make((13, 40), torch.float32, seed=8, layout="transposed")  # a transposed view: stride 13
    w = make((97, 40), torch.float32, seed=9, scale=0.3, layout="transposed")
    assert not x.is_contiguous() and not w.is_contiguous()
    check_against_reference(flce(provider, 4), FLCE_SPEC.reference, [x, w, targets(13, 97), None],
                            torch.float32, names=["loss", "dx", "dW", "target", "db"])
    one = make((1, 24), torch.float32, seed=10)
    check_against_reference(flce(provider, None), FLCE_SPEC.reference,
                            [one, make((31, 24), seed=11), torch.tensor([30]), make((31,), seed=12)],
                            torch.float32, names=["loss", "dx", "dW", "target", "db"])


@pytest.mark.parametrize("provider", ["cpu", "aten"])
def test_fused_linear_cross_entropy_nan_inf_propagate_like_reference(provider) -> None:
    x, w = make((6, 16), seed=13), make((21, 16), seed=14, scale=0.3)
    x[2, 3] = float("nan")
    x[4, 0] = float("inf")
    t = torch.tensor([0, 5, 20, 1, 2, -100])
    ours = fwd_bwd(flce(provider, 2), [x, w, t, None], reduction="sum")
    truth = fwd_bwd(FLCE_SPEC.reference, [x.double(), w.double(), t, None], reduction="sum")
    for o, tr, name in zip(ours, truth, ["loss", "dx", "dW"]):
        assert torch.equal(o.isnan(), tr.isnan()), name
        assert torch.equal(o.isinf(), tr.isinf()), name
    assert ours[0].isnan()  # a NaN token makes the summed loss NaN, as eager does


@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("provider", ["cpu", "aten"])
def test_fused_linear_cross_entropy_under_autocast(provider, with_bias) -> None:
    """CPU autocast with fp32 x and weights (mixed-precision training): the chunk matmuls were
    autocast to bf16 while writing fp32 `out=` buffers and raised. Now the projection runs in bf16
    as eager's F.linear does, the loss comes back in fp32 as F.cross_entropy's, the grads in the
    leaves' dtype; each within 2x eager autocast's own error against float64 (plus bf16's eps)."""
    x, w = make((3, 21, 64), seed=15), make((2003, 64), seed=16, scale=0.2)
    b = make((2003,), seed=17) if with_bias else None
    t = targets(63, 2003, ignore_rows=(2, 40)).view(3, 21)

    def run(fn, dtype_cast=None):
        leaves = [v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point()
                  else v for v in (x, w, b)]
        if dtype_cast is not None:
            leaves = [v.detach().to(dtype_cast).requires_grad_() if v is not None else None for v in leaves]
            loss = fn(*leaves)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = fn(*leaves)
        loss.backward()
        return [loss.detach()] + [v.grad for v in leaves if v is not None]

    ours = run(lambda x_, w_, b_: fused_linear_cross_entropy(x_, w_, t, b_, chunk_size=16, provider=provider))
    eager = run(lambda x_, w_, b_: FLCE_SPEC.reference(x_, w_, t, b_))
    truth = run(lambda x_, w_, b_: FLCE_SPEC.reference(x_, w_, t, b_), torch.float64)
    assert ours[0].dtype == eager[0].dtype == torch.float32
    for o, e, tr, name in zip(ours, eager, truth, ["loss", "dx", "dW", "db"]):
        assert o.dtype == e.dtype, name
        err, err_eager = (o.double() - tr).abs().max().item(), (e.double() - tr).abs().max().item()
        assert err <= 2 * err_eager + 2 ** -8 * tr.abs().max().item(), (name, err, err_eager)


def test_fused_linear_cross_entropy_mixed_dtypes_need_autocast() -> None:
    """bf16 hidden states with an fp32 head: eager's F.linear takes them under autocast only; so do we."""
    x, w, t = make((16, 32), torch.bfloat16, 20), make((300, 32), seed=21, scale=0.3), targets(16, 300)
    with pytest.raises(CrossEntropyError, match="share a dtype"):
        fused_linear_cross_entropy(x, w, t, provider="cpu")
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(xs, ws, t, provider="cpu")
        want = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w), t)
    loss.backward()
    assert loss.dtype == torch.float32 and xs.grad.dtype == torch.bfloat16 and ws.grad.dtype == torch.float32
    torch.testing.assert_close(loss, want, rtol=1e-2, atol=1e-2)


def test_fused_linear_cross_entropy_partial_grads_and_no_grad() -> None:
    x, w, t = make((10, 16), seed=6), make((50, 16), seed=7), targets(10, 50)
    xg = x.clone().requires_grad_()
    loss = fused_linear_cross_entropy(xg, w, t, chunk_size=3, provider="cpu")  # frozen weight
    (3.0 * loss).backward()
    xr = x.double().requires_grad_()
    (3.0 * FLCE_SPEC.reference(xr, w.double(), t)).backward()
    assert torch.allclose(xg.grad.double(), xr.grad, atol=1e-6)
    with torch.no_grad():
        plain = fused_linear_cross_entropy(x, w, t, chunk_size=4, provider="cpu")
    assert torch.allclose(plain.double(), FLCE_SPEC.reference(x.double(), w.double(), t), atol=1e-5)



class _InnerDimOneProducts(TorchDispatchMode):
    """Records the bf16 matmuls (mm, addmm) with inner dimension 1 that reach ATen."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.default,
                    torch.ops.aten.addmm.out, torch.ops.aten.addmm_.default):
            a = args[0] if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out) else args[1]
            if a.dtype == torch.bfloat16 and a.shape[1] == 1:
                self.seen.append((func.__name__, tuple(a.shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("provider", ["cpu", "aten"])
def test_bf16_products_with_inner_dim_one_skip_the_gemm(provider) -> None:
    """torch 2.13's oneDNN corrupts the heap on bf16 matmuls with k = 1 (a pure-torch repro:
    tests/kernels/repro_onednn_bf16_k1.py). A 1-row chunk's dW (k = 1), hidden 1 and vocab 1 now
    run as outer products, rounded once as the GEMM rounds: bit-equal to torch.mm here."""
    shapes = [((5, 16), (40, 16), 2, "contiguous"), ((5, 1), (40, 1), 3, "contiguous"),  # 1-row chunk, H=1
              ((4, 16), (1, 16), 3, "contiguous"), ((7, 1), (1, 1), 64, "transposed")]  # V=1; [7, 1] stride (1, 7)
    for (xs, ws, chunk, layout) in shapes:
        x = make(xs, torch.bfloat16, 30, layout=layout).requires_grad_()
        w = make(ws, torch.bfloat16, 31).requires_grad_()
        b = make((ws[0],), torch.bfloat16, 32).requires_grad_()
        with _InnerDimOneProducts() as seen:
            fused_linear_cross_entropy(x, w, targets(xs[0], ws[0]), b, chunk_size=chunk,
                                       provider=provider).backward()
        assert seen.seen == [], (xs, ws, seen.seen)
        assert x.grad.isfinite().all() and w.grad.isfinite().all() and b.grad.isfinite().all()
    a, m = make((33, 1), torch.bfloat16, 33), make((1, 47), torch.bfloat16, 34, layout="transposed")
    bias = make((47,), torch.bfloat16, 35)
    assert torch.equal(_mm(a, m), torch.mm(a, m))  # one k = 1 product alone is safe
    assert torch.equal(_mm(a, m, bias), torch.addmm(bias, a, m))
    out = torch.full((40, 47), float("nan"), dtype=torch.bfloat16)
    _mm(a, m, out=out[2:35])
    assert torch.equal(out[2:35], torch.mm(a, m)) and out[:2].isnan().all() and out[35:].isnan().all()

@pytest.mark.parametrize("args, kw, message", [
    (((4, 8), (10, 8), (4,)), {"reduction": "none"}, "reduction"),
    (((4, 8), (10, 9), (4,)), {}, "weight"),
    (((4, 8), (10, 8), (5,)), {}, "target"),
    (((0, 8), (10, 8), (0,)), {}, "empty"),
    (((4, 8), (10, 8), (4,)), {"chunk_size": 0}, "chunk_size"),
])
def test_fused_linear_cross_entropy_bad_input(args, kw, message) -> None:
    xs, ws, ts = args
    with pytest.raises(CrossEntropyError, match=message):
        fused_linear_cross_entropy(torch.zeros(xs), torch.zeros(ws), torch.zeros(ts, dtype=torch.long), **kw)


def test_default_chunk_size_keeps_chunk_logits_near_x() -> None:
    c = default_chunk_size(4096, 768, 32000)
    assert c == 128 and c * 32000 <= 2 * 4096 * 768 * 2
    assert default_chunk_size(1, 768, 32000) == 1 and default_chunk_size(0, 768, 32000) == 1


_MEMORY_SCRIPT = """
import json, sys, torch, torch.nn.functional as F
from benchmarks.kernels.memory_probe import peak_rss_delta_bytes
from kernels.linear_cross_entropy import fused_linear_cross_entropy
variant = sys.argv[1]
fns = {"fused": lambda x, w, t: fused_linear_cross_entropy(x, w, t, provider="cpu"),
       "unfused": lambda x, w, t: F.cross_entropy(x @ w.T, t)}
def run(n, h, v):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=g).requires_grad_()
    w = (0.05 * torch.randn(v, h, generator=g)).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    return x, w, t
def step(x, w, t):
    loss = fns[variant](x, w, t)
    loss.backward()
    return float(loss.detach())
step(*run(8, 16, 64))  # load the C++ ops and start the threads, outside the measurement
x, w, t = run(1024, 256, 32000)
loss, peak = peak_rss_delta_bytes(lambda: step(x, w, t))
print(json.dumps(dict(peak=peak, loss=loss, dx_sum=float(x.grad.double().abs().sum()))))
"""


def _peak(variant: str) -> dict:
    import os

    proc = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, variant], cwd=REPO_ROOT,
                          text=True, capture_output=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fused_linear_cross_entropy_peak_memory_is_much_smaller() -> None:
    """Each variant in a fresh process: peak RSS above the post-setup baseline, fwd + bwd."""
    from benchmarks.kernels.memory_probe import available

    reason = available()
    if reason:
        pytest.skip(reason)
    fused, unfused = _peak("fused"), _peak("unfused")
    logits_bytes = 1024 * 32000 * 4  # 131 MB
    grads_bytes = (1024 + 32000) * 256 * 4  # dx + dW: 34 MB, needed by both
    # unfused holds the logits, the log-probs and their gradients: several logits tensors
    assert unfused["peak"] > 2 * logits_bytes, (fused, unfused)
    # fused: dW + dx + one [128, 32000] chunk (+ allocator slack): under one logits tensor
    assert fused["peak"] < grads_bytes + 0.5 * logits_bytes, (fused, unfused)
    assert fused["peak"] * 3 < unfused["peak"], (fused, unfused)
    assert fused["loss"] == pytest.approx(unfused["loss"], rel=1e-5)
    assert fused["dx_sum"] == pytest.approx(unfused["dx_sum"], rel=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU check)")
def test_fused_linear_cross_entropy_under_autocast_cuda() -> None:
    """The triton provider under CUDA autocast (bf16): as eager's F.linear + F.cross_entropy."""
    x0, w0 = make((256, 128), seed=18).cuda(), make((5003, 128), seed=19, scale=0.2).cuda()
    t = targets(256, 5003, ignore_rows=(3,)).cuda()
    out = []
    for fn in (lambda x, w: fused_linear_cross_entropy(x, w, t, provider="triton"),
               lambda x, w: FLCE_SPEC.reference(x, w, t)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(x, w)
        loss.backward()
        out.append((loss.detach(), x.grad, w.grad))
    (lo, gx, gw), (le, ex, ew) = out
    assert lo.dtype == le.dtype == torch.float32 and gx.dtype == gw.dtype == torch.float32
    torch.testing.assert_close(lo, le, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx, ex, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(gw, ew, rtol=2e-2, atol=2e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the GPU check)")
def test_fused_linear_cross_entropy_in_a_cuda_graph_cuda() -> None:
    """No host read on the GPU (the mean's count stays on the device): forward and backward are
    captured in one CUDA graph, and a replay with new targets (another ignored count) gives
    eager's loss and grads for those targets."""
    x = make((64, 128), seed=30).cuda().requires_grad_()
    w = make((1001, 128), seed=31, scale=0.2).cuda().requires_grad_()
    t = targets(64, 1001, ignore_rows=(2, 9)).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        for _ in range(2):
            x.grad = w.grad = None
            fused_linear_cross_entropy(x, w, t, provider="triton").backward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # an eager call makes no synchronizing call either
    try:
        fused_linear_cross_entropy(x, w, t, provider="triton").backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = fused_linear_cross_entropy(x, w, t, provider="triton")
        loss.backward()
    t.copy_(targets(64, 1001, seed=1, ignore_rows=(0, 5, 6, 40)).cuda())
    graph.replay()
    torch.cuda.synchronize()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = FLCE_SPEC.reference(xr, wr, t)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-3, atol=1e-5)

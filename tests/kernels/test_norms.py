"""CPU (C++) norm kernels vs the float64 truth, judged against eager's own error; modules;
provider choice and reasons; zero-size inputs; NaN/Inf; costs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import norms
from kernels.registry import KERNELS, dispatch, select_provider, why_not
from tests.kernels.norm_cases import CASES
from tests.kernels.numerics import (AWKWARD_2D, BATCHED, DTYPES, assert_matches, check_against_reference, eps,
                                    fwd_bwd, make, to_f64, with_nonfinite)


pytestmark = pytest.mark.usefixtures("cpu_provider")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", AWKWARD_2D + BATCHED, ids=str)
@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "rms_norm_gemma", "add_layer_norm", "add_rms_norm"])
def test_matches_float64(case: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    CASES[case].check("cpu", shape, dtype)


@pytest.mark.parametrize("case", ["layer_norm_plain", "layer_norm_no_bias", "rms_norm_plain", "add_rms_norm_gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optional_parameters(case: str, dtype: torch.dtype) -> None:
    CASES[case].check("cpu", (17, 129), dtype)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_non_contiguous(case: str, layout: str) -> None:
    args = CASES[case].inputs((6, 40), torch.float32, layout)
    assert not args[0].is_contiguous()
    CASES[case].check("cpu", (6, 40), torch.float32, args=args)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["layer_norm", "rms_norm"])
def test_weight_grads_over_many_row_chunks(case: str, threads: int) -> None:
    """Many short rows: the per-chunk partial sums and their reduction must add up exactly once."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        CASES[case].check("cpu", (1999, 33), torch.float32)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "rms_norm_gemma", "add_layer_norm", "add_rms_norm"])
def test_nan_inf_propagate_like_reference(case: str) -> None:
    c = CASES[case]
    args = c.inputs((4, 9), torch.float32)
    args[0] = with_nonfinite(args[0], row=1)
    c.check("cpu", (4, 9), torch.float32, args=args)  # backward too: NaN rows poison dw like eager


@pytest.mark.parametrize("shape", [(0, 8), (3, 0), (2, 0, 5)], ids=str)
@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_zero_size(case: str, shape: tuple[int, ...]) -> None:
    c = CASES[case]
    args = c.inputs(shape, torch.float32)
    ours = fwd_bwd(c.ours("cpu"), args)
    eager = fwd_bwd(c.reference, args)
    for o, e in zip(ours, eager):
        assert (o is None) == (e is None)
        if o is not None:
            assert o.shape == e.shape
            if o.numel() and not e.isnan().any():  # weight grads over zero rows are zeros
                assert torch.equal(o, e)


def test_gemma_offset_and_llama_casting_differ_as_hf_does() -> None:
    """bf16: llama casting rounds before the weight, gemma after; each matches its own reference."""
    x = make((8, 64), torch.bfloat16, 1)
    w = make((64,), torch.bfloat16, 2, scale=0.5)
    llama = kernels.rms_norm(x, w, 1e-6, 1.0, casting="llama", provider="cpu")
    gemma = kernels.rms_norm(x, w, 1e-6, 1.0, provider="cpu")
    assert torch.equal(llama, norms.rms_norm_reference(x, w, 1e-6, 1.0, "llama"))
    assert torch.equal(gemma, norms.rms_norm_reference(x, w, 1e-6, 1.0, "gemma"))
    assert not torch.equal(llama, gemma)
    with pytest.raises(ValueError, match="casting"):
        kernels.rms_norm(x, w, 1e-6, casting="t5", provider="cpu")


def _hf_llama_rms_norm(weight: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm.forward, written out independently of kernels.norms."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_module_matches_hf_llama_rms_norm(dtype: torch.dtype) -> None:
    m = norms.RMSNorm(96, eps=1e-6, provider="cpu", dtype=dtype)
    with torch.no_grad():
        m.weight.copy_(make((96,), dtype, 5, shift=1.0))
    x = make((2, 5, 96), dtype, 6)
    ours, hf = m(x), _hf_llama_rms_norm(m.weight, x, 1e-6)
    assert_matches([ours], [hf], [_hf_llama_rms_norm(m.weight.double(), x.double(), 1e-6)], dtype)


def test_layer_norm_module_is_a_drop_in_for_nn_layer_norm() -> None:
    ref = torch.nn.LayerNorm(48)
    ours = norms.LayerNorm(48, provider="cpu")
    ours.load_state_dict(ref.state_dict())
    x = make((3, 7, 48), torch.float32, 3)
    assert torch.allclose(ours(x), ref(x), atol=1e-5)


@pytest.mark.parametrize("affine", [True, False])
def test_rms_module_is_a_drop_in_for_nn_rms_norm(affine: bool) -> None:
    """torch.nn.RMSNorm's keywords and state dict; without a weight there is none to load."""
    ref = torch.nn.RMSNorm(48, eps=1e-6, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ref.weight.copy_(make((48,), torch.float32, 4, shift=1.0))
    ours = norms.RMSNorm(48, eps=1e-6, provider="cpu", elementwise_affine=affine)
    ours.load_state_dict(ref.state_dict())
    assert (ours.weight is None) == (not affine) and repr(ours).startswith("RMSNorm(48, eps=1e-06")
    x = make((3, 7, 48), torch.float32, 3).requires_grad_()
    got, want = ours(x), ref(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    g_got, = torch.autograd.grad(got.square().sum(), x)
    g_want, = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rms_module_takes_nn_rms_norms_defaults(dtype) -> None:
    """nn.RMSNorm(n) has eps=None (fp32's epsilon for 16- and 32-bit inputs) and takes a
    normalized_shape; eps=None used to reach the op and raise, and RMSNorm((4, 48)) built a
    [4, 48] weight that broadcast instead of normalizing over both dims as torch does."""
    ref = torch.nn.RMSNorm([48], dtype=dtype)
    ours = norms.RMSNorm([48], eps=ref.eps, provider="cpu", dtype=dtype)
    x = (make((5, 48), torch.float32, 6) * 1e-3).to(dtype)  # small: eps matters
    truth = F.rms_norm(x.double(), (48,), None, torch.finfo(torch.float32).eps)
    torch.testing.assert_close(ours(x).double(), truth, rtol=eps(dtype) * 4, atol=eps(dtype) * 4)
    assert ours.eps is None and norms.rms_norm(x, None, None, provider="cpu").shape == x.shape


@pytest.mark.parametrize("shape", [(5, 7), (3, 5, 7)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_modules_normalize_several_trailing_dims_as_torchs_do(kind: str, dtype, shape) -> None:
    """normalized_shape with several dims (torch's modules take it) is normalized as one dim, weight
    and bias keep torch's shape (state dicts load both ways); forward and the x, weight and bias
    grads against torch's module in float64, on a contiguous and a transposed input. A shape that
    does not match the input's trailing dims is one clear error."""
    x = make((2, 3, 5, 7), dtype, 3)
    g = make((2, 3, 5, 7), dtype, 4)
    torch_cls = torch.nn.LayerNorm if kind == "layer" else torch.nn.RMSNorm
    truth_mod = torch_cls(shape, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        for i, p in enumerate(truth_mod.parameters()):
            p.copy_(make(p.shape, torch.float64, 10 + i, shift=1.0))
    ours = (kernels.LayerNorm if kind == "layer" else kernels.RMSNorm)(shape, eps=1e-5, provider="cpu", dtype=dtype)
    ours.load_state_dict({k: v.to(dtype) for k, v in truth_mod.state_dict().items()})
    eager = torch_cls(shape, eps=1e-5, dtype=dtype)
    eager.load_state_dict(ours.state_dict())
    for inp, grad in ((x, g), (x.transpose(0, 1).contiguous().transpose(0, 1), g)):
        results = []
        for mod, cast in ((ours, dtype), (eager, dtype), (truth_mod, torch.float64)):
            leaf = inp.detach().to(cast).requires_grad_()
            out = mod(leaf)
            grads = torch.autograd.grad(out, [leaf, *mod.parameters()], grad.to(cast))
            results.append([out, *grads])
        assert_matches(*results, dtype)
    with pytest.raises(ValueError, match="trailing dims"):
        ours(make((2, 3, 7, 5), dtype, 5))


def test_add_modules_return_sum_and_normed() -> None:
    x, r = make((5, 32), torch.float32, 1), make((5, 32), torch.float32, 2)
    s, y = norms.AddRMSNorm(32, provider="cpu")(x, r)
    assert torch.equal(s, x + r)
    assert torch.allclose(y, F.rms_norm(x + r, (32,), eps=1e-6), atol=1e-6)
    s, y = norms.AddLayerNorm(32, provider="cpu")(x, r)
    assert torch.allclose(y, F.layer_norm(x + r, (32,)), atol=1e-5)


def test_auto_provider_on_cpu_is_cpu() -> None:
    x = make((4, 16), torch.float32)
    chosen, skipped = select_provider(KERNELS["layer_norm"], (x, None, None, 1e-5), {})
    assert chosen == "cpu" and skipped == {}


def test_unsupported_calls_fall_back_with_reasons() -> None:
    x64 = make((4, 16), torch.float64)
    chosen, skipped = select_provider(KERNELS["rms_norm"], (x64, None, 1e-6), {})
    assert chosen == "reference" and "float64" in skipped["cpu"]
    out = kernels.rms_norm(x64, None)  # runs (on the reference)
    assert out.dtype == torch.float64
    x, w16 = make((4, 16), torch.float32), make((16,), torch.bfloat16)  # a weight below x's dtype
    chosen, skipped = select_provider(KERNELS["layer_norm"], (x, w16, None, 1e-5), {})
    assert chosen == "reference" and "mixed dtypes" in skipped["cpu"]
    with pytest.raises(ValueError, match="mixed dtypes"):
        kernels.layer_norm(x, w16, None, provider="cpu")
    xb = make((4, 16), torch.bfloat16)
    with pytest.raises(ValueError, match="mixed dtypes"):
        kernels.layer_norm(xb, make((16,), torch.float64), provider="cpu")
    with pytest.raises(ValueError, match="residual .* does not match"):  # eager would promote
        kernels.add_rms_norm(xb, make((4, 16), torch.float32), None, provider="cpu")
    with pytest.raises(ValueError, match="residual .* does not match"):  # eager would broadcast
        kernels.add_layer_norm(xb, make((16,), torch.bfloat16), provider="cpu")
    with pytest.raises(ValueError, match="does not match the last dim"):
        kernels.layer_norm(xb, make((15,), torch.bfloat16), provider="cpu")


@pytest.mark.parametrize("shape", [(1, 8), (17, 4099), (2, 3, 7, 64)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", ["layer_norm", "layer_norm_no_bias", "rms_norm", "rms_norm_gemma",
                                  "add_layer_norm", "add_rms_norm", "add_rms_norm_gemma"])
def test_mixed_precision_parameters(case: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """fp32 weight and bias on a bf16/fp16 input (CPU autocast, fp32 master weights): fused, with
    eager's output dtype (x's; llama casting promotes to fp32) and fp32 parameter grads."""
    c = CASES[case]
    c.check("cpu", shape, dtype, args=c.inputs(shape, dtype, param_dtype=torch.float32))


def test_mixed_precision_is_fused_not_the_reference() -> None:
    """The automatic choice no longer falls back to the eager chain (36x slower at 4096x768)."""
    x = make((64, 256), torch.bfloat16)
    w, b = make((256,), torch.float32, 1), make((256,), torch.float32, 2)
    for name, args in (("layer_norm", (x, w, b, 1e-5)), ("rms_norm", (x, w, 1e-6)),
                       ("rms_norm", (x, w, 1e-6, 1.0)), ("add_rms_norm", (x, x, w, 1e-6))):
        chosen, skipped = select_provider(KERNELS[name], args, {})
        assert chosen == "cpu" and not skipped, (name, skipped)
    y = kernels.rms_norm(x, w, 1e-6, provider="cpu")  # llama casting: weight * bf16 normed, in fp32
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, norms.rms_norm_reference(x, w, 1e-6), rtol=1e-2, atol=1e-2)
    assert kernels.rms_norm(x, w, 1e-6, 1.0, provider="cpu").dtype == torch.bfloat16  # gemma: x's dtype


def test_aten_layer_norm_takes_mixed_parameters_on_cpu_only() -> None:
    x = make((4, 16), torch.bfloat16)
    w, b = make((16,), torch.float32, 1), make((16,), torch.float32, 2)
    assert norms._aten_ln_dtypes(x, w, None, 1e-5) is None
    assert norms._aten_ln_dtypes(x, w, b, 1e-5) is None
    assert "CPU only" in norms._aten_ln_dtypes(x.to("meta"), w.to("meta"), None, 1e-5)
    assert norms._aten_ln_dtypes(x.to("meta"), w.to("meta").bfloat16(), None, 1e-5) is None


@pytest.mark.parametrize("name", ["layer_norm", "add_layer_norm"])
def test_aten_is_not_admitted_for_an_fp32_bias_alone_on_low_precision(name: str) -> None:
    """F.layer_norm's backward raises for a bf16/fp16 x with an fp32 bias and no weight (found by
    tests/kernels/fuzz.py: the aten provider admitted it); add_layer_norm judges x + residual's
    dtype (an fp32 residual makes the sum fp32, where F.layer_norm takes anything fp32)."""
    for dtype in (torch.bfloat16, torch.float16):
        x, b = make((4, 16), dtype), make((16,), torch.float32, 2)
        args = [x, None, b, 1e-5] if name == "layer_norm" else [x, make((4, 16), dtype, 3), None, b, 1e-5]
        assert "backward raises" in why_not(KERNELS[name], "aten", tuple(args), {})
        check_against_reference(getattr(kernels, name), KERNELS[name].reference, args, dtype)  # the automatic choice
    x = make((4, 16), torch.bfloat16)
    assert norms._aten_add_ln_dtypes(x, x.float(), None, make((16,), torch.float32, 2)) is None


@pytest.mark.parametrize("name", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("params", [("float32", "bfloat16"), ("bfloat16", "float32"), ("float16", "float32")])
def test_aten_refuses_what_f_layer_norm_raises_on(name: str, params: tuple[str, str]) -> None:
    """One fp32 and one low-precision parameter: F.layer_norm raises on CPU ("expect parameter to
    have scalar type of Float"), so the aten provider says why instead; the others run it."""
    x = make((4, 16), torch.bfloat16)
    w, b = (make((16,), getattr(torch, d), i) for i, d in enumerate(params, 1))
    args = (x, w, b, 1e-5) if name == "layer_norm" else (x, x.clone(), w, b, 1e-5)
    with pytest.raises(RuntimeError):
        F.layer_norm(x, (16,), w, b)
    assert why_not(KERNELS[name], "aten", args, {})  # ours, or the kernel's own check (fp16 on bf16)
    with pytest.raises(ValueError, match="aten.*unavailable"):
        dispatch(name, *args, provider="aten")
    ref = dispatch(name, *args, provider="reference")
    chosen, _ = select_provider(KERNELS[name], args, {})
    out = dispatch(name, *args, provider=chosen)
    for a, e in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2)


def test_explicit_triton_without_gpu_or_interpreter_raises_with_reason(monkeypatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = make((4, 16), torch.float32)
    with pytest.raises(ValueError, match="triton.*unavailable: (no CUDA GPU|Triton not installed|provider triton does not run on cpu)"):
        kernels.layer_norm(x, provider="triton")


def test_aten_provider_rms_only_in_fp32() -> None:
    x = make((4, 16), torch.bfloat16)
    with pytest.raises(ValueError, match="F.rms_norm rounds differently"):
        kernels.rms_norm(x, None, provider="aten")
    xf = make((4, 16), torch.float32)
    w = make((16,), torch.float32, 1)
    assert torch.allclose(kernels.rms_norm(xf, w, provider="aten"), norms.rms_norm_reference(xf, w), atol=1e-6)


def test_cost_counts_bytes_of_fused_and_unfused_chains() -> None:
    x = torch.empty(4096, 768)
    w = torch.empty(768)
    c = KERNELS["layer_norm"].cost(x, w, w, 1e-5)
    e = 4096 * 768
    assert c.bytes_fused == 2 * e * 4 + 2 * 768 * 4 + 2 * 4096 * 4
    # the eager reference: mean, x-mean, pow, mean, x-mean, *rstd, *w, +b = 14 passes (+ w, b)
    assert c.bytes_unfused == 14 * e * 4 + 2 * 768 * 4
    a = KERNELS["add_rms_norm"].cost(x, x, w, 1e-6)
    assert a.bytes_fused == 4 * e * 4 + 768 * 4 + 4096 * 4  # RMSNorm saves rstd only
    xb = torch.empty(4096, 768, dtype=torch.bfloat16)  # fp32 weight, llama casting: y is fp32
    assert KERNELS["rms_norm"].cost(xb, w, 1e-6).bytes_fused == e * 2 + e * 4 + 768 * 4 + 4096 * 4
    assert KERNELS["rms_norm"].cost(xb, w, 1e-6, 1.0).bytes_fused == 2 * e * 2 + 768 * 4 + 4096 * 4
    assert c.flops > 0 and a.flops > 0


def test_inference_path_skips_autograd() -> None:
    x = make((4, 16), torch.float32).requires_grad_()
    with torch.no_grad():
        y = kernels.layer_norm(x, provider="cpu")
    assert y.grad_fn is None
    truth = norms.layer_norm_reference(to_f64(x))
    assert torch.allclose(y.double(), truth, atol=1e-5)


def test_streamed_outputs_path_matches_float64() -> None:
    """Large outputs use non-temporal stores; force that path on small shapes in a subprocess."""
    import os
    import subprocess
    import sys

    from tests.kernels.numerics import REPO_ROOT

    env = dict(os.environ, FUSIONLENS_CPU_STREAM_BYTES="0", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-c", "from tests.kernels.norm_cases import run_cpu_streaming; "
                           "print('checks', run_cpu_streaming())"], cwd=REPO_ROOT, env=env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "38"


# Shapes that hit every loop of the C++ row kernels for each vector width (16/8/4 floats): the
# 4-vector main loop, the 1-vector loop and the scalar tail (83 = 64 + 16 + 3 = 2*32 + 2*8 + 3,
# 23 = 16 + 4 + 3), and the backward's row blocks (9 rows = two blocks of 4 + one row alone).
ISA_SHAPES: tuple[tuple[int, int], ...] = ((9, 83), (6, 23), (5, 4117))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "base"])
@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "rms_norm_gemma", "add_layer_norm", "add_rms_norm"])
def test_every_instruction_set_copy_matches_float64(case: str, isa: str, monkeypatch) -> None:
    """norms.cpp holds one copy of its kernels per instruction set, picked at run time;
    FUSIONLENS_CPU_ISA picks one, so each copy this CPU can run is checked here."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    order = ["base", "avx2", "avx512"]
    picked = torch.ops.fusionlens.norms_isa()
    assert order.index(picked) <= order.index(isa)  # never above what was asked (or what the CPU has)
    for dtype in DTYPES:
        for shape in ISA_SHAPES:
            CASES[case].check("cpu", shape, dtype)
    for shape in ISA_SHAPES:  # fp32 parameters on bf16 rows (llama casting: the fp32-output copy)
        c = CASES[case]
        c.check("cpu", shape, torch.bfloat16, args=c.inputs(shape, torch.bfloat16, param_dtype=torch.float32))


def test_default_instruction_set_copy_is_at_most_avx2(monkeypatch) -> None:
    """AVX2 by default for float32/float16 (measured faster than AVX-512 on Zen 4), the best copy the
    CPU has for bfloat16 (AVX-512 measured faster); lower only where the CPU lacks it."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", "avx512")  # never above what the CPU has: its best copy
    best = torch.ops.fusionlens.norms_isa(torch.bfloat16)
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", "avx2")  # the override applies to every dtype
    assert torch.ops.fusionlens.norms_isa(torch.bfloat16) in ("avx2", "base")
    monkeypatch.delenv("FUSIONLENS_CPU_ISA")
    assert torch.ops.fusionlens.norms_isa() in ("avx2", "base")
    assert torch.ops.fusionlens.norms_isa(torch.float16) in ("avx2", "base")
    assert torch.ops.fusionlens.norms_isa(torch.bfloat16) == best


def test_unknown_instruction_set_name_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", "sse9")
    with pytest.raises(RuntimeError, match="FUSIONLENS_CPU_ISA must be avx512, avx2 or base"):
        kernels.layer_norm(make((2, 8), torch.float32), provider="cpu")


# Rows run in passes with a prefetch of the next row in batches of 64 columns, and the backward
# adds each row to its chunk's weight/bias partials: widths around the batch and vector sizes,
# 1 row, and more rows than chunks at 1 and 2 threads (chunk ends stop the prefetch).
LN_PASS_SHAPES: tuple[tuple[int, int], ...] = ((1, 64), (2, 65), (3, 127), (4, 129), (33, 768), (301, 200))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["layer_norm", "add_layer_norm", "layer_norm_plain", "rms_norm", "rms_norm_gemma",
                                  "add_rms_norm"])
def test_row_passes_and_prefetch_tails(case: str, dtype: torch.dtype, threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape in LN_PASS_SHAPES:
            CASES[case].check("cpu", shape, dtype)
    finally:
        torch.set_num_threads(before)


def _bits_with_nan(t: torch.Tensor) -> torch.Tensor:
    """int16 bits of a 16-bit tensor, every NaN as one value (NaN sign/payload bits are not compared)."""
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int16)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "base"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_layer_norm_16bit_rounds_exactly_like_its_fp32_run(isa: str, dtype: torch.dtype, monkeypatch) -> None:
    """16-bit rows are converted in registers (load and rounded store per vector): y, dx, dw, db of a
    16-bit call must be bit for bit our fp32 call on the same values, rounded by torch's `.to()`."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    g = torch.Generator().manual_seed(5)
    m, n = 7, 83  # vector loops and scalar tails at every width
    x = (torch.randn(m, n, generator=g) * 3 + 1).to(dtype)
    x[2, 5], x[4, 0] = float("inf"), float("nan")  # NaN rows in y and dx
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    b = (0.1 * torch.randn(n, generator=g)).to(dtype)
    dy = torch.randn(m, n, generator=g).to(dtype)
    outs = {}
    for dt in (dtype, torch.float32):
        args = [t.to(dt).requires_grad_(True) for t in (x, w, b)]
        y = kernels.layer_norm(*args, 1e-5, provider="cpu")
        outs[dt] = (y, *torch.autograd.grad(y, args, dy.to(dt)))
    for low, ref in zip(outs[dtype], outs[torch.float32]):
        assert low.dtype == dtype
        assert torch.equal(_bits_with_nan(low), _bits_with_nan(ref.to(dtype)))


@pytest.mark.parametrize("bits", [0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001], ids=hex)
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_fp32_weight_nan_payloads_stay_nan_on_bf16_rows(name: str, bits: int) -> None:
    """bf16 rows are rounded by an integer add that skips its NaN select when no fp32 operand is NaN
    (a NaN from bf16 data has zero low bits and survives it); a NaN weight whose low bits would
    carry (0x7FFFFFFF + 0x8000 is -0 as bf16) must take the guarded rounding, forward and backward."""
    g = torch.Generator().manual_seed(9)
    m, n = 5, 83  # pairs blocks and a tail at every vector width
    x = torch.randn(m, n, generator=g).to(torch.bfloat16)
    w = 1 + 0.1 * torch.randn(n, generator=g)
    w[[3, 40, 81]] = torch.tensor([bits] * 3, dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert bool(w[[3, 40, 81]].isnan().all())
    args = [x] + ([torch.randn(m, n, generator=g).to(torch.bfloat16)] if name.startswith("add_") else []) + [w]
    if name.endswith("layer_norm"):
        args.append(0.1 * torch.randn(n, generator=g))
    dy = torch.randn(m, n, generator=g).to(torch.bfloat16)
    fn = getattr(kernels, name)
    kw = {} if name.endswith("layer_norm") else {"casting": "gemma"}  # gemma: an fp32 weight, a bf16 y
    got = {}
    for provider in ("cpu", "reference"):
        leaves = [t.clone().requires_grad_(True) for t in args]
        outs = fn(*leaves, 1e-5, provider=provider, **kw)
        outs = outs if isinstance(outs, tuple) else (outs,)
        y = outs[-1] if name.startswith("add_") else outs[0]
        got[provider] = (y, *torch.autograd.grad(y, leaves, dy.to(y.dtype)))
    y, dx = got["cpu"][:2]
    assert y.dtype == dx.dtype == torch.bfloat16 and bool(y.isnan().any()) and bool(dx.isnan().any())
    for ours, ref in zip(got["cpu"], got["reference"]):
        assert torch.equal(ours.isnan(), ref.isnan()), name

"""Every loop of the C++ extension must compile to vector code in each instruction-set copy.

A run-time flag tested inside an `omp simd` loop, c10's 16-bit conversions (a NaN branch, a
struct store) or an integer `?:` in the inline exp each made GCC leave whole loops scalar without
a word, while every numeric test passed: LAMB's stage 1 in every dtype, every bf16 loop and
AMSGrad ran 2.3-5.5x slower; in the AVX2 and baseline copies every exp loop (SiLU, GELU-tanh, the
gated units and every activation gradient, softmax, cross-entropy's gradient) and fp16's
optimizer loops ran scalar, 4-12x slower on CPUs without AVX-512 (docs/kernels.md). This reads
the built extension's machine code (objdump, from the binutils that the C++ build needs anyway):
the optimizer's loops must have packed arithmetic at each copy's full width, and every function
of the AVX2 and baseline copies must have at least half as many packed instructions (ymm; SSE
xmm) as the same function of the AVX-512 copy has zmm ones.
"""
from __future__ import annotations

import platform
import functools
import re
import shutil
import subprocess
from collections import Counter, defaultdict

import pytest

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
    reason="needs an x86-64 build and objdump")

# adamw_chunk picks one of the adamw_loop instances; it holds the loop itself if they are inlined
LOOPS = ("adamw_loop", "adamw_chunk", "lamb_stage1", "lamb_stage2", "sumsq_chunk")
FAMILY = {"adamw_loop": "adamw", "adamw_chunk": "adamw"}
WIDTH = {"avx2": "ymm", "avx512": "zmm", "base": "xmm"}
# a function's header line: 0000000000001030 <void fl_act::isa_avx2::(anonymous namespace)::act_span<2l>(...)>:
HEADER = re.compile(r"^[0-9a-f]+ <(.*)>:$")
ISA = re.compile(r"::isa_(avx2|avx512|base)::")
# one optimizer loop: void fl_optim::isa_avx2::(anonymous namespace)::lamb_stage1<float, float, false>(...)
OPTIM = re.compile(r"^(?:\w+ )?fl_optim::isa_\*::\(anonymous namespace\)::(\w+)<([^>]*)>\(")
# packed float arithmetic (VEX or legacy SSE) and its register width
PACKED = re.compile(r"\tv?(?:div|mul|add|sub|sqrt|max|min|fn?m(?:add|sub)\d{3})p[sd]\s.*%(xmm|ymm|zmm)")


@functools.lru_cache(maxsize=1)
def _functions() -> dict[tuple[str, str], list[str]]:
    """{(isa, function name with isa_* for the copy's namespace): instruction lines} of every
    function in a per-ISA copy, from the loaded extension's disassembly."""
    import kernels._build as build

    build.load_cpu_ops()
    so = build.build_dir_for(build._inputs()) / "fusionlens_cpu.so"
    text = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(so)], check=True,
                          capture_output=True, text=True).stdout
    out: dict[tuple[str, str], list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            isa = ISA.search(m.group(1))
            cur = (isa.group(1), m.group(1).replace(isa.group(0), "::isa_*::")) if isa else None
            if cur:
                out.setdefault(cur, [])
        elif cur and line.startswith(" "):
            out[cur].append(line)
        elif not line.strip():
            cur = None
    return out


def _packed(body: list[str]) -> Counter:
    return Counter(m.group(1) for line in body if (m := PACKED.search(line)))


def _loop_functions() -> dict[tuple[str, str, str], list[str]]:
    """{(isa, loop, template args): instruction lines} of the optimizer's loops (AVX2, AVX-512)."""
    out = {}
    for (isa, name), body in _functions().items():
        m = OPTIM.match(name)
        if m and isa != "base" and m.group(1) in LOOPS:
            out[isa, m.group(1), m.group(2)] = body
    return out


def test_every_optimizer_loop_is_vectorized_in_the_avx2_and_avx512_copies() -> None:
    funcs = _loop_functions()
    found = defaultdict(set)
    scalar = []
    separate = {(isa, args.split(",")[0]) for isa, loop, args in funcs if loop == "adamw_loop"}
    for (isa, loop, args), body in funcs.items():
        dtype = args.split(",")[0]
        found[isa, FAMILY.get(loop, loop)].add(dtype)
        if loop == "adamw_chunk" and (isa, dtype) in separate:
            continue
        widths = set(_packed(body))
        if WIDTH[isa] not in widths:
            scalar.append(f"{isa} {loop}<{args}> ({len(body)} instructions, packed: {sorted(widths) or 'none'})")
    # the check is not vacuous: every loop was found in both copies, for fp32, bf16, fp16 and fp64
    for isa in ("avx2", "avx512"):
        for loop in {FAMILY.get(name, name) for name in LOOPS}:
            assert {"float", "c10::BFloat16", "c10::Half", "double"} <= found[isa, loop], (isa, loop, found[isa, loop])
    assert not scalar, "loops left scalar:\n" + "\n".join(scalar)


def test_the_avx2_and_baseline_copies_vectorize_every_loop_the_avx512_copy_does() -> None:
    funcs = _functions()
    names = {name for _, name in funcs}
    compared, scalar = 0, []
    for name in sorted(names):
        wide = _packed(funcs.get(("avx512", name), []))["zmm"]
        if not wide:
            continue
        compared += 1
        for isa in ("avx2", "base"):
            if (isa, name) not in funcs:
                continue
            n = _packed(funcs[isa, name])[WIDTH[isa]]
            if n < 0.5 * wide:
                scalar.append(f"{isa}: {n} packed {WIDTH[isa]} against {wide} zmm in {name[:140]}")
    # not vacuous: the activation, softmax, cross-entropy, RoPE, norm and optimizer loops are compared
    families = {re.match(r"(?:[\w:<>, ]+ )?(\w+)::isa_", name).group(1) for name in names
                if _packed(funcs.get(("avx512", name), []))["zmm"]}
    assert {"fl_act", "fl_softmax", "fl_ce", "fl_rope", "fl_optim", "fusionlens"} <= families, families
    assert compared > 50, compared
    assert not scalar, "loops left scalar below AVX-512:\n" + "\n".join(scalar)


# one activation span: void fl_act::isa_*::(anonymous namespace)::glu_span<0l, c10::BFloat16>(...)
ACT_SPAN = re.compile(r"^(?:\w+ )?fl_act::isa_\*::\(anonymous namespace\)::(\w+_span)<(\d)l, ([\w:]+)>\(")


def test_every_activation_span_is_vectorized_for_each_storage_type() -> None:
    """The spans read bf16 (and, in the baseline copy, fp16) inside their one simd loop: a
    conversion that does not vectorize would leave the whole loop scalar, which the relative check
    above cannot see when every copy is scalar alike."""
    found, scalar = set(), []
    for (isa, name), body in _functions().items():
        m = ACT_SPAN.match(name)
        if not m:
            continue
        span, kind, dtype = m.groups()
        found.add((isa, span, kind, dtype))
        if WIDTH[isa] not in _packed(body):
            scalar.append(f"{isa} {span}<{kind}, {dtype}> ({len(body)} instructions)")
    expected = {(isa, span, kind, dtype)
                for isa in ("avx512", "avx2", "base")
                for span in ("act_span", "act_grad_span", "glu_span", "glu_grad_span")
                for kind in "012"
                for dtype in ("float", "c10::BFloat16", *(("c10::Half",) if isa == "base" else ()))}
    assert expected <= found, sorted(expected - found)[:8]
    assert not scalar, "activation spans left scalar:\n" + "\n".join(scalar)

"""Kernel-name demangling: the shared `demangle` on hand-written symbols with known spellings, the
events-table pass on synthetic frames, and real traces (ROCm: mangled; NVIDIA: untouched)
checked against their raw JSON and, where installed, binutils' `c++filt`."""
from __future__ import annotations

import math
import shutil
import subprocess
import threading

import numpy as np
import pandas as pd
import pytest

from profiler.trace import demangle as dm
from profiler.trace.demangle import demangle, demangle_kernel_names, demangle_many, demangle_status
from tests.profiler.trace.conftest import TRACES_DIR, loaded, raw_truth

CXXFILT = shutil.which("c++filt")
AMD_MANGLED = TRACES_DIR / "tracelens_amd_vllm_decode_hipgraph_replay.json.gz"
NVIDIA = TRACES_DIR / "tracelens_h100_bert_small.json.gz"

# (mangled, demangled): literal spellings of the GNU demangler (also what Kineto writes for CUDA).
KNOWN = [
    ("_Z3fooi", "foo(int)"),
    ("_Z10gemmKernelPfS_i", "gemmKernel(float*, float*, int)"),
    ("_ZN2at6native6launchILi4EEEvPKfRSt6vectorIiSaIiEE",
     "void at::native::launch<4>(float const*, std::vector<int, std::allocator<int> >&)"),
    ("_ZN7cutlass6KernelINS_4gemm6kernel4GemmIfLb1EEEEEvNT_6ParamsE",
     "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<float, true> >(cutlass::gemm::kernel::Gemm<float, true>::Params)"),
    ("__Z3fooi", "foo(int)"),  # macOS spelling
    ("_Z3fooDF16b", "foo(std::bfloat16_t)"),  # what ck_tile kernels use; GCC < 13 libstdc++ misreads it
]
NOT_MANGLED = ["", "foo", "void at::native::vectorized_elementwise_kernel<4>(int)", "triton_poi_fused_0",
               "Memcpy DtoH (Device -> Pinned)", "Z3fooi", "_z3fooi", "ncclKernel_AllReduce_RING_LL_Sum_float"]
GARBAGE = ["_Z", "_Zxx", "_ZN", "_Z3fo", "_Z3fooIi", "_Z3fooIiEvv(", "_Z" + "N" * 5000, "_Z" + "I" * 50000, "_Z3foo\x00i",
           "_Z3f\u00e9i", "_Z3foo i", "_Z" + "A" * 70000]


def _cxxfilt(names: list[str]) -> list[str]:
    out = subprocess.run([CXXFILT], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()


@pytest.fixture
def fresh():
    """Each test starts with no memoised names or probe (and leaves none behind)."""
    dm.cache_clear()
    yield
    dm.cache_clear()


def _needs_fallback(mangled: str) -> bool:
    return "DF" in mangled and demangle_status() is not None and CXXFILT is None


@pytest.mark.parametrize("mangled,want", KNOWN)
def test_known_symbols(fresh, mangled, want):
    if _needs_fallback(mangled):
        assert demangle(mangled) == mangled  # old libstdc++ and no c++filt: kept, never misspelled
    else:
        assert demangle(mangled) == want


@pytest.mark.skipif(CXXFILT is None, reason="c++filt is not installed")
def test_agrees_with_cxxfilt(fresh):
    names = [m for m, _ in KNOWN if not m.startswith("__")]
    names += ["_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
              "_ZN7ck_tile6kentryILi1ENS_3FooIDF16bfEEJNS1_5KargsEEEEvDpT1_",
              "_Z17gemv2T_kernel_valIiiffffLi128ELi16ELi4ELi4ELb0ELb1E18cublasGemvParamsExIi30cublasGemvTensor"
              "StridedBatchedIKfES3_S1_IfEfEEvT11_T4_S7_"]
    assert [demangle(n) for n in names] == _cxxfilt(names)


@pytest.mark.parametrize("name", NOT_MANGLED + GARBAGE)
def test_other_names_come_back_unchanged(fresh, name):
    assert demangle(name) == name
    assert demangle_many([name, name]) == {name: name}


def test_non_strings_and_many(fresh):
    assert demangle(None) is None and demangle(7) == 7  # type: ignore[arg-type]
    got = demangle_many(["_Z3fooi", "foo", "_Zxx", "_Z3fooi"])
    assert got == {"_Z3fooi": "foo(int)", "foo": "foo", "_Zxx": "_Zxx"}


def test_old_libstdcxx_without_cxxfilt_keeps_extended_float_names(fresh, monkeypatch):
    """A demangler that misreads DF16b (GCC < 13: 'foo(bool _Accum)') is never trusted with it."""
    monkeypatch.setattr(dm.shutil, "which", lambda tool: None)
    monkeypatch.setattr(dm, "PROBE_EXTENDED_FLOAT", ("_Z3fooi", "never this"))  # as if the probe failed
    assert "kept mangled" in demangle_status()
    assert demangle("_Z3fooDF16b") == "_Z3fooDF16b"
    assert demangle("_ZN7ck_tile3FooIDF16bEE") == "_ZN7ck_tile3FooIDF16bEE"
    assert demangle("_Z3fooi") == "foo(int)"  # everything else still goes through libstdc++


def test_without_libstdcxx_it_is_the_identity_with_a_reason(fresh, monkeypatch):
    monkeypatch.setattr(dm, "_symbol", lambda kind, symbol: (None, f"{symbol} not found (test)"))
    monkeypatch.setattr(dm.shutil, "which", lambda tool: None)
    reason = demangle_status()
    assert "unavailable" in reason and "__cxa_demangle not found" in reason and "kept mangled" in reason
    assert demangle("_Z3fooi") == "_Z3fooi" and demangle("foo") == "foo"


def test_thread_safe(fresh):
    names = [f"_Z{len(f'k{i}')}k{i}i" for i in range(400)]
    want = {n: f"k{i}(int)" for i, n in enumerate(names)}
    errors: list[str] = []

    def work(offset: int) -> None:
        for j in range(len(names)):
            n = names[(j + offset) % len(names)]
            if demangle(n) != want[n]:
                errors.append(n)

    threads = [threading.Thread(target=work, args=(k * 37,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _events(rows: list[tuple[str, str]]) -> pd.DataFrame:
    kinds, names = zip(*rows)
    return pd.DataFrame({"kind": pd.Categorical(kinds), "name": pd.Categorical(names),
                         "dur_us": np.arange(len(rows), dtype=float)})


def test_events_pass_renames_merges_and_splits(fresh):
    ev = _events([("kernel", "_Z3fooi"), ("kernel", "_Z3bari"), ("kernel", "bar(int)"),
                  ("cpu_op", "_Z3bazi"), ("kernel", "_Z3bazi"), ("kernel", "_Zxx"), ("cpu_op", "_Z3quxi"),
                  ("kernel", "void k<1>(int)")])
    out, renamed = demangle_kernel_names(ev)
    assert out["name"].astype(str).tolist() == ["foo(int)", "bar(int)", "bar(int)", "_Z3bazi", "baz(int)", "_Zxx",
                                                "_Z3quxi", "void k<1>(int)"]
    assert renamed == {"foo(int)": "_Z3fooi", "bar(int)": "_Z3bari", "baz(int)": "_Z3bazi"}
    cats = set(out["name"].cat.categories)
    assert "_Z3bari" not in cats and "_Z3fooi" not in cats  # no category left without rows
    assert "_Z3bazi" in cats and "_Z3quxi" in cats  # still named by non-kernel rows
    assert out["dur_us"].tolist() == ev["dur_us"].tolist() and ev["name"].iloc[0] == "_Z3fooi"  # input kept


def test_events_pass_leaves_unmangled_frames_alone(fresh):
    ev = _events([("kernel", "void k<1>(int)"), ("cpu_op", "aten::mm")])
    out, renamed = demangle_kernel_names(ev)
    assert out is ev and renamed == {}
    empty = _events([("kernel", "x")]).iloc[:0]
    assert demangle_kernel_names(empty) == (empty, {})


def test_rocm_trace_names_are_demangled_and_totals_unchanged():
    tr, truth = loaded(AMD_MANGLED), raw_truth(AMD_MANGLED)
    kernels = tr.events[tr.events["kind"] == "kernel"]
    # Independent count and time from the raw JSON, in plain Python.
    raw_kernels = [e for e in truth["kept"] if e["cat"] in ("kernel", "Kernel")]
    assert len(kernels) == len(raw_kernels) == truth["kernel_count"]
    assert math.isclose(kernels["dur_us"].sum(), sum(float(e["dur"]) for e in raw_kernels), rel_tol=1e-12)
    raw_names = {e["name"] for e in raw_kernels}
    mangled = sorted(n for n in raw_names if n.startswith("_Z"))
    assert mangled, "the bundled ROCm trace carries mangled ck_tile kernel names"
    renamed = dict(tr.meta["demangled_names"])
    assert set(renamed.values()) <= raw_names and all(v.startswith("_Z") for v in renamed.values())
    names = set(kernels["name"].astype(str))
    if CXXFILT is not None:  # the reference demangler: every name it can read is read
        readable = {m: d for m, d in zip(mangled, _cxxfilt(mangled)) if d != m}
        assert readable and {renamed[d] for d in readable.values()} == set(readable)
        assert not names & set(readable) and set(readable.values()) <= names
        assert all(d.startswith("void ck_tile::kentry<1, ck_tile::Rmsnorm2dFwd<") for d in readable.values())
    for d, m in renamed.items():  # rows per name are the raw rows of its mangled name
        assert (kernels["name"] == d).sum() == sum(e["name"] == m for e in raw_kernels)


def test_nvidia_trace_is_untouched():
    tr, truth = loaded(NVIDIA), raw_truth(NVIDIA)
    assert tr.meta["demangled_names"] == {}
    assert sorted(tr.events.loc[tr.events["kind"] == "kernel", "name"].astype(str)) == truth["kernel_names"]

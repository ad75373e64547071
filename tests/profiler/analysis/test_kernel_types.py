"""Kernel type, collective and tensor-core recognition by content."""
from __future__ import annotations

import pandas as pd
import pytest

from profiler.analysis import kernel_types as kt


def rows(names, kind="kernel", collective=None):
    return pd.DataFrame({"kind": pd.Categorical([kind] * len(names)),
                         "name": pd.Categorical(names),
                         "collective_name": pd.Categorical([collective] * len(names))})


COMM = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "send_recv"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", "broadcast"),
    ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", "other"),
    ("rcclKernel_AllReduce_RING_LL_Sum_bf16", "all_reduce"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<__nv_bfloat16, 8>(...)", "all_reduce"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, ...)", "all_reduce"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16>", "all_reduce"),
    ("all_to_all_dispatch_kernel", "all_to_all"),
    ("nvshmemi_transfer_put_signal", "other"),
]
COMPUTE = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>",
    "ampere_sgemm_128x64_nn",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>",  # "reduce" alone is not a collective
    "triton_red_fused_sum_0",
    "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1, true>",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4>",
]


@pytest.mark.parametrize("name,collective", COMM)
def test_communication_recognised_by_content(name, collective):
    r = rows([name])
    assert kt.kernel_type(r).iloc[0] == kt.COMMUNICATION
    assert kt.collective(r).iloc[0] == collective


@pytest.mark.parametrize("name", COMPUTE)
def test_computation_is_not_communication(name):
    r = rows([name])
    assert kt.kernel_type(r).iloc[0] == kt.COMPUTATION
    assert pd.isna(kt.collective(r).iloc[0])


def test_collective_args_make_a_kernel_communication():
    r = rows(["my_custom_comm_kernel"], collective="allgather")
    assert kt.kernel_type(r).iloc[0] == kt.COMMUNICATION
    assert kt.collective(r).iloc[0] == "all_gather"


def test_memory_rows_and_kinds():
    r = pd.concat([rows(["Memcpy HtoD (Pageable -> Device)"], "gpu_memcpy"), rows(["Memset (Device)"], "gpu_memset"),
                   rows(["__amd_rocclr_copyBuffer"]), rows(["aten::mm"], "cpu_op")], ignore_index=True)
    t = kt.kernel_type(r)
    assert list(t.iloc[:3]) == [kt.MEMORY] * 3 and pd.isna(t.iloc[3])


TENSOR_CORE = [
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_64x1_nn_align8>(...)",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_16x6_tn_align4>(...)",
    "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN",
    "volta_h884gemm_64x64_ldg8_nn",
    "turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn",
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn",
    "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass3x_sm90_tensorop_s64x128x16gemm_bf16>>",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1",
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4>>",
    "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl>",
    "hmma_gemm_kernel",
]
NOT_TENSOR_CORE = [
    "volta_sgemm_128x64_nn",
    "ampere_sgemm_32x32_sliced1x4_tn",
    "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(...)",
    "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>",
    "triton_poi_fused_gemma_rmsnorm_0",
    "Cijk_Ailk_Bljk_SB_MT64x64x8_SE_K1",  # Tensile without MFMA
]


@pytest.mark.parametrize("name", TENSOR_CORE)
def test_tensor_core_names(name):
    assert kt.is_tensor_core(rows([name]))[0]


@pytest.mark.parametrize("name", NOT_TENSOR_CORE)
def test_not_tensor_core_names(name):
    assert not kt.is_tensor_core(rows([name]))[0]


def test_pattern_registry_rejects_duplicates_and_bad_regex():
    with pytest.raises(ValueError, match="duplicate"):
        kt._check_unique((kt.NamePattern("a", "x"), kt.NamePattern("a", "y")), "test")
    with pytest.raises(ValueError, match="bad regex"):
        kt.NamePattern("b", "(")


def test_classification_runs_once_per_distinct_name():
    names = ["ncclKernel_AllReduce", "k"] * 50_000
    r = rows(names)
    assert (kt.kernel_type(r) == kt.COMMUNICATION).sum() == 50_000

"""The datasheet figures themselves (kept apart from the lookup logic in `devices.py`).

Conventions: FLOP/s are dense unless in `sparse`; memory bandwidth is the datasheet's peak in
bytes/s (1 GB/s = 1e9 B/s); L2 in bytes; SM count = SMs (NVIDIA) or CUs (AMD) of one device as
CUDA/HIP enumerates it (an MI250 appears as two GCD devices, so its entry is one GCD).
"""
from __future__ import annotations

from profiler.capture.devices import GB_S, MIB, T, DeviceSpec

# Source strings (document name + URL where one exists).
A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), table 'Specifications'"
A100_WP = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 40 MB L2"
H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (v1.0x), Table: H100 SXM5 / PCIe peak rates (dense and sparse)"
H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h100/): memory bandwidth"
H200_DS = ("NVIDIA H200 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/h200/): prints sparse "
           "tensor figures ('with sparsity'); dense = half; FP64/FP32 are dense")
ADA_WP = "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A (GeForce RTX 4090), FP32-accumulate tensor rates"
L4_DS = "NVIDIA L4 Tensor Core GPU datasheet (https://www.nvidia.com/en-us/data-center/l4/): tensor figures printed with sparsity; dense = half"
L40S_DS = "NVIDIA L40S GPU datasheet (https://www.nvidia.com/en-us/data-center/l40s/): dense | sparse tensor figures"
V100_DS = "NVIDIA Tesla V100 GPU datasheet (tesla-v100-datasheet-letter-fnl-web.pdf): SXM2 and PCIe columns"
V100_WP = "NVIDIA Tesla V100 GPU Architecture whitepaper (WP-08608-001): 80 SMs, 6144 KB L2"
TURING_WP = "NVIDIA Turing GPU Architecture whitepaper (WP-09183-001), Appendix A: RTX 2080 Ti reference-board rates"
MI300X_DS = "AMD Instinct MI300X accelerator data sheet (https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html)"
CDNA3_WP = "AMD CDNA 3 Architecture whitepaper: 8 XCDs x 38 CUs, 4 MB L2 per XCD"
MI250_DS = ("AMD Instinct MI250 / MI250X product specifications (per OAM module, two GCDs); halved per GCD as in "
            "ROCm docs 'AMD Instinct MI250 microarchitecture' (1.6 TB/s, 22.6 TFLOP/s FP64 vector, 104 CUs per GCD)")
A10G_SRC = ("No NVIDIA datasheet exists for the AWS-only A10G; figures from the spec table of baseten.co 'NVIDIA A10 "
            "vs A10G for ML model inference' (third party; re-checked here only qualitatively: its text says the A10G "
            "has higher CUDA-core and lower tensor throughput than the A10's 31.2/125 TFLOP/s, and the same 600 GB/s)")


def _a100(name: str, bw_gb_s: float, mem_gb: int, notes: str = "") -> DeviceSpec:
    return DeviceSpec(
        name=name, vendor="nvidia",
        dense_flops_per_s={"fp64": 9.7 * T, "fp64_tensor": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T,
                           "fp16": 312 * T, "bf16": 312 * T},
        sparse_flops_per_s={"tf32": 312 * T, "fp16": 624 * T, "bf16": 624 * T},
        mem_bw_bytes_per_s=bw_gb_s * GB_S, memory_bytes=mem_gb * 10**9, l2_bytes=40 * MIB, sm_count=108,
        sources={"dense": A100_DS, "sparse": A100_DS, "mem_bw": A100_DS, "l2": A100_WP, "sm_count": A100_WP},
        notes=notes)


def _h100_sxm(name: str, bw_gb_s: float, mem_gb: int, src_bw: str) -> DeviceSpec:
    return DeviceSpec(
        name=name, vendor="nvidia",
        dense_flops_per_s={"fp64": 33.5 * T, "fp64_tensor": 66.9 * T, "fp32": 66.9 * T, "tf32": 494.7 * T,
                           "fp16": 989.4 * T, "bf16": 989.4 * T, "fp8": 1978.9 * T},
        sparse_flops_per_s={"tf32": 989.4 * T, "fp16": 1978.9 * T, "bf16": 1978.9 * T, "fp8": 3957.8 * T},
        mem_bw_bytes_per_s=bw_gb_s * GB_S, memory_bytes=mem_gb * 10**9, l2_bytes=50 * MIB, sm_count=132,
        sources={"dense": H100_WP, "sparse": H100_WP, "mem_bw": src_bw, "l2": H100_WP, "sm_count": H100_WP})


DEVICE_TABLE: tuple[DeviceSpec, ...] = (
    _a100("A100-SXM4-80GB", 2039, 80),
    _a100("A100-SXM4-40GB", 1555, 40),
    _a100("A100-PCIE-80GB", 1935, 80),
    _a100("A100-PCIE-40GB", 1555, 40),
    _a100("A100-PG509-200", 1555, 40,
          notes="Board PG509 SKU 200 is not in NVIDIA's public datasheet; its deviceProperties (108 SMs, "
                "sm_80, 42.3e9 B) match the A100 SXM4 40GB, whose figures are used"),
    _h100_sxm("H100-SXM5-80GB", 3350, 80, H100_DS),
    DeviceSpec(
        name="H100-PCIE-80GB", vendor="nvidia",
        dense_flops_per_s={"fp64": 25.6 * T, "fp64_tensor": 51.2 * T, "fp32": 51.2 * T, "tf32": 378 * T,
                           "fp16": 756 * T, "bf16": 756 * T, "fp8": 1513 * T},
        sparse_flops_per_s={"tf32": 756 * T, "fp16": 1513 * T, "bf16": 1513 * T, "fp8": 3026 * T},
        mem_bw_bytes_per_s=2000 * GB_S, memory_bytes=80 * 10**9, l2_bytes=50 * MIB, sm_count=114,
        sources={"dense": H100_WP, "sparse": H100_WP, "mem_bw": H100_DS, "l2": H100_WP, "sm_count": H100_WP}),
    DeviceSpec(
        name="H200-SXM-141GB", vendor="nvidia",
        dense_flops_per_s={"fp64": 34 * T, "fp64_tensor": 67 * T, "fp32": 67 * T, "tf32": 494.5 * T,
                           "fp16": 989.5 * T, "bf16": 989.5 * T, "fp8": 1979 * T},
        sparse_flops_per_s={"tf32": 989 * T, "fp16": 1979 * T, "bf16": 1979 * T, "fp8": 3958 * T},
        mem_bw_bytes_per_s=4800 * GB_S, memory_bytes=141 * 10**9, l2_bytes=60 * MIB, sm_count=132,
        sources={"dense": H200_DS, "sparse": H200_DS, "mem_bw": H200_DS,
                 "l2": ("cudaDeviceProp.l2CacheSize as torch.cuda.get_device_properties(0).L2_cache_size read it on "
                        "an NVIDIA H200 (132 SMs, 143771 MiB) on 2026-10-28: 60 MB (the datasheet prints no L2 size; "
                        "the H100 SXM5 reports 50 MB); benchmarks/gpu_check.sh prints it again in env.txt"),
                 "sm_count": "same GH100 die and SM configuration as H100 SXM5: " + H100_WP}),
    DeviceSpec(
        name="L4", vendor="nvidia",
        dense_flops_per_s={"fp32": 30.3 * T, "tf32": 60 * T, "fp16": 121 * T, "bf16": 121 * T, "fp8": 242.5 * T},
        sparse_flops_per_s={"tf32": 120 * T, "fp16": 242 * T, "bf16": 242 * T, "fp8": 485 * T},
        mem_bw_bytes_per_s=300 * GB_S, memory_bytes=24 * 10**9, l2_bytes=48 * MIB, sm_count=58,
        sources={"dense": L4_DS, "sparse": L4_DS, "mem_bw": L4_DS, "l2": ADA_WP + " (AD104: 48 MB L2)",
                 "sm_count": "TechPowerUp GPU database: NVIDIA L4, 7,424 CUDA cores = 58 SMs x 128"},
        notes="FP64 is not printed in the datasheet and is left out"),
    DeviceSpec(
        name="L40S", vendor="nvidia",
        dense_flops_per_s={"fp32": 91.6 * T, "tf32": 183 * T, "fp16": 362.05 * T, "bf16": 362.05 * T, "fp8": 733 * T},
        sparse_flops_per_s={"tf32": 366 * T, "fp16": 733 * T, "bf16": 733 * T, "fp8": 1466 * T},
        mem_bw_bytes_per_s=864 * GB_S, memory_bytes=48 * 10**9, l2_bytes=96 * MIB, sm_count=142,
        sources={"dense": L40S_DS, "sparse": L40S_DS, "mem_bw": L40S_DS, "l2": ADA_WP + " (AD102: 96 MB L2)",
                 "sm_count": L40S_DS + " (18,176 CUDA cores = 142 SMs x 128)"},
        notes="FP64 is not printed in the datasheet and is left out"),
    DeviceSpec(
        name="RTX-4090", vendor="nvidia",
        dense_flops_per_s={"fp32": 82.6 * T, "tf32": 82.6 * T, "fp16": 165.2 * T, "bf16": 165.2 * T, "fp8": 330.3 * T},
        sparse_flops_per_s={"tf32": 165.2 * T, "fp16": 330.4 * T, "bf16": 330.4 * T, "fp8": 660.6 * T},
        mem_bw_bytes_per_s=1008 * GB_S, memory_bytes=24 * 10**9, l2_bytes=72 * MIB, sm_count=128,
        sources={"dense": ADA_WP, "sparse": ADA_WP, "mem_bw": ADA_WP, "l2": ADA_WP, "sm_count": ADA_WP},
        notes="GeForce tensor rates with FP32 accumulate (what PyTorch uses); FP16-accumulate rates are 2x"),
    DeviceSpec(
        name="A10G", vendor="nvidia",
        dense_flops_per_s={"fp32": 35 * T, "tf32": 35 * T, "fp16": 70 * T, "bf16": 70 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=600 * GB_S, memory_bytes=24 * 10**9, l2_bytes=None, sm_count=None,
        sources={"dense": A10G_SRC, "mem_bw": A10G_SRC},
        notes="Third-party figures (no NVIDIA datasheet); treat the compute roof as approximate. SM count and "
              "L2 left out: no source found"),
    DeviceSpec(
        name="V100-SXM2", vendor="nvidia",
        dense_flops_per_s={"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=900 * GB_S, memory_bytes=None, l2_bytes=6 * MIB, sm_count=80,
        sources={"dense": V100_DS, "mem_bw": V100_DS, "l2": V100_WP, "sm_count": V100_WP},
        notes="16 GB and 32 GB share these figures; fp16 is the tensor-core rate; no bf16/tf32 on Volta"),
    DeviceSpec(
        name="V100-DGXS", vendor="nvidia",
        dense_flops_per_s={"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=900 * GB_S, memory_bytes=32 * 10**9, l2_bytes=6 * MIB, sm_count=80,
        sources={"dense": "NVIDIA DGX Station datasheet: 4x Tesla V100, 500 TFLOPS tensor (= 125 per GPU); "
                          "other rates as " + V100_DS + " SXM2 column",
                 "mem_bw": V100_DS, "l2": V100_WP, "sm_count": V100_WP},
        notes="DGX Station V100 (NVLink board); SXM2 clocks"),
    DeviceSpec(
        name="V100-PCIE", vendor="nvidia",
        dense_flops_per_s={"fp64": 7 * T, "fp32": 14 * T, "fp16": 112 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=900 * GB_S, memory_bytes=None, l2_bytes=6 * MIB, sm_count=80,
        sources={"dense": V100_DS, "mem_bw": V100_DS, "l2": V100_WP, "sm_count": V100_WP}),
    DeviceSpec(
        name="RTX-2080-Ti", vendor="nvidia",
        dense_flops_per_s={"fp32": 13.4 * T, "fp16": 53.8 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=616 * GB_S, memory_bytes=11 * 10**9, l2_bytes=5632 * 1024, sm_count=68,
        sources={"dense": TURING_WP, "mem_bw": TURING_WP, "l2": TURING_WP, "sm_count": TURING_WP},
        notes="fp16 = tensor rate with FP32 accumulate (GeForce half rate); Founders Edition clocks are ~6% higher"),
    DeviceSpec(
        name="MI300X", vendor="amd",
        dense_flops_per_s={"fp64": 81.7 * T, "fp64_tensor": 163.4 * T, "fp32": 163.4 * T, "fp32_tensor": 163.4 * T,
                           "tf32": 653.7 * T, "fp16": 1307.4 * T, "bf16": 1307.4 * T, "fp8": 2614.9 * T},
        sparse_flops_per_s={"tf32": 1307.4 * T, "fp16": 2614.9 * T, "bf16": 2614.9 * T, "fp8": 5229.8 * T},
        mem_bw_bytes_per_s=5300 * GB_S, memory_bytes=192 * 10**9, l2_bytes=32 * MIB, sm_count=304,
        sources={"dense": MI300X_DS, "sparse": MI300X_DS, "mem_bw": MI300X_DS, "l2": CDNA3_WP, "sm_count": MI300X_DS},
        notes="L2 = 8 XCDs x 4 MB (each XCD sees its own 4 MB); the 256 MB Infinity Cache is not counted"),
    DeviceSpec(
        name="MI250-GCD", vendor="amd",
        dense_flops_per_s={"fp64": 22.65 * T, "fp64_tensor": 45.25 * T, "fp32": 22.65 * T, "fp32_tensor": 45.25 * T,
                           "fp16": 181.05 * T, "bf16": 181.05 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=1638.4 * GB_S, memory_bytes=64 * 10**9, l2_bytes=8 * MIB, sm_count=104,
        sources={"dense": MI250_DS, "mem_bw": MI250_DS, "l2": MI250_DS, "sm_count": MI250_DS},
        notes="One GCD (half an MI250 OAM: 45.3/90.5/362.1 TFLOP/s and 3.2768 TB/s per module)"),
    DeviceSpec(
        name="MI250X-GCD", vendor="amd",
        dense_flops_per_s={"fp64": 23.95 * T, "fp64_tensor": 47.85 * T, "fp32": 23.95 * T, "fp32_tensor": 47.85 * T,
                           "fp16": 191.5 * T, "bf16": 191.5 * T},
        sparse_flops_per_s={},
        mem_bw_bytes_per_s=1638.4 * GB_S, memory_bytes=64 * 10**9, l2_bytes=8 * MIB, sm_count=110,
        sources={"dense": MI250_DS, "mem_bw": MI250_DS, "l2": MI250_DS, "sm_count": MI250_DS},
        notes="One GCD (half an MI250X OAM: 47.9/95.7/383 TFLOP/s per module)"),
)

"""Accelerators the roofline cost model knows: public spec-sheet figures (dense, no sparsity).

- A100-80GB SXM: 312 TFLOP/s bf16/fp16 tensor, 2,039 GB/s HBM2e, 80 GB (NVIDIA A100 datasheet).
- H100-SXM: 989 TFLOP/s bf16/fp16 tensor (1,979 with sparsity), 3.35 TB/s HBM3, 80 GB (NVIDIA H100 datasheet).
- H200 SXM: 989 TFLOP/s bf16/fp16 tensor, 4.8 TB/s HBM3e, 141 GB (NVIDIA H200 datasheet).
- L4: 121 TFLOP/s bf16/fp16 tensor (242 with sparsity), 300 GB/s GDDR6, 24 GB (NVIDIA L4 datasheet).
- cpu: this machine, measured when asked for: a float32 GEMM rate and a copy bandwidth (see `measure_cpu`).
"""

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s at the dtype the model runs in
    memory_bandwidth: float  # bytes/s
    memory_bytes: float
    kind: str = "gpu"  # gpu: its memory sizes the KV cache; cpu: a CPU run's fixed cache, as the real runner's


GB = 1e9
HARDWARE = {
    "a100-80gb": Hardware("A100-80GB", 312e12, 2039 * GB, 80 * GB),
    "h100": Hardware("H100-SXM", 989e12, 3350 * GB, 80 * GB),
    "h200": Hardware("H200", 989e12, 4800 * GB, 141 * GB),
    "l4": Hardware("L4", 121e12, 300 * GB, 24 * GB),
}


def measure_cpu(memory_bytes: float = 24 * GB) -> Hardware:
    """This CPU's float32 GEMM rate and copy bandwidth, measured now (a second or two)."""
    import torch  # only this measurement needs it

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b  # warm-up
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ b
    flops = reps * 2 * 1024**3 / (time.perf_counter() - start)
    src = torch.empty(64 * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        dst.copy_(src)
    bandwidth = reps * 2 * src.numel() * 4 / (time.perf_counter() - start)  # read + write
    return Hardware("cpu (measured)", flops, bandwidth, memory_bytes, kind="cpu")


def get_hardware(name: str) -> Hardware:
    if name == "cpu":
        return measure_cpu()
    if name not in HARDWARE:
        raise KeyError(f"unknown hardware {name!r}; choose one of {', '.join([*HARDWARE, 'cpu'])}")
    return HARDWARE[name]

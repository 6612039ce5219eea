"""Accelerators the roofline knows: the catalogue in `conf/hardware/` (one YAML file each, every figure cited to its
spec sheet there), a user's own YAML file, or the figures given inline. `cpu` measures this machine.

`runner.hardware=h100` (a catalogue name), `runner.hardware=/path/my_gpu.yaml`, or
`runner.hardware={name: my-gpu, bf16_tflops: 400, memory_bandwidth_gbps: 2000, memory_gb: 64, interconnect_gbps: 400}`.
"""

import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field, ValidationError, model_validator

from harness.catalogue import catalogue_entry, catalogue_names
from harness.sim.costmodel.elementwise import Curve, log2, maximum
from workloads.config import Strict, one_line

CATALOGUE_DIR = Path(__file__).resolve().parents[3] / "conf" / "hardware"
GB = 1e9
GIB = 2**30
# The share of peak FLOP/s a serving engine's kernels reach where a hardware file gives none: fitted to published
# vLLM runs on Hopper GPUs (README "Grounding"). An older class reaches a larger share of its lower peak (an A100's
# file says so), as FlashAttention-2 did: 50-73% of peak on an A100, less on an H100 (FlashAttention-2 and -3
# papers, arXiv 2307.08691 and 2407.08608).
DEFAULT_COMPUTE_EFFICIENCY = 0.51


class HardwareSpec(Strict):
    """What a hardware file says: spec-sheet figures, dense (no sparsity)."""

    name: str
    bf16_tflops: Annotated[float, Field(gt=0)]
    memory_bandwidth_gbps: Annotated[float, Field(gt=0)]
    # What the device reports (NVML's total, as vLLM sizes its cache from it), where known: a datasheet's "80 GB" is
    # 80 GiB less what the driver keeps, 85.5 GB on an H100. Else the datasheet's figure.
    memory_gb: Annotated[float, Field(gt=0)]
    interconnect_gbps: Annotated[float, Field(gt=0)]  # GPU-to-GPU in its usual node, both directions together
    # Dense tensor-core peaks of the narrower formats, where the GPU has them (FP8 on Hopper, Ada, Blackwell and
    # MI300-class; FP4 on Blackwell and MI355X). A GPU without one runs that format's weights widened to BF16.
    fp8_tflops: Annotated[float, Field(gt=0)] | None = None
    fp4_tflops: Annotated[float, Field(gt=0)] | None = None
    # The share of that FP8 peak a GEMM over this project's FP8 (weights scaled per 128 x 128 block, activations per
    # 128 elements: `FORMAT_BYTES`) reaches against one scaled per channel, where measured: tensor cores that take no
    # block scales (Hopper's) leave the kernel to rescale each 128-deep slice of its partial sums on the CUDA cores.
    fp8_block_scaled_share: Annotated[float, Field(gt=0, le=1)] = 1.0
    # The bandwidth a kernel streaming weights was measured to reach on this GPU, where that falls short of the
    # datasheet's by more than an engine's share of it allows (`EngineProfile.stream_bandwidth_cap`).
    stream_bandwidth_gbps: Annotated[float, Field(gt=0)] | None = None
    # A fixed time each GEMM kernel takes beyond its weights' stream, in a CUDA graph, where measured: why a small
    # model's decode step streams at less of the bandwidth (`python -m harness.gpu_check --sections dense_gemms`
    # fits both figures on seven models' decode steps).
    gemm_fixed_us: Annotated[float, Field(ge=0)] = 0.0
    # Share of peak FLOP/s a serving engine reaches on this GPU class, where measured runs say; else the default.
    compute_efficiency: Annotated[float, Field(gt=0, le=1)] = DEFAULT_COMPUTE_EFFICIENCY
    # FlashAttention's measured forward rate on this GPU (BF16, causal, head dim 128), TFLOP/s by sequence length,
    # where published: attention kernels reach their own share of peak, growing with the keys each query reads.
    flash_attention_tflops: dict[int, Annotated[float, Field(gt=0)]] | None = None
    # Where FlashAttention-3 is absent (Ampere, Ada): the query rows FlashAttention-2's kernel over a paged cache
    # computes at a time for each sequence and head, whatever that sequence's queries fill of them.
    flash_attention_query_tile: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _share_of_a_peak_given(self):
        if self.fp8_block_scaled_share != 1.0 and self.fp8_tflops is None:
            raise ValueError("fp8_block_scaled_share is a share of fp8_tflops, which is not given")
        if self.stream_bandwidth_gbps and self.stream_bandwidth_gbps > self.memory_bandwidth_gbps:
            raise ValueError(f"stream_bandwidth_gbps ({self.stream_bandwidth_gbps:g}) is above the datasheet's "
                             f"memory_bandwidth_gbps ({self.memory_bandwidth_gbps:g})")
        return self


# A GEMM whose weights the GPU's tensor cores cannot take runs a mixed-precision kernel (Marlin-style: each weight tile
# widened to BF16 in registers, the tokens taken 64 at a time). Memory-bound, at a few tokens, it is as fast as its
# bytes allow (the roofline's other bound); compute-bound it reaches a share of a BF16 GEMM's FLOP/s that falls as the
# tokens grow: on an A100 Marlin levels off at 141 TFLOP/s from 128 tokens on, while torch's BF16 GEMM keeps climbing
# (IST-DASLab's bench.py on an A100, vllm-project/vllm pull request #2497, comment of 2024-01-24): (tokens, share).
WIDENED_GEMM_SHARES = ((128, 1.0), (256, 0.74), (512, 0.73), (1024, 0.66), (2048, 0.60))


_WIDENED_GEMM_CURVE = Curve(np.log2([tokens for tokens, _ in WIDENED_GEMM_SHARES]),
                            [share for _, share in WIDENED_GEMM_SHARES])


def widened_gemm_share(num_tokens):
    """`WIDENED_GEMM_SHARES` at a step's `num_tokens` (arrays too), interpolated in log tokens, held beyond its ends."""
    return _WIDENED_GEMM_CURVE(log2(maximum(num_tokens, 1)))


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # FLOP/s at the dtype the model runs in
    memory_bandwidth: float  # bytes/s
    memory_bytes: float
    kind: str = "gpu"  # gpu: its memory sizes the KV cache; cpu: a CPU run's fixed cache, as the real runner's
    interconnect_bandwidth: float = 0.0  # bytes/s between two GPUs of a node, both directions together
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY  # share of peak_flops a serving engine reaches
    fp8_flops: float | None = None  # FP/s of the FP8 tensor cores; None: none
    fp8_block_scaled_share: float = 1.0  # of fp8_flops, a block-scaled FP8 GEMM's (HardwareSpec's)
    fp4_flops: float | None = None
    flash_attention_rates: tuple[tuple[int, float], ...] = ()  # (causal sequence length, FLOP/s), ascending
    attention_query_tile: int = 0  # FlashAttention-2's query rows per tile on this GPU; 0: none given
    stream_bandwidth: float | None = None  # bytes/s a weight-streaming kernel was measured at; None: none given
    gemm_fixed_s: float = 0.0  # each dense GEMM's fixed time beyond its stream (HardwareSpec's); 0: none measured

    @classmethod
    def from_spec(cls, spec: HardwareSpec) -> "Hardware":
        return cls(spec.name, spec.bf16_tflops * 1e12, spec.memory_bandwidth_gbps * GB, spec.memory_gb * GB,
                   interconnect_bandwidth=spec.interconnect_gbps * GB, compute_efficiency=spec.compute_efficiency,
                   fp8_flops=spec.fp8_tflops and spec.fp8_tflops * 1e12,
                   fp8_block_scaled_share=spec.fp8_block_scaled_share,
                   fp4_flops=spec.fp4_tflops and spec.fp4_tflops * 1e12,
                   flash_attention_rates=tuple(sorted((length, tflops * 1e12) for length, tflops
                                                      in (spec.flash_attention_tflops or {}).items())),
                   attention_query_tile=spec.flash_attention_query_tile or 0,
                   stream_bandwidth=spec.stream_bandwidth_gbps and spec.stream_bandwidth_gbps * GB,
                   gemm_fixed_s=spec.gemm_fixed_us * 1e-6)

    def attention_share(self, mean_keys):
        """The share of peak FLOP/s attention reaches when each query reads `mean_keys` keys on average (arrays too):
        FlashAttention's measured rate at the causal sequence length of that mean (twice it), interpolated in log
        length and held beyond the measured ones. None where the hardware file gives no rates."""
        if not self.flash_attention_rates:
            return None
        return self._attention_curve(log2(maximum(2 * mean_keys, 1)))

    @cached_property
    def _attention_curve(self) -> Curve:
        """Shares of peak by log2 length, built once: a replay asks for it every step."""
        lengths, rates = zip(*self.flash_attention_rates)
        return Curve(np.log2(lengths), np.array(rates) / self.peak_flops)

    def gemm_peak(self, weight_bytes: float) -> float:
        """The tensor-core peak a GEMM over weights of `weight_bytes` per parameter reaches: its format's, or the
        next wider format the GPU has (FP8 weights on an A100 and FP4 on a Hopper are widened to BF16 in the
        kernel: Marlin-style mixed-precision GEMMs, which reach `widened_gemm_share` of it). Activations are
        quantized to match where the GPU can. FP8 is block-scaled (`fp8_block_scaled_share`)."""
        if not self.has_cores_for(weight_bytes):
            return self.peak_flops
        return self.fp4_flops if weight_bytes < 1 else self.fp8_flops * self.fp8_block_scaled_share

    def has_cores_for(self, weight_bytes: float) -> bool:
        """Whether the GPU has tensor cores of the narrower format of weights of `weight_bytes` per parameter (FP8
        or FP4), which take their inputs in that format too."""
        return bool(self.fp4_flops if weight_bytes < 1 else self.fp8_flops if weight_bytes == 1 else False)

    def widens(self, weight_bytes: float) -> bool:
        """Whether GEMMs over weights of `weight_bytes` per parameter widen them in the kernel (no tensor cores for
        their format here)."""
        return weight_bytes < 2 and not self.has_cores_for(weight_bytes)

    @property
    def serving_defaults(self) -> tuple[int, int]:
        return serving_defaults(self.name, self.memory_bytes)


def serving_defaults(name: str, memory_bytes: float) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's API server uses on a GPU by default: 1024 and 8192 with at
    least 70 GiB of memory, except on an A100, else 256 and 2048 (vLLM's `EngineArgs.get_batch_defaults`)."""
    if memory_bytes >= 70 * GIB and "a100" not in name.lower():
        return 1024, 8192
    return 256, 2048


# How a GPU names itself (torch.cuda.get_device_name) → its catalogue entry, most specific first.
DEVICE_NAMES = [("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100"), ("b200", "b200"), ("l40s", "l40s"),
                ("l4", "l4"), ("4090", "rtx-4090"), ("mi300x", "mi300x"), ("mi355x", "mi355x")]


def catalogue_name(device_name: str, memory_bytes: float) -> str | None:
    """The catalogue entry for the GPU this process sees, or None for one the catalogue lacks."""
    name = device_name.lower()
    if "a100" in name:
        return "a100-80gb" if memory_bytes > 50 * GIB else "a100-40gb"
    return next((entry for fragment, entry in DEVICE_NAMES if fragment in name), None)


def catalogue() -> list[str]:
    return catalogue_names(CATALOGUE_DIR)


def get_hardware(choice) -> Hardware:
    """`choice`: a catalogue name, a YAML file's path, a mapping of the figures, or `cpu`. Raises ValueError naming
    the problem (an unknown name lists the catalogue)."""
    if choice == "cpu":
        return measure_cpu()
    choice, where = catalogue_entry(choice, CATALOGUE_DIR, "hardware", "runner.hardware", ", and cpu")
    try:
        return Hardware.from_spec(HardwareSpec.model_validate(choice))
    except ValidationError as e:
        raise ValueError(f"{where}: {one_line(e, choice)}") from None


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

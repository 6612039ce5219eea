"""A roofline cost model: a named accelerator and a model architecture give each step's FLOPs and bytes.

A step is two kinds of kernel, each bound by its own compute or its own memory traffic: the GEMMs over the weights
(every layer and the LM head, for the step's tokens) and attention over the KV cache (the cached keys each query
reads, and the new K/V written). So

    time = max(gemm FLOPs / (peak * compute_efficiency), weight bytes / (bandwidth * memory_efficiency))
         + max(attention FLOPs / (peak * compute_efficiency), KV bytes / (bandwidth * memory_efficiency))

and the engine adds its own time per step: `step_overhead_s`, plus `seq_overhead_s` for each sequence in the step
(scheduling, sampling and output processing are per-request work on the CPU). Taking one max over the step's
totals instead would let a compute-bound GEMM hide memory-bound attention, which no kernel does. The architecture
comes from a transformers config, so a model can be described without ever being loaded.
"""

from harness.model_spec import Architecture
from harness.sim.costmodel.hardware import Hardware
from harness.sim.costmodel.shape import StepShape


class RooflineCostModel:
    def __init__(self, arch: Architecture, hardware: Hardware, compute_efficiency: float | None = None,
                 memory_efficiency: float = 0.7, step_overhead_s: float = 0.0, seq_overhead_s: float = 0.0):
        self.arch, self.hardware = arch, hardware
        # None: the share the hardware file gives for its GPU class (see `Hardware.compute_efficiency`).
        self.compute_efficiency = compute_efficiency or hardware.compute_efficiency
        self.memory_efficiency = memory_efficiency
        self.step_overhead_s, self.seq_overhead_s = step_overhead_s, seq_overhead_s

    def overhead(self, shape: StepShape) -> float:
        """The engine's own seconds for a step: fixed, plus per sequence (rows of a padded rectangle included)."""
        return self.step_overhead_s + self.seq_overhead_s * shape.num_rows

    def gemm_flops(self, shape: StepShape) -> float:
        a = self.arch
        return 2 * a.num_layers * a.layer_params * shape.num_tokens + 2 * a.embedding_params * shape.num_sampled

    def attention_flops(self, shape: StepShape) -> float:
        a = self.arch
        return 4 * a.num_layers * a.num_heads * a.head_dim * shape.attention_pairs  # QK^T and PV

    def kv_bytes(self, shape: StepShape) -> float:
        # Read every cached key and value each query's sequence attends to; write the step's new K/V.
        return (shape.kv_tokens_read + shape.num_tokens) * self.arch.kv_bytes_per_token

    def flops(self, shape: StepShape) -> float:
        return self.gemm_flops(shape) + self.attention_flops(shape)

    def bytes(self, shape: StepShape) -> float:
        return self.arch.weight_bytes_read_per_step + self.kv_bytes(shape)

    def predict(self, shape: StepShape) -> float:
        """Seconds inside the model for a step of this shape (the engine's overhead is `step_overhead_s`)."""
        compute_rate = self.hardware.peak_flops * self.compute_efficiency
        memory_rate = self.hardware.memory_bandwidth * self.memory_efficiency
        gemm = max(self.gemm_flops(shape) / compute_rate, self.arch.weight_bytes_read_per_step / memory_rate)
        attention = max(self.attention_flops(shape) / compute_rate, self.kv_bytes(shape) / memory_rate)
        return gemm + attention

    def num_kv_blocks(self, block_size: int, memory_fraction: float) -> int:
        """Blocks that fit in the accelerator's memory beside the weights."""
        free = self.hardware.memory_bytes * memory_fraction - self.arch.weight_bytes
        if free <= 0:
            memory_gb = self.hardware.memory_bytes / 1e9
            raise ValueError(f"the model's weights ({self.arch.weight_bytes / 1e9:.1f} GB) do not fit in "
                             f"{memory_fraction:.0%} of {self.hardware.name}'s {memory_gb:.0f} GB")
        return int(free // (block_size * self.arch.kv_bytes_per_token))

"""A roofline cost model: a named accelerator and a model architecture give each step's FLOPs and bytes.

time = max(FLOPs / (peak * compute_efficiency), bytes / (bandwidth * memory_efficiency)) + step_overhead.
The architecture comes from a transformers config, so a model can be described without ever being loaded.
"""

from harness.model_spec import Architecture
from harness.sim.costmodel.hardware import Hardware
from harness.sim.costmodel.shape import StepShape


class RooflineCostModel:
    def __init__(self, arch: Architecture, hardware: Hardware, compute_efficiency: float = 0.5,
                 memory_efficiency: float = 0.7, step_overhead_s: float = 0.0):
        self.arch, self.hardware = arch, hardware
        self.compute_efficiency, self.memory_efficiency = compute_efficiency, memory_efficiency
        self.step_overhead_s = step_overhead_s

    def flops(self, shape: StepShape) -> float:
        a = self.arch
        dense = 2 * a.num_layers * a.layer_params * shape.num_tokens
        attention = 4 * a.num_layers * a.num_heads * a.head_dim * shape.attention_pairs  # QK^T and PV
        lm_head = 2 * a.hidden_size * a.vocab_size * shape.num_sampled
        return dense + attention + lm_head

    def bytes(self, shape: StepShape) -> float:
        a = self.arch
        kv = (shape.kv_tokens_read + shape.num_tokens) * a.kv_bytes_per_token  # read the cache, write the new K/V
        return a.weight_bytes + kv

    def predict(self, shape: StepShape) -> float:
        compute = self.flops(shape) / (self.hardware.peak_flops * self.compute_efficiency)
        memory = self.bytes(shape) / (self.hardware.memory_bandwidth * self.memory_efficiency)
        return max(compute, memory)

    def num_kv_blocks(self, block_size: int, memory_fraction: float) -> int:
        """Blocks that fit in the accelerator's memory beside the weights."""
        free = self.hardware.memory_bytes * memory_fraction - self.arch.weight_bytes
        if free <= 0:
            memory_gb = self.hardware.memory_bytes / 1e9
            raise ValueError(f"the model's weights ({self.arch.weight_bytes / 1e9:.1f} GB) do not fit in "
                             f"{memory_fraction:.0%} of {self.hardware.name}'s {memory_gb:.0f} GB")
        return int(free // (block_size * self.arch.kv_bytes_per_token))

"""A roofline cost model: a named accelerator and a model architecture give each step's FLOPs and bytes.

A step is two kinds of kernel, each bound by its own compute or its own memory traffic: the GEMMs over the weights
(every layer and the LM head, for the step's tokens) and attention over the KV cache (the cached keys each query
reads, and the new K/V written). So

    time = max(gemm FLOPs / (peak * compute_efficiency), weight bytes / (bandwidth * memory_efficiency))
         + max(attention FLOPs / (peak * compute_efficiency), KV bytes / (bandwidth * memory_efficiency))

A mixture of experts reads, per layer, the experts its step's tokens are expected to touch (uniform top-k
routing over T tokens), and computes only the experts each token is routed to. With `tensor_parallel` N, the GPUs
of one node split every weight matrix and the KV heads N ways, each computing 1/N of the FLOPs over 1/N of the
bytes, and two all-reduces per layer (after attention and after the MLP) move the step's activations between them
over the node's GPU-to-GPU links: a ring all-reduce takes 2 (N-1) steps, each sending 1/N of the message to the
next GPU, so it costs 2 (N-1) step latencies plus 2 (N-1)/N of the message over the link.

The engine adds its own time per step: `step_overhead_s`, plus `seq_overhead_s` for each sequence in the step
(scheduling, sampling and output processing are per-request work on the CPU), plus `token_overhead_s` for each
token (the host builds every token's position and cache slot: work that does not shrink with more GPUs or grow
with a bigger model, which is why a prefill's time is not its FLOPs alone). Taking one max over the step's
totals instead would let a compute-bound GEMM hide memory-bound attention, which no kernel does. The architecture
comes from a transformers config, so a model can be described without ever being loaded.
"""

import numpy as np

from harness.model_spec import Architecture
from harness.sim.costmodel.hardware import Hardware
from harness.sim.costmodel.shape import StepShape

# A ring all-reduce over NVLink: a fixed cost per ring step (a hand-off to the next GPU and its wait), and the
# share of the link's one-way bandwidth it reaches for the messages of a serving step (0.1-40 MB). Both fitted to
# Lambda's vLLM runs of Llama-3-8B on 2 and 4 H100s and Llama-3-70B on 4 and 8, at 10 and 320 prompts
# (`tests/fixtures/published/multi_gpu/`), which they bring within 8.4% on throughput and TPOT: one fixed cost per
# all-reduce cannot serve 2 and 8 GPUs together (10 µs leaves 8 GPUs 27% too fast, 30 µs leaves 2 GPUs 9% too
# slow), and the full link speed makes 8 GPUs at low load 25% too slow or at high load too fast, whatever the
# latency. 0.35 of NVLink 4's 450 GB/s is 160 GB/s, below the 460-480 GB/s bus bandwidth nccl-tests reaches on 8
# H100s with gigabyte messages (docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests), as megabyte messages are.
ALLREDUCE_STEP_LATENCY_S = 1.5e-6
ALLREDUCE_BANDWIDTH_SHARE = 0.35


class RooflineCostModel:
    def __init__(self, arch: Architecture, hardware: Hardware, compute_efficiency: float | None = None,
                 memory_efficiency: float = 0.7, step_overhead_s: float = 0.0, seq_overhead_s: float = 0.0,
                 tensor_parallel: int = 1, token_overhead_s: float = 0.0):
        if arch.num_kv_heads % tensor_parallel:
            raise ValueError(f"runner.tensor_parallel={tensor_parallel} does not divide the model's "
                             f"{arch.num_kv_heads} KV heads: each GPU must hold whole heads")
        self.arch, self.hardware, self.tensor_parallel = arch, hardware, tensor_parallel
        # None: the share the hardware file gives for its GPU class (see `Hardware.compute_efficiency`).
        self.compute_efficiency = compute_efficiency or hardware.compute_efficiency
        self.memory_efficiency = memory_efficiency
        self.step_overhead_s, self.seq_overhead_s = step_overhead_s, seq_overhead_s
        self.token_overhead_s = token_overhead_s

    def overhead(self, shape: StepShape) -> float:
        """The engine's own seconds for a step: fixed, plus per sequence (rows of a padded rectangle included) and
        per token (padding included)."""
        return self.step_overhead_s + self.seq_overhead_s * shape.num_rows + self.token_overhead_s * shape.num_tokens

    def gemm_flops(self, shape: StepShape) -> float:
        a = self.arch
        return 2 * a.num_layers * a.active_layer_params * shape.num_tokens + 2 * a.embedding_params * shape.num_sampled

    def attention_flops(self, shape: StepShape) -> float:
        a = self.arch
        return 4 * a.num_layers * a.num_heads * a.head_dim * shape.attention_pairs  # QK^T and PV

    def kv_bytes(self, shape: StepShape) -> float:
        # Read every cached key and value each query's sequence attends to; write the step's new K/V.
        return (shape.kv_tokens_read + shape.num_tokens) * self.arch.kv_bytes_per_token

    def flops(self, shape: StepShape) -> float:
        return self.gemm_flops(shape) + self.attention_flops(shape)

    def bytes(self, shape: StepShape) -> float:
        return self.arch.weight_bytes_read(shape.num_tokens) + self.kv_bytes(shape)

    def allreduce_s(self, shape: StepShape) -> float:
        """Two ring all-reduces per layer of the step's activations `[T, hidden]`; none on one GPU."""
        n = self.tensor_parallel
        if n == 1:
            return 0.0
        message = shape.num_tokens * self.arch.hidden_size * self.arch.bytes_per_param
        # The catalogue gives both directions together.
        one_way = self.hardware.interconnect_bandwidth / 2 * ALLREDUCE_BANDWIDTH_SHARE
        return 2 * self.arch.num_layers * 2 * (n - 1) * (ALLREDUCE_STEP_LATENCY_S + message / n / one_way)

    def predict(self, shape: StepShape) -> float:
        """Seconds inside the model for a step of this shape (the engine's overhead is `step_overhead_s`): each
        GPU's share of the kernels, and the all-reduces between them."""
        return self._seconds(shape, max)

    def predict_many(self, shape: StepShape) -> np.ndarray:
        """`predict` for many steps at once: a shape whose fields are arrays, one entry per step."""
        return self._seconds(shape, np.maximum)

    def _seconds(self, shape: StepShape, maximum) -> float:
        n = self.tensor_parallel
        compute_rate = self.hardware.peak_flops * self.compute_efficiency * n
        memory_rate = self.hardware.memory_bandwidth * self.memory_efficiency * n
        gemm = maximum(self.gemm_flops(shape) / compute_rate,
                       self.arch.weight_bytes_read(shape.num_tokens) / memory_rate)
        attention = maximum(self.attention_flops(shape) / compute_rate, self.kv_bytes(shape) / memory_rate)
        return gemm + attention + self.allreduce_s(shape)

    def num_kv_blocks(self, block_size: int, memory_fraction: float) -> int:
        """Blocks that fit in the GPUs' memory beside the weights (split N ways, as the KV heads are)."""
        n, weights = self.tensor_parallel, self.arch.weight_bytes
        usable = self.hardware.memory_bytes * memory_fraction
        free = n * usable - weights
        if free <= 0:
            gpus = f"{n} x {self.hardware.name}" if n > 1 else self.hardware.name
            needed = next((k for k in range(n + 1, self.arch.num_kv_heads + 1)
                           if self.arch.num_kv_heads % k == 0 and k * usable > weights * 1.1), None)
            hint = f"; runner.tensor_parallel={needed} would hold them" if needed else ""
            raise ValueError(f"the model's weights ({weights / 1e9:.1f} GB) do not fit in {memory_fraction:.0%} of "
                             f"{gpus}'s {self.hardware.memory_bytes / 1e9:.0f} GB{hint}")
        return int(free // (block_size * self.arch.kv_bytes_per_token))

"""A roofline cost model: a named accelerator, a model architecture and a serving engine give each step's time.

A step is three kinds of kernel, each bound by its own compute or its own memory traffic, and the memory-bound
kernels between them (`Architecture.activation_bytes_per_token`), on each GPU's share:

    time = max(dense GEMM FLOPs / (GEMM peak * compute eff.), dense weight bytes / (bandwidth * memory eff.))
           (a smooth norm of the two instead where the engine says so: `GEMM_KNEE_POWER`)
           + dense GEMMs * the GPU's fixed time per GEMM, where measured (`Hardware.gemm_fixed_s`; for the engines
             that take its measured stream rate)
         + max(expert GEMM FLOPs / (GEMM peak * compute eff. * MoE share), expert weight bytes / (...))
         + max(attention FLOPs / (BF16 peak * attention eff.), KV bytes / (bandwidth * memory eff.))
         + tokens * activation bytes per token / (bandwidth * memory eff.)   (engines with `activation_traffic`:
           the kernels between the GEMMs, and those quantizing their inputs for FP8 or FP4 tensor cores)
         + sequences * 2 * linear-attention state bytes / (bandwidth * state kernel share)
           + linear layers * state kernel floor   (Gated DeltaNet layers: each sequence's state read and written back
           once a step, at the rate and with the fixed cost measured of vLLM's kernel; their FLOPs, a few MFLOP a
           token, are left out)
         + all-reduces between the GPUs

The GEMM peak is the weights' format's (FP8 or FP4 tensor cores where the GPU has them, see `Hardware.gemm_peak`).
The bandwidth is the datasheet's at the engine's share, and no more than the GPU was measured to stream where its file
says so and the engine's share was measured on another GPU (`EngineProfile.stream_bandwidth_cap`).
Attention reaches FlashAttention's measured share of peak at the step's keys per query where the hardware file has
it and the engine runs it (`EngineProfile.flash_attention`, `Hardware.attention_share`), else the compute eff.; such
an engine's kernels skip the pairs a prompt chunk's causal mask hides (`StepShape.masked_pairs`), as the measured
rates count them. Where a GPU runs FlashAttention-2 instead, an engine that runs its decode rows in the prompt
chunks' attention call (`EngineProfile.decode_rows_in_query_tiles`) computes each as a whole query tile
(`Hardware.attention_query_tile`).
A mixture of experts reads, per layer, the experts its step's tokens are expected to touch (uniform top-k routing)
and computes only the experts each token is routed to; grouped expert GEMMs reach a smaller share of peak with fewer
tokens per expert (`EngineProfile.moe_share`). Attention counts MLA's absorbed and expanded forms
(`Architecture.attention_flops_per_pair`) and caps a sliding-window layer at its window.

With `tensor_parallel` N, the GPUs of one node split every weight matrix and the attention heads N ways, each
computing 1/N of the FLOPs over 1/N of the weight bytes; the KV cache splits by KV head as far as the heads go (a
latent cache is held whole by every GPU), and two all-reduces per layer move the step's activations between them
over the node's links: a ring all-reduce takes 2 (N-1) steps, each sending 1/N of the message to the next GPU. With
`expert_parallel`, each GPU holds whole experts instead of a slice of every one: the same bytes and FLOPs in total,
but the busiest GPU's share of the experts a step touches sets the time (a few tokens touch few experts, unevenly).
Each expert a layer touches also costs the engine's `expert_overhead_s` of GPU time whatever its tokens, and each
MoE layer its `moe_layer_overhead_s` whatever its experts (the small kernels around the grouped GEMMs).

The engine adds its host time per step (`EngineProfile`: fixed, per sequence, per token); with async scheduling
that work overlaps the GPU's step and only what exceeds it shows. Taking one max over the step's totals instead
would let a compute-bound GEMM hide memory-bound attention, which no kernel does. The architecture comes from a
transformers config, so a model can be described without ever being loaded.
"""

import math

import numpy as np

from harness.architecture import Architecture
from harness.core.kv_cache import WindowBlocks
from harness.sim.costmodel.elementwise import maximum, minimum, sqrt, where
from harness.sim.costmodel.hardware import Hardware, widened_gemm_share
from harness.sim.costmodel.shape import StepShape
from harness.sim.costmodel.startup_memory import default_memory_fraction, pool_bytes_per_token, profile_run_bytes
from harness.sim.engine_profile import EngineProfile

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
# Near the ridge a GEMM neither streams its weights at the full bandwidth share nor computes at its full share of
# peak: its time is a smooth norm of the two bounds, (compute^p + memory^p)^(1/p), not their max. vLLM's GEMM
# benchmark on an H100 (pull request #49363: torch's BF16 GEMM over N=43008 x K=5376, 462 MB of weights) took 157,
# 162 and 200 µs at 64, 128 and 256 tokens, where the weights alone take 151 µs at the held bandwidth share (its
# one-token time) and the FLOPs 43, 86 and 171 µs at 0.7 of peak: p = 3 gives 152, 159 and 203 µs, a max 151, 151
# and 171.
GEMM_KNEE_POWER = 3
# The Gated DeltaNet decode kernel moves each sequence's state at a share of the datasheet bandwidth, after a fixed
# time per layer. vLLM's `fused_recurrent_gated_delta_rule_fwd`, timed per layer on an H200 with Qwen3-Next's shapes
# (vLLM pull request #31722, after its change): 13.60 µs at 32 sequences and 215.12 µs at 1,024 on four GPUs (each
# reading and writing 8 heads of 128 x 128 in bf16, 0.52 MB a sequence), 20.29 and 420.22 µs on two (1.05 MB): 2.58
# and 2.60 TB/s a sequence, 0.54 of the H200's 4.8, after 7.1 and 7.4 µs. SGLang runs kernels of the same origin
# (flash-linear-attention's); the same kernel on a B200 reaches 0.43 of its 8 TB/s after 3.4 µs, which the one share
# here overstates there.
LINEAR_STATE_STREAM_SHARE = 0.54
LINEAR_LAYER_STEP_FLOOR_S = 7.2e-6


class RooflineCostModel:
    def __init__(self, arch: Architecture, hardware: Hardware, engine: EngineProfile,
                 compute_efficiency: float | None = None, tensor_parallel: int = 1, expert_parallel: bool = False):
        n = tensor_parallel
        if arch.num_heads % n or (arch.num_kv_heads % n and n % arch.num_kv_heads):
            raise ValueError(f"runner.tensor_parallel={n} does not split the model's {arch.num_heads} attention heads "
                             f"and {arch.num_kv_heads} KV heads evenly: each GPU must hold whole heads")
        if expert_parallel and (not arch.num_experts or arch.num_experts % n):
            raise ValueError(f"runner.expert_parallel needs a mixture of experts whose experts the "
                             f"{n} GPUs share evenly; the model has {arch.num_experts}")
        self.arch, self.hardware, self.engine = arch, hardware, engine
        self.tensor_parallel, self.expert_parallel = n, expert_parallel
        # None: the hardware class's share of peak FLOP/s (`Hardware.compute_efficiency`), scaled by the engine's.
        self.compute_efficiency = compute_efficiency or engine.compute_efficiency_on(hardware)
        # Attention at FlashAttention's measured rates where the hardware file has them and the engine runs it.
        self._flash_attention = engine.flash_attention and bool(hardware.flash_attention_rates)
        # FlashAttention skips the key blocks a causal mask hides wholly; an engine without it computed them (its
        # fitted figures were read with them in).
        self._skips_masked = engine.flash_attention
        # FlashAttention-2's query tile where the engine runs its decode rows in the prompts' attention call: not for
        # a latent cache (MLA's own kernels) or attention sinks, which FlashAttention-2 lacks (vLLM runs its Triton
        # attention for them, whose tiles a decode row fills).
        tiled = engine.decode_rows_in_query_tiles and not arch.latent_attention and not arch.attention_sinks
        self._query_tile = hardware.attention_query_tile if tiled else 0
        # Bytes/s its kernels stream: the engine's share of the datasheet, no more than the GPU was measured to reach
        # where the engine's share was measured on another GPU.
        self._bandwidth = hardware.memory_bandwidth * engine.memory_efficiency
        if engine.stream_bandwidth_cap and hardware.stream_bandwidth:
            self._bandwidth = min(self._bandwidth, hardware.stream_bandwidth)
        # What every step's cost is built from and no step changes: the parameters a token multiplies outside and
        # inside its routed experts, the weights every step reads, one expert's bytes, attention per query-key pair, a
        # token's cache and how many ways the GPUs split it.
        self._routed_params = arch.num_moe_layers * arch.experts_per_token * arch.expert_params
        self._dense_params = arch.active_layer_params - self._routed_params
        self._dense_bytes = arch.dense_weight_bytes_read()
        self._dense_peak = hardware.gemm_peak(arch.weight_format_bytes)
        # Every GPU runs each dense GEMM on its slice: the fixed time per kernel does not split. Measured with the
        # GPU's stream rate, it goes with it (an engine fitted with each GPU's shortfall in its own share takes
        # neither).
        gemm_fixed_s = hardware.gemm_fixed_s if engine.stream_bandwidth_cap else 0.0
        self._dense_fixed_s = arch.num_dense_gemms * gemm_fixed_s
        self._dense_widened = hardware.widens(arch.weight_format_bytes)
        self._expert_padding = self._padded_expert_params() / arch.expert_params if arch.num_experts else 1.0
        self._expert_bytes = arch.num_moe_layers * arch.expert_params * arch.expert_format_bytes * self._expert_padding
        # The weights' memory on all GPUs together, the experts as the engine holds them.
        self.weight_bytes = arch.weight_bytes + (self._expert_padding - 1) * arch.routed_expert_params * \
            arch.expert_format_bytes
        self._prefill_pair_flops = arch.attention_flops_per_pair(decode=False)
        self._decode_pair_flops = arch.attention_flops_per_pair(decode=True)
        self._kv_bytes_per_token, self._kv_shards = arch.kv_bytes_per_token, arch.kv_shards(n)
        self._kv_reread_bytes_per_token = arch.kv_reread_bytes_per_token
        self._pool_bytes_per_token = pool_bytes_per_token(arch, engine.cache_sizing)
        # A full-attention layer's pairs cost in proportion to its head size where it differs (Gemma 4's 512 to 256).
        self._full_pair_scale = (arch.full_head_dim or arch.head_dim) / arch.head_dim
        # DeepSeek Sparse Attention's indexer scores every pair in FP8 (DeepGEMM's MQA logits kernel), at the rate the
        # GPU's FP8 GEMMs reach where it has FP8 tensor cores: its FLOPs in BF16 terms, to go with the attention's.
        fp8_speedup = hardware.gemm_peak(1.0) / hardware.gemm_peak(arch.bytes_per_param)
        self._index_pair_flops = arch.num_indexed_layers * arch.index_flops_per_pair() / fp8_speedup
        self._indexed_latent_bytes = arch.indexed_latent_bytes_per_token
        # DeepSeek-V4's CSA layers: the indexer scores each query against every compressed key, the attention reads
        # the entries it picks.
        self._compressed_index_flops = arch.num_csa_layers * arch.index_flops_per_pair() / fp8_speedup
        self._csa_entry_bytes = arch.num_csa_layers * arch.kv_width * arch.kv_element_bytes
        # Linear-attention layers read each sequence's state and write it back once a step (a decode row's token, or
        # a prompt chunk's in one pass), split by value head: `[B, H_v, D_k, D_v]`.
        self._state_shards = min(n, arch.linear_value_heads) if arch.num_linear_layers else 1
        self._state_traffic = 2 * arch.linear_state_bytes / self._state_shards
        self._state_bandwidth = hardware.memory_bandwidth * LINEAR_STATE_STREAM_SHARE
        self._state_floor_s = arch.num_linear_layers * LINEAR_LAYER_STEP_FLOOR_S
        self._activation_bytes = 0.0
        if engine.activation_traffic:
            self._activation_bytes = arch.activation_bytes_per_token(n) + self._input_quantization_bytes(n)

    def _padded_expert_params(self) -> int:
        """One expert's parameters as the engine holds them (`EngineProfile.padded_fp4_experts`): its hidden width to
        a multiple of 256, each GPU's share of its intermediate width (all of it with expert parallelism) to one of
        128, in FP4 alone."""
        a = self.arch
        if not (self.engine.padded_fp4_experts and a.expert_format_bytes < 1):
            return a.expert_params
        split = 1 if self.expert_parallel else self.tensor_parallel
        width = -(-a.expert_intermediate_size // split // 128) * 128 * split
        return 3 * -(-a.hidden_size // 256) * 256 * width

    def _input_quantization_bytes(self, tensor_parallel: int) -> float:
        """Bytes each GPU moves per token quantizing the linear layers' inputs for FP8 or FP4 tensor cores
        (`Architecture.quantized_inputs_per_token`): each element read in the compute dtype and written in the
        weights' format. Nothing where no tensor cores of the weights' format run the GEMM (`Hardware.has_cores_for`):
        weights in the compute dtype or BF16, or widened in the kernel (Marlin's W8A16 on an A100 takes BF16
        activations)."""
        a = self.arch
        outside, routed = a.quantized_inputs_per_token(tensor_parallel)

        def per_element(weight_bytes):
            return a.bytes_per_param + weight_bytes if self.hardware.has_cores_for(weight_bytes) else 0.0

        return outside * per_element(a.weight_format_bytes) + routed * per_element(a.expert_format_bytes)

    def host_seconds(self, shape: StepShape):
        """The engine's host work for a step: fixed, plus per sequence (rows of a padded rectangle included) and per
        token (padding included)."""
        e = self.engine
        return e.step_overhead_s + e.seq_overhead_s * shape.num_rows + e.token_overhead_s * shape.num_tokens

    def overhead(self, shape: StepShape, busy):
        """What the host adds to a step of `busy` seconds on the GPU: all its work, or with async scheduling (the
        next step scheduled while the GPU runs this one) only what the GPU's step does not cover."""
        host = self.host_seconds(shape)
        return maximum(host - busy, 0.0) if self.engine.async_scheduling else host

    def gemm_flops(self, shape: StepShape):
        """Dense GEMMs (attention projections, dense and shared-expert MLPs, routers, the LM head) and the routed
        experts' GEMMs, over the step's tokens."""
        dense = 2 * self._dense_params * shape.num_tokens + 2 * self.arch.embedding_params * shape.num_sampled
        return dense, 2 * self._routed_params * self._expert_padding * shape.num_tokens

    def attention_pairs(self, shape: StepShape):
        """The query-key pairs the step's attention computes."""
        return shape.attention_pairs - shape.masked_pairs if self._skips_masked else shape.attention_pairs

    def attention_flops(self, shape: StepShape):
        return self._attention_flops(shape, self.attention_pairs(shape))

    def _attention_flops(self, shape: StepShape, pairs):
        """`attention_flops` given the step's `attention_pairs`, which a step's time reads twice."""
        a = self.arch
        prefill_pairs = pairs - shape.decode_pairs
        decode_rows = self._decode_pair_flops * shape.decode_pairs
        if self._query_tile:
            # A decode row fills one of FlashAttention-2's tile rows per head, the tile computed whole; in a step of
            # decode rows alone the kernel puts a KV head's group of query heads in those rows
            # (`seqlenq_ngroups_swapped` in its mha_varlen_fwd), which fill them that much more.
            group = a.num_heads // a.num_kv_heads
            decode_rows = decode_rows * where(prefill_pairs > 0, self._query_tile, max(self._query_tile / group, 1.0))
        per_layer = self._prefill_pair_flops * prefill_pairs + decode_rows
        full = a.num_full_layers * per_layer
        if self._full_pair_scale != 1.0:
            full = full * self._full_pair_scale
        if a.num_indexed_layers:
            # An indexed layer's query attends to the `index_topk` keys its indexer picks, the indexer itself scoring
            # every pair.
            picked = self._picked(pairs, shape) / maximum(pairs, 1)
            full = full - a.num_indexed_layers * per_layer * (1 - picked) + self._index_pair_flops * pairs
        if a.keys_are_values:
            full = full + self._compressed_attention_flops(shape, pairs, per_layer)
        if not a.num_sliding_layers:
            return full
        # A sliding layer's query attends to at most `sliding_window` keys.
        windowed = minimum(1.0, shape.num_tokens * a.sliding_window / maximum(pairs, 1))
        return full + a.num_sliding_layers * per_layer * windowed

    def _compressed_attention_flops(self, shape: StepShape, pairs, per_layer):
        """DeepSeek-V4's compressed layers, beside their window: a CSA query attends to the `index_topk` entries its
        indexer picks of the one per `csa_rate` tokens before it, the indexer scoring them all; an HCA query to every
        one of its one per `hca_rate` tokens."""
        a = self.arch
        flops = 0.0
        if a.num_csa_layers:
            entries = pairs / a.csa_rate
            picked = self._picked(entries, shape) / maximum(pairs, 1)
            flops = a.num_csa_layers * per_layer * picked + self._compressed_index_flops * entries
        if a.num_hca_layers:
            flops = flops + a.num_hca_layers * per_layer / a.hca_rate
        return flops

    def _picked(self, candidates, shape: StepShape):
        """Of the keys (or compressed entries) an indexer scores for the step's queries, those they attend to and
        read: `index_topk` a query at most (a decode row's own, a prompt chunk's whole context once)."""
        return minimum(candidates, shape.num_tokens * self.arch.index_topk)

    def kv_bytes(self, shape: StepShape):
        """KV bytes the step moves, all GPUs together: every cached key and value each query's sequence attends to
        (a sliding layer's last `sliding_window`; a layer reading another's cache reads it again; an indexed layer the
        keys its indexer picks; DeepSeek-V4's compressed entries, a CSA layer's those its indexer picks), and the
        step's new ones."""
        a = self.arch
        read = self._kv_bytes_per_token * (shape.kv_tokens_read + shape.num_tokens)
        if self._kv_reread_bytes_per_token:
            read = read + self._kv_reread_bytes_per_token * shape.kv_tokens_read
        if self._indexed_latent_bytes:
            # An indexed layer reads every cached token's index key but only the K and V (the latent) of the keys
            # picked for each query.
            cached = shape.kv_tokens_read
            read = read - self._indexed_latent_bytes * (cached - self._picked(cached, shape))
        if self._csa_entry_bytes:
            # A CSA layer reads every compressed index key but only the entries picked for each query.
            entries = shape.kv_tokens_read / a.csa_rate
            read = read - self._csa_entry_bytes * (entries - self._picked(entries, shape))
        if not a.num_sliding_layers:
            return read
        sliding = a.num_sliding_layers * a.kv_width * a.kv_element_bytes
        return read + sliding * (minimum(shape.kv_tokens_read, shape.num_rows * a.sliding_window) + shape.num_tokens)

    def expert_bytes_per_gpu(self, num_tokens):
        """The routed experts' bytes the busiest GPU reads: 1/N of every touched expert, or its own whole ones."""
        return self._expert_bytes_of(self._busiest(self.arch.experts_touched(num_tokens)))

    def _busiest(self, touched):
        """Of the experts a step touches per MoE layer, those the busiest GPU works on: a slice of every one (tensor
        parallel), or its own (expert parallel): the mean share plus the spread of the maximum over N GPUs, about
        sigma sqrt(2 ln N) above the mean for N draws near a normal one."""
        a, n = self.arch, self.tensor_parallel
        if not self.expert_parallel or n == 1:
            return touched
        chance = touched / a.num_experts
        local = a.num_experts / n
        return local * chance + sqrt(local * chance * (1 - chance)) * math.sqrt(2 * math.log(n))

    def _expert_bytes_of(self, experts_per_gpu):
        return experts_per_gpu * self._expert_bytes / (1 if self.expert_parallel else self.tensor_parallel)

    def allreduce_s(self, shape: StepShape):
        """Two ring all-reduces per layer of the step's activations `[T, hidden]`; none on one GPU."""
        n = self.tensor_parallel
        if n == 1:
            return 0.0
        message = shape.num_tokens * self.arch.hidden_size * self.arch.bytes_per_param
        # The catalogue gives both directions together.
        one_way = self.hardware.interconnect_bandwidth / 2 * ALLREDUCE_BANDWIDTH_SHARE
        return 2 * self.arch.num_layers * 2 * (n - 1) * (ALLREDUCE_STEP_LATENCY_S + message / n / one_way)

    def _gemm_seconds(self, compute, memory):
        """A dense GEMM's time from its two bounds: their smooth norm where the engine's kernels were fitted so
        (`EngineProfile.gemm_knee`), else the sharp roofline's max."""
        if not self.engine.gemm_knee:
            return maximum(compute, memory)
        return (compute**GEMM_KNEE_POWER + memory**GEMM_KNEE_POWER) ** (1 / GEMM_KNEE_POWER)

    def predict(self, shape: StepShape) -> float:
        """Seconds on the GPUs for a step of this shape (the engine's host time is `overhead`): each GPU's share of
        the kernels, and the all-reduces between them."""
        return float(self._seconds(shape))

    def predict_many(self, shape: StepShape) -> np.ndarray:
        """`predict` for many steps at once: a shape whose fields are arrays, one entry per step."""
        return self._seconds(shape)

    def dense_gemm_s(self, shape: StepShape):
        """Seconds of the step's dense GEMMs on each GPU: the attention projections, dense and shared-expert MLPs,
        routers and LM head, each GPU computing and reading its 1/N."""
        return self._dense_gemm_s(shape, self.gemm_flops(shape)[0])

    def _dense_gemm_s(self, shape: StepShape, dense_flops):
        """`dense_gemm_s` given the step's dense FLOPs, which a step's time computes once with its experts'."""
        n = self.tensor_parallel
        gemm_peak = self._dense_peak * (self.compute_efficiency * n)
        if self._dense_widened:  # a mixed-precision kernel: a falling share of the BF16 peak as the tokens grow
            gemm_peak = gemm_peak * widened_gemm_share(shape.num_tokens)
        streamed = self._gemm_seconds(dense_flops / gemm_peak, self._dense_bytes / n / self._bandwidth)
        return streamed + self._dense_fixed_s

    def _seconds(self, shape: StepShape):
        a, n = self.arch, self.tensor_parallel
        compute = self.compute_efficiency * n
        memory = self._bandwidth
        dense_flops, expert_flops = self.gemm_flops(shape)
        seconds = self._dense_gemm_s(shape, dense_flops)
        if a.num_experts:
            # No `widened_gemm_share`: the engine's fitted share for grouped expert GEMMs (`moe_share`) holds their
            # kernels' own shortfall, widened weights (gpt-oss's MXFP4 experts on a Hopper) included.
            expert_peak = self.hardware.gemm_peak(a.expert_format_bytes) * compute
            touched = a.experts_touched(shape.num_tokens)  # per MoE layer, all GPUs together
            per_expert = shape.num_tokens * a.experts_per_token / maximum(touched, 1e-9)
            busiest = self._busiest(touched)
            seconds = seconds + maximum(expert_flops / (expert_peak * self.engine.moe_share(per_expert)),
                                        self._expert_bytes_of(busiest) / memory)
            seconds = seconds + a.num_moe_layers * (busiest * self.engine.expert_overhead_s
                                                    + self.engine.moe_layer_overhead_s)
        kv_per_gpu = self.kv_bytes(shape) / self._kv_shards
        pairs = self.attention_pairs(shape)
        attention_compute = compute
        if self._flash_attention:
            attention_compute = self.hardware.attention_share(pairs / shape.num_tokens) * n
        attention = maximum(self._attention_flops(shape, pairs) / (self.hardware.peak_flops * attention_compute),
                            kv_per_gpu / memory)
        between_gemms = self._activation_bytes * shape.num_tokens / memory
        return seconds + attention + between_gemms + self.state_s(shape.num_rows) + self.allreduce_s(shape)

    def state_s(self, num_rows):
        """Seconds a step of `num_rows` sequences spends reading and writing their linear-attention states, on each GPU:
        the decode kernel's measured rate and fixed time per layer (`LINEAR_STATE_STREAM_SHARE`); none without such
        layers."""
        return self._state_traffic * num_rows / self._state_bandwidth + self._state_floor_s

    def num_kv_blocks(self, block_size: int, memory_fraction: float | None,
                      caps: tuple[int, int] | None = None) -> int:
        """Blocks that fit in each GPU's memory beside its share of the weights (the cache split as `kv_shards`), as
        the engine sizes its cache (`EngineProfile.cache_sizing`): `memory_fraction` of the GPU (None: the engine's
        default), less, for vLLM, what its profile run at `caps` (max_num_seqs, max_batch_tokens) held."""
        a, n = self.arch, self.tensor_parallel
        if memory_fraction is None:
            memory_fraction = default_memory_fraction(self.engine.cache_sizing, self.hardware.memory_bytes, n)
        held = 0.0
        if self.engine.cache_sizing == "vllm" and caps:
            num_seqs, num_tokens = caps
            held = profile_run_bytes(a, num_tokens, num_seqs, n, self.expert_parallel)
        usable = self.hardware.memory_bytes * memory_fraction - held
        if n * usable <= self.weight_bytes:
            gpus = f"{n} x {self.hardware.name}" if n > 1 else self.hardware.name
            needed = next((k for k in (2, 4, 8, 16) if k > n and not a.num_heads % k
                           and k * usable > self.weight_bytes * 1.1), None)
            hint = f"; runner.tensor_parallel={needed} would hold them" if needed else ""
            because_held = n * (usable + held) > self.weight_bytes  # they would fit but for the start-up's peak
            raise ValueError(f"the model's weights ({self.weight_bytes / 1e9:.1f} GB) do not fit in "
                             f"{memory_fraction:.0%} of {gpus}'s {self.hardware.memory_bytes / 1e9:.0f} GB"
                             f"{f' less the {held / 1e9:.1f} GB the engine holds at start-up' if because_held else ''}"
                             f"{hint}")
        return int((n * usable - self.weight_bytes) // self._block_bytes(block_size))

    def state_blocks(self, block_size: int) -> int:
        """Blocks of the cache each running sequence holds for its linear-attention state, all GPUs together: a
        fixed size, whatever the sequence's length (vLLM's V1 engine keeps it in the same pool as the cache)."""
        if not self.arch.num_linear_layers:
            return 0
        state = self.arch.linear_state_bytes * (self.tensor_parallel // self._state_shards)
        return -int(-state // self._block_bytes(block_size))

    def window_blocks(self, block_size: int) -> WindowBlocks | None:
        """What each sequence's sliding-window (or chunked) layers hold in the pool of an engine that sizes its
        cache as vLLM's V1 does: its hybrid cache manager gives them block tables of their own in the one pool, a
        block per block of tokens up to the window's cdiv(window, block_size) + 1 (gpt-oss: 9 of 16 tokens beside
        its full layers'; Llama 4's chunked layers: up to 513, so as many as the full layers' below 8,192 tokens).
        The layers of each kind are split into groups of one size, the smaller count, or the larger where it is under
        1.5 times the smaller (`_get_kv_cache_groups_uniform_page_size` in vLLM's kv_cache_utils), the last group
        padded. None for an engine with a pool of its own for these layers (SGLang's) or none, and where the layers
        keeping a cache are not full and window ones of one width (what vLLM's uniform-page grouping needs)."""
        a = self.arch
        full = a.num_full_layers - a.full_layers_reusing_kv
        window = a.num_sliding_layers - a.sliding_layers_reusing_kv
        uniform = a.kv_bytes_per_token == full * a.kv_width * a.kv_element_bytes and a.full_kv_width == a.kv_width
        if self.engine.cache_sizing != "vllm" or not (full and window and uniform):
            return None
        group = min(full, window)
        if max(full, window) < 1.5 * group:
            group = max(full, window)
        return WindowBlocks(max_blocks=-(-a.sliding_window // block_size) + 1,
                            window_layers=-(-window // group) * group, full_layers=full)

    def hybrid_block_size(self, block_size: int) -> int:
        """The cache block an engine that sizes its cache as vLLM does gives a model with linear-attention layers: no
        smaller than one layer's state, so that a block of a full-attention layer and a state take pages of one size
        (`verify_and_update_config` of vLLM's HybridAttentionMambaModelConfig: 16 x ceil(state page / (16 x a
        token's page)), 528 tokens for Qwen3.5-9B), or `block_size` if larger; `block_size` for any other model or
        engine."""
        a = self.arch
        if not a.num_linear_layers or self.engine.cache_sizing != "vllm":
            return block_size
        state_page = a.linear_state_bytes / a.num_linear_layers / self._state_shards
        token_page = a.kv_width * a.kv_element_bytes / self._kv_shards
        return max(block_size, 16 * math.ceil(state_page / (16 * token_page)))

    def _block_bytes(self, block_size: int) -> float:
        """A cache block's bytes, all GPUs together: each token's cache is held by N / shards GPUs (a latent cache
        by all N), with, under SGLang, its share of the sliding-window layers' own pool (`pool_bytes_per_token`)."""
        if not self._kv_bytes_per_token:
            raise ValueError("the model has no layer attending to its whole context, so no KV cache to size: "
                             "models of linear-attention layers alone are not modelled")
        return block_size * self._pool_bytes_per_token * (self.tensor_parallel // self._kv_shards)

"""How a serving engine sizes its KV cache at start-up: what it holds back beside the weights.

**vLLM** sizes its cache after a profile run (`Worker.determine_available_memory`, vllm/v1/worker/gpu_worker.py): the
cache gets `gpu_memory_utilization` x the GPU's memory, less the weights, less the torch memory the run's peak took
and the memory that grew outside torch. The run is one forward pass of `max_num_batched_tokens` dummy tokens, then
the sampler on `min(max_num_seqs, tokens)` rows of logits (`GPUModelRunner.profile_run`, `_dummy_sampler_run`);
the forward pass's activations are freed before the sampler runs, so the larger of the two is the peak.

- The forward pass's widest moment is an MLP: the residual stream and its normed copy beside the gate-up output
  and its activation (3 x the width a GPU holds); a fused MoE holds each token's `experts_per_token` rows of them
  and their outputs, un-summed.
- The sampler's moment holds the logits four times over: as the LM head wrote them (the model's dtype), their fp32
  copy (`Sampler.forward`; temperature divides it in place), and FlashInfer's top-k-masked copy and its softmax
  (`top_k_top_p_sampling_from_logits`, top-k first, FlashInfer 0.3.1): 14 bytes a bf16 logit, 2.2 GB for 1,024 rows
  of Qwen3's 151,936. vLLM 0.10-0.11 sample through FlashInfer where it is installed (`TopKTopPSampler`, read in the
  0.11.0 wheel), and its dummy requests ask for top-k and top-p both; vLLM 0.19 holds as much another way (a Triton
  kernel masks the fp32 logits in place, then the softmax and `random_sample`'s exponential draws, 4 bytes each), so
  the count holds for every published V1 run here. vLLM 0.12-0.16 made FlashInfer opt-in and sorted the logits
  (values and int64 indices beside the probabilities and masks, some 28 bytes a logit), which this count does not
  follow: the sort's values and indices alone would leave GPUStack's Qwen3-32B runs below about 1,620 blocks, too
  few for them to have started. GPUStack's H100 runs of Qwen3-32B bound it from above: they served 32,100-token
  requests at `--max-model-len 32768`, which vLLM starts only with a cache of 2,048 blocks of 16, and this count
  leaves 2,069 (the run's hidden states, 0.1 GB beside the logits, are left out: with them the count would fall 4
  blocks short, within what the 0.16 GiB outside torch below, an older engine's figure, leaves open). Counted at 8
  bytes a logit (fp32 logits and probabilities alone) the cache came out 2% larger for Qwen3-14B and 9% for
  Qwen3-32B on an H100, and the H100's bursts of 2,000-token prompts, whose TPOT follows how many requests decode
  beside each prompt chunk, 10-11% long in TPOT (README, "Grounding").
- Memory outside torch (CUDA libraries' workspaces): 0.16 GiB in vLLM's own log on an H100 at one GPU (PR #12126,
  "non_torch_memory takes 0.16GiB"). More GPUs add communicators' buffers, which no figure here covers.

Where the weights leave little room (Qwen3-32B on an 80 GB GPU: 11 GB beside them), this is a fifth of that room,
and the concurrency a burst reaches follows it: GPUStack's H100 page measured a peak of 186 output tokens a second
on 4,000-token prompts at 43 ms a decode step, 8 requests decoding at once, where a cache with nothing held back
holds 10 (README, "Simulation").

**SGLang** gives the weights and the cache `--mem-fraction-static` of the GPU and its activations and CUDA graphs
the rest, so nothing comes off the share; its default share is computed from the GPU's memory
(`ServerArgs._handle_gpu_memory_settings`, python/sglang/srt/server_args.py, the 0.5 series): (memory - reserved) /
memory, reserving in MiB 512 of metadata, 1.5 per token of a chunked-prefill chunk for activations, 2 per batch of
its largest decode CUDA graph, and 1,024 per 8 GPUs; at least 10 GiB on a GPU over 60 GiB. The chunk and the
largest graph grow with the GPU's memory (`SGLANG_MEMORY_CLASSES`). On an 80 GB GPU at one GPU that is 0.83: one
SGLang user found 0.828 for Qwen3-32B on an H100 (sgl-project/sglang issue #29092). Qwen3-32B's cache then holds
half of what vLLM's does on the same GPU, as GPUStack's pages show: SGLang's peak output rate on ShareGPT was 1,329
tokens a second to vLLM's 2,360 at a like decode step (README, "Simulation").
"""

from harness.architecture import Architecture
from harness.config import DEFAULT_MEMORY_FRACTION

MIB = 2**20
NON_TORCH_BYTES = 0.16 * 2**30
SAMPLER_FP32_COPIES = 3  # of each logit beside the LM head's own: fp32 logits, their top-k mask, its softmax
# SGLang's defaults by the GPU's memory: (below this many MiB, chunked-prefill chunk, largest decode graph batch under
# 4 GPUs, at 4 or more).
SGLANG_MEMORY_CLASSES = ((20 * 1024, 2048, 8, 8), (35 * 1024, 2048, 24, 80), (60 * 1024, 4096, 32, 160),
                         (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))


def forward_peak_bytes(arch: Architecture, num_tokens: int, tensor_parallel: int, expert_parallel: bool) -> float:
    """The widest activations one GPU holds in a forward pass of `num_tokens` tokens: an MLP's."""
    n = tensor_parallel
    dense = arch.num_dense_layers or not arch.num_experts
    widths = [arch.num_mlp_matrices * arch.intermediate_size / n] if dense else []
    if arch.num_experts:
        expert_width = arch.expert_intermediate_size / (1 if expert_parallel else n)
        # A fused MoE's caches: gate-up output and activation per routed row, and each row's output before the sum.
        widths.append(arch.experts_per_token * (3 * expert_width + arch.hidden_size))
    return num_tokens * (2 * arch.hidden_size + max(widths)) * arch.bytes_per_param


def profile_run_bytes(arch: Architecture, max_batch_tokens: int, max_num_seqs: int, tensor_parallel: int = 1,
                      expert_parallel: bool = False) -> float:
    """Bytes each GPU holds back from its KV cache for vLLM's profile run at these caps."""
    forward = forward_peak_bytes(arch, max_batch_tokens, tensor_parallel, expert_parallel)
    return NON_TORCH_BYTES + max(forward, sampler_peak_bytes(arch, min(max_num_seqs, max_batch_tokens)))


def sampler_peak_bytes(arch: Architecture, num_rows: int) -> float:
    """The logits vLLM's dummy sampler run holds at once, `[R, vocab]`: in the model's dtype and three fp32 copies."""
    return num_rows * arch.vocab_size * (arch.bytes_per_param + 4 * SAMPLER_FP32_COPIES)


def sglang_mem_fraction_static(memory_bytes: float, tensor_parallel: int = 1) -> float:
    """SGLang's default --mem-fraction-static on a GPU of `memory_bytes`, at `tensor_parallel` GPUs."""
    memory = memory_bytes / MIB
    _, chunk, graph_batch_small, graph_batch_large = next(c for c in SGLANG_MEMORY_CLASSES if memory < c[0])
    graph_batch = graph_batch_small if tensor_parallel < 4 else graph_batch_large
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_batch * 2 + tensor_parallel / 8 * 1024
    if memory > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((memory - reserved) / memory, 3)


# SGLang's sliding-window layers keep a pool of their own, sized at start beside the full layers' to hold
# --swa-full-tokens-ratio (0.8 by default) as many tokens (`ModelRunner.set_num_token_hybrid`: the memory for N tokens
# of every layer split as full_tokens x full_layers + 0.8 full_tokens x window_layers): each token the full layers
# can hold costs 0.8 of a window layers' token too.
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8


def pool_bytes_per_token(arch, cache_sizing: str) -> float:
    """The cache memory one token of the pool the engine sizes takes (`EngineProfile.cache_sizing`): the layers
    attending to the whole context, and under SGLang its sliding-window layers' pool's share."""
    if cache_sizing == "sglang":
        return arch.kv_bytes_per_token + SGLANG_SWA_FULL_TOKENS_RATIO * arch.sliding_kv_bytes_per_token
    return arch.kv_bytes_per_token


def default_memory_fraction(cache_sizing: str, memory_bytes: float, tensor_parallel: int = 1) -> float:
    """The share of a GPU's memory an engine that sizes its cache as `cache_sizing` gives weights and cache by
    default (`EngineProfile.cache_sizing`)."""
    if cache_sizing == "sglang":
        return sglang_mem_fraction_static(memory_bytes, tensor_parallel)
    return DEFAULT_MEMORY_FRACTION

"""The parts every run is assembled from, ours or a peer's, real or simulated: its workload, what `auto` means on its
device (KV blocks, engine caps), and a replica with the strategy's options. The composition roots (`harness.job`,
`harness.peers.job`, `harness.sim.replica`) put them together; this module imports none of them."""

import logging

from harness.architecture import Architecture
from harness.config import CPU_ENGINE_CAPS, DEFAULT_MEMORY_FRACTION, ConfigError, RunConfig
from harness.core.engine import Engine
from harness.core.kv_cache import WindowBlocks
from harness.core.replica import build_replica
from workloads import build_workload

log = logging.getLogger(__name__)
CPU_NUM_BLOCKS = 2048  # `kv_cache.num_blocks=auto` on a CPU, real or simulated: 32k slots at block size 16


def load_workload(cfg: RunConfig, vocab_size: int, tokenizer, max_model_len: int, with_ids: bool = True):
    workload = build_workload(cfg.workload, vocab_size, tokenizer, max_model_len, with_ids)
    for key, value in workload.info.items():
        if key != "provenance":  # long; the report carries it
            log.info("workload %s: %s", key, value)
    return workload


def largest_step(cfg: RunConfig, workload, engine_caps: tuple[int, int], max_model_len: int) -> tuple[int, int, bool]:
    """(rows, tokens a row, padded) of the largest forward pass a strategy may run on this workload at this
    concurrency, whichever strategy runs: the larger, in tokens, of a ragged step filling the token budget and a padded
    batch of as many rows as the concurrency lets in, each as wide as the longest prompt the context holds. Every
    strategy holds back the same, so a sweep compares them on one cache, as the simulator's does."""
    num_seqs, num_tokens = engine_caps
    options = cfg.strategy.model_dump()
    budget = options.get("max_batch_tokens", "auto")
    ragged = (1, min(num_tokens if budget == "auto" else budget, max_model_len), False)
    seqs = options.get("batch_size", options.get("max_num_seqs", "auto"))
    rows = min(num_seqs if seqs == "auto" else seqs, len(workload.requests))
    longest = max((spec.prompt_len for spec in workload.requests if spec.prompt_len <= max_model_len), default=1)
    return max(ragged, (max(1, rows), longest, True), key=lambda step: step[0] * step[1])


def device_num_blocks(cfg: RunConfig, model, device, step: tuple[int, int, bool]) -> int:
    """`kv_cache.num_blocks`, `auto` resolved: on a GPU, the memory share vLLM's `--gpu-memory-utilization` gives
    the process, less what the weights hold and what the largest step (`largest_step`: rows, tokens a row, padded)
    was measured to take at its peak; on a CPU, the fixed pool. Raises ConfigError when nothing is left for it."""
    if cfg.kv_cache.num_blocks != "auto":
        return cfg.kv_cache.num_blocks
    if device.type != "cuda":
        return CPU_NUM_BLOCKS
    import torch

    from harness.real.runner import activation_peak_bytes

    rows, row_tokens, padded = step
    peak = activation_peak_bytes(model, rows, row_tokens, padded, cfg.kv_cache.block_size, cfg.kernel_backend)
    free, total = torch.cuda.mem_get_info(device)
    share = DEFAULT_MEMORY_FRACTION if cfg.kv_cache.memory_fraction == "auto" else cfg.kv_cache.memory_fraction
    left = share * total - (total - free) - peak
    arch = Architecture.from_config(model.config, next(model.parameters()).dtype.itemsize)
    block_bytes = cfg.kv_cache.block_size * arch.kv_bytes_per_token
    if left < block_bytes:
        gib = 2**30
        raise ConfigError(f"kv_cache: no GPU memory left for a KV cache: of {share:g} x {total / gib:.1f} GiB, the "
                          f"weights and what else this process holds take {(total - free) / gib:.1f} GiB and a step "
                          f"of {rows} x {row_tokens} tokens {peak / gib:.1f} GiB; lower the batch (concurrency, "
                          f"strategy.max_batch_tokens) or raise kv_cache.memory_fraction")
    log.info("kv cache: %.1f GiB, of %g x %.1f GiB less %.1f GiB held (weights) and %.1f GiB at the peak of a step "
             "of %d x %d tokens", left / 2**30, share, total / 2**30, (total - free) / 2**30, peak / 2**30, rows,
             row_tokens)
    return int(left // block_bytes)


def device_caps(device) -> tuple[tuple[int, int], str]:
    """The engine caps `auto` means on this device ((max_num_seqs, max_batch_tokens), whose they are)."""
    if device.type != "cuda":
        return CPU_ENGINE_CAPS, "the CPU defaults"
    import torch

    from harness.sim.costmodel.hardware import serving_defaults

    name = torch.cuda.get_device_name(device)
    return serving_defaults(name, torch.cuda.get_device_properties(device).total_memory), f"vLLM's on {name}"


def configured_replica(cfg: RunConfig, make_runner, num_blocks: int, max_model_len: int, eos, engine_class,
                       caps: tuple[tuple[int, int], str], scheduler: str = "vllm", recv_interval: int = 1,
                       state_blocks: int = 0, window: WindowBlocks | None = None) -> Engine:
    """A replica with the strategy's options, `auto` caps replaced by `caps` ((sequences, tokens), whose), continuous
    batching scheduled as `scheduler`'s engine does (SGLang's taking requests in every `recv_interval` steps), each
    sequence holding `state_blocks` blocks for a linear-attention state (then no prefix caching: not modelled) and
    its sliding-window layers' blocks as `window` says, if given."""
    (num_seqs, num_tokens), whose = caps
    most = num_blocks // (1 + state_blocks + (window.held(1) if window else 0))
    if num_seqs > most:  # `auto` fits the hardware: no more running requests than the cache holds at a block each
        num_seqs, whose = most, f"{whose}, capped at the KV cache's {num_blocks} blocks"
    if state_blocks and cfg.kv_cache.prefix_caching:
        log.info("prefix caching off: a model with linear-attention layers keeps a state per sequence, which vLLM "
                 "does not cache by default and this simulator does not model cached")
    options = cfg.strategy.model_dump(exclude={"name"})
    auto = sorted(key for key, value in options.items() if value == "auto")
    options |= {key: num_tokens if key == "max_batch_tokens" else num_seqs for key in auto}
    try:
        engine = build_replica(cfg.strategy.name, options, make_runner, num_blocks=num_blocks,
                               block_size=cfg.kv_cache.block_size, max_model_len=max_model_len, eos_token_ids=eos,
                               engine_class=engine_class,
                               prefix_caching=cfg.kv_cache.prefix_caching and not state_blocks,
                               scheduler=scheduler, eviction=cfg.kv_cache.eviction, recv_interval=recv_interval,
                               state_blocks=state_blocks, window=window)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    engine.caps_source = f"{', '.join(auto)} from {whose}" if auto else "as configured"
    if auto:
        log.info("engine caps: %s = %s (%s)", ", ".join(auto), ", ".join(str(options[k]) for k in auto), whose)
    return engine

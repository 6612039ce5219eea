"""Simulated replicas: which engine a simulated replica runs (the strategy's simulated engine, or the step-by-step
one where the simulated engine does not cover the strategy's options), and the replicas a `runner=sim` run gets."""

import logging
from functools import partial

from harness.architecture import Architecture
from harness.config import CPU_ENGINE_CAPS, ConfigError, RunConfig
from harness.core.engine import Engine
from harness.core.kv_cache import BlockAllocator
from harness.model_spec import (
    DTYPE_BYTES,
    dtype_name,
    load_tokenizer,
    read_model_config,
    transformers_num_params,
)
from harness.run_parts import CPU_NUM_BLOCKS, configured_replica, load_workload
from harness.sim.continuous import SimContinuous
from harness.sim.costmodel import RooflineCostModel, build_cost_model
from harness.sim.padded import SimDynamic, SimStatic
from harness.sim.router import make_router
from harness.sim.runner import SimRunner
from harness.sim.sglang import SimSGLang
from strategies import Strategy
from strategies.continuous import ContinuousBatching
from strategies.sglang import SGLangBatching

log = logging.getLogger(__name__)
# How far a model's parameters read from its config may stray from transformers' count before a run says so: the norms
# and biases the shape leaves out come to a fraction of a percent.
MISREAD_TOLERANCE = 0.02
SIMULATED_ENGINES = {"static": SimStatic, "dynamic": SimDynamic, "continuous": SimContinuous}


def simulated_engine(strategy: Strategy, runner: SimRunner, allocator: BlockAllocator, max_model_len: int,
                     eos_token_ids=(), shared_prefixes: bool = False) -> Engine:
    """The strategy's simulated engine, or the step-by-step one where that does not cover the strategy's options
    or the workload shares prompt prefixes through a prefix cache (`shared_prefixes`: some request has pieces), or
    where SGLang's schedule runs over a pool holding window layers' blocks beside the full layers' (SGLang's own
    engine keeps a pool of their own; `SimSGLang` counts one block a decoder's crossing)."""
    engine_class = SIMULATED_ENGINES[strategy.name]
    if isinstance(strategy, SGLangBatching):
        engine_class = SimSGLang if allocator.window is None else Engine
    elif isinstance(strategy, ContinuousBatching) and not SimContinuous.covers(strategy):
        engine_class = Engine
    if shared_prefixes and allocator.prefix_caching:
        engine_class = Engine
    return engine_class(strategy, runner, allocator, max_model_len, eos_token_ids)


def misread_layout(config: dict, arch: Architecture, tolerance: float = MISREAD_TOLERANCE) -> str | None:
    """What to tell the user when the shape read from a model's config holds more than `tolerance` more or fewer
    parameters than transformers builds for it: the model has parts the simulator does not read, and its weights'
    bytes, and so every step's time, are off by about as much. None when they agree or nothing can be built."""
    built = transformers_num_params(config)
    if not built:
        return None
    error = arch.num_params / built - 1
    if abs(error) <= tolerance:
        return None
    return (f"model type {config.get('model_type', 'unknown')!r}: the simulator reads {arch.num_params / 1e9:,.2f}B "
            f"parameters from its config where transformers builds {built / 1e9:,.2f}B ({error:+.0%}): the layout has "
            "parts the simulator does not model, and its predictions are off by as much")


def simulated_replicas(cfg: RunConfig):
    """`runner.replicas` simulated replicas behind `runner.router`; the model is only described, never loaded.
    Returns (replicas, router or None, workload, device, dtype)."""
    config = read_model_config(cfg.model)
    accelerated = cfg.runner.hardware not in (None, "cpu")
    dtype = dtype_name(cfg.dtype, "cuda" if accelerated else "cpu")
    try:
        arch = Architecture.from_config(config, DTYPE_BYTES[dtype], cfg.model.quantization, cfg.kv_cache.dtype)
        costs = build_cost_model(cfg.runner, arch)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    misread = misread_layout(config, arch) if cfg.model.source == "hf" else None
    if misread:
        log.warning(misread)
    tokenizer = load_tokenizer(cfg.model)
    workload = load_workload(cfg, config["vocab_size"], tokenizer, config["max_position_embeddings"],
                             with_ids=False)  # a simulation needs lengths only
    hardware = getattr(costs, "hardware", None)
    if hardware is not None and hardware.kind == "gpu":
        caps = hardware.serving_defaults, f"vLLM's on {hardware.name}"
    else:
        caps = CPU_ENGINE_CAPS, "the CPU defaults"
    profiled = isinstance(costs, RooflineCostModel)  # a profile's scheduler, if any
    state_blocks = 0
    if profiled and arch.num_linear_layers:
        cfg = _hybrid_cache(cfg, costs)
        state_blocks = costs.state_blocks(cfg.kv_cache.block_size)
    window = costs.window_blocks(cfg.kv_cache.block_size) if profiled else None
    if cfg.kv_cache.num_blocks != "auto":
        blocks = cfg.kv_cache.num_blocks
    else:
        blocks = auto_num_blocks(costs, cfg, caps[0])
    engine_class = partial(simulated_engine, shared_prefixes=any(s.prefix_pieces for s in workload.requests))
    scheduler = costs.engine.scheduler if profiled else "vllm"
    recv_interval = costs.engine.scheduler_recv_interval if profiled else 1
    replicas = [configured_replica(cfg, lambda allocator: SimRunner(costs), blocks, config["max_position_embeddings"],
                                   (), engine_class, caps, scheduler, recv_interval, state_blocks, window)
                for _ in range(cfg.runner.replicas)]
    for replica in replicas:
        replica.layout_warning = misread  # the summary keeps it, so a sweep's table says which runs it touches
    route = make_router(cfg.runner.router, cfg.runner.router_load_weight) if len(replicas) > 1 else None
    return replicas, route, workload, "cpu", dtype


def _hybrid_cache(cfg: RunConfig, costs: RooflineCostModel) -> RunConfig:
    """`cfg` with the cache block an engine that sizes its cache as vLLM does gives a model with linear-attention
    layers (`RooflineCostModel.hybrid_block_size`), where `kv_cache.block_size` is smaller."""
    block_size = costs.hybrid_block_size(cfg.kv_cache.block_size)
    if block_size == cfg.kv_cache.block_size:
        return cfg
    log.info("kv_cache.block_size %d -> %d: vLLM makes a block of the full-attention layers no smaller than one "
             "layer's linear-attention state", cfg.kv_cache.block_size, block_size)
    return cfg.model_copy(update={"kv_cache": cfg.kv_cache.model_copy(update={"block_size": block_size})})


def auto_num_blocks(costs, cfg: RunConfig, engine_caps: tuple[int, int]) -> int:
    """`kv_cache.num_blocks=auto` in a simulation: what the accelerator's memory holds beside the weights, as the
    engine profile sizes its cache, vLLM's start-up profile run taken at the engine's default caps `engine_caps`
    whatever the strategy's own, so that every strategy of a sweep gets the same cache (DESIGN: a fair
    comparison); for a CPU (calibrated here, or the roofline of this CPU), the real CPU runner's fixed cache, so
    both compare."""
    hardware = getattr(costs, "hardware", None)
    if hardware is None or hardware.kind == "cpu":
        return CPU_NUM_BLOCKS
    share = None if cfg.kv_cache.memory_fraction == "auto" else cfg.kv_cache.memory_fraction
    try:
        return costs.num_kv_blocks(cfg.kv_cache.block_size, share, engine_caps)
    except ValueError as e:
        raise ConfigError(str(e)) from None

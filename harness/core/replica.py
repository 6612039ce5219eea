"""The one place a replica is put together: its block allocator, strategy, runner and engine."""

from collections.abc import Callable, Iterable
from dataclasses import replace

from harness.core.engine import Engine
from harness.core.kv_cache import CACHE_POLICIES, BlockAllocator, WindowBlocks
from harness.core.runner import Runner
from strategies import CONTINUOUS_SCHEDULERS, STRATEGIES


def build_replica(strategy: str, options: dict, make_runner: Callable[[BlockAllocator], Runner], *,
                  num_blocks: int, block_size: int, max_model_len: int, eos_token_ids: Iterable[int] = (),
                  engine_class: Callable[..., Engine] = Engine, prefix_caching: bool = False,
                  scheduler: str = "vllm", eviction: str = "auto", recv_interval: int = 1,
                  state_blocks: int = 0, window: WindowBlocks | None = None) -> Engine:
    """A replica running `strategy` with `options` over a fresh cache of `num_blocks` blocks (reusing cached prefixes
    if `prefix_caching`, kept as `scheduler`'s engine keeps them, `CACHE_POLICIES`, its free blocks handed out in
    `eviction` order unless `auto`); continuous batching as that engine schedules it (`CONTINUOUS_SCHEDULERS`), taking
    arrived requests in every `recv_interval` decode batches where that is SGLang's scheduler. Each running sequence
    of a model with linear-attention layers holds `state_blocks` more blocks for its state, and of one with
    sliding-window layers those layers' blocks as `window` says, if given.

    `engine_class` makes the engine from (strategy, runner, allocator, max_model_len, eos_token_ids): `Engine`,
    or a simulator's choice (`harness.sim.replica.simulated_engine`). `make_runner` gets the allocator (a real
    runner sizes its cache tensors from it). A strategy that could run more requests at once than the cache has
    blocks is refused: each running request holds at least one.
    Raises ValueError naming the problem (unknown strategy, bad option, too small a cache).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    cache_policy = CACHE_POLICIES[scheduler]
    if eviction != "auto":
        cache_policy = replace(cache_policy, eviction=eviction)
    allocator = BlockAllocator(num_blocks, block_size, prefix_caching, cache_policy, state_blocks, window)
    try:
        policy_class = CONTINUOUS_SCHEDULERS[scheduler] if strategy == "continuous" else STRATEGIES[strategy]
        if recv_interval != 1 and strategy == "continuous" and scheduler == "sglang":
            options = options | {"recv_interval": recv_interval}
        policy = policy_class(allocator, **options)
    except TypeError as e:  # an option the strategy does not take, or one it needs
        raise ValueError(f"strategy={strategy}: {e}") from None
    if allocator.num_blocks < policy.max_concurrency:
        raise ValueError(f"kv_cache.num_blocks={allocator.num_blocks} cannot hold one block for each of the "
                         f"{policy.max_concurrency} requests {strategy} may run at once")
    return engine_class(policy, make_runner(allocator), allocator, max_model_len, eos_token_ids)

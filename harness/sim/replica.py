"""Which engine a simulated replica runs: the strategy's simulated engine, or the step-by-step one where the
simulated engine does not cover the strategy's options."""

from harness.core.engine import Engine
from harness.core.kv_cache import BlockAllocator
from harness.sim.continuous import SimContinuous
from harness.sim.padded import SimDynamic, SimStatic
from harness.sim.runner import SimRunner
from strategies import Strategy
from strategies.continuous import ContinuousBatching

SIMULATED_ENGINES = {"static": SimStatic, "dynamic": SimDynamic, "continuous": SimContinuous}


def simulated_engine(strategy: Strategy, runner: SimRunner, allocator: BlockAllocator, max_model_len: int,
                     eos_token_ids=()) -> Engine:
    engine_class = SIMULATED_ENGINES[strategy.name]
    if isinstance(strategy, ContinuousBatching) and not SimContinuous.covers(strategy):
        engine_class = Engine
    return engine_class(strategy, runner, allocator, max_model_len, eos_token_ids)

"""Scheduling policies. Each reads the engine's queues and returns a `BatchPlan`; none touches a tensor."""

from strategies.base import BatchPlan, KVBlocks, Request, RequestStatus, ScheduledChunk, Strategy
from strategies.continuous import ContinuousBatching
from strategies.dynamic import DynamicBatching
from strategies.sglang import SGLangBatching
from strategies.static import StaticBatching

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (StaticBatching, DynamicBatching, ContinuousBatching)
}
# How an engine schedules continuous batching (an engine profile's `scheduler`): vLLM's, the strategy as written, or
# SGLang's.
CONTINUOUS_SCHEDULERS: dict[str, type[ContinuousBatching]] = {"vllm": ContinuousBatching, "sglang": SGLangBatching}

__all__ = ["CONTINUOUS_SCHEDULERS", "STRATEGIES", "BatchPlan", "ContinuousBatching", "DynamicBatching", "KVBlocks",
           "Request", "RequestStatus", "SGLangBatching", "ScheduledChunk", "StaticBatching", "Strategy"]

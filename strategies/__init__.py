"""Scheduling policies. Each reads the engine's queues and returns a `BatchPlan`; none touches a tensor."""

from strategies.base import BatchPlan, KVBlocks, Request, RequestStatus, ScheduledChunk, Strategy
from strategies.continuous import ContinuousBatching
from strategies.dynamic import DynamicBatching
from strategies.static import StaticBatching

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (StaticBatching, DynamicBatching, ContinuousBatching)
}

__all__ = ["STRATEGIES", "BatchPlan", "ContinuousBatching", "DynamicBatching", "KVBlocks", "Request",
           "RequestStatus", "ScheduledChunk", "StaticBatching", "Strategy"]

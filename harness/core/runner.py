"""The runner interface: execute a `BatchPlan`, return the sampled tokens and how long it took."""

from dataclasses import dataclass, field
from typing import Any, Protocol

from strategies import BatchPlan


@dataclass
class StepResult:
    sampled: dict[int, int]  # request_id → next token, for every chunk that reached its request's last token
    duration_s: float  # time inside the model (measured) or the cost model (predicted)
    overhead_s: float = 0.0  # predicted time outside the model (scheduling, launches); real runs measure it
    logits: dict[int, Any] = field(default_factory=dict)  # request_id → [V] tensor, when a runner is asked to keep them


class Runner(Protocol):
    # True: the engine times the whole step on the wall clock. False: the result's durations are the step's time.
    measures_wall_time: bool

    def execute(self, plan: BatchPlan) -> StepResult: ...

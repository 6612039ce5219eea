"""What every runner returns for a step."""

from dataclasses import dataclass, field

import torch


@dataclass
class StepResult:
    sampled: dict[int, int]  # request_id → next token, for every chunk that reached its request's last token
    duration_s: float  # time inside the model (measured) or the cost model (predicted)
    overhead_s: float = 0.0  # predicted time outside the model (scheduling, launches); real runs measure it
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # request_id → [V], kept only when asked

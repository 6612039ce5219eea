"""What every runner returns for a step."""

from dataclasses import dataclass, field

import torch


@dataclass
class StepResult:
    sampled: dict[int, int]  # request_id → next token, for every chunk that reached its request's last token
    duration_s: float  # time inside the model (measured) or the cost model (predicted)
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # request_id → [V], kept only when asked

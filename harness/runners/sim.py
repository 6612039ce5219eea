"""The simulated runner: same interface as the real one, but the step's duration comes from a cost model and no
tokens are computed (each request generates exactly its max_new_tokens, as `vllm bench --ignore-eos`)."""

from harness.costmodel import step_shape
from harness.runners.base import StepResult
from strategies import BatchPlan

PLACEHOLDER_TOKEN = 0  # what a simulated step "samples": only the count of tokens matters


class SimRunner:
    measures_wall_time = False

    def __init__(self, cost_model):
        self.cost_model = cost_model

    def execute(self, plan: BatchPlan) -> StepResult:
        sampled = {c.request.request_id: PLACEHOLDER_TOKEN for c in plan.chunks if c.samples}
        return StepResult(sampled=sampled, duration_s=self.cost_model.predict(step_shape(plan)),
                          overhead_s=self.cost_model.step_overhead_s)

"""The simulated runner: same interface as the real one, but the step's duration comes from a cost model and no
tokens are computed (each request generates exactly its max_new_tokens, as `vllm bench --ignore-eos`)."""

from harness.core.runner import StepResult
from harness.sim.costmodel import step_shape
from strategies import BatchPlan


class SimRunner:
    measures_wall_time = False
    placeholder_token = 0  # what a simulated step "samples": only the count of tokens matters

    def __init__(self, cost_model):
        self.cost_model = cost_model

    def execute(self, plan: BatchPlan) -> StepResult:
        sampled = {c.request.request_id: self.placeholder_token for c in plan.chunks if c.samples}
        shape = step_shape(plan)
        busy = self.cost_model.predict(shape)
        return StepResult(sampled=sampled, duration_s=busy, overhead_s=self.cost_model.overhead(shape, busy))

"""The simulated replica: an engine whose steady decode stretches are run in bulk.

After a step that decoded every running request and changed nothing else, the steps that follow are the same
step one token further on, until a request finishes, one arrives and could enter, or the cache must grow past its
free blocks. The cost model predicts them all at once; the records are those step-by-step running makes (a
differential test holds that).
"""

from dataclasses import replace

import numpy as np

from harness.core.engine import Engine
from harness.core.replay import Arrivals
from harness.sim.runner import SimRunner
from strategies import BatchPlan


class SimEngine(Engine):
    runner: SimRunner

    def step(self, arrivals: Arrivals | None = None) -> BatchPlan:
        plan = super().step(arrivals)
        decoded_everyone = len(plan.chunks) == len(self.running) and all(c.is_decode for c in plan.chunks)
        # A finish shrinks `running` below the plan's chunks, so `decoded_everyone` also says nobody finished.
        if decoded_everyone and not plan.preempted and self.strategy.is_steady(self.waiting, self.running):
            self._run_decodes(plan, arrivals)
        return plan

    def _run_decodes(self, plan: BatchPlan, arrivals: Arrivals | None) -> None:
        running, allocator = self.running, self.allocator
        # Stop one step before the first request would finish: that step goes through `step` as usual.
        steps = min(r.max_new_tokens - r.num_output_tokens for r in running) - 1
        computed = np.array([r.num_computed_tokens for r in running])  # [S]
        held = np.array([allocator.num_blocks_held(r.request_id) for r in running])  # [S] blocks
        extra_blocks = [0]  # blocks newly needed by step j, over all requests
        for j in range(1, steps + 1):
            needed = int(np.maximum(allocator.num_blocks_for(computed + j) - held, 0).sum())
            if needed > allocator.num_free_blocks:
                steps = j - 1  # the cache fills up: let the strategy decide that step (preemption)
                break
            extra_blocks.append(needed)
        if steps <= 0:
            return
        base_used = allocator.num_used_blocks
        template = self.records.steps[-1]
        times = []
        for j, (busy, overhead) in enumerate(self.runner.decode_run(plan, steps), start=1):
            if arrivals is not None:
                arrivals.deliver_due(self)  # they join the queue (or are rejected) before this step
                if arrivals.next_s <= self.clock:
                    break  # another replica may get it: the replay loop routes it first
            if not self.strategy.is_steady(self.waiting, self.running):
                break
            self.records.steps.append(replace(template, step=len(self.records.steps), start_s=self.clock,
                                              duration_s=busy + overhead, busy_s=busy, num_waiting=len(self.waiting),
                                              kv_used_blocks=base_used + extra_blocks[j]))
            self.clock += busy + overhead
            times.append(self.clock)
        if not times:
            return
        for request, n in zip(running, computed.tolist()):
            allocated = allocator.allocate(request.request_id, n + len(times))
            assert allocated, "the blocks were counted above"
        self._append_decodes(self.runner.placeholder_token, times)

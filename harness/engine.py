"""The loop and the clock: admit arrivals, schedule, run, apply, record. One step at a time."""

import time
from collections import deque
from dataclasses import dataclass, field

from tqdm import tqdm

from harness.kv_cache import BlockAllocator
from strategies import BatchPlan, Request, RequestStatus, Strategy
from workloads import RequestSpec


@dataclass
class StepRecord:
    step: int
    start_s: float
    duration_s: float  # how far the clock moved: wall time of the whole step, or the predicted time
    busy_s: float  # time inside the model or the cost model
    num_prefill_tokens: int
    num_decode_tokens: int
    num_padding_tokens: int
    num_rows: int  # sequences (ragged) or rectangle rows (padded)
    row_width: int  # padded rectangle width; 0 for ragged
    num_preempted: int
    num_waiting: int
    num_running: int
    kv_used_blocks: int


@dataclass
class RunRecords:
    requests: list[Request]
    steps: list[StepRecord] = field(default_factory=list)


class Engine:
    """Replays a workload on a virtual clock. Each step moves the clock by its duration; an idle engine jumps to
    the next arrival instead of sleeping, so real and simulated runs of one workload compare directly."""

    def __init__(self, strategy: Strategy, runner, allocator: BlockAllocator, max_model_len: int,
                 eos_token_id: int | None = None, progress: bool = False):
        self.strategy = strategy
        self.runner = runner
        self.allocator = allocator
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.progress = progress
        self.logits: dict[int, list] = {}  # request_id → per-token logits, when the runner keeps them

    def run(self, specs: list[RequestSpec]) -> RunRecords:
        pending = deque(sorted(specs, key=lambda s: s.arrival_s))
        records = RunRecords(requests=[])
        waiting: deque[Request] = deque()
        running: list[Request] = []
        clock = 0.0
        bar = tqdm(total=len(specs), unit="req", disable=not self.progress, desc=self.strategy.name, leave=False)
        while pending or waiting or running:
            while pending and pending[0].arrival_s <= clock:
                request = self._enter(pending.popleft())
                records.requests.append(request)
                if request.status == RequestStatus.REJECTED:
                    bar.update()
                else:
                    waiting.append(request)
            if not waiting and not running:
                if pending:
                    clock = max(clock, pending[0].arrival_s)
                continue
            step_start = time.perf_counter()
            plan = self.strategy.schedule(waiting, running)
            if not plan.chunks:
                raise RuntimeError(f"{self.strategy.name} scheduled nothing with {len(waiting)} waiting and "
                                   f"{len(running)} running requests: a scheduler bug, not a workload problem")
            num_prefill = sum(c.num_tokens for c in plan.chunks if not c.is_decode)  # before tokens are added
            result = self.runner.execute(plan)
            kv_used = self.allocator.num_used_blocks  # before finished requests give their blocks back
            advanced = self._apply(plan, result, running)
            wall = time.perf_counter() - step_start
            duration = wall if self.runner.measures_wall_time else result.duration_s
            records.steps.append(StepRecord(
                step=len(records.steps), start_s=clock, duration_s=duration, busy_s=result.duration_s,
                num_prefill_tokens=num_prefill, num_decode_tokens=plan.num_scheduled_tokens - num_prefill,
                num_padding_tokens=plan.num_padding_tokens, num_rows=plan.num_rows,
                row_width=plan.row_width if plan.padded else 0, num_preempted=len(plan.preempted),
                num_waiting=len(waiting), num_running=len(plan.chunks), kv_used_blocks=kv_used,
            ))
            for chunk in plan.chunks:
                if chunk.request.first_scheduled_s is None:
                    chunk.request.first_scheduled_s = clock
            clock += duration
            # Tokens are stamped at the end of their step, when a client would see them.
            for request in advanced:
                request.token_times_s.append(clock)
                if request.status == RequestStatus.FINISHED:
                    request.finish_s = clock
                    bar.update()
        bar.close()
        return records

    def _enter(self, spec: RequestSpec) -> Request:
        request = Request(request_id=spec.request_id, arrival_s=spec.arrival_s, token_ids=list(spec.prompt_ids),
                          num_prompt_tokens=spec.prompt_len, max_new_tokens=spec.max_new_tokens)
        needed_blocks = self.allocator.num_blocks_for(request.max_num_tokens)
        if spec.prompt_len + spec.max_new_tokens > self.max_model_len:
            request.reject_reason = (f"prompt ({spec.prompt_len}) + max_new_tokens ({spec.max_new_tokens}) exceeds "
                                     f"the model's context of {self.max_model_len} tokens")
        elif needed_blocks > self.allocator.num_blocks:
            request.reject_reason = (f"needs {needed_blocks} KV blocks, more than the whole cache "
                                     f"({self.allocator.num_blocks})")
        if request.reject_reason:
            request.status = RequestStatus.REJECTED
        return request

    def _apply(self, plan: BatchPlan, result, running: list[Request]) -> list[Request]:
        """Advance each scheduled request; returns those that got a new token."""
        advanced = []
        for chunk in plan.chunks:
            request, samples = chunk.request, chunk.samples
            request.num_computed_tokens += chunk.num_tokens
            is_prefill = request.num_computed_tokens < request.num_prompt_tokens
            request.status = RequestStatus.PREFILLING if is_prefill else RequestStatus.DECODING
            if not samples:
                continue
            token = result.sampled[request.request_id]
            request.token_ids.append(token)
            advanced.append(request)
            if request.request_id in result.logits:
                self.logits.setdefault(request.request_id, []).append(result.logits[request.request_id])
            hit_eos = self.eos_token_id is not None and token == self.eos_token_id
            if request.num_output_tokens == request.max_new_tokens or hit_eos:
                request.status = RequestStatus.FINISHED
                running.remove(request)
                self.strategy.on_finished(request)
        return advanced

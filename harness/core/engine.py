"""One replica: its queues, strategy, runner and cache on a virtual clock. Schedule, run, apply, record.

The engine is the one writer of request state: it applies the strategy's admissions and preemptions, the
runner's tokens, and finishes requests (see `strategies.base` for who reads what).
"""

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from harness.core.kv_cache import BlockAllocator
from harness.core.records import RunRecords
from harness.core.runner import Runner, StepResult
from strategies import BatchPlan, Request, RequestStatus, Strategy
from workloads import RequestSpec
from workloads.spec import fits_context

if TYPE_CHECKING:
    from harness.core.replay import Arrivals


def request_for(spec: RequestSpec, sent_s: float | None = None) -> Request:
    """The engine-side request for `spec`, sent by the client at `sent_s` (default: when the workload wanted it)."""
    return Request(request_id=spec.request_id, arrival_s=spec.arrival_s, token_ids=list(spec.prompt_ids),
                   num_prompt_tokens=spec.prompt_len, max_new_tokens=spec.max_new_tokens, sent_s=sent_s,
                   prefix_pieces=spec.prefix_pieces)


def context_overflow(spec: RequestSpec, max_model_len: int) -> str | None:
    """Why `spec` can never run in a context of `max_model_len` tokens, or None if it fits."""
    if fits_context(spec.prompt_len, spec.max_new_tokens, max_model_len):
        return None
    return (f"prompt ({spec.prompt_len}) + max_new_tokens ({spec.max_new_tokens}) exceeds the model's context of "
            f"{max_model_len} tokens")


class Engine:
    """Each step moves the clock by the step's duration: the wall time of the whole step (a real runner) or the
    predicted time (a simulated one). The replay loop jumps an idle engine to its next arrival instead of
    sleeping, so real and simulated runs of one workload compare directly."""

    def __init__(self, strategy: Strategy, runner: Runner, allocator: BlockAllocator, max_model_len: int,
                 eos_token_ids: Iterable[int] = ()):
        self.strategy = strategy
        self.runner = runner
        self.allocator = allocator
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)  # stop on any of them; empty: run to max_new_tokens
        self.clock = 0.0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.records = RunRecords()
        self.num_output_tokens = 0
        self.num_done = 0  # requests finished or rejected
        self.caps_source = ""  # where `auto` engine caps came from, for the report
        self.layout_warning: str | None = None  # a simulated model's shape read wrong from its config, for the report
        # Called with a request's id and the time it finishes or is rejected (the client frees a slot, or sends the
        # conversation's next turn).
        self.on_done = None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def add_request(self, spec: RequestSpec, sent_s: float | None = None) -> Request:
        """A request reaches the engine, sent by the client at `sent_s` (default: when the workload wanted it). It
        is queued, or rejected at once with its reason if it can never be served."""
        request = request_for(spec, sent_s)
        needed_blocks = self.allocator.num_blocks_for(request.max_num_tokens)
        request.reject_reason = context_overflow(spec, self.max_model_len)
        if request.reject_reason is None and needed_blocks > self.allocator.num_blocks:
            request.reject_reason = (f"needs {needed_blocks} KV blocks, more than the whole cache "
                                     f"({self.allocator.num_blocks})")
        if request.reject_reason:
            request.status = RequestStatus.REJECTED
            self._done(request, request.sent_s)
        else:
            self.waiting.append(request)
        self.records.requests.append(request)
        return request

    def step(self, arrivals: "Arrivals | None" = None) -> BatchPlan:
        """Schedule, execute and apply one step at the current clock; returns the step's plan.

        A plain step ignores `arrivals` (the requests still to come); the simulated engine's bulk decode reads them.
        """
        step_start = time.perf_counter()
        plan = self.strategy.schedule(self.waiting, self.running)
        if not plan.chunks:
            raise RuntimeError(f"{self.strategy.name} scheduled nothing with {len(self.waiting)} waiting and "
                               f"{len(self.running)} running requests: a scheduler bug, not a workload problem")
        self._apply_queue_changes(plan)
        num_prefill = sum(c.num_tokens for c in plan.chunks if not c.is_decode)  # before tokens are added
        admitted = {r.request_id for r in plan.admitted}  # a set: a step may admit hundreds beside a thousand rows
        entering = [c for c in plan.chunks if c.request.request_id in admitted]
        num_lookup = sum(c.request.num_tokens for c in entering)
        result = self.runner.execute(plan)
        kv_used = self.allocator.num_used_blocks  # before finished requests give their blocks back
        sampled = self._apply_result(plan, result)
        if self.runner.measures_wall_time:
            duration = time.perf_counter() - step_start
        else:
            duration = result.duration_s + result.overhead_s
        self.records.steps.append(
            step=len(self.records.steps), start_s=self.clock, duration_s=duration, busy_s=result.duration_s,
            num_prefill_tokens=num_prefill, num_decode_tokens=plan.num_scheduled_tokens - num_prefill,
            num_padding_tokens=plan.num_padding_tokens, num_rows=plan.num_rows,
            row_width=plan.row_width if plan.padded else 0, num_preempted=len(plan.preempted),
            num_waiting=len(self.waiting), num_seqs=len(plan.chunks), kv_used_blocks=kv_used,
            num_lookup_tokens=num_lookup, num_cached_tokens=sum(c.start for c in entering),
            kv_cached_blocks=self.allocator.num_cached_blocks)
        for chunk in plan.chunks:
            if chunk.request.first_scheduled_s is None:
                chunk.request.first_scheduled_s = self.clock
        self.clock += duration
        # Tokens are stamped at the end of their step, when a client would see them.
        for request in sampled:
            if request.first_token_s is None:
                request.first_token_s = self.clock
            request.token_times_s.append(self.clock)
            if request.status == RequestStatus.FINISHED:
                request.finish_s = self.clock
                self._done(request, self.clock)
        self.num_output_tokens += len(sampled)
        return plan

    def _done(self, request: Request, time_s: float) -> None:
        self.num_done += 1
        if self.on_done is not None:
            self.on_done(request.request_id, time_s)

    def _apply_queue_changes(self, plan: BatchPlan) -> None:
        for request in plan.admitted:
            entered = self.waiting.popleft()
            assert entered is request, "a strategy admits from the head of the queue, in order"
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        for request in plan.preempted:
            self.running.remove(request)
            self.waiting.appendleft(request)
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0  # its blocks are gone: recompute from the start
            request.num_preemptions += 1

    def _apply_result(self, plan: BatchPlan, result: StepResult) -> list[Request]:
        """Advance each scheduled request; returns those that got a new token, finished ones included."""
        sampled = []
        for chunk in plan.chunks:
            request = chunk.request
            if request.num_cached_tokens is None:  # its first admission: it starts after its cached prefix
                request.num_cached_tokens = chunk.start
            request.num_computed_tokens = chunk.start + chunk.num_tokens
            request.status = RequestStatus.RUNNING
            self.allocator.cache_computed(request)
            if not chunk.samples:
                continue
            token = result.sampled[request.request_id]
            request.token_ids.append(token)
            request.num_output_tokens += 1
            sampled.append(request)
            if request.num_output_tokens == request.max_new_tokens or token in self.eos_token_ids:
                request.status = RequestStatus.FINISHED
                self.running.remove(request)
                self.strategy.on_finished(request)
        return sampled

    def run(self, specs: list[RequestSpec], progress: bool = False, max_concurrency: int | None = None) -> RunRecords:
        """Replay `specs` on this engine alone."""
        from harness.core.replay import replay  # the loop drives engines; only this convenience goes back

        replay([self], specs, progress=progress, desc=self.strategy.name, max_concurrency=max_concurrency)
        return self.records

"""The loop and the clock: admit arrivals, schedule, run, apply, record. One step at a time."""

import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
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
    num_seqs: int  # requests with tokens in this step
    kv_used_blocks: int


@dataclass
class RunRecords:
    requests: list[Request] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)


class Engine:
    """One replica on a virtual clock: its queues, strategy, runner and cache. Each step moves its clock by the
    step's duration; `run` jumps an idle engine to the next arrival instead of sleeping, so real and simulated runs
    of one workload compare directly."""

    def __init__(self, strategy: Strategy, runner, allocator: BlockAllocator, max_model_len: int,
                 eos_token_id: int | None = None, fast_forward: bool = True):
        self.strategy = strategy
        self.runner = runner
        self.allocator = allocator
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.clock = 0.0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.records = RunRecords()
        self.logits: dict[int, list] = {}  # request_id → per-token logits, when the runner keeps them
        self.num_output_tokens = 0
        self.num_done = 0  # requests finished or rejected
        self.owns_arrivals = False  # set by `replay` when this engine is the only replica
        # A simulated runner can predict a run of identical decode steps at once (the records are the same).
        self.fast_forward = fast_forward and hasattr(runner, "decode_run")

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def add_request(self, spec: RequestSpec) -> Request:
        """A request arrives: it is queued, or rejected at once with its reason if it can never be served."""
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
            self.num_done += 1
        else:
            self.waiting.append(request)
        self.records.requests.append(request)
        return request

    def step(self, arrivals: deque[RequestSpec] | None = None) -> list[Request]:
        """Schedule, execute and apply one step at the current clock; returns the requests it finished.

        With a simulated runner, the decode-only steps that follow and change nothing but each request's length
        (no finish, no admission, blocks to spare) are then run in bulk. `arrivals`, the time-ordered requests
        still to come, are taken in on the way when they are this engine's alone; else the run stops at the next.
        """
        step_start = time.perf_counter()
        plan = self.strategy.schedule(self.waiting, self.running)
        if not plan.chunks:
            raise RuntimeError(f"{self.strategy.name} scheduled nothing with {len(self.waiting)} waiting and "
                               f"{len(self.running)} running requests: a scheduler bug, not a workload problem")
        num_prefill = sum(c.num_tokens for c in plan.chunks if not c.is_decode)  # before tokens are added
        result = self.runner.execute(plan)
        kv_used = self.allocator.num_used_blocks  # before finished requests give their blocks back
        advanced = self._apply(plan, result)
        if self.runner.measures_wall_time:
            duration = time.perf_counter() - step_start
        else:
            duration = result.duration_s + result.overhead_s
        self.records.steps.append(StepRecord(
            step=len(self.records.steps), start_s=self.clock, duration_s=duration, busy_s=result.duration_s,
            num_prefill_tokens=num_prefill, num_decode_tokens=plan.num_scheduled_tokens - num_prefill,
            num_padding_tokens=plan.num_padding_tokens, num_rows=plan.num_rows,
            row_width=plan.row_width if plan.padded else 0, num_preempted=len(plan.preempted),
            num_waiting=len(self.waiting), num_seqs=len(plan.chunks), kv_used_blocks=kv_used,
        ))
        for chunk in plan.chunks:
            if chunk.request.first_scheduled_s is None:
                chunk.request.first_scheduled_s = self.clock
        self.clock += duration
        # Tokens are stamped at the end of their step, when a client would see them.
        self.num_output_tokens += len(advanced)
        finished = []
        for request in advanced:
            request.token_times_s.append(self.clock)
            if request.status == RequestStatus.FINISHED:
                request.finish_s = self.clock
                finished.append(request)
        every_running_decoded = len(advanced) == len(plan.chunks) == len(self.running) and \
            all(c.is_decode for c in plan.chunks)
        if self.fast_forward and not finished and not plan.preempted and every_running_decoded and \
                self.strategy.is_steady(self.waiting, self.running):
            self._run_decodes(plan, arrivals)
        self.num_done += len(finished)
        return finished

    def _run_decodes(self, plan: BatchPlan, arrivals: deque[RequestSpec] | None) -> None:
        """Run the steady decode steps after `plan` in bulk, with the records step-by-step running would make."""
        running = self.running
        # Stop one step before the first request would finish: that step goes through `step` as usual.
        steps = min(r.max_new_tokens - r.num_output_tokens for r in running) - 1
        computed = np.array([r.num_computed_tokens for r in running])  # [S]
        held = np.array([len(self.allocator.block_tables[r.request_id]) for r in running])  # [S] blocks
        size = self.allocator.block_size
        extra_blocks = [0]  # blocks newly needed by step j, over all requests
        for j in range(1, steps + 1):
            needed = int(np.maximum(-(-(computed + j) // size) - held, 0).sum())
            if needed > self.allocator.num_free_blocks:
                steps = j - 1  # the cache fills up: let the strategy decide that step (preemption)
                break
            extra_blocks.append(needed)
        if steps <= 0:
            return
        durations = self.runner.decode_run(plan, steps)
        base_used = self.allocator.num_used_blocks
        template = self.records.steps[-1]
        times = []
        for j, (busy, overhead) in enumerate(durations, start=1):
            while self.owns_arrivals and arrivals and arrivals[0].arrival_s <= self.clock:
                self.add_request(arrivals.popleft())  # joins the queue (or is rejected) before this step
            if arrivals and arrivals[0].arrival_s <= self.clock and not self.owns_arrivals:
                break  # another replica may get it: the replay loop routes it first
            if not self.strategy.is_steady(self.waiting, self.running):
                break
            self.records.steps.append(replace(template, step=len(self.records.steps), start_s=self.clock,
                                              duration_s=busy + overhead, busy_s=busy, num_waiting=len(self.waiting),
                                              kv_used_blocks=base_used + extra_blocks[j]))
            self.clock += busy + overhead
            times.append(self.clock)
        done = len(times)
        if not done:
            return
        token = self.runner.placeholder_token
        for request, n in zip(running, computed.tolist()):
            request.num_computed_tokens = n + done
            request.token_ids.extend([token] * done)
            request.token_times_s.extend(times)
            allocated = self.allocator.allocate(request.request_id, n + done)
            assert allocated, "the blocks were counted above"
        self.num_output_tokens += done * len(running)

    def _apply(self, plan: BatchPlan, result) -> list[Request]:
        """Advance each scheduled request; returns those that got a new token."""
        advanced = []
        for chunk in plan.chunks:
            request = chunk.request
            request.num_computed_tokens += chunk.num_tokens
            if request.num_computed_tokens < request.num_prompt_tokens:
                request.status = RequestStatus.PREFILLING
            else:
                request.status = RequestStatus.DECODING
            if not chunk.samples:
                continue
            token = result.sampled[request.request_id]
            request.token_ids.append(token)
            advanced.append(request)
            if request.request_id in result.logits:
                self.logits.setdefault(request.request_id, []).append(result.logits[request.request_id])
            hit_eos = self.eos_token_id is not None and token == self.eos_token_id
            if request.num_output_tokens == request.max_new_tokens or hit_eos:
                request.status = RequestStatus.FINISHED
                self.running.remove(request)
                self.strategy.on_finished(request)
        return advanced

    def run(self, specs: list[RequestSpec], progress: bool = False) -> RunRecords:
        """Replay `specs` on this engine alone."""
        replay([self], lambda engines, spec: engines[0], specs, progress, desc=self.strategy.name)
        return self.records


def replay(engines: list[Engine], route, specs: list[RequestSpec], progress: bool = False,
           desc: str = "") -> None:
    """Co-simulate replicas behind one arrival stream, in time order.

    The next event is either the next arrival (routed by `route(engines, spec)`, which sees every replica as it
    is at that moment) or the step of the busy replica whose clock is furthest behind. An idle replica's clock
    jumps to the arrival it receives.
    """
    pending = deque(sorted(specs, key=lambda s: s.arrival_s))
    engines[0].owns_arrivals = len(engines) == 1
    bar = tqdm(total=len(specs), unit="req", disable=not progress, desc=desc, leave=False)
    while True:
        busy = [e for e in engines if e.has_work]
        next_step = min(busy, key=lambda e: e.clock) if busy else None
        if pending and (next_step is None or pending[0].arrival_s <= next_step.clock):
            spec = pending.popleft()
            target = route(engines, spec)
            if not target.has_work:
                target.clock = max(target.clock, spec.arrival_s)
            target.add_request(spec)
        elif next_step is not None:
            clock = max(e.clock for e in engines)
            if next_step.step(pending) and progress and clock > 0:
                output = sum(e.num_output_tokens for e in engines)
                bar.set_postfix_str(f"{output / clock:.0f} output tok/s", refresh=False)
        else:
            break
        bar.update(sum(e.num_done for e in engines) - bar.n)
    bar.close()

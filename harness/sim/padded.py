"""Static and dynamic batching, simulated: `strategies.static` and `strategies.dynamic`'s schedules, at the cost of
what changed.

Both run every running request's next token in one padded rectangle. Between a step that admits and the next
request's finish, every step is the same rectangle with one more cached key per row, so those steps are timed
and recorded together as arrays (`SimEngine._run_steps`).
"""

import numpy as np

from harness.core.replay import Arrivals
from harness.sim.costmodel import StepShape
from harness.sim.engine import SimEngine
from strategies import Request


class SimPadded(SimEngine):
    def _prefill_and_decode(self, step: int, admitted: list[Request], num_idle_rows: int = 0) -> None:
        """One step: the decoders' next tokens and the admitted requests' whole prompts, left-padded together."""
        prompts = [r.num_prompt_tokens for r in admitted]
        num_decode, num_prefill = len(self.decoders), sum(prompts)
        width = max(prompts, default=1 if num_decode else 0)
        longest = max(self.decoders.longest_row(step), max(prompts, default=0))
        rows = num_decode + len(admitted) + num_idle_rows
        for request in admitted:
            request.first_scheduled_s = self.clock
            request.num_cached_tokens = 0  # nothing shared, nothing preempted: no prefix to find
            self._name(request, request.num_prompt_tokens)
        pairs = rows * width * longest
        shape = StepShape(True, rows * width, rows, pairs, rows * longest, rows, pairs if width == 1 else 0)
        end_s = self._record(step, shape, num_prefill=num_prefill, num_decode=num_decode, row_width=width,
                             num_seqs=num_decode + len(admitted), num_lookup=sum(r.num_tokens for r in admitted))
        self._decoded(end_s)
        self._finished(self._finishing(step), end_s)
        done = []
        for request in admitted:
            request.num_computed_tokens = request.num_prompt_tokens
            self._sampled(request, end_s)
            if request.max_new_tokens == 1:
                done.append(request)
            else:
                self._join_decoders(request, step + 1)
        self._finished(done, end_s)

    def _decode_stretch(self, arrivals: Arrivals | None, rows: int) -> bool:
        """The decode-only steps from here up to the next finish, in `rows` padded rows, if several may run;
        returns whether they ran."""
        if not self._may_run(arrivals):
            return False
        step = len(self.records.steps)
        num_live = len(self.decoders)
        num_steps = self.decoders.next_finish() - step + 1
        keys = rows * (self.decoders.longest_row(step) + np.arange(num_steps))  # [N] the longest row grows
        ran = self._run_steps(step, arrivals, StepShape(True, rows, rows, keys, keys, rows, keys), num_decode=num_live,
                              num_padding=rows - num_live, row_width=1, kv_used_blocks=self.allocator.num_used_blocks,
                              kv_cached_blocks=lambda ran: self.num_cached_blocks(step + np.arange(ran)))
        self._finished(self._finishing(step + ran - 1), self.clock)
        return True

    def _finished(self, requests: list[Request], end_s: float) -> None:
        raise NotImplementedError


class SimDynamic(SimPadded):
    """Admit from the head of the queue while a row is free and its whole length's blocks are; then one step."""

    def step(self, arrivals: Arrivals | None = None) -> None:
        if self._decode_stretch(arrivals, len(self.decoders)):
            return
        step = len(self.records.steps)
        admitted = []
        while self._may_admit():
            request = self.waiting[0]
            self._admit(request)
            self._hold(request, self.allocator.num_blocks_for(request.max_num_tokens))
            admitted.append(request)
        self._prefill_and_decode(step, admitted)
        if not admitted:
            self._decode_stretch(arrivals, len(self.decoders))

    def _may_admit(self) -> bool:
        return (bool(self.waiting) and len(self.running) < self.strategy.batch_size
                and self.allocator.num_blocks_for(self.waiting[0].max_num_tokens) <= self.allocator.num_free_blocks)

    def _finished(self, requests: list[Request], end_s: float) -> None:
        for request in requests:
            self._release(request)
            self._finish(request, end_s)


class SimStatic(SimPadded):
    """A batch starts when the last one has drained: the longest FIFO prefix of the queue (up to batch_size) whose
    rectangle (longest prompt + longest output) fits the cache; its rows stay until all of them are done."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch: list[Request] = []

    def step(self, arrivals: Arrivals | None = None) -> None:
        step = len(self.records.steps)
        if self.batch:
            if not self._decode_stretch(arrivals, len(self.batch)):
                self._prefill_and_decode(step, [], num_idle_rows=len(self.batch) - len(self.decoders))
                self._decode_stretch(arrivals, len(self.batch))
            return
        candidates = [self.waiting[i] for i in range(min(self.strategy.batch_size, len(self.waiting)))]
        longest_prompt = longest_output = rows = 0
        for k, request in enumerate(candidates, start=1):
            longest_prompt = max(longest_prompt, request.num_prompt_tokens)
            longest_output = max(longest_output, request.max_new_tokens)
            if k * self.allocator.num_blocks_for(longest_prompt + longest_output - 1) > self.allocator.num_free_blocks:
                break
            rows = k
        self.batch = candidates[:rows]
        width = max(r.num_prompt_tokens for r in self.batch) + max(r.max_new_tokens for r in self.batch) - 1
        for request in self.batch:
            self._admit(request)
            self._hold(request, self.allocator.num_blocks_for(width))
        self._prefill_and_decode(step, list(self.batch))

    def _finished(self, requests: list[Request], end_s: float) -> None:
        for request in requests:
            self._finish(request, end_s)
        if requests and not self.running:  # the batch has drained: its rows, pads and all, go back
            for request in self.batch:
                self._release(request)
            self.batch = []

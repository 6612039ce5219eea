"""Continuous batching, simulated: `strategies.continuous`'s schedule (decodes first), at the cost of what changed.

Each step, in the strategy's order: the decoders (only those at a block boundary can run out of cache, and they
ask in admission order), then the requests still prefilling, then admissions from the queue. A request that
cannot get its blocks preempts the newest running request, as the strategy does, until it can or it is itself
the newest. Prefilling requests and admissions are few per step; the decoders are a `DecodeSet`.
"""

import numpy as np

from harness.core.replay import Arrivals
from harness.sim.costmodel import StepShape
from harness.sim.engine import MIN_RUN_STEPS, SimEngine
from strategies import Request, RequestStatus
from strategies.continuous import ContinuousBatching


class SimContinuous(SimEngine):
    strategy: ContinuousBatching

    def __init__(self, strategy: ContinuousBatching, *args, **kwargs):
        assert self.covers(strategy), "use the step-by-step Engine for these options"
        super().__init__(strategy, *args, **kwargs)
        self.prefilling: dict[int, Request] = {}  # running requests not decoding, in admission order

    @staticmethod
    def covers(strategy: ContinuousBatching) -> bool:
        """vLLM's schedule, decodes first, and every decoder fits the token budget: otherwise which decoders run is
        decided request by request, as the step-by-step engine does. (SGLang's schedule has its own, `SimSGLang`.)"""
        return (type(strategy) is ContinuousBatching and strategy.order == "decode_first"
                and strategy.max_num_seqs <= strategy.max_batch_tokens)

    def step(self, arrivals: Arrivals | None = None) -> None:
        # Looked for here only: between a step's end and the next one's start the replay loop only hands over the
        # requests that arrived, which the look must see (a look at the end too found nothing more, and cost 5%).
        if self._decode_stretch(arrivals):
            return
        step = len(self.records.steps)
        budget = self.strategy.max_batch_tokens
        preempted: list[Request] = []
        self._hold_crossing(step, preempted)
        budget -= len(self.decoders)

        chunks: list[tuple[Request, int, int]] = []  # (request, first token, tokens)
        for request in list(self.prefilling.values()):
            if budget == 0:
                break
            if request.request_id not in self.running:
                continue
            start = request.num_computed_tokens
            num_new = self.strategy.num_new_tokens(request, start, budget)
            needed = self.allocator.num_blocks_for(start + num_new) - self.held.get(request.request_id, 0)
            while needed > self.allocator.num_free_blocks:
                victim, was_decoding = self._preempt_newest(step)
                preempted.append(victim)
                budget += was_decoding  # a decoder's token was in the budget
                if victim is request:
                    break
            else:
                self._hold(request, max(needed, 0))
                chunks.append((request, start, num_new))
                budget -= num_new

        num_lookup = num_cached = 0  # the admitted requests' tokens, and those found in the prefix cache
        if not preempted:  # preempting means the cache is full: admitting now would only preempt again
            while self.waiting and budget and len(self.running) < self.strategy.max_num_seqs:
                request = self.waiting[0]
                if not self._admissible(request):
                    break
                cached = self._cached_prefix(request)
                num_new = self.strategy.num_new_tokens(request, cached, budget)
                needed = self.allocator.num_blocks_for(cached + num_new)  # its cached blocks were free ones
                if needed > self.allocator.num_free_blocks:
                    break
                self._admit(request)
                self.prefilling[request.request_id] = request
                self._hold(request, needed - self._take_cached(request))
                chunks.append((request, cached, num_new))
                budget -= num_new
                num_lookup += request.num_tokens
                num_cached += cached
                if request.num_cached_tokens is None:
                    request.num_cached_tokens = cached
        for victim in preempted:
            self.waiting.appendleft(victim)

        num_decode = len(self.decoders)  # those a prefill preempted are gone
        decode_keys = self.decoders.keys_read(step)
        num_prefill, keys, pairs, num_sampled, decode_pairs, masked_pairs = self._start_chunks(chunks)
        rows = num_decode + len(chunks)
        shape = StepShape(False, num_decode + num_prefill, rows, pairs + decode_keys, keys + decode_keys,
                          num_sampled + num_decode, decode_pairs + decode_keys, masked_pairs)
        end_s = self._record(step, shape, num_prefill=num_prefill, num_decode=num_decode, row_width=0,
                             num_preempted=len(preempted), num_seqs=rows, num_lookup=num_lookup, num_cached=num_cached)

        self._decoded(end_s)
        for request in self._finishing(step):
            self._release(request)
            self._finish(request, end_s)
        self._apply_chunks(chunks, self.prefilling, end_s, lambda request: self._join_decoders(request, step + 1))

    def _hold_crossing(self, step: int, preempted: list[Request]) -> None:
        """The decoders at a block boundary take their blocks (one each, more while their window layers' grow), in
        admission order; one that finds too few preempts the newest running request until it gets them or is itself
        the newest (`preempted` gets the victims)."""
        crossing = self.decoders.crossing(step)
        if not crossing:
            return
        allocator, held = self.allocator, self.held
        if allocator.window is None:
            needs = [1] * len(crossing)
        else:
            base = self.decoders.base
            needs = [allocator.num_blocks_for(base[r.request_id] + step + 1) - held[r.request_id] for r in crossing]
        if sum(needs) <= allocator.num_free_blocks:  # the common case: no one preempts, the order does not matter
            for request, need in zip(crossing, needs):
                held[request.request_id] += need
            allocator.take(sum(needs))
            return
        served = 0  # blocks given since the last preemption, taken at once before the next one
        for request, need in sorted(zip(crossing, needs), key=lambda pair: self._admitted_as[pair[0].request_id]):
            if request.request_id not in self.running:
                break  # a victim, so the newest: those after it, newer, went before it
            if need > allocator.num_free_blocks - served:
                allocator.take(served)
                served = 0
                while need > allocator.num_free_blocks:
                    victim, _ = self._preempt_newest(step)
                    preempted.append(victim)
                    if victim is request:
                        return
            held[request.request_id] += need
            served += need
        allocator.take(served)

    def _decode_stretch(self, arrivals: Arrivals | None) -> bool:
        """The decode-only steps from here, up to the next finish or the first a decoder's block would not fit, if
        they are several; returns whether they ran."""
        if self.prefilling or self._late_first_decode or not self.decoders:
            return False
        step = len(self.records.steps)
        window = self.allocator.window
        if window is not None and -(-(self.decoders.shortest_row(step) - 1) // self.allocator.block_size) < \
                window.max_blocks:
            return False  # a decoder's window layers still take blocks as it crosses: one step at a time
        num_steps = self.decoders.next_finish() - step + 1
        # The next finish first: at a high load one is often a step or two away, and it is cheaper to find.
        if num_steps < MIN_RUN_STEPS or not self._may_run(arrivals):
            return False
        steps = step + np.arange(num_steps)  # [N]
        phases = np.array(self.decoders.phase_sizes())
        taken = np.cumsum(phases[steps % len(phases)])  # [N] new blocks by each step's end
        num_steps = int(np.searchsorted(taken, self.allocator.num_free_blocks, side="right"))
        if num_steps < MIN_RUN_STEPS:
            return False
        decoders = self.decoders
        n = len(decoders)
        keys = decoders.sum_base + n * (steps[:num_steps] + 1)  # [N] one more key a decoder a step
        ran = self._run_steps(step, arrivals, StepShape(False, n, n, keys, keys, n, keys), num_decode=n, num_padding=0,
                              row_width=0, kv_used_blocks=self.allocator.num_used_blocks + taken[:num_steps],
                              kv_cached_blocks=lambda ran: self.num_cached_blocks(steps[:ran])
                              - self.allocator.num_evicted_by(taken[:ran]))
        self.allocator.take(int(taken[ran - 1]))
        for rid, base in decoders.base.items():  # each holds the blocks of its cached tokens
            self.held[rid] = self.allocator.num_blocks_for(base + step + ran)
        for request in self._finishing(step + ran - 1):
            self._release(request)
            self._finish(request, self.clock)
        return True

    def _may_admit(self) -> bool:
        if not self.waiting or len(self.running) >= self.strategy.max_num_seqs:
            return False
        budget = self.strategy.max_batch_tokens - len(self.decoders)
        request = self.waiting[0]
        cached = self._cached_prefix(request)
        return budget > 0 and self._admissible(request) and self.allocator.num_blocks_for(
            cached + self.strategy.num_new_tokens(request, cached, budget)) <= self.allocator.num_free_blocks

    def _admissible(self, request: Request) -> bool:
        """Whether the strategy's admission lets `request` in now, its next chunk's blocks aside: with
        `whole_prompt`, all of its tokens must fit (its own cached blocks among the free ones)."""
        return (self.strategy.admission == "next_chunk"
                or self.allocator.num_blocks_for(request.num_tokens) <= self.allocator.num_free_blocks)

    def _preempt_newest(self, step: int) -> tuple[Request, bool]:
        """Evict the newest running request: its cache goes, and it will recompute its tokens from the queue.
        Returns it, and whether it was decoding."""
        rid, victim = self.running.popitem()
        was_decoding = rid in self.decoders
        if was_decoding:
            self._leave_decoders(victim, step)
        else:
            del self.prefilling[rid]
        self._release(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        return victim, was_decoding

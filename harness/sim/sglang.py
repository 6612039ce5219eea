"""SGLang's continuous batching, simulated: `strategies.sglang`'s schedule, at the cost of what changed.

Each step is a prefill batch or a decode batch, never both. A prefill batch (the prompt being chunked goes on, then
admissions against the reserve for the running requests' output to come) pauses the decoders, so the `DecodeSet`
counts decode batches, not steps (`decode_step`): a member has `base + d` tokens computed when decode batch `d`
starts, and its output to come is `last + 1 - d`. Between finishes, decode batches run in bulk up to the first that
would retract, or that the head of the queue would enter instead: the reserve shrinks as the ratio decays and the
decoders' output to come falls, while their new blocks fill the cache, so that moment is found for every batch of
the stretch at once. With a receive interval (`RecvSkipper`), a stretch ends before the batch whose step would take
requests in.
"""

import numpy as np

from harness.core.replay import Arrivals
from harness.sim.costmodel import StepShape
from harness.sim.engine import MIN_RUN_STEPS, SimEngine
from strategies import Request, RequestStatus
from strategies.sglang import (
    CLIP_MAX_NEW_TOKENS,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY,
    RETRACT_DECODE_STEPS,
    SGLangBatching,
    output_to_come,
    ratio_after_retraction,
    retraction_order,
)


class SimSGLang(SimEngine):
    strategy: SGLangBatching

    def __init__(self, strategy: SGLangBatching, *args, **kwargs):
        super().__init__(strategy, *args, **kwargs)
        assert not self._names_output, "SGLang's cache names prompt blocks: its decoders' named blocks do not grow"
        self.prefilling: dict[int, Request] = {}  # running requests whose prompt (or recompute) is unfinished
        self.new_token_ratio = strategy.new_token_ratio
        self.decode_step = 0  # decode batches so far: the decoders' clock
        self._last_decode_s = 0.0  # the end of the last decode batch: every decoder's last token but the late ones'
        self._paused = False  # a prefill batch ran since the last decode batch
        self._clipped: dict[int, int] = {}  # decoders whose output to come exceeded the clip: request_id → last + 1
        self._stretch: tuple | None = None  # during a bulk run: (head of the queue, [N] room, [N] free blocks)
        self.recv = strategy.recv  # which waiting requests the scheduler has taken in
        self._received_at = -1  # the step whose start last asked it

    def step(self, arrivals: Arrivals | None = None) -> None:
        self._receive()
        if self._decode_stretch(arrivals):
            return
        step = len(self.records.steps)
        chunks, num_lookup, num_cached = self._prefill_batch()
        if chunks:
            self._run_prefill(step, chunks, num_lookup, num_cached)
            self.recv.add(prefill=True)
        elif self.decoders:
            self._run_decode(step)
            self.recv.add(prefill=False)
        else:
            raise RuntimeError(f"sglang scheduled nothing with {len(self.waiting)} waiting and {len(self.running)} "
                               "running requests: a scheduler bug, not a workload problem")
        self._decode_stretch(arrivals)

    def _receive(self) -> None:
        """What the scheduler does at a step's start, once a step: takes the waiting requests in if it is due."""
        step = len(self.records.steps)
        if step != self._received_at:
            self.recv.step(self.waiting, self.running.values())
            self._received_at = step

    def _would_have(self, request: Request) -> bool:
        """Whether the scheduler has taken `request` in by the next step's start."""
        return self.recv.has(request) or self.recv.due(idle=not self.running)

    # One step at a time.

    def _prefill_batch(self) -> tuple[list[tuple[Request, int, int]], int, int]:
        """`SGLangBatching._prefill_batch`: the chunks (request, first token, tokens) it runs, their blocks held, and
        the admitted requests' tokens and cached tokens."""
        budget = self.strategy.max_batch_tokens
        chunks = []
        for request in self.prefilling.values():
            if not budget:
                break
            start = request.num_computed_tokens
            num_new = self.strategy.num_new_tokens(request, start, budget)
            needed = self.allocator.num_blocks_for(start + num_new) - self.held[request.request_id]
            if needed <= self.allocator.num_free_blocks:
                self._hold(request, max(needed, 0))
                chunks.append((request, start, num_new))
                budget -= num_new
        if any(start + num_new < request.num_tokens for request, start, num_new in chunks):
            return chunks, 0, 0
        reserved = self._output_to_come() * self.new_token_ratio
        num_lookup = num_cached = 0
        bs = self.allocator.block_size
        while self.waiting and budget and len(self.running) < self.strategy.max_num_seqs:
            request = self.waiting[0]
            if not self.recv.has(request):
                break
            cached = self._cached_prefix(request)
            uncached = request.num_tokens - cached
            free = self.allocator.num_free_blocks * bs - reserved
            if uncached + output_to_come(request) + bs >= free and self.running:
                break
            num_new = self.strategy.num_new_tokens(request, cached, budget)
            needed = self.allocator.num_blocks_for(cached + num_new)  # its cached blocks were free ones
            if needed > self.allocator.num_free_blocks:
                break
            self._admit(request)
            self.prefilling[request.request_id] = request
            self._hold(request, needed - self._take_cached(request))
            chunks.append((request, cached, num_new))
            budget -= num_new
            reserved += uncached + output_to_come(request)
            num_lookup += request.num_tokens
            num_cached += cached
            if request.num_cached_tokens is None:
                request.num_cached_tokens = cached
            if num_new < uncached:
                break  # its prompt is chunked: it goes on next step, alone
        return chunks, num_lookup, num_cached

    def _run_prefill(self, step: int, chunks: list[tuple[Request, int, int]], num_lookup: int, num_cached: int):
        num_prefill, keys, pairs, num_sampled, decode_pairs, masked_pairs = self._start_chunks(chunks)
        shape = StepShape(False, num_prefill, len(chunks), pairs, keys, num_sampled, decode_pairs, masked_pairs)
        end_s = self._record(step, shape, num_prefill=num_prefill, num_decode=0, row_width=0, num_seqs=len(chunks),
                             num_lookup=num_lookup, num_cached=num_cached)
        self.records.gaps_per_step.append(0)
        self._paused = True
        self._apply_chunks(chunks, self.prefilling, end_s, lambda request: self._join(request, end_s))

    def _run_decode(self, step: int) -> None:
        """`SGLangBatching._decode_batch`: every decoder's next token, after retracting some if their new blocks
        do not fit."""
        d = self.decode_step
        crossing = self.decoders.crossing(d)
        retracted = []
        if len(crossing) > self.allocator.num_free_blocks:
            opening = {r.request_id for r in crossing}
            decoding = [r for rid, r in self.running.items() if rid in self.decoders]  # admission order
            keep = sorted(decoding, key=lambda r: retraction_order(self._outputs(r), r.num_prompt_tokens),
                          reverse=True)
            opened = len(crossing)
            bs = self.allocator.block_size
            while len(keep) > 1 and (opened > self.allocator.num_free_blocks or
                                     self.allocator.num_free_blocks * bs < RETRACT_DECODE_STEPS * len(keep)):
                victim = keep.pop()
                opened -= victim.request_id in opening
                self._retract(victim)
                retracted.append(victim)
            while opened > self.allocator.num_free_blocks and self.prefilling:  # newest first
                victim = self.prefilling.popitem()[1]
                del self.running[victim.request_id]
                self._evict(victim)
                retracted.append(victim)
            self.new_token_ratio = ratio_after_retraction(sum(map(self._outputs, keep)), len(keep),
                                                          sum(r.max_new_tokens for r in keep))
            crossing = self.decoders.crossing(d)
        else:
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        for victim in retracted:
            self.waiting.appendleft(victim)
        for request in crossing:
            self.held[request.request_id] += 1
        self.allocator.take(len(crossing))
        n, keys = len(self.decoders), self.decoders.keys_read(d)
        end_s = self._record(step, StepShape(False, n, n, keys, keys, n, keys), num_prefill=0, num_decode=n,
                             row_width=0, num_preempted=len(retracted), num_seqs=n)
        self._decoded_batch(end_s)
        for request in self.decoders.finishing(d):
            self._end(request, end_s)
        self.decode_step = d + 1

    def _decoded_batch(self, end_s: float) -> None:
        """The decoders' tokens of the batch that ended at `end_s`: one step after their last, or after the same
        pause (the prefill batches since the last decode batch), or, for those that joined since, their own gap."""
        late = self._late_first_decode
        self.records.other_gaps.extend(end_s - last for last in late.values())
        regular = len(self.decoders) - len(late)
        if self._paused and regular:
            self.records.shared_gaps.append(end_s - self._last_decode_s)
            self.records.shared_gap_counts.append(regular)
            regular = 0
        self.records.gaps_per_step.append(regular)
        late.clear()
        self.num_output_tokens += len(self.decoders)
        self._last_decode_s, self._paused = end_s, False

    # The decoders, counted by decode batch.

    def _join(self, request: Request, end_s: float) -> None:
        """`request` (all its tokens but the last cached) decodes from the next decode batch on; its last token came
        at `end_s`, or earlier if it joined without sampling."""
        rid = request.request_id
        self._late_first_decode[rid] = self._last_token_s.pop(rid, end_s)
        self.decoders.join(request, self.decode_step, request.num_computed_tokens)
        to_come = request.max_new_tokens - request.num_output_tokens
        if to_come > CLIP_MAX_NEW_TOKENS:
            self._clipped[rid] = self.decode_step + to_come

    def _retract(self, request: Request) -> None:
        rid = request.request_id
        request.num_computed_tokens = self.decoders.leave(request, self.decode_step)
        request.num_output_tokens = request.num_computed_tokens + 1 - request.num_prompt_tokens
        self._last_token_s[rid] = self._late_first_decode.pop(rid, self._last_decode_s)
        self._clipped.pop(rid, None)
        del self.running[rid]
        self._evict(request)

    def _evict(self, request: Request) -> None:
        """A retracted request's blocks go back; it will recompute its tokens from the queue."""
        self._release(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1

    def _end(self, request: Request, end_s: float) -> None:
        self._clipped.pop(request.request_id, None)
        self._release(request)
        self._finish(request, end_s)

    def _outputs(self, request: Request) -> int:
        """A decoder's output tokens when the current decode batch starts."""
        return self.decoders.base[request.request_id] + self.decode_step + 1 - request.num_prompt_tokens

    def _decoders_to_come(self, d):
        """The decoders' output to come, as SGLang clips it, when decode batch `d` (an int, or an array) starts."""
        n = len(self.decoders)
        to_come = self.decoders.sum_last + n - n * d
        for last in self._clipped.values():
            to_come = to_come - np.maximum(last - d - CLIP_MAX_NEW_TOKENS, 0)
        return to_come

    def _output_to_come(self) -> int:
        """The running requests' output to come, as SGLang clips it."""
        return int(self._decoders_to_come(self.decode_step)) + sum(map(output_to_come, self.prefilling.values()))

    # Decode-only stretches.

    def _admits(self, request: Request, room, free_blocks):
        """Whether `request`, at the head of the queue, enters a prefill batch that `room` tokens of reserve-free
        cache and `free_blocks` (arrays: one entry per step) would leave, with no prompt being chunked."""
        if len(self.running) >= self.strategy.max_num_seqs:
            return np.zeros(np.shape(room), dtype=bool)
        cached = self._cached_prefix(request)
        needed = request.num_tokens - cached + output_to_come(request) + self.allocator.block_size
        blocks = self.allocator.num_blocks_for(
            cached + self.strategy.num_new_tokens(request, cached, self.strategy.max_batch_tokens))
        return (needed < room) & (blocks <= free_blocks)

    def _may_admit(self) -> bool:
        """Now: whether the next step admits the head of the queue. During a bulk run (a request that arrived
        became the head): whether it would at any step of the run, which stops there to find out step by step."""
        if not self.waiting or not self._would_have(self.waiting[0]):
            return False
        head = self.waiting[0]
        if self._stretch is None:
            free = self.allocator.num_free_blocks
            room = free * self.allocator.block_size - self._output_to_come() * self.new_token_ratio
            return bool(self._admits(head, room, free))
        stretch_head, room, free_blocks = self._stretch
        return head is not stretch_head and bool(self._admits(head, room, free_blocks).any())

    def _decode_stretch(self, arrivals: Arrivals | None) -> bool:
        """The decode batches from here, up to the next finish, the first a decoder's block would not fit in, or
        the first the head of the queue would enter instead, if they are several; returns whether they ran."""
        if self.prefilling or self._late_first_decode or self._paused or not self._may_run(arrivals):
            return False
        self._receive()  # no arrival is due before this step starts (`_may_run`)
        step, d = len(self.records.steps), self.decode_step
        num_steps = min(self.decoders.next_finish() - d + 1, self.recv.steps_to_next())
        if num_steps < MIN_RUN_STEPS:
            return False
        phases = np.array(self.decoders.phase_sizes())
        taken = np.cumsum(phases[(d + np.arange(num_steps)) % len(phases)])  # [N] new blocks by each step's end
        free = self.allocator.num_free_blocks
        num_steps = int(np.searchsorted(taken, free, side="right"))
        if num_steps < MIN_RUN_STEPS:
            return False
        taken = taken[:num_steps]
        batches = d + np.arange(num_steps)  # [N]
        # The ratio each batch is scheduled with, and the one after the last: decayed once a batch, as SGLang's
        # `max(floor, ratio - decay)` does it, subtraction by subtraction.
        ratios = np.maximum(MIN_NEW_TOKEN_RATIO, np.subtract.accumulate(
            np.concatenate(([self.new_token_ratio], np.full(num_steps, NEW_TOKEN_RATIO_DECAY)))))  # [N + 1]
        free_blocks = free - np.concatenate(([0], taken[:-1]))  # [N] when each batch is scheduled
        room = free_blocks * self.allocator.block_size - self._decoders_to_come(batches) * ratios[:-1]  # [N]
        head = self.waiting[0] if self.waiting else None
        if head is not None and self.recv.has(head):
            admits = self._admits(head, room, free_blocks)
            if self._cached_prefix(head):  # its cached blocks stay as long as nothing is evicted
                admits |= taken > free - self.allocator.num_evictable_blocks
            if admits.any():
                num_steps = int(np.argmax(admits))
                if num_steps < MIN_RUN_STEPS:
                    return False
        decoders, n = self.decoders, len(self.decoders)
        keys = decoders.sum_base + n * (batches[:num_steps] + 1)  # [N] one more key a decoder a batch
        self._stretch = head, room[:num_steps], free_blocks[:num_steps]
        ran = self._run_steps(step, arrivals, StepShape(False, n, n, keys, keys, n, keys), num_decode=n,
                              num_padding=0, row_width=0,
                              kv_used_blocks=self.allocator.num_used_blocks + taken[:num_steps],
                              kv_cached_blocks=lambda ran: self.num_cached_blocks(step)
                              - self.allocator.num_evicted_by(taken[:ran]))
        self._stretch = None
        self.recv.add(prefill=False, num_steps=ran)
        self.allocator.take(int(taken[ran - 1]))
        self.new_token_ratio = float(ratios[ran])
        self.decode_step = d + ran
        self._last_decode_s = self.clock
        for rid, base in decoders.base.items():  # each holds the blocks of its cached tokens
            self.held[rid] = self.allocator.num_blocks_for(base + d + ran)
        for request in decoders.finishing(d + ran - 1):
            self._end(request, self.clock)
        return True

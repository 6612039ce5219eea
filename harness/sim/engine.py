"""The simulated replica: the engine's schedule and records, at a cost per step of what changed in it.

A simulated step computes no tokens, so the engine need not touch every running request each step: requests
that decode one token a step are held as aggregates (`DecodeSet`), the cache as a count of blocks, steps as
columns. Each strategy's simulated engine (`sim.continuous`, `sim.padded`) makes exactly the schedule and
records of the step-by-step `Engine` running that strategy (the differential tests hold that): the step-by-step
engine is the reference, this one the fast path.
"""

from collections.abc import Callable

import numpy as np

from harness.core.engine import Engine
from harness.core.kv_cache import BlockAllocator, BlockCount
from harness.core.replay import Arrivals
from harness.sim.costmodel import StepShape
from harness.sim.decoders import DecodeSet
from harness.sim.runner import SimRunner
from strategies import Request, RequestStatus, Strategy

# A bulk of steps is timed as arrays only when it is at least this many steps long (the next event this far
# away): one step at a time is cheaper for one or two, and a stretch sets each decoder's blocks once.
MIN_RUN_STEPS = 4


class SimEngine(Engine):
    runner: SimRunner
    allocator: BlockCount

    def __init__(self, strategy: Strategy, runner: SimRunner, allocator: BlockAllocator, max_model_len: int,
                 eos_token_ids=()):
        if eos_token_ids:
            raise ValueError("a simulated run generates no token ids, so it cannot stop at EOS")
        prefix_caching = allocator.prefix_caching
        super().__init__(strategy, runner, BlockCount(allocator.num_blocks, allocator.block_size, prefix_caching,
                                                      allocator.policy, allocator.state_blocks, allocator.window),
                         max_model_len)
        # Whether a decoder's blocks are named as it fills them: then the decoders' named blocks are counted from
        # the `DecodeSet` while they decode, not kept in `named`.
        self._names_output = prefix_caching and allocator.policy.names_output
        self.running: dict[int, Request] = {}  # request_id → request, in admission order
        self.decoders = DecodeSet(allocator.block_size)
        self.held: dict[int, int] = {}  # request_id → cache blocks it holds
        self.named: dict[int, int] = {}  # request_id → of those, its full blocks computed (named, with caching)
        self.num_named_held = 0
        self._admissions = 0
        self._admitted_as: dict[int, int] = {}  # request_id → admission number (running order)
        self._last_token_s: dict[int, float] = {}  # requests that left the decoders with tokens: their last one
        self._late_first_decode: dict[int, float] = {}  # new decoders whose previous token is not one step back
        self._last_step_s = 0.0  # the last step's duration

    def add_request(self, spec, sent_s: float | None = None) -> Request:
        if spec.prefix_pieces and self.allocator.prefix_caching:
            raise ValueError("a simulated engine models no prefix shared between requests: run this workload on "
                             "the step-by-step engine (harness.sim.replica.simulated_engine chooses it)")
        return super().add_request(spec, sent_s)

    # What every strategy's step does with the requests it touches.

    def _admit(self, request: Request) -> None:
        entered = self.waiting.popleft()
        assert entered is request, "requests are admitted from the head of the queue, in order"
        request.status = RequestStatus.RUNNING
        self.running[request.request_id] = request
        self._admissions += 1
        self._admitted_as[request.request_id] = self._admissions

    def _hold(self, request: Request, num_blocks: int) -> None:
        self.held[request.request_id] = self.held.get(request.request_id, 0) + num_blocks
        self.allocator.take(num_blocks)

    def _release(self, request: Request) -> None:
        """Its blocks go back; its named blocks stay cached."""
        named = self.named.pop(request.request_id, 0)
        self.num_named_held -= named
        self.allocator.give(self.held.pop(request.request_id), request.request_id, named)

    def _name(self, request: Request, num_computed: int) -> None:
        """`request` will have `num_computed` tokens computed once this step runs: its full blocks among them are
        named (with prefix caching, as the cache's policy says), as the step-by-step engine names them after it."""
        if self.allocator.prefix_caching:
            named = self.allocator.num_named_blocks(request, num_computed)
            self.num_named_held += named - self.named.get(request.request_id, 0)
            self.named[request.request_id] = named

    def _cached_prefix(self, request: Request) -> int:
        """Tokens of `request`, about to enter, the prefix cache holds: its own blocks, if it was preempted and they
        were not evicted since (never its last token)."""
        cached = min(self.allocator.num_cached_blocks_of(request.request_id),
                     (request.num_tokens - 1) // self.allocator.block_size)
        return cached * self.allocator.block_size

    def _take_cached(self, request: Request) -> int:
        """`request` enters holding its cached blocks again; returns how many."""
        count = self.allocator.reclaim(request.request_id)
        if count:
            self.held[request.request_id] = self.held.get(request.request_id, 0) + count
            self.named[request.request_id] = count
            self.num_named_held += count
        return count

    def _join_decoders(self, request: Request, step: int) -> None:
        """`request` (all its tokens but the last cached) decodes from `step` on."""
        last = self._last_token_s.pop(request.request_id, None)
        if last is not None:  # it recomputed after a preemption: its previous token is older than one step
            self._late_first_decode[request.request_id] = last
        self.decoders.join(request, step, request.num_computed_tokens)
        if self._names_output:  # counted by the decoders from here
            self.num_named_held -= self.named.pop(request.request_id, 0)

    def _leave_decoders(self, request: Request, step: int) -> None:
        """`request` stops decoding before `step` runs: its counts become explicit again."""
        request.num_computed_tokens = self.decoders.leave(request, step)
        if self._names_output:
            self._name(request, request.num_computed_tokens)
        request.num_output_tokens = request.num_computed_tokens + 1 - request.num_prompt_tokens
        # Its last token: from the step before (it decoded there, or joined after sampling there), unless it
        # joined without sampling and has not decoded yet.
        self._last_token_s[request.request_id] = self._late_first_decode.pop(request.request_id, self.clock)

    def _finishing(self, step: int) -> list[Request]:
        """The decoders whose last token comes from `step`; they leave the decoders, their blocks all named."""
        done = self.decoders.finishing(step)
        if done and self._names_output:
            for request in done:
                self._name(request, request.max_num_tokens)
        return done

    def _decoded(self, end_s: float) -> None:
        """The decoders' tokens of the step that ended at `end_s`: one gap each, one step long unless recorded."""
        late = self._late_first_decode
        if late:
            self.records.other_gaps.extend(end_s - last for last in late.values())
        self.records.gaps_per_step.append(len(self.decoders) - len(late))
        late.clear()
        self.num_output_tokens += len(self.decoders)

    def _sampled(self, request: Request, end_s: float) -> None:
        """A token sampled at the end of a prefill chunk."""
        if request.first_token_s is None:
            request.first_token_s = end_s
        else:
            self.records.other_gaps.append(end_s - self._last_token_s.pop(request.request_id))
        request.num_output_tokens += 1
        self.num_output_tokens += 1

    def _finish(self, request: Request, end_s: float) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_s = end_s
        request.num_output_tokens = request.max_new_tokens
        request.num_computed_tokens = request.num_prompt_tokens + request.max_new_tokens - 1
        del self.running[request.request_id]
        del self._admitted_as[request.request_id]
        self._last_token_s.pop(request.request_id, None)
        self._done(request, end_s)

    def _start_chunks(self, chunks: list[tuple[Request, int, int]]) -> tuple[int, int, int, int, int, int]:
        """Prefill chunks (request, first token, tokens) about to run: their full blocks named, first scheduling
        stamped. Returns their tokens, keys read, query-key pairs, sampled tokens, decode pairs (a one-token row)
        and masked pairs, as `step_shape` counts them."""
        tokens = keys = pairs = num_sampled = decode_pairs = masked_pairs = 0
        for request, start, num_new in chunks:
            self._name(request, start + num_new)
            if request.first_scheduled_s is None:
                request.first_scheduled_s = self.clock
            tokens += num_new
            keys += start + num_new
            pairs += num_new * (start + num_new)
            num_sampled += start + num_new == request.num_tokens
            decode_pairs += start + num_new if num_new == 1 else 0
            masked_pairs += num_new * (num_new - 1) // 2
        return tokens, keys, pairs, num_sampled, decode_pairs, masked_pairs

    def _apply_chunks(self, chunks: list[tuple[Request, int, int]], prefilling: dict[int, Request], end_s: float,
                      join: Callable[[Request], None]) -> None:
        """The chunks' step ended at `end_s`: each request's tokens computed, a token sampled where a chunk reached
        its last, and a request done prefilling leaves `prefilling` to finish or `join` the decoders."""
        for request, start, num_new in chunks:
            request.num_computed_tokens = start + num_new
            if start + num_new == request.num_tokens:
                self._sampled(request, end_s)
                if request.num_output_tokens == request.max_new_tokens:
                    del prefilling[request.request_id]
                    self._release(request)
                    self._finish(request, end_s)
                    continue
            if request.num_computed_tokens + 1 == request.num_tokens >= request.num_prompt_tokens + 1:
                del prefilling[request.request_id]
                join(request)

    def _record(self, step: int, shape: StepShape, *, num_prefill: int, num_decode: int, row_width: int,
                num_preempted: int = 0, num_seqs: int, num_lookup: int = 0, num_cached: int = 0) -> float:
        """Time the step from its shape, record it, and move the clock; returns the step's end."""
        busy = self.runner.cost_model.predict(shape)
        duration = busy + self.runner.cost_model.overhead(shape, busy)
        self.records.steps.append(
            step=step, start_s=self.clock, duration_s=duration, busy_s=busy, num_prefill_tokens=num_prefill,
            num_decode_tokens=num_decode, num_padding_tokens=shape.num_tokens - num_prefill - num_decode,
            num_rows=shape.num_rows, row_width=row_width, num_preempted=num_preempted,
            num_waiting=len(self.waiting), num_seqs=num_seqs, kv_used_blocks=self.allocator.num_used_blocks,
            num_lookup_tokens=num_lookup, num_cached_tokens=num_cached, kv_cached_blocks=self.num_cached_blocks(step))
        self.clock += duration
        self._last_step_s = duration
        return self.clock

    def num_cached_blocks(self, step):
        """Named blocks in the cache once `step` (or each of an array of steps) has run, held or not, the decoders'
        full blocks among them if they are named; blocks evicted later in those steps aside."""
        decoding = self.decoders.num_full_blocks(step) if self._names_output else 0
        return self.num_named_held + self.allocator.num_evictable_blocks + decoding

    # Decode-only stretches, timed and recorded as arrays.

    def _may_admit(self) -> bool:
        """Whether the next step would admit the head of the queue."""
        return False

    def _may_run(self, arrivals: Arrivals | None) -> bool:
        """Whether steps may run in bulk from here: decoders, nothing due at the next step (an arrival, another
        replica's step, an admission), and room for a few steps before the next such event (arrays pay only over
        a stretch: one step at a time is cheaper for one or two)."""
        if not self.decoders or arrivals is None:
            return False
        # Room first: it costs a subtraction, and at a high load the next arrival is often too near.
        return (min(arrivals.next_s, arrivals.horizon_s) - self.clock > MIN_RUN_STEPS * self._last_step_s
                and not self._may_admit())

    def _run_steps(self, step: int, arrivals: Arrivals, shape: StepShape, *, num_decode: int, num_padding: int,
                   row_width: int, kv_used_blocks, kv_cached_blocks) -> int:
        """Decode-only steps from `step`, one per entry of `shape`'s arrays, in which only the clock, the keys read
        and the blocks held (`kv_used_blocks`: a scalar or per step) and cached (`kv_cached_blocks(n)`: for the first
        n steps, asked only for those that ran: at a low load an arrival ends most stretches after a few) change;
        returns how many ran. Stops before
        another replica's clock, or an arrival another replica may get (the replay loop routes it first) or this
        one would admit (`_may_admit`); arrivals before that are queued (a lone replica takes them itself)."""
        busy = self.runner.cost_model.predict_many(shape)  # [N]
        duration = busy + self.runner.cost_model.overhead(shape, busy)
        ends = np.cumsum(np.concatenate(([self.clock], duration)))[1:]  # the clock, added to step by step
        starts = np.concatenate(([self.clock], ends[:-1]))
        n = min(len(busy), int(np.searchsorted(starts, arrivals.horizon_s)))  # another replica steps first
        waiting = np.full(n, len(self.waiting))
        while True:
            k = int(np.searchsorted(starts, arrivals.next_s))  # the first step the next request reaches
            if k >= n:
                break
            queued = len(self.waiting)
            self.clock = float(starts[k])
            arrivals.deliver_due(self)
            waiting[k:] += len(self.waiting) - queued
            if arrivals.next_s <= self.clock or self._may_admit():
                n = k  # it is for the replay loop, or step k admits it: stop before step k
                break
        if isinstance(kv_used_blocks, np.ndarray):
            kv_used_blocks = kv_used_blocks[:n]
        self.records.steps.extend(
            step=np.arange(step, step + n), start_s=starts[:n], duration_s=duration[:n], busy_s=busy[:n],
            num_prefill_tokens=0, num_decode_tokens=num_decode, num_padding_tokens=num_padding,
            num_rows=num_decode + num_padding, row_width=row_width, num_preempted=0, num_waiting=waiting[:n],
            num_seqs=num_decode, kv_used_blocks=kv_used_blocks, num_lookup_tokens=0,
            num_cached_tokens=0, kv_cached_blocks=kv_cached_blocks(n))
        self.records.gaps_per_step.extend([num_decode] * n)
        self.num_output_tokens += num_decode * n
        self.clock = float(ends[n - 1])
        self._last_step_s = float(duration[n - 1])
        return n

"""Continuous batching as SGLang schedules it: prefill batches apart from decode batches, admission against a reserve
for the running requests' future tokens, and that reserve's ratio learned from retractions.

SGLang 0.5's scheduler (python/sglang/srt/managers/scheduler.py, schedule_policy.py, schedule_batch.py), with its
defaults (mixed chunks off, `schedule_conservativeness` 1, `SGLANG_*` environment defaults):

- Each step it first tries a prefill batch: a request whose prompt is being chunked goes on, then waiting requests
  in order while the chunk budget (`max_batch_tokens`, SGLang's `chunked_prefill_size`) lasts. If any prefill runs,
  the step runs no decodes; decoding waits for steps with nothing to admit.
- A waiting request enters only if its uncached prompt, its output still to come (at most 4,096 tokens) and a page
  fit in the cache's free space less a reserve: each running request's output still to come times
  `new_token_ratio`, and the whole of those admitted earlier in the same batch.
- `new_token_ratio` starts at 0.7 and falls by (0.7 - 0.098) / 600 with each decode batch to 0.098. When a decode
  batch finds too little cache for its next tokens, SGLang retracts requests, those with the fewest output tokens
  first (of those, the longest prompt), until 20 more tokens for each request left fit, and sets the ratio to the
  share the requests left have decoded: (their output tokens + 20 each) / (their output budgets + 1).

- With `--scheduler-recv-interval` N (`recv_interval`, default 1), the scheduler takes arrived requests in only when
  a counter it adds to at every step reaches N: 1 after a decode batch, at once after a prefill batch, and at once
  when nothing runs (its idle loop spins). Under decoding, a request that arrived waits up to N decode batches before
  any batch can admit it (SGLang's `SchedulerRecvSkipper`; the counter starts full).

A retracted request goes back to the head of the queue here (SGLang's goes to its tail) and recomputes its tokens,
less what the prefix cache still holds, as the engine does for every preemption. A request that no reserve admits
runs when nothing else does, so an engine never stands idle with work waiting; and where one decoder's next block
is held by prompts still being chunked (a tiny cache, where SGLang stops on "no space left"), those are retracted
too, newest first, so it never stands still either.
"""

from collections import deque
from collections.abc import Collection, Iterable, Sequence

from strategies.base import BatchPlan, Request, ScheduledChunk
from strategies.continuous import ContinuousBatching

INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS  # a decode batch
# What a step adds to the receive counter (SchedulerRecvSkipper's weights): a decode batch 1, any other step (a prefill
# batch) enough to receive at the next.
RECV_WEIGHT_DECODE, RECV_WEIGHT_OTHER = 1, 1000


def output_to_come(request: Request) -> int:
    """A request's output still to come, as SGLang's estimate clips it."""
    return min(request.max_new_tokens - request.num_output_tokens, CLIP_MAX_NEW_TOKENS)


def retraction_order(num_output_tokens: int, num_prompt_tokens: int) -> tuple[int, int]:
    """Decoders sorted by this, largest first, are retracted from the end: the fewest outputs, then the longest
    prompt (SGLang's `retract_decode`)."""
    return num_output_tokens, -num_prompt_tokens


def ratio_after_retraction(num_output_tokens: int, num_requests: int, max_new_tokens: int) -> float:
    """`new_token_ratio` once a retraction leaves `num_requests` decoding, with these outputs and output budgets in
    all: the share they have decoded, counting 20 more tokens each."""
    return min(1.0, (num_output_tokens + RETRACT_DECODE_STEPS * num_requests) / (max_new_tokens + 1))


class RecvSkipper:
    """Which waiting requests SGLang's scheduler has taken in (`--scheduler-recv-interval`, the module docstring)."""

    def __init__(self, interval: int):
        if interval < 1:
            raise ValueError(f"the scheduler's receive interval must be at least 1 step, got {interval}")
        self.interval = interval
        self.counter = interval  # full: the first step receives
        # Request ids taken in: those waiting or running at the last take (a running request retracted since goes back
        # to the queue taken in); finished ones drop out at the next take.
        self.received: set[int] = set()

    def due(self, idle: bool) -> bool:
        """Whether a step starting now takes the waiting requests in."""
        return self.interval > 1 and (idle or self.counter >= self.interval)

    def step(self, waiting: Iterable[Request], running: Collection[Request]) -> None:
        """At a step's start, after `add` counted the last one: takes `waiting` in when it is `due` (idle: nothing
        `running`)."""
        if self.due(idle=not running):
            self.received = {r.request_id for r in waiting} | {r.request_id for r in running}
            self.counter = 0

    def add(self, prefill: bool, num_steps: int = 1) -> None:
        self.counter += RECV_WEIGHT_OTHER if prefill else RECV_WEIGHT_DECODE * num_steps

    def has(self, request: Request) -> bool:
        return self.interval == 1 or request.request_id in self.received

    def steps_to_next(self) -> int:
        """Decode batches that may run from here before one takes requests in (the next step starts that one)."""
        return max(self.interval - self.counter, 1) if self.interval > 1 else 1 << 30


class SGLangBatching(ContinuousBatching):
    """SGLang's continuous batching (see the module docstring); the options are `ContinuousBatching`'s, its
    `order` unused (prefill batches always come first and run alone) and `admission` too (a prompt enters only with
    room for all of it and its expected output, as the module docstring says), and `recv_interval`."""

    def __init__(self, *args, recv_interval: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.recv = RecvSkipper(recv_interval)

    def schedule(self, waiting: deque[Request], running: Sequence[Request]) -> BatchPlan:
        self.recv.step(waiting, running)
        plan = self._prefill_batch(waiting, running)
        plan = plan if plan.chunks else self._decode_batch(running)
        self.recv.add(prefill=not any(c.is_decode for c in plan.chunks))
        return plan

    def _prefill_batch(self, waiting: deque[Request], running: Sequence[Request]) -> BatchPlan:
        budget = self.max_batch_tokens
        chunks: list[ScheduledChunk] = []
        for request in running:  # a prompt being chunked goes on first
            if budget and not request.is_decoding:
                num_new = self.num_new_tokens(request, request.num_computed_tokens, budget)
                if self.kv.allocate(request, request.num_computed_tokens + num_new):
                    chunks.append(ScheduledChunk(request, request.num_computed_tokens, num_new))
                    budget -= num_new
        if any(c.start + c.num_tokens < c.request.num_tokens for c in chunks):
            return BatchPlan(chunks=chunks)  # one chunked prompt at a time
        reserved = sum(map(output_to_come, running)) * self.new_token_ratio  # tokens
        admitted: list[Request] = []
        for request in waiting:
            if not budget or len(running) + len(admitted) >= self.max_num_seqs or not self.recv.has(request):
                break
            cached = self.kv.num_cached_tokens(request)
            uncached = request.num_tokens - cached
            free = self.kv.num_free_blocks * self.kv.block_size - reserved
            alone = not running and not admitted  # nothing else would run: never stand idle
            if uncached + output_to_come(request) + self.kv.block_size >= free and not alone:
                break
            num_new = self.num_new_tokens(request, cached, budget)
            if not self.kv.allocate(request, cached + num_new, cached):
                break
            admitted.append(request)
            chunks.append(ScheduledChunk(request, cached, num_new))
            budget -= num_new
            reserved += uncached + output_to_come(request)
            if num_new < uncached:
                break  # its prompt is chunked: it goes on next step, alone
        return BatchPlan(chunks=chunks, admitted=admitted)

    def _decode_batch(self, running: Sequence[Request]) -> BatchPlan:
        decoding = [r for r in running if r.is_decoding]
        retracted: list[Request] = []
        opened = sum(map(self._blocks_opened, decoding))  # blocks the decoders' next tokens open
        if opened > self.kv.num_free_blocks:
            # Until the rest have room for 20 more tokens each.
            keep = sorted(decoding, key=lambda r: retraction_order(r.num_output_tokens, r.num_prompt_tokens),
                          reverse=True)
            while len(keep) > 1 and (opened > self.kv.num_free_blocks or
                                     self.kv.num_free_blocks * self.kv.block_size < RETRACT_DECODE_STEPS * len(keep)):
                victim = keep.pop()
                opened -= self._blocks_opened(victim)
                self.kv.free(victim)
                retracted.append(victim)
            chunking = [r for r in running if not r.is_decoding]
            while opened > self.kv.num_free_blocks and chunking:
                victim = chunking.pop()
                self.kv.free(victim)
                retracted.append(victim)
            decoding = [r for r in decoding if r not in retracted]
            self.new_token_ratio = ratio_after_retraction(sum(r.num_output_tokens for r in decoding), len(decoding),
                                                          sum(r.max_new_tokens for r in decoding))
        else:
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        chunks = [ScheduledChunk(r, r.num_computed_tokens, 1) for r in decoding
                  if self.kv.allocate(r, r.num_computed_tokens + 1)]
        return BatchPlan(chunks=chunks, preempted=retracted)

    def _blocks_opened(self, request: Request) -> int:
        """Blocks a decoder's next token opens: one at a block's boundary, more where the pool holds window layers'
        blocks beside its full layers' (an engine sizing one pool as vLLM does) and those still grow."""
        return self.kv.num_blocks_for(request.num_tokens) - self.kv.num_blocks_for(request.num_computed_tokens)

"""Continuous batching: a ragged batch under a token budget, decodes first, chunked prefill fills the rest."""

from collections import deque
from collections.abc import Sequence

from strategies.base import BatchPlan, KVBlocks, Request, ScheduledChunk, Strategy

ORDERS = ("decode_first", "prefill_first")
# When a waiting prompt may enter: once the blocks of its next chunk are free (vLLM 0.10-0.19), or only once all of
# it fits (vLLM 0.20 and later, `scheduler_reserve_full_isl`, vllm-project/vllm PR #37307), so that a long prompt
# is not admitted into a nearly full cache only to be preempted chunks later.
ADMISSIONS = ("next_chunk", "whole_prompt")


class ContinuousBatching(Strategy):
    """Each step: every running request's next tokens under the budget `max_batch_tokens` (decodes first by
    default), then waiting requests' prompts, chunked to fit, each from the end of its cached prefix, entering as
    `admission` says. Blocks are allocated as tokens are computed and freed the moment a request finishes. When the
    cache runs out, the newest running request is preempted and will recompute its tokens later (less what the
    prefix cache still holds); no request is dropped.
    """

    name = "continuous"

    def __init__(self, kv: KVBlocks, max_batch_tokens: int, max_num_seqs: int,
                 max_prefill_chunk: int | None = None, order: str = "decode_first", admission: str = "next_chunk"):
        super().__init__(kv)
        if order not in ORDERS:
            raise ValueError(f"strategy.order must be one of {ORDERS}, got {order!r}")
        if admission not in ADMISSIONS:
            raise ValueError(f"strategy.admission must be one of {ADMISSIONS}, got {admission!r}")
        self.max_batch_tokens = max_batch_tokens
        self.max_num_seqs = max_num_seqs
        self.max_prefill_chunk = max_prefill_chunk or max_batch_tokens
        self.order = order
        self.admission = admission

    @property
    def max_concurrency(self) -> int:
        return self.max_num_seqs

    def schedule(self, waiting: deque[Request], running: Sequence[Request]) -> BatchPlan:
        budget = self.max_batch_tokens
        scheduled: dict[int, ScheduledChunk] = {}
        staying = list(running)  # admission order: preemption victims come off the end, newest first
        preempted: list[Request] = []

        decodes, prefills = [], []
        for r in running:
            (decodes if r.is_decoding else prefills).append(r)
        order = decodes + prefills if self.order == "decode_first" else prefills + decodes
        for request in order:
            if budget == 0:
                break
            if request in preempted:
                continue
            num_new = self.num_new_tokens(request, request.num_computed_tokens, budget)
            while not self.kv.allocate(request, request.num_computed_tokens + num_new):
                # Recompute-style preemption: the victim's cache goes; the engine queues it first again.
                victim = staying.pop()
                self.kv.free(victim)
                preempted.append(victim)
                chunk = scheduled.pop(victim.request_id, None)
                budget += chunk.num_tokens if chunk else 0
                if victim is request:
                    break
            else:
                scheduled[request.request_id] = ScheduledChunk(request, request.num_computed_tokens, num_new)
                budget -= num_new

        # Preempting means the cache is full: admitting now would only preempt again.
        admitted: list[Request] = []
        if not preempted:
            for request in waiting:
                if budget == 0 or len(staying) + len(admitted) >= self.max_num_seqs:
                    break
                cached = self.kv.num_cached_tokens(request)
                if self.admission == "whole_prompt" and not self.kv.fits(request, request.num_tokens, cached):
                    break
                num_new = self.num_new_tokens(request, cached, budget)
                if not self.kv.allocate(request, cached + num_new, cached):
                    break
                admitted.append(request)
                scheduled[request.request_id] = ScheduledChunk(request, cached, num_new)
                budget -= num_new

        return BatchPlan(chunks=list(scheduled.values()), admitted=admitted, preempted=preempted)

    def num_new_tokens(self, request: Request, start: int, budget: int) -> int:
        """The tokens `request` runs next from `start` (its computed or cached tokens) under `budget`: the rest of
        its prompt (or recompute) up to the chunk cap."""
        return min(request.num_tokens - start, budget, self.max_prefill_chunk)

"""Dynamic batching: padded rows, but a finished row is refilled at once with a waiting request."""

from collections import deque
from collections.abc import Sequence

from strategies.base import BatchPlan, KVBlocks, Request, ScheduledChunk, Strategy


class DynamicBatching(Strategy):
    """Up to `batch_size` rows in a padded `[B, L]` layout; a finished request leaves and a waiting one takes its
    place at the next step.

    A newcomer's whole prompt runs in the same rectangle as the others' single decode tokens, so inserting an
    n-token prompt into B rows costs (n-1)(B-1) padding tokens. Each row reserves the slots of its request's
    full length (prompt + max_new_tokens) when it enters, as a padded engine preallocates its rows. With a prefix
    cache, a newcomer's row starts after its cached prefix: the rectangle is as wide as the uncached prompt.
    """

    name = "dynamic"

    def __init__(self, kv: KVBlocks, batch_size: int):
        super().__init__(kv)
        self.batch_size = batch_size

    @property
    def max_concurrency(self) -> int:
        return self.batch_size

    def schedule(self, waiting: deque[Request], running: Sequence[Request]) -> BatchPlan:
        admitted = []
        for request in waiting:
            if len(running) + len(admitted) >= self.batch_size:
                break
            cached = self.kv.num_cached_tokens(request)
            if not self.kv.allocate(request, request.max_num_tokens, cached):
                break  # FIFO: the head of the queue waits for blocks, nobody overtakes it
            admitted.append((request, cached))
        chunks = [ScheduledChunk(r, r.num_computed_tokens, r.num_tokens - r.num_computed_tokens) for r in running]
        chunks += [ScheduledChunk(r, cached, r.num_tokens - cached) for r, cached in admitted]
        return BatchPlan(chunks=chunks, padded=True, admitted=[r for r, _ in admitted])

"""Static batching: fill a batch when it is empty, then run it until its longest request is done."""

from collections import deque
from collections.abc import Sequence
from itertools import islice

from strategies.base import BatchPlan, KVBlocks, Request, RequestStatus, ScheduledChunk, Strategy


class StaticBatching(Strategy):
    """Up to `batch_size` waiting requests start together, left-padded to the longest prompt, and decode together.

    A finished request's row keeps being computed (as padding) until the whole batch drains, and every row holds
    the slots of the full rectangle (longest prompt + longest output) until then, as a padded engine
    preallocates `[B, L + max_new_tokens]`. Nothing joins mid-batch. With a prefix cache, each row's prefill starts
    after its cached prefix, so the first rectangle is as wide as the longest uncached prompt.
    """

    name = "static"

    def __init__(self, kv: KVBlocks, batch_size: int):
        super().__init__(kv)
        self.batch_size = batch_size
        self.batch: list[Request] = []

    @property
    def max_concurrency(self) -> int:
        return self.batch_size

    def schedule(self, waiting: deque[Request], running: Sequence[Request]) -> BatchPlan:
        if not self.batch:
            return self._start_batch(waiting)
        live = [r for r in self.batch if r.status != RequestStatus.FINISHED]
        return BatchPlan(
            chunks=[ScheduledChunk(r, r.num_computed_tokens, 1) for r in live],
            padded=True,
            idle_rows=[r for r in self.batch if r.status == RequestStatus.FINISHED],
        )

    def _start_batch(self, waiting: deque[Request]) -> BatchPlan:
        # Take the longest FIFO prefix of the queue whose rectangle fits in the cache, sized as if nothing were
        # cached: a row's cached blocks may be free ones it takes back, so only the whole rectangle is a safe bound.
        candidates = list(islice(waiting, self.batch_size))
        rows = 0
        for k in range(1, len(candidates) + 1):
            if k * self.kv.num_blocks_for(self._rectangle_width(candidates[:k])) > self.kv.num_free_blocks:
                break
            rows = k
        self.batch = candidates[:rows]
        width = self._rectangle_width(self.batch)
        cached = []
        for request in self.batch:  # each looks up just before it allocates: an earlier row's blocks may evict
            cached.append(self.kv.num_cached_tokens(request))
            allocated = self.kv.allocate(request, width, cached[-1])
            assert allocated, "the rectangle was sized to fit the free blocks"
        return BatchPlan(chunks=[ScheduledChunk(r, n, r.num_tokens - n) for r, n in zip(self.batch, cached)],
                         padded=True, admitted=list(self.batch))

    @staticmethod
    def _rectangle_width(requests: list[Request]) -> int:
        if not requests:
            return 0
        return max(r.num_prompt_tokens for r in requests) + max(r.max_new_tokens for r in requests) - 1

    def on_finished(self, request: Request) -> None:
        # Rows are held, pads and all, until the batch drains.
        if all(r.status == RequestStatus.FINISHED for r in self.batch):
            for r in self.batch:
                self.kv.free(r)
            self.batch = []

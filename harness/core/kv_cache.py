"""The paged KV cache's bookkeeping: a pool of blocks, a free list and one block table per request
(`BlockAllocator`, for the step-by-step engine: the real runner adds the tensors `[num_blocks, block_size, H_kv,
D]`), or only how many blocks are held (`BlockCount`, for the simulated engines, which need no block ids).
"""

from collections import OrderedDict, deque

from harness.core.prefix_cache import PrefixCache, prompt_block_hashes
from strategies import Request


class CachePool:
    """A pool of `num_blocks` blocks of `block_size` token slots."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"kv_cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size

    def num_blocks_for(self, num_tokens):
        """Blocks that hold `num_tokens` slots (ceil division; also elementwise on a numpy array)."""
        return -(-num_tokens // self.block_size)


class BlockCount(CachePool):
    """The cache as a simulator needs it: how many blocks are held, not which.

    With `prefix_caching`, a released request's named prompt blocks stay cached as one group, least recently
    released first; taking blocks beyond the free ones evicts from the oldest group, its last blocks first (as
    `BlockAllocator` releases them), so a group always keeps its leading blocks. Groups are found by request id:
    the simulated engines model a workload with no prefix shared between requests, where the only reuse is a
    preempted request finding its own prompt again.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        super().__init__(num_blocks, block_size)
        self.num_used_blocks = 0
        self.prefix_caching = prefix_caching
        self.groups: OrderedDict[int, int] = OrderedDict()  # request_id → its cached blocks no request holds
        self.num_evictable_blocks = 0
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    def take(self, num_blocks: int) -> None:
        assert num_blocks <= self.num_free_blocks, "took blocks the cache does not have"
        to_evict = num_blocks - (self.num_free_blocks - self.num_evictable_blocks)
        while to_evict > 0:
            rid, count = next(iter(self.groups.items()))
            evicted = min(count, to_evict)
            if evicted == count:
                del self.groups[rid]
            else:
                self.groups[rid] = count - evicted  # keeps its place: the group was released as one
            self.num_evictable_blocks -= evicted
            self.num_evictions += evicted
            to_evict -= evicted
        self.num_used_blocks += num_blocks

    def give(self, num_blocks: int, request_id: int | None = None, num_named: int = 0) -> None:
        """Give back `num_blocks`; the first `num_named` of them (the request's named prompt blocks) stay cached."""
        self.num_used_blocks -= num_blocks
        if num_named:
            self.groups[request_id] = num_named
            self.num_evictable_blocks += num_named

    def num_cached_blocks_of(self, request_id: int) -> int:
        return self.groups.get(request_id, 0)

    def reclaim(self, request_id: int) -> int:
        """The request takes its cached group back (it is held again); returns how many blocks."""
        count = self.groups.pop(request_id, 0)
        self.num_evictable_blocks -= count
        self.num_used_blocks += count
        return count


class BlockAllocator(CachePool):
    """Which blocks each request holds: the real runner reads and writes its K/V through these tables.

    With `prefix_caching`, a request that enters takes the cached blocks of its longest cached prompt prefix
    (`num_cached_tokens`, then `allocate(..., num_cached_tokens)`), and the engine names each full prompt block
    once it is computed (`cache_computed`). Freed named blocks stay cached; a block is taken from the free list
    first, and only when that is empty is the least recently used cached block evicted (free blocks hold nothing
    worth keeping). A cached block no request holds counts as free.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        super().__init__(num_blocks, block_size)
        self._free: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self.prefix = PrefixCache() if prefix_caching else None
        self._hashes: dict[int, list[int]] = {}  # request_id → its prompt blocks' hashes, while it holds blocks
        self._num_named: dict[int, int] = {}  # request_id → leading blocks of its table already named or matched

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + (len(self.prefix.evictable) if self.prefix else 0)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Named blocks in the cache, held by requests or not."""
        return self.prefix.num_cached_blocks if self.prefix else 0

    @property
    def num_evictions(self) -> int:
        return self.prefix.num_evictions if self.prefix else 0

    def num_cached_tokens(self, request: Request) -> int:
        """Leading tokens of `request`, about to enter, whose K/V the cache holds: whole blocks, and never the
        last token (computing it gives the next one)."""
        return self.cached_tokens_of(self._hashes_of(request), request.num_tokens) if self.prefix else 0

    def cached_tokens_of(self, hashes: list[int], num_tokens: int) -> int:
        """Leading tokens of a prompt `num_tokens` long whose full blocks `hashes` name, the cache holds (a router
        asks each replica without the request entering any)."""
        if self.prefix is None:
            return 0
        return len(self.prefix.match(hashes[:(num_tokens - 1) // self.block_size])) * self.block_size

    def allocate(self, request: Request, num_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Grow the request's table to hold `num_tokens` slots; a request entering with `num_cached_tokens` (from
        `num_cached_tokens`) takes those cached blocks first. All or nothing: False if the blocks aren't free."""
        table = self.block_tables.get(request.request_id)
        if table is not None:
            if len(table) * self.block_size >= num_tokens:
                return True  # the common case: a decode token that fits in the last block
            return self._grow(table, self.num_blocks_for(num_tokens) - len(table))
        hits = self._hits(request, num_cached_tokens)
        if not self._fits(hits, num_tokens):
            return False
        table = []
        missing = self.num_blocks_for(num_tokens) - len(hits)
        for block in hits:
            self.prefix.hold(block)
        table.extend(hits)
        self._grow(table, missing)
        self.block_tables[request.request_id] = table
        if self.prefix is not None:
            self._num_named[request.request_id] = len(hits)
        return True

    def fits(self, request: Request, num_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Whether `allocate` would hold `num_tokens` slots for `request`, about to enter, holding nothing."""
        return self._fits(self._hits(request, num_cached_tokens), num_tokens)

    def _hits(self, request: Request, num_cached_tokens: int) -> list[int]:
        """The cached blocks of the request's first `num_cached_tokens`, as `num_cached_tokens()` just found them."""
        if self.prefix is None:
            return []
        hits = self.prefix.match(self._hashes_of(request)[:num_cached_tokens // self.block_size])
        assert len(hits) * self.block_size == num_cached_tokens, "cached tokens not looked up just before"
        return hits

    def _fits(self, hits: list[int], num_tokens: int) -> bool:
        # Cached blocks no request holds count as free: taking them back uses those up too.
        missing = self.num_blocks_for(num_tokens) - len(hits)
        return missing + (self.prefix.num_reviving(hits) if hits else 0) <= self.num_free_blocks

    def _grow(self, table: list[int], missing: int) -> bool:
        if missing > self.num_free_blocks:
            return False
        for _ in range(missing):
            table.append(self._free.popleft() if self._free else self.prefix.evict())
        return True

    def cache_computed(self, request: Request) -> None:
        """Name the request's full prompt blocks computed so far, so later requests may reuse them."""
        if self.prefix is None:
            return
        rid = request.request_id
        table, hashes = self.block_tables[rid], self._hashes_of(request)
        computed = min(request.num_computed_tokens, request.num_prompt_tokens) // self.block_size
        for i in range(self._num_named[rid], computed):
            self.prefix.add(table[i], hashes[i])
        self._num_named[rid] = max(self._num_named[rid], computed)

    def free(self, request: Request) -> None:
        """Give back the request's blocks: named ones stay cached (the request's last blocks first in line to be
        evicted, as the least likely to be shared), the rest go to the free list."""
        table = self.block_tables.pop(request.request_id, ())
        if self.prefix is None:
            self._free.extend(table)
            return
        self._hashes.pop(request.request_id, None)
        self._num_named.pop(request.request_id, None)
        for block in reversed(table):
            if block in self.prefix.hash_of:  # named: this request held it
                self.prefix.release(block)
            else:
                self._free.append(block)

    def _hashes_of(self, request: Request) -> list[int]:
        hashes = self._hashes.get(request.request_id)
        if hashes is None:
            hashes = self._hashes[request.request_id] = prompt_block_hashes(request, self.block_size)
        return hashes

    def slots(self, request_id: int, start: int, end: int) -> list[int]:
        """Cache slots (block * block_size + offset) of the request's token positions [start, end)."""
        table, size = self.block_tables[request_id], self.block_size
        return [table[p // size] * size + p % size for p in range(start, end)]

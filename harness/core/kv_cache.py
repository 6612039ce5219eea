"""The paged KV cache's bookkeeping: a pool of blocks, a free list and one block table per request
(`BlockAllocator`, for the step-by-step engine: the real runner adds the tensors `[num_blocks, block_size, H_kv,
D]`), or only how many blocks are held (`BlockCount`, for the simulated engines, which need no block ids).
"""

from collections import deque


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
    """The cache as a simulator needs it: how many blocks are held, not which."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.num_used_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    def take(self, num_blocks: int) -> None:
        assert num_blocks <= self.num_free_blocks, "took blocks the cache does not have"
        self.num_used_blocks += num_blocks

    def give(self, num_blocks: int) -> None:
        self.num_used_blocks -= num_blocks


class BlockAllocator(CachePool):
    """Which blocks each request holds: the real runner reads and writes its K/V through these tables."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._free: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, request_id: int, num_tokens: int) -> bool:
        """Grow the request's table to hold `num_tokens` slots. All or nothing: False if the blocks aren't free."""
        table = self.block_tables.get(request_id)
        if table is None:
            table = []
        elif len(table) * self.block_size >= num_tokens:
            return True  # the common case: a decode token that fits in the last block
        missing = self.num_blocks_for(num_tokens) - len(table)
        if missing > len(self._free):
            return False
        table.extend(self._free.popleft() for _ in range(missing))
        self.block_tables[request_id] = table
        return True

    def free(self, request_id: int) -> None:
        self._free.extend(self.block_tables.pop(request_id, ()))

    def slots(self, request_id: int, start: int, end: int) -> list[int]:
        """Cache slots (block * block_size + offset) of the request's token positions [start, end)."""
        table, size = self.block_tables[request_id], self.block_size
        return [table[p // size] * size + p % size for p in range(start, end)]

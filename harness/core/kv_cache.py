"""The paged KV cache's bookkeeping: a pool of blocks, a free list and one block table per request
(`BlockAllocator`, for the step-by-step engine: the real runner adds the tensors `[num_blocks, block_size, H_kv,
D]`), or only how many blocks are held (`BlockCount`, for the simulated engines, which need no block ids).
"""

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from harness.core.prefix_cache import PrefixCache, block_hashes
from strategies import Request


@dataclass(frozen=True)
class CachePolicy:
    """How an engine's prefix cache keeps blocks no request holds, and which blocks it names."""

    # Free blocks are handed out in the order they were freed, named or not ("release_order": vLLM's free block
    # queue to 0.23), or blocks holding nothing first, then named ones least recently freed first ("empty_first":
    # SGLang's radix cache evicts only when its free slots run short, and later vLLM prepends unnamed blocks).
    eviction: str
    # Whether full blocks of generated tokens are named too (vLLM hashes every full block; SGLang keeps a
    # retracted request's prompt in its radix tree and frees the rest).
    names_output: bool


@dataclass(frozen=True)
class WindowBlocks:
    """What a sequence's sliding-window layers hold in the one pool beside its full layers' blocks, as vLLM's hybrid
    cache manager keeps them: layers of one kind in groups of equal size, each group with a block table of its own
    whose blocks take the pool's page, a window group freeing the blocks wholly before its window. So a block of
    theirs for each block of tokens, up to `max_blocks` (vLLM's `SlidingWindowSpec.max_admission_blocks_per_request`
    at one token in flight: cdiv(window, block size) + 1), times `window_layers / full_layers` (their layer slots,
    padded to whole groups, against the full layers' that the pool's block is sized by). Not held here: a prefill
    chunk's blocks already behind the window, which vLLM frees at the sequence's next step."""

    max_blocks: int
    window_layers: int
    full_layers: int

    def held(self, num_token_blocks):
        """The window layers' blocks beside `num_token_blocks` blocks of tokens (elementwise on a numpy array)."""
        capped = np.minimum(num_token_blocks, self.max_blocks) if isinstance(num_token_blocks, np.ndarray) \
            else min(num_token_blocks, self.max_blocks)
        return -(-capped * self.window_layers // self.full_layers)


EVICTION_ORDERS = ("release_order", "empty_first")
# Each scheduler's engine's (`strategies.CONTINUOUS_SCHEDULERS`): vLLM's as 0.10-0.23 keep it (vLLM PR #42656, opened
# 2026-05-14, in later releases, hands blocks holding nothing out first: `kv_cache.eviction=empty_first`), SGLang's.
CACHE_POLICIES = {"vllm": CachePolicy("release_order", names_output=True),
                  "sglang": CachePolicy("empty_first", names_output=False)}


class CachePool:
    """A pool of `num_blocks` blocks of `block_size` token slots, kept as `policy` says once named. A model with
    linear-attention layers also keeps a fixed-size state per sequence in the pool, `state_blocks` blocks of it
    (vLLM's V1 engine holds both in one pool, its state as blocks of the same size); one with sliding-window layers
    may keep their last window there too (`window`)."""

    def __init__(self, num_blocks: int, block_size: int, policy: CachePolicy, state_blocks: int = 0,
                 window: WindowBlocks | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"kv_cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.policy = policy
        self.state_blocks = state_blocks
        self.window = window

    def num_blocks_for(self, num_tokens):
        """Blocks a sequence of `num_tokens` slots holds: its tokens' (ceil division), its state's and its window
        layers' (also elementwise on a numpy array)."""
        if self.window is None:  # the common case, asked for at every step: no second call
            return -(-num_tokens // self.block_size) + self.state_blocks
        return -(-num_tokens // self.block_size) + self.num_side_blocks_for(num_tokens)

    def num_side_blocks_for(self, num_tokens):
        """Of those, the blocks beside its tokens' own: its state's and its window layers'."""
        if self.window is None:
            return self.state_blocks
        return self.state_blocks + self.window.held(-(-num_tokens // self.block_size))

    def num_named_blocks(self, request: Request, num_computed: int) -> int:
        """Blocks of `request` named once `num_computed` of its tokens are: its full ones, prompt ones only unless
        the policy names output too."""
        return (num_computed if self.policy.names_output
                else min(num_computed, request.num_prompt_tokens)) // self.block_size


class BlockCount(CachePool):
    """The cache as a simulator needs it: how many blocks are held, not which.

    With `prefix_caching`, a released request's named blocks stay cached as one group. The free blocks are kept as
    runs in the order `policy` hands them out, a run either blocks holding nothing or one request's group, its last
    blocks first (as `BlockAllocator` frees them), so a group partly handed out keeps its leading blocks. Groups are
    found by request id: the simulated engines model a workload with no prefix shared between requests, where the
    only reuse is a preempted request finding its own blocks again.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False,
                 policy: CachePolicy = CACHE_POLICIES["vllm"], state_blocks: int = 0,
                 window: WindowBlocks | None = None):
        super().__init__(num_blocks, block_size, policy, state_blocks, window)
        self.num_used_blocks = 0
        self.prefix_caching = prefix_caching
        # The free blocks in the order they are handed out: run key → [request_id, or None for blocks holding
        # nothing, count]. Without prefix caching nothing is named and the order does not matter: not kept.
        self._runs: OrderedDict[int, list] = OrderedDict({0: [None, num_blocks]})
        self._group_run: dict[int, int] = {}  # request_id → the key of its cached group's run
        self._next_key = 1
        self.num_evictable_blocks = 0
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_used_blocks

    def take(self, num_blocks: int) -> None:
        assert num_blocks <= self.num_free_blocks, "took blocks the cache does not have"
        self.num_used_blocks += num_blocks
        if not self.prefix_caching:
            return
        runs = self._runs
        while num_blocks:
            key = next(iter(runs))
            run = runs[key]
            if run[0] is None and run[1] > num_blocks:  # the common case: blocks holding nothing at the head
                run[1] -= num_blocks
                return
            taken = min(run[1], num_blocks)
            run[1] -= taken
            num_blocks -= taken
            if run[0] is not None:  # a cached group: its blocks are evicted
                self.num_evictable_blocks -= taken
                self.num_evictions += taken
            if not run[1]:
                del runs[key]
                self._group_run.pop(run[0], None)

    def give(self, num_blocks: int, request_id: int | None = None, num_named: int = 0) -> None:
        """Give back `num_blocks`; the first `num_named` of them (the request's named blocks) stay cached, one run at
        the tail of the free order."""
        self.num_used_blocks -= num_blocks
        if not self.prefix_caching:
            return
        if num_blocks > num_named:
            self._free_empty(num_blocks - num_named)
        if num_named:
            key, self._next_key = self._next_key, self._next_key + 1
            self._runs[key] = [request_id, num_named]
            self._group_run[request_id] = key
            self.num_evictable_blocks += num_named

    def _free_empty(self, count: int) -> None:
        """`count` blocks holding nothing join the free order: at its head (`empty_first`) or its tail, in one run
        with the blocks holding nothing there, if any."""
        runs, first = self._runs, self.policy.eviction == "empty_first"
        if runs:
            end = runs[next(iter(runs)) if first else next(reversed(runs))]
            if end[0] is None:
                end[1] += count
                return
        key, self._next_key = self._next_key, self._next_key + 1
        runs[key] = [None, count]
        if first:
            runs.move_to_end(key, last=False)

    def num_cached_blocks_of(self, request_id: int) -> int:
        key = self._group_run.get(request_id)
        return 0 if key is None else self._runs[key][1]

    def reclaim(self, request_id: int) -> int:
        """The request takes its cached group back (it is held again); returns how many blocks."""
        key = self._group_run.pop(request_id, None)
        if key is None:
            return 0
        _, count = self._runs.pop(key)
        self.num_evictable_blocks -= count
        self.num_used_blocks += count
        return count

    def num_evicted_by(self, taken: np.ndarray) -> np.ndarray:
        """Cached blocks evicted by taking each of `taken` blocks from here (elementwise, without taking them)."""
        if not self.prefix_caching or not self.num_evictable_blocks:
            return np.zeros_like(taken)
        ends, named = [0], [0]  # the free order's run boundaries, and the named blocks before each
        for request_id, count in self._runs.values():
            ends.append(ends[-1] + count)
            named.append(named[-1] + (count if request_id is not None else 0))
            if ends[-1] >= taken[-1]:
                break
        # Named blocks grow one for one inside a group's run and not at all inside an empty one: exact at integers.
        return np.rint(np.interp(taken, ends, named)).astype(taken.dtype)


class BlockAllocator(CachePool):
    """Which blocks each request holds: the real runner reads and writes its K/V through these tables.

    With `prefix_caching`, a request that enters takes the cached blocks of its longest cached prefix
    (`num_cached_tokens`, then `allocate(..., num_cached_tokens)`), and the engine names each full block once it
    is computed (`cache_computed`). Blocks no request holds are free, named ones still cached until handed out
    again, and are handed out in the order `policy` says. A sequence's side blocks (its state's and window layers',
    in a simulation: never the real runner's, whose slots are its table's) are kept beside its table, never named.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False,
                 policy: CachePolicy = CACHE_POLICIES["vllm"], state_blocks: int = 0,
                 window: WindowBlocks | None = None):
        super().__init__(num_blocks, block_size, policy, state_blocks, window)
        # Blocks no request holds, in the order they are handed out; named ones among them are still cached.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self._side_blocks: dict[int, list[int]] = {}  # request_id → its side blocks, beside its table
        self.prefix = PrefixCache() if prefix_caching else None
        self._hashes: dict[int, list[int]] = {}  # request_id → its full blocks' hashes so far, while it holds blocks
        self._num_named: dict[int, int] = {}  # request_id → leading blocks of its table already named or matched

    @property
    def prefix_caching(self) -> bool:
        return self.prefix is not None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

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
        if self.prefix is None:
            return 0
        return self.cached_tokens_of(self._hashes_of(request, request.num_tokens), request.num_tokens)

    def cached_tokens_of(self, hashes: list[int], num_tokens: int) -> int:
        """Leading tokens of a request `num_tokens` long whose full blocks `hashes` name, the cache holds (a router
        asks each replica without the request entering any)."""
        if self.prefix is None:
            return 0
        return len(self.prefix.match(hashes[:(num_tokens - 1) // self.block_size])) * self.block_size

    def allocate(self, request: Request, num_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Grow the request's table to hold `num_tokens` slots; a request entering with `num_cached_tokens` (from
        `num_cached_tokens`) takes those cached blocks first. All or nothing: False if the blocks aren't free."""
        table = self.block_tables.get(request.request_id)
        num_token_blocks = -(-num_tokens // self.block_size)
        if table is not None:
            if len(table) >= num_token_blocks:
                return True  # the common case: a decode token that fits in the last block (side blocks grow alike)
            side = self._side_blocks[request.request_id]
            missing_side = self.num_side_blocks_for(num_tokens) - len(side)
            if num_token_blocks - len(table) + missing_side > self.num_free_blocks:
                return False
            self._grow(side, missing_side)
            return self._grow(table, num_token_blocks - len(table))
        hits = self._hits(request, num_cached_tokens)
        if not self._fits(hits, num_tokens):
            return False
        for block in hits:
            if self.prefix.hold(block):
                del self._free[block]
        table = list(hits)
        self._grow(table, num_token_blocks - len(hits))
        self.block_tables[request.request_id] = table
        self._side_blocks[request.request_id] = []
        self._grow(self._side_blocks[request.request_id], self.num_side_blocks_for(num_tokens))
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
        hits = self.prefix.match(self._hashes_of(request, num_cached_tokens)[:num_cached_tokens // self.block_size])
        assert len(hits) * self.block_size == num_cached_tokens, "cached tokens not looked up just before"
        return hits

    def _fits(self, hits: list[int], num_tokens: int) -> bool:
        # Cached blocks no request holds are free ones: taking them back uses those up too.
        missing = self.num_blocks_for(num_tokens) - len(hits)
        return missing + (self.prefix.num_reviving(hits) if hits else 0) <= self.num_free_blocks

    def _grow(self, table: list[int], missing: int) -> bool:
        if missing > self.num_free_blocks:
            return False
        for _ in range(missing):
            block, _ = self._free.popitem(last=False)
            if self.prefix is not None and block in self.prefix.hash_of:
                self.prefix.evict(block)  # the least recently freed named block: its tokens are overwritten
            table.append(block)
        return True

    def cache_computed(self, request: Request) -> None:
        """Name the request's full blocks computed so far, so later requests (or it, back from a preemption) may
        reuse them."""
        if self.prefix is None:
            return
        rid = request.request_id
        computed = self.num_named_blocks(request, request.num_computed_tokens)
        if computed <= self._num_named[rid]:
            return
        table, hashes = self.block_tables[rid], self._hashes_of(request, computed * self.block_size)
        for i in range(self._num_named[rid], computed):
            self.prefix.add(table[i], hashes[i])
        self._num_named[rid] = computed

    def free(self, request: Request) -> None:
        """Give back the request's blocks, its last first (vLLM's order: a prefix's tail is the least likely to be
        shared, so the first to be handed out again); named ones stay cached until then."""
        table = self.block_tables.pop(request.request_id, ())
        self._hashes.pop(request.request_id, None)
        self._num_named.pop(request.request_id, None)
        # Its side blocks first: they hold nothing a later request could find, as its table's unnamed tail.
        for block in [*self._side_blocks.pop(request.request_id, ()), *reversed(table)]:
            if self.prefix is None or block not in self.prefix.hash_of:
                self._free[block] = None
                if self.policy.eviction == "empty_first":
                    self._free.move_to_end(block, last=False)  # it holds nothing worth keeping: handed out first
            elif self.prefix.release(block):  # named, and no other request holds it
                self._free[block] = None

    def _hashes_of(self, request: Request, num_tokens: int) -> list[int]:
        """The hashes of the request's full blocks among its first `num_tokens` (at least)."""
        hashes = self._hashes.setdefault(request.request_id, [])
        if len(hashes) < num_tokens // self.block_size:
            block_hashes(request, self.block_size, request.num_tokens // self.block_size, hashes)
        return hashes

    def slots(self, request_id: int, start: int, end: int) -> list[int]:
        """Cache slots (block * block_size + offset) of the request's token positions [start, end)."""
        table, size = self.block_tables[request_id], self.block_size
        return [table[p // size] * size + p % size for p in range(start, end)]

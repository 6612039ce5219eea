"""Automatic prefix caching, as vLLM's V1 engine does it: a full prompt block is named by a hash of its tokens
chained to the previous block's hash, so one name means one whole prefix. Requests that share a prefix share its
blocks by reference count; a block no request holds stays cached until the cache needs room, and then the least
recently used goes first.

Only prompt blocks are named: the ids of generated tokens exist in a real run alone, and a simulated run must make
the same decisions. A request without prompt ids (a simulation) is named by the workload's `prefix_pieces`
instead: the same piece key is the same tokens in every request, and what follows the pieces is its own.
"""

from collections import OrderedDict

from strategies import Request

OWN_CONTENT = -1  # a piece key no workload uses: the rest of a prompt after its shared pieces


def prompt_block_hashes(request: Request, block_size: int) -> list[int]:
    """The chained hashes of `request`'s full prompt blocks, from its token ids where it has them."""
    num_blocks = request.num_prompt_tokens // block_size
    ids = request.token_ids
    hashes, parent = [], None
    if len(ids) == request.num_tokens:  # the prompt's ids are known
        for i in range(num_blocks):
            parent = hash((parent, tuple(ids[i * block_size:(i + 1) * block_size])))
            hashes.append(parent)
        return hashes
    pieces, start = [], 0  # (key, first token, end) of each piece, in prompt positions
    for key, length in request.prefix_pieces:
        pieces.append((key, start, start + length))
        start += length
    for i in range(num_blocks):
        lo, hi = i * block_size, (i + 1) * block_size
        content = tuple((key, max(lo, s) - s, min(hi, e) - s) for key, s, e in pieces if s < hi and e > lo)
        if hi > start:  # past the shared pieces: this request's own tokens, and every block after too
            content += ((OWN_CONTENT, request.request_id),)
        parent = hash((parent, content))
        hashes.append(parent)
    return hashes


class PrefixCache:
    """Which physical blocks hold which named prompt blocks, who holds them, and which may be evicted."""

    def __init__(self):
        self.block_of: dict[int, int] = {}  # hash → block
        self.hash_of: dict[int, int] = {}  # block → hash
        self.ref_counts: dict[int, int] = {}  # block → requests holding it
        # Cached blocks no request holds, least recently released first: the eviction order.
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0

    def match(self, hashes: list[int]) -> list[int]:
        """The blocks of the longest leading run of `hashes` that is cached."""
        blocks = []
        for h in hashes:
            block = self.block_of.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def num_reviving(self, blocks: list[int]) -> int:
        """How many of `blocks` no request holds: taking them uses up free (evictable) blocks."""
        return sum(1 for b in blocks if self.ref_counts[b] == 0)

    def hold(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.evictable[block]
        self.ref_counts[block] += 1

    def add(self, block: int, block_hash: int) -> bool:
        """Name a freshly computed block, held by the request that computed it. False if another block already
        holds the same tokens (two requests computed one prefix at once): this one stays its request's own."""
        if block_hash in self.block_of:
            return False
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
        self.ref_counts[block] = 1
        return True

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.evictable[block] = None

    def evict(self) -> int:
        """Forget the least recently used cached block no request holds; returns it, free for anything."""
        block, _ = self.evictable.popitem(last=False)
        del self.block_of[self.hash_of.pop(block)]
        del self.ref_counts[block]
        self.num_evictions += 1
        return block

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_of)
